"""The quickstart's GRPO model in transformers: AutoTokenizer and AutoModelForCausalLM load the
folder Grove wrote, and greedy decoding of held-out prompts gives exactly the completions Grove's
`grove eval --greedy` recorded (eval-after.json). Usage: check_quickstart_model.py MODEL_DIR EVAL_JSON"""
import json
import sys

import torch
import transformers

model_dir, eval_json = sys.argv[1], sys.argv[2]
tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
rows = json.load(open(eval_json))["rows"][:20]
mismatches = 0
for row in rows:
    ids = tokenizer(row["prompt"], return_tensors="pt").input_ids
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    if text != row["completion"]:
        mismatches += 1
        print(f"MISMATCH {row['prompt']!r}: transformers {text!r} vs grove {row['completion']!r}")
print(f"{len(rows) - mismatches}/{len(rows)} held-out completions identical in transformers")
sys.exit(1 if mismatches else 0)
