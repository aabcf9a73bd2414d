#!/bin/bash
# Where the GPU time of generation goes, kernel by kernel: one timed grove::generate at a kit shape
# (a random model, prompts of 32, 128 new tokens, bf16, the graph engine) under the profiler
# (GROVE_BENCH_TRACE), then the kernels by total time (tools/device/trace_kernels.py). On the GPU
# machine, from the repository root, after `make device-bundle` here:
#     bash tools/device/trace_decode.sh [SHAPE] [BATCH] [BUNDLE] [ENGINE]
# (default qwen2.5-0.5b 64 build/device-bundle graphs; ENGINE as grove_bench_generate takes it)
set -eu
SHAPE=${1:-qwen2.5-0.5b}
BATCH=${2:-64}
B=${3:-build/device-bundle}
ENGINE=${4:-graphs}
export LD_LIBRARY_PATH=$B/lib:$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
for f in $B/lib/*.xz; do [ -e "${f%.xz}" ] || python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' "$f" "${f%.xz}"; done
MODEL=$(mktemp -d)
python3 - "$B" "$SHAPE" "$MODEL" <<'PY'
import sys, importlib.util, torch
spec = importlib.util.spec_from_file_location("g", sys.argv[1] + "/generate.py"); g = importlib.util.module_from_spec(spec); spec.loader.exec_module(g)
from transformers import AutoModelForCausalLM
torch.manual_seed(0)
AutoModelForCausalLM.from_config(g.model_config(sys.argv[2])).save_pretrained(sys.argv[3])
PY
GROVE_BENCH_TRACE=$MODEL/trace.json $B/bin/grove_bench_generate "$MODEL" "$BATCH" 32 128 bfloat16 cuda "$ENGINE"
python3 "$(dirname "$0")/trace_kernels.py" "$MODEL/trace.json" 30
