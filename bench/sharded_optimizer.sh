#!/usr/bin/env bash
# ZeRO stage 1 (train.shard_optimizer_state) on this machine: `grove train --nproc 2` on the same
# replayed rollouts with the optimizer state sharded and not, side by side. The model is random, at
# SmolLM2-135M's layer shape with the vocabulary of a tokenizer trained on the built-in task (463
# pieces; 106M weights, so AdamW's moments take 0.85 GB per rank unsharded). Prints seconds per step
# (the mean after the first) and the peak RSS of the largest rank.
#   bash bench/sharded_optimizer.sh [STEPS]        (default 4; needs the build; about 3 minutes)
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
for shard in false true; do
  /usr/bin/time -f "%M" -o "$out/rss-$shard.txt" "$grove" train "$out/grove.toml" --nproc 2 \
    --set train.shard_optimizer_state=$shard --set "output.dir=\"$out/run-$shard\"" --overwrite >"$out/log-$shard.txt" 2>&1 ||
    { tail -5 "$out/log-$shard.txt" >&2; exit 1; }
done
.venv/bin/python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print(f"{'shard_optimizer_state':>22} {'s/step':>7} {'step_time/train':>16} {'largest rank peak RSS MiB':>26}")
for shard in ("false", "true"):
    rows = [json.loads(line) for line in open(f"{out}/run-{shard}/metrics.jsonl")][1:]
    mean = lambda key: sum(r[key] for r in rows) / len(rows)
    rss_mib = int(open(f"{out}/rss-{shard}.txt").read().split()[-1]) / 1024
    print(f"{shard:>22} {mean('step_time'):7.2f} {mean('step_time/train'):16.2f} {rss_mib:26.0f}")
PY
