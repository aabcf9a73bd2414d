#!/usr/bin/env bash
# The optimizer's memory on this machine: `grove train --nproc 2` on the same replayed rollouts with
# AdamW's state whole on each rank, sharded (ZeRO stage 1, train.shard_optimizer_state), and with
# Adafactor (train.optim, factored state), side by side. The model is random, at SmolLM2-135M's layer
# shape with the vocabulary of a tokenizer trained on the built-in task (463 pieces; 106M weights, so
# AdamW's moments take 0.85 GB per rank unsharded). Prints seconds per step (the mean after the
# first), the peak RSS of the largest rank and the size of the checkpoint's optimizer state.
#   bash bench/sharded_optimizer.sh [STEPS]        (default 4; needs the build; about 5 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-4}
out=$(realpath -m runs/bench-sharded-optimizer)
grove=build/bin/grove
mkdir -p "$out"
if [ ! -e "$out/model/config.json" ]; then
  "$grove" tokenizer train --input builtin:arithmetic --out "$out/tokenizer" --vocab-size 512 >/dev/null 2>&1
  "$grove" init-model "$out/model" --tokenizer "$out/tokenizer" --hidden 576 --layers 30 --heads 9 --kv-heads 3 \
    --intermediate 1536 --seed 1 >/dev/null
fi
.venv/bin/python - "$out" "$steps" <<'PY'
import json, random, sys
out, steps = sys.argv[1], int(sys.argv[2])
rng = random.Random(0)
vocab = json.load(open(f"{out}/model/config.json"))["vocab_size"]
with open(f"{out}/rollouts.jsonl", "w") as f:  # steps x 8 groups of 2 completions, 32 + 32 tokens
    for _ in range(steps * 8):
        prompt = [rng.randrange(4, vocab) for _ in range(32)]
        for _ in range(2):
            f.write(json.dumps({"prompt_ids": prompt, "completion_ids": [rng.randrange(4, vocab) for _ in range(32)],
                                "rewards": {"format": rng.random()}}) + "\n")
with open(f"{out}/prompts.jsonl", "w") as f:
    f.write(json.dumps({"prompt": "unused: the rollouts are replayed"}) + "\n")
with open(f"{out}/grove.toml", "w") as f:
    f.write(f'[model]\npath = "model"\nchat_template = "none"\n[data]\nsource = "prompts.jsonl"\n'
            '[rollouts]\npath = "rollouts.jsonl"\n[generation]\nnum_generations = 2\nmax_completion_length = 32\n'
            '[[rewards]]\nplugin = "format"\n'
            f'[train]\nper_device_train_batch_size = 8\nmax_steps = {steps}\nlearning_rate = 1e-5\n'
            f'[output]\nsave_steps = {steps}\n[logging]\nlogging_steps = 1\n')
PY
variants=("adamw_torch false" "adamw_torch true" "adafactor false")
for variant in "${variants[@]}"; do
  read -r optim shard <<<"$variant"
  name=$optim-$shard
  /usr/bin/time -f "%M" -o "$out/rss-$name.txt" "$grove" train "$out/grove.toml" --nproc 2 \
    --set "train.optim=\"$optim\"" --set train.shard_optimizer_state=$shard --set "output.dir=\"$out/run-$name\"" \
    --overwrite >"$out/log-$name.txt" 2>&1 || { tail -5 "$out/log-$name.txt" >&2; exit 1; }
done
.venv/bin/python - "$out" "$steps" "${variants[@]}" <<'PY'
import json, os, sys
out, steps, variants = sys.argv[1], sys.argv[2], [v.split() for v in sys.argv[3:]]
print(f"{'optim':>12} {'shard_optimizer_state':>22} {'s/step':>7} {'step_time/train':>16} "
      f"{'largest rank peak RSS MiB':>26} {'optimizer state MiB':>20}")
for optim, shard in variants:
    run = f"{out}/run-{optim}-{shard}"
    rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl")][1:]
    mean = lambda key: sum(r[key] for r in rows) / len(rows)
    rss_mib = int(open(f"{out}/rss-{optim}-{shard}.txt").read().split()[-1]) / 1024
    state_mib = os.path.getsize(f"{run}/checkpoint-{steps}/optimizer.safetensors") / 2**20
    print(f"{optim:>12} {shard:>22} {mean('step_time'):7.2f} {mean('step_time/train'):16.2f} {rss_mib:26.0f} "
          f"{state_mib:20.1f}")
PY
