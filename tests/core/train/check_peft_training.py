"""Trains nothing: loads a Grove adapter checkpoint with PEFT and checks that PEFT would train the
same adapter the same way.
    check_peft_training.py CHECKPOINT_DIR BASE_DIR GROVE.safetensors MERGED_DIR

GROVE.safetensors holds Grove's input_ids, its logits, the gradients of the next-token
cross-entropy over input_ids ("grad.<saved name>") and its weight-decay flags ("decays.<saved
name>", 1 or 0). Checked against PEFT and transformers:
  - the trainable tensors PEFT creates from adapter_config.json have Grove's names and shapes
    (target_modules, exclude_modules, layers_to_transform, rank_pattern);
  - PEFT's logits equal Grove's, and so do PEFT's gradients of the same loss (DoRA's detached norm);
  - transformers' Trainer decays the tensors Grove decays (get_decay_parameter_names);
  - PEFT's merge_and_unload gives the weights of Grove's merged export (MERGED_DIR), and keeps a
    tied lm_head tied as the export does."""
import glob
import os
import re
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, Trainer

checkpoint, base, grove_file, merged_dir = sys.argv[1:5]
grove = load_file(grove_file)
failures = []


def saved_name(peft_name):
    """PEFT's module parameter name as its adapter file names it."""
    name = re.sub(r"\.default(\.weight)?$", r"\1", peft_name).replace(".modules_to_save.", ".")
    return re.sub(r"lora_magnitude_vector\.weight$", "lora_magnitude_vector", name)


model = PeftModel.from_pretrained(
    AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager"), checkpoint, is_trainable=True
)
model.train()  # the adapter's dropout is 0 here: train mode changes nothing but what PEFT computes
trainable = {saved_name(n): p for n, p in model.named_parameters() if p.requires_grad}
grove_grads = {k[len("grad."):]: v for k, v in grove.items() if k.startswith("grad.")}
if set(trainable) != set(grove_grads):
    failures.append(f"PEFT trains {sorted(set(trainable) - set(grove_grads))} that Grove does not, "
                    f"Grove {sorted(set(grove_grads) - set(trainable))} that PEFT does not")

ids = grove["input_ids"]
logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float()
logit_diff = (logits - grove["logits"]).abs().max().item()
if logit_diff > 1e-4:
    failures.append(f"logits differ by {logit_diff}")
loss = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:])
loss.backward()
worst = 0.0
for name, p in trainable.items():
    if name not in grove_grads:
        continue
    if p.shape != grove_grads[name].shape:
        failures.append(f"{name}: PEFT's shape {tuple(p.shape)}, Grove's {tuple(grove_grads[name].shape)}")
        continue
    scale = max(p.grad.abs().max().item(), 1e-8)
    diff = (p.grad - grove_grads[name]).abs().max().item() / scale
    worst = max(worst, diff)
    if diff > 1e-4:
        failures.append(f"{name}: gradients differ by {diff:.2e} of their largest")

decayed = {saved_name(n) for n in Trainer.get_decay_parameter_names(None, model)}
for name in trainable:
    grove_decays = bool(grove[f"decays.{name}"].item()) if f"decays.{name}" in grove else None
    if grove_decays != (name in decayed):
        failures.append(f"{name}: transformers decays it: {name in decayed}, Grove: {grove_decays}")

unloaded = model.merge_and_unload()
merged = unloaded.state_dict()
grove_merged = {}
for f in glob.glob(os.path.join(merged_dir, "*.safetensors")):
    grove_merged.update(load_file(f))
if set(grove_merged) - set(merged):
    failures.append(f"Grove's merged export has tensors PEFT's merge lacks: {sorted(set(grove_merged) - set(merged))}")
merge_diff = max((merged[k].float() - v.float()).abs().max().item() for k, v in grove_merged.items() if k in merged)
if merge_diff > 1e-5:
    failures.append(f"merged weights differ by {merge_diff}")
# a tied model's export holds only embed_tokens: it is right only if PEFT's merge keeps them tied
if getattr(unloaded.config, "tie_word_embeddings", False) and "lm_head.weight" not in grove_merged:
    if not torch.equal(unloaded.get_output_embeddings().weight, unloaded.get_input_embeddings().weight):
        failures.append("PEFT's merge unties lm_head from embed_tokens, Grove's export keeps them tied")

if failures:
    sys.exit("\n".join(failures))
print(f"PEFT: {len(trainable)} tensors, logits within {logit_diff:.1e}, gradients within {worst:.1e} of their "
      f"largest, merged weights within {merge_diff:.1e}, decay flags equal")
