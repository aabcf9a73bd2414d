#!/usr/bin/env bash
# Installs Grove into a scratch prefix, builds examples/custom-objective (a C objective) against the
# INSTALLED SDK only, checks the example's own manifest with the installed grove, and trains two
# steps with it on a tiny checkpoint: the objective's metric must reach metrics.jsonl.
set -euo pipefail
build=$1 source=$2 work=$3
rm -rf "$work" && mkdir -p "$work/run"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$source/examples/custom-objective" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
plugin="$work/build/libdual_clip_objective.so"
test -f "$plugin"
sed "s|\.\./\.\./build-objective/|$work/build/|" "$source/examples/custom-objective/grove.toml" > "$work/grove.toml"
out=$("$work/prefix/bin/grove" check "$work/grove.toml")
echo "$out" | grep -q "objective  dual_clip 1.0.0" || { echo "installed grove did not load the example objective: $out"; exit 1; }

# two steps on a tiny checkpoint with the example objective
for i in 0 1 2 3 4 5 6 7; do echo "{\"prompt\": \"What is $i + 2?\"}"; done > "$work/run/prompts.jsonl"
cat > "$work/run/grove.toml" <<TOML
[model]
path = "$build/tests/models/tiny/llama_gqa"
chat_template = "none"
[data]
source = "prompts.jsonl"
[generation]
num_generations = 2
max_completion_length = 6
[[rewards]]
plugin = "format"
config = { pattern = "[aeiou]", full_match = false }
[objective]
plugin = "$plugin"
config = { clip_ratio_c = 2.0 }
[loss]
num_iterations = 2
[train]
per_device_train_batch_size = 4
max_steps = 2
learning_rate = 0.05
[output]
dir = "out"
TOML
"$work/prefix/bin/grove" train "$work/run/grove.toml" > "$work/run/train.log" 2>&1 || { cat "$work/run/train.log"; exit 1; }
lines=$(grep -c dual_clip_ratio "$work/run/out/metrics.jsonl")
[ "$lines" = 2 ] || { echo "expected 2 metrics lines with dual_clip_ratio, got $lines"; cat "$work/run/out/metrics.jsonl"; exit 1; }
echo "custom-objective example: built against $work/prefix, checked and trained by the installed grove"
