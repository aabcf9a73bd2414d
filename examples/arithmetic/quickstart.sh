#!/usr/bin/env bash
# The main job (`make quickstart`): from nothing to a model that GRPO visibly improves, on a CPU.
#   1. a sentencepiece tokenizer trained on the task's text      grove tokenizer train
#   2. a small Llama initialised from scratch                    grove init-model
#   3. a short supervised warm-start, deliberately imperfect      grove sft   examples/arithmetic/sft.toml
#   4. held-out evaluation before GRPO                            grove eval  (greedy, 200 problems)
#   5. GRPO with three weighted rewards                           grove train examples/arithmetic/grove.toml
#   6. held-out evaluation after, side by side with before        grove eval --compare
#   7. the curves of the run                                      grove plot
# Usage: quickstart.sh [--out DIR] [--sft-steps N] [--grpo-steps N]   (defaults: runs/quickstart, 400, 500)
# Everything is seeded: the same machine gives the same numbers.
set -euo pipefail
cd "$(dirname "$0")/../.."
grove=${GROVE:-build/bin/grove}
out=runs/quickstart sft_steps=400 grpo_steps=500
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --sft-steps) sft_steps=$2; shift 2 ;;
    --grpo-steps) grpo_steps=$2; shift 2 ;;
    *) echo "quickstart.sh: unknown option $1 (use --out DIR, --sft-steps N, --grpo-steps N)" >&2; exit 2 ;;
  esac
done
out=$(realpath -m "$out")
mkdir -p "$out"
stage() { printf '\n== %s  [%ds]\n' "$1" "$SECONDS"; }

stage "1/7 tokenizer: sentencepiece BPE, 512 pieces, trained on builtin:arithmetic"
"$grove" tokenizer train --input builtin:arithmetic --out "$out/tokenizer" --vocab-size 512 \
  --symbol '<think>' --symbol '</think>' --symbol '<answer>' --symbol '</answer>' 2>/dev/null

stage "2/7 model: a 4-layer, 128-wide Llama from scratch"
"$grove" init-model "$out/base" --tokenizer "$out/tokenizer" --hidden 128 --layers 4 --heads 4 --kv-heads 2 \
  --intermediate 384 --seed 1

stage "3/7 supervised warm-start: $sft_steps steps on worked reference completions"
"$grove" sft examples/arithmetic/sft.toml --set model.path="$out/base" --set output.dir="$out/sft" \
  --set train.max_steps="$sft_steps" --overwrite

manifest=(examples/arithmetic/grove.toml --set model.path="$out/sft" --set output.dir="$out/grpo"
          --set train.max_steps="$grpo_steps" --set output.save_steps="$grpo_steps")
stage "4/7 held-out evaluation of the warm-started model (before GRPO)"
"$grove" eval "${manifest[@]}" --greedy --save "$out/eval-before.json"

stage "5/7 GRPO: $grpo_steps steps, 16 prompts x 8 completions, rewards format + correctness + length_penalty"
"$grove" train "${manifest[@]}" --overwrite

stage "6/7 held-out evaluation after GRPO"
"$grove" eval "${manifest[@]}" --set model.path="$out/grpo/checkpoint-$grpo_steps" --greedy \
  --save "$out/eval-after.json" --compare "$out/eval-before.json" | tee "$out/summary.txt"

stage "7/7 plot"
"$grove" plot "$out/grpo" --title "quickstart: GRPO on builtin:arithmetic ($(date -u +%Y-%m-%d), $(nproc) CPU cores)"

printf '\nquickstart done in %d s. Model: %s/grpo/checkpoint-%s (a Hugging Face folder); metrics: %s/grpo/metrics.jsonl; plot: %s/grpo/metrics.png\n' \
  "$SECONDS" "$out" "$grpo_steps" "$out" "$out"
