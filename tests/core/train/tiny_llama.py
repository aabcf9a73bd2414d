"""The tiny random Llama (and Gemma 3, OLMo 2, Qwen3-MoE, Mixtral, OLMoE) that the TRL reference scripts of this
folder train, written by transformers."""
import os

import torch
from transformers import (AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, LlamaConfig, MixtralConfig, Olmo2Config, Olmo3Config,
                          OlmoeConfig, Qwen2MoeConfig, Qwen3MoeConfig)


def save_tiny_llama(folder):
    """A 2-layer Llama (vocabulary 128, GQA 4/2 heads, untied head), weights N(0, 0.08), seed 0."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # larger weights than the default init, so log-probs differ visibly
        for p in model.parameters():
            p.normal_(0, 0.08)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    return folder


def save_tiny_gemma(folder):
    """A 2-layer Gemma 3 text model (vocabulary 128, one KV head, head_dim 24, query_pre_attn_scalar 20;
    layer 0 slides with a window of 3, layer 1 is global with linear rotary scaling), weights N(0, 0.08)."""
    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=24, query_pre_attn_scalar=20,
                              sliding_window=3, sliding_window_pattern=2, max_position_embeddings=128,
                              rope_scaling={"rope_type": "linear", "factor": 8.0}, rms_norm_eps=1e-5, bos_token_id=2,
                              eos_token_id=1, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # the norms too: Gemma's scale by 1 + weight
        for p in model.parameters():
            p.normal_(0, 0.08)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    return folder


def save_tiny_gemma2(folder):
    """A 2-layer Gemma 2 (vocabulary 128, GQA 4/2 heads, head_dim 16, query_pre_attn_scalar 20; layer 0
    slides with a window of 3), its attention scores soft-capped at 1 and its final logits at 2 (caps
    that bend this small model's values), weights N(0, 0.08)."""
    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=20, sliding_window=3,
                          attn_logit_softcapping=1.0, final_logit_softcapping=2.0, max_position_embeddings=128,
                          rms_norm_eps=1e-5, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.08)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    return folder


def save_tiny_olmo2(folder, olmo3=False):
    """A 2-layer OLMo 2 (vocabulary 128, GQA 4/2 heads; norms after the attention and the MLP, q and k
    normed over the whole projection), weights N(0, 0.08), norms N(1, 0.2); with `olmo3`, OLMo 3's
    layers: the first slides (a window of 3 tokens, shorter than the rows) and rotates without the
    yarn scaling the second takes."""
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                  pad_token_id=0)
    config = (Olmo3Config(sliding_window=3, layer_types=["sliding_attention", "full_attention"],
                          rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                          **common)
              if olmo3 else Olmo2Config(**common))
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0, 0.2) if "norm" in name else p.normal_(0, 0.08)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    return folder


def save_tiny_moe(folder, family="qwen3_moe"):
    """A 2-layer mixture of experts (vocabulary 128, GQA 4/2 heads), weights N(0, 0.08), norms N(1, 0.2),
    routers and experts N(0, 0.3) so that routing matters: Qwen3-MoE (6 experts, 2 per token,
    renormalized; layer 1 dense through mlp_only_layers), Mixtral (4 experts, 2 per token, every layer),
    OLMoE (4 experts, 2 per token, not renormalized, q and k normed over the whole projection) or Qwen2-MoE
    (4 experts, 2 per token, and a shared expert behind its sigmoid gate, in every layer)."""
    torch.manual_seed(0)
    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0,
                  tie_word_embeddings=False)
    config = {"qwen3_moe": lambda: Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_experts=6,
                                                  num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
                                                  head_dim=16, **common),
              "mixtral": lambda: MixtralConfig(intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, **common),
              "olmoe": lambda: OlmoeConfig(intermediate_size=32, num_experts=4, num_experts_per_tok=2, **common),
              "qwen2_moe": lambda: Qwen2MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_experts=4,
                                                  num_experts_per_tok=2, shared_expert_intermediate_size=48,
                                                  use_sliding_window=False, **common)}[family]()
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)
            else:
                p.normal_(0, 0.3 if ".experts." in name or "shared_expert" in name or name.endswith(".gate.weight")
                          else 0.08)
    os.makedirs(folder, exist_ok=True)
    model.save_pretrained(folder)
    return folder
