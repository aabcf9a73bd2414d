#!/usr/bin/env bash
# Dynamic sampling (DAPO's filter groups) against plain GRPO on the quickstart's task, side by side
# on this machine: the same warm-started model, manifest and seed, STEPS steps each way.
#   bash bench/dynamic_sampling.sh [STEPS]         (default 40; needs the build; about 5 minutes)
# Prints, per run: frac_reward_zero_std (the share of rows in groups whose rewards all agree, TRL's
# metric) of what each step trains on, generation rounds per step, seconds per step, and the reward.
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-40}
out=$(realpath -m runs/bench-dynamic-sampling)
if [ ! -d "$out/sft" ]; then  # the quickstart's warm start (tokenizer, model, SFT), with a single GRPO step
  bash examples/arithmetic/quickstart.sh --out "$out" --grpo-steps 1 >/dev/null 2>&1
fi
for mode in off on; do
  dynamic=false && [ $mode = on ] && dynamic=true
  build/bin/grove train examples/arithmetic/grove.toml --set model.path="$out/sft" --set output.dir="$out/$mode" \
    --set train.max_steps="$steps" --set output.save_steps="$steps" --set generation.dynamic_sampling=$dynamic \
    --overwrite >/dev/null
done
.venv/bin/python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
def mean(rows, key):
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else float("nan")
print(f"{'':>5} {'frac_reward_zero_std':>21} {'first round':>12} {'rounds/step':>12} {'s/step':>7} {'generate s':>11} "
      f"{'reward, last 10':>16}")
for mode in ("off", "on"):
    rows = [json.loads(line) for line in open(f"{out}/{mode}/metrics.jsonl")]
    print(f"{mode:>5} {mean(rows, 'frac_reward_zero_std'):21.3f} "
          f"{mean(rows, 'dynamic_sampling/first_round_frac_reward_zero_std'):12.3f} "
          f"{mean(rows, 'dynamic_sampling/rounds'):12.2f} {mean(rows, 'step_time'):7.3f} "
          f"{mean(rows, 'step_time/generate'):11.3f} {mean(rows[-10:], 'reward'):16.3f}")
PY
