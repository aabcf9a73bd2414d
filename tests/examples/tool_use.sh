#!/usr/bin/env bash
# examples/tool-use/run.sh as it is (about 3 minutes on 2 cores): the warm-started model rarely calls
# the calculator and answers the held-out problems wrong; after GRPO with the calculator environment
# it calls it in every episode and answers right; without the tool it stays wrong. Asserts the
# margins the example's README promises: accuracy with the tool from at most 0.1 to at least 0.9.
set -euo pipefail
build=$1 source=$2 work=$3
rm -rf "$work"
out=$(GROVE="$build/bin/grove" bash "$source/examples/tool-use/run.sh" --out "$work" 2>&1) ||
  { echo "$out"; echo "run.sh failed"; exit 1; }
echo "$out" | tail -25
test -s "$work/grpo/metrics.png" || { echo "no plot"; exit 1; }
"$source/.venv/bin/python" - "$work/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(s)
assert s["before"] <= 0.1, f"the warm start already answers {s['before']:.0%} right with the tool"
assert s["after"] >= 0.9, f"after GRPO only {s['after']:.0%} right with the tool"
assert s["tool_calls_after"] >= 0.9, f"after GRPO only {s['tool_calls_after']} tool calls per episode"
assert s["before_no_tool"] <= 0.05 and s["after_no_tool"] <= 0.05, "without the tool the model should stay wrong"
PY
