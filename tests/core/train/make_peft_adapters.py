"""Adapters made by PEFT itself, for Grove to merge without a grove_adapter.json (peft_lora_import).
    make_peft_adapters.py BASE_DIR OUT_DIR [TIED_BASE_DIR]
Each OUT_DIR/NAME is PEFT's save_pretrained folder of a LoRA on BASE_DIR with every weight moved
away from its initial value (so nothing is trivially the identity), beside NAME.merged.safetensors,
PEFT's merge_and_unload of it: the weights Grove's merge must give. With TIED_BASE_DIR (a model
that ties lm_head to embed_tokens), also "tied_embedding": its embedding trained whole with
ensure_weight_tying, and "tied_trainable_tokens": rows of it trained (trainable_token_indices)."""
import os
import sys

import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

base, out = sys.argv[1:3]
tied_base = sys.argv[3] if len(sys.argv) > 3 else None
configs = {
    "dora_patterns": LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "mlp.down_proj"], use_dora=True,
                                rank_pattern={"v_proj": 2}, alpha_pattern={"down_proj": 3}, init_lora_weights=False),
    "layers": LoraConfig(r=3, lora_alpha=5, use_rslora=True, target_modules=["q_proj", "k_proj", "up_proj"],
                         layers_to_transform=1, exclude_modules=["model.layers.1.self_attn.k_proj"],
                         init_lora_weights=False),
    "regex": LoraConfig(r=2, lora_alpha=4, target_modules=r"model\.layers\.\d+\.(self_attn\.o_proj|mlp\.gate_proj)",
                        exclude_modules=r"model\.layers\.0\.mlp\..*", init_lora_weights=False),
    "modules_to_save": LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["lm_head", "model.norm"],
                                  init_lora_weights=False),
    "layers_pattern": LoraConfig(r=2, target_modules=["q_proj"], layers_to_transform=[1], layers_pattern="layers"),
}
jobs = [(base, name, config) for name, config in configs.items()]
jobs.append((base, "trainable_tokens", LoraConfig(r=2, target_modules=["q_proj"], trainable_token_indices=[3, 7, 11],
                                                  init_lora_weights=False)))
if tied_base:
    jobs.append((tied_base, "tied_embedding", LoraConfig(r=2, target_modules=["q_proj"], modules_to_save=["embed_tokens"],
                                                         ensure_weight_tying=True, init_lora_weights=False)))
    jobs.append((tied_base, "tied_trainable_tokens", LoraConfig(r=2, target_modules=["q_proj"],
                                                                trainable_token_indices=[3, 7, 11], init_lora_weights=False)))
torch.manual_seed(0)
for model_dir, name, config in jobs:
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), config)
    with torch.no_grad():
        for tensor_name, p in model.named_parameters():
            if p.requires_grad:  # trained-looking values, magnitudes included
                p.mul_(1.0 + 0.5 * torch.rand_like(p))
    model.save_pretrained(os.path.join(out, name))
    # lm_head as the base has it is left out (the merged export of a tied model has none)
    merged = {k: v.contiguous() for k, v in model.merge_and_unload().state_dict().items()
              if k != "lm_head.weight" or "lm_head" in (config.modules_to_save or [])}
    save_file(merged, os.path.join(out, f"{name}.merged.safetensors"))
print(f"PEFT adapters in {out}: {', '.join(name for _, name, _ in jobs)}")
