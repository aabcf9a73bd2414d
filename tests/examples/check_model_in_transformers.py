"""A model folder Grove wrote, in transformers: AutoTokenizer and AutoModelForCausalLM load it, and
greedy decoding of the prompts of a `grove eval --greedy --save` file gives exactly the completions
Grove recorded there.
Usage: check_model_in_transformers.py MODEL_DIR EVAL_JSON [MAX_NEW_TOKENS (48)] [ROWS (20)]"""
import json
import sys

import torch
import transformers

model_dir, eval_json = sys.argv[1], sys.argv[2]
max_new_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 48
row_count = int(sys.argv[4]) if len(sys.argv) > 4 else 20
tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
saved = json.load(open(eval_json))
if not saved.get("greedy"):
    sys.exit(f"{eval_json}: not a greedy evaluation; run grove eval with --greedy")
rows = saved["rows"][:row_count]
eos = model.generation_config.eos_token_id  # every EOS id, as Grove stops on any of them
eos_ids = set(eos if isinstance(eos, list) else [eos])

# prompts of one token length decode together, unpadded, so no row's attention or positions change
# (a row at a time took two minutes for SmolLM2 on two cores). The prompt already holds the chat
# template's special tokens as text; add no BOS/EOS of our own.
by_length = {}
for index, row in enumerate(rows):
    ids = tokenizer(row["prompt"], add_special_tokens=False).input_ids
    by_length.setdefault(len(ids), []).append((index, ids))
texts = [None] * len(rows)
for length, members in by_length.items():
    ids = torch.tensor([member_ids for _, member_ids in members])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=eos, pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
    for (index, _), generated in zip(members, out[:, length:].tolist()):
        # a finished row is padded to the longest: keep its tokens up to its first EOS
        end = next((i + 1 for i, token in enumerate(generated) if token in eos_ids), len(generated))
        texts[index] = tokenizer.decode(generated[:end], skip_special_tokens=True)

mismatches = 0
for row, text in zip(rows, texts):
    if text != row["completion"]:
        mismatches += 1
        print(f"MISMATCH {row['prompt']!r}: transformers {text!r} vs grove {row['completion']!r}")
print(f"{len(rows) - mismatches}/{len(rows)} held-out completions identical in transformers ({model_dir})")
sys.exit(1 if mismatches else 0)
