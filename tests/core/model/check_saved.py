"""Loads folders Grove saved with transformers and checks each one's logits against its reference, and
that it holds the original checkpoint's tensors, by the same names and bit for bit (Grove trained
nothing; a multimodal checkpoint's vision tower is written back as it was). Several folders in one
process: importing transformers costs seconds, a forward of a tiny model milliseconds.
    check_saved.py SAVED_DIR REFERENCE.safetensors ORIGINAL_DIR [SAVED_DIR REFERENCE ORIGINAL_DIR ...]"""
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM


def problem(saved, reference, original):
    """What is wrong with the saved folder, or None."""
    ref = load_file(reference)
    model = AutoModelForCausalLM.from_pretrained(saved, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                       position_ids=ref["position_ids"]).logits.float()
    diff = ((logits - ref["logits"]).abs().amax(-1) * ref["attention_mask"]).max().item()
    if diff > 1e-4:
        return f"{saved}: transformers' logits differ from the reference by {diff}"
    before, after = load_file(f"{original}/model.safetensors"), load_file(f"{saved}/model.safetensors")
    if before.keys() != after.keys():
        return f"{saved}: tensors {sorted(before.keys() ^ after.keys())} are in only one of it and {original}"
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    if changed:
        return f"{saved}: tensors {changed} differ from {original}'s"
    return None


arguments = sys.argv[1:]
if not arguments or len(arguments) % 3:
    sys.exit(__doc__)
problems = [p for i in range(0, len(arguments), 3) if (p := problem(*arguments[i:i + 3]))]
print("\n".join(problems))
sys.exit(1 if problems else 0)
