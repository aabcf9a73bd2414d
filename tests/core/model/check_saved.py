"""Loads a folder Grove saved with transformers and checks its logits against the reference, and that
it holds the original checkpoint's tensors, by the same names and bit for bit (Grove trained nothing;
a multimodal checkpoint's vision tower is written back as it was).
    check_saved.py SAVED_DIR REFERENCE.safetensors ORIGINAL_DIR"""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

saved, reference, original = sys.argv[1], sys.argv[2], sys.argv[3]
ref = load_file(reference)
model = AutoModelForCausalLM.from_pretrained(saved, attn_implementation="eager").eval()
with torch.no_grad():
    logits = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                   position_ids=ref["position_ids"]).logits.float()
diff = ((logits - ref["logits"]).abs().amax(-1) * ref["attention_mask"]).max().item()
if diff > 1e-4:
    sys.exit(f"{saved}: transformers' logits differ from the reference by {diff}")

before, after = load_file(f"{original}/model.safetensors"), load_file(f"{saved}/model.safetensors")
if before.keys() != after.keys():
    sys.exit(f"{saved}: tensors {sorted(before.keys() ^ after.keys())} are in only one of it and {original}")
changed = [name for name in before if not torch.equal(before[name], after[name])]
if changed:
    sys.exit(f"{saved}: tensors {changed} differ from {original}'s")
