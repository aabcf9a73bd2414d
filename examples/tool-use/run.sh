#!/usr/bin/env bash
# A small model learns to use a tool, on a CPU (README.md in this folder):
#   1. a sentencepiece tokenizer trained on the task's text          grove tokenizer train
#   2. a 4-layer, 128-wide Llama from scratch                          grove init-model
#   3. warm start: tool-using episodes (the tool's turns masked)       grove sft examples/tool-use/sft.toml
#   4. warm start: mostly answering without the tool                   grove sft examples/tool-use/habit.toml
#   5. held-out evaluation before GRPO, with the tool and without      grove eval [--no-environment]
#   6. GRPO with the calculator environment                            grove train examples/tool-use/grove.toml
#   7. held-out evaluation after, with the tool and without            grove eval --compare
#   8. the curves of the run                                           grove plot
# Usage: run.sh [--out DIR] [--eval-limit N]   (defaults: runs/tool-use, 200)
# Everything is seeded: the same machine gives the same numbers. Writes DIR/summary.json with the
# held-out accuracies and tool calls per episode.
set -euo pipefail
cd "$(dirname "$0")/../.."
grove=${GROVE:-build/bin/grove}
out=runs/tool-use limit=200
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --eval-limit) limit=$2; shift 2 ;;
    *) echo "run.sh: unknown option $1 (use --out DIR, --eval-limit N)" >&2; exit 2 ;;
  esac
done
out=$(realpath -m "$out")
mkdir -p "$out"
stage() { printf '\n== %s  [%ds]\n' "$1" "$SECONDS"; }

stage "1/8 tokenizer: sentencepiece BPE, 512 pieces, trained on builtin:multiplication"
"$grove" tokenizer train --input builtin:multiplication --out "$out/tokenizer" --vocab-size 512 \
  --symbol '<calc>' --symbol '</calc>' --symbol '<result>' --symbol '</result>' \
  --symbol '<answer>' --symbol '</answer>' 2>/dev/null

stage "2/8 model: a 4-layer, 128-wide Llama from scratch"
"$grove" init-model "$out/base" --tokenizer "$out/tokenizer" --hidden 128 --layers 4 --heads 4 --kv-heads 2 \
  --intermediate 384 --seed 1

stage "3/8 warm start: 1000 steps on tool-using episodes (the calculator's turns masked)"
"$grove" sft examples/tool-use/sft.toml --set model.path="$out/base" --set output.dir="$out/sft" --overwrite

stage "4/8 warm start: 60 steps on episodes of which a fifth use the tool"
"$grove" sft examples/tool-use/habit.toml --set model.path="$out/sft" --set output.dir="$out/habit" --overwrite

manifest=(examples/tool-use/grove.toml --set model.path="$out/habit" --set output.dir="$out/grpo")
evaluate() {  # evaluate NAME MODEL [grove eval options]
  local name=$1 model=$2
  shift 2
  "$grove" eval "${manifest[@]}" --set model.path="$model" --greedy --limit "$limit" --save "$out/eval-$name.json" "$@"
}
stage "5/8 held-out evaluation of the warm start, with the calculator and without"
evaluate before "$out/habit"
evaluate before-no-tool "$out/habit" --no-environment

stage "6/8 GRPO: 80 steps, 8 problems x 8 episodes, the calculator environment"
"$grove" train "${manifest[@]}" --overwrite

stage "7/8 held-out evaluation after GRPO, with the calculator and without"
evaluate after "$out/grpo/checkpoint-80" --compare "$out/eval-before.json" | tee "$out/summary.txt"
evaluate after-no-tool "$out/grpo/checkpoint-80" --no-environment --compare "$out/eval-before-no-tool.json" |
  tee -a "$out/summary.txt"
field() { sed -n "s/^  \"$2\": \\([0-9.e-]*\\),\\{0,1\\}\$/\\1/p" "$out/eval-$1.json"; }
printf '{"before": %s, "after": %s, "before_no_tool": %s, "after_no_tool": %s, "tool_calls_before": %s, "tool_calls_after": %s}\n' \
  "$(field before accuracy)" "$(field after accuracy)" "$(field before-no-tool accuracy)" \
  "$(field after-no-tool accuracy)" "$(field before tool_call_frequency)" "$(field after tool_call_frequency)" \
  >"$out/summary.json"

stage "8/8 plot"
"$grove" plot "$out/grpo" --title "tool use: GRPO with the calculator on builtin:multiplication ($(date -u +%Y-%m-%d), $(nproc) CPU cores)"

printf '\ntool-use example done in %d s. Held-out accuracy (greedy): %s\nModel: %s/grpo/checkpoint-80; plot: %s/grpo/metrics.png\n' \
  "$SECONDS" "$(cat "$out/summary.json")" "$out" "$out"
