"""The tiny random Llama that the TRL reference scripts of this folder train, written by transformers."""
import os

import torch
from transformers import AutoModelForCausalLM, LlamaConfig


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
