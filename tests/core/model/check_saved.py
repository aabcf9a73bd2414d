"""Loads a folder Grove saved with transformers and checks its logits against the reference.
    check_saved.py SAVED_DIR REFERENCE.safetensors"""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

saved, reference = sys.argv[1], sys.argv[2]
ref = load_file(reference)
model = AutoModelForCausalLM.from_pretrained(saved, attn_implementation="eager").eval()
with torch.no_grad():
    logits = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                   position_ids=ref["position_ids"]).logits.float()
diff = ((logits - ref["logits"]).abs().amax(-1) * ref["attention_mask"]).max().item()
if diff > 1e-4:
    sys.exit(f"{saved}: transformers' logits differ from the reference by {diff}")
