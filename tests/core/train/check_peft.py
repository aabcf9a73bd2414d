"""Loads a Grove LoRA checkpoint with PEFT and compares logits with Grove's.
    check_peft.py CHECKPOINT_DIR BASE_DIR GROVE_LOGITS.safetensors"""
import sys

import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

checkpoint, base, logits_file = sys.argv[1:4]
ref = load_file(logits_file)
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, attn_implementation="eager"), checkpoint).eval()
with torch.no_grad():
    logits = model(input_ids=ref["input_ids"], attention_mask=torch.ones_like(ref["input_ids"])).logits.float()
diff = (logits - ref["logits"]).abs().max().item()
base_model = AutoModelForCausalLM.from_pretrained(base).eval()
with torch.no_grad():
    moved = (base_model(input_ids=ref["input_ids"]).logits - logits).abs().max().item()
if diff > 1e-4 or moved < 1e-4:
    sys.exit(f"PEFT logits differ from Grove's by {diff} (adapter moved logits by {moved})")
print(f"PEFT loads the adapter: max logit difference {diff:.2e}, adapter effect {moved:.2e}")
