#!/bin/bash
# A kernel change judged on a GPU in one short call: this bundle's CUDA decode against a baseline
# build's, on the same machine in the same run.
#   1. tokens: the graph engine against the eager loop (greedy, 120 tokens, so the batch moves
#      buckets and attention covers more than one key tile) on llama_gqa, Qwen3 and Gemma 3's sliding
#      layer, float32 (must be identical) and bf16 (figures only), and without split attention
#      (float32, figures only: it sums in another order);
#   2. speed: grove_bench_generate of the bundle and of the baseline, alternated, at the kit's shapes
#      (random models, prompts of 32, 128 new tokens, bf16), each result a JSON line.
# BASELINE holds bin/grove_bench_generate and lib/libgrove_{core,torch}.so of the build before the
# change (copy them from build/device-bundle before rebuilding it). Output goes to OUT (stdout too).
#   bash tools/device/compare_builds.sh BUNDLE BASELINE OUT [SHAPE:BATCH ...]
# (default shapes: qwen2.5-0.5b:512 qwen2.5-0.5b:64 smollm2-135m:512)
set -u
B=$(cd "$1" && pwd) BASE=$(cd "$2" && pwd) OUT=$3
shift 3
SHAPES=${*:-qwen2.5-0.5b:512 qwen2.5-0.5b:64 smollm2-135m:512}
mkdir -p "$OUT"
TORCH_LIB=$("${PYTHON:-python3}" -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
for f in "$B"/lib/*.xz; do
  [ -e "${f%.xz}" ] || "${PYTHON:-python3}" -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' "$f" "${f%.xz}"
done
NEW_PATH=$B/lib:$TORCH_LIB
OLD_PATH=$BASE/lib:$B/lib:$TORCH_LIB # the baseline's Grove libraries first, the rest from the bundle

"${PYTHON:-python3}" - "$B" "$NEW_PATH" <<'PY' 2>&1 | tee "$OUT/tokens.txt"
import json, os, subprocess, sys
bundle, path = sys.argv[1], sys.argv[2]
prompts = "/tmp/compare-prompts.jsonl"
with open(prompts, "w") as f:
    for text in ["What is 2 + 2?", "Tell me a story about", "x", "The capital of France is", "1 2 3 4 5 6 7 8 9",
                 "Once upon a time there", "a b", "Hello"] * 3:
        f.write(json.dumps({"prompt": text}) + "\n")
def generate(model, dtype, *engine):
    r = subprocess.run([f"{bundle}/bin/grove", "generate", "--model", f"{bundle}/models/tiny/{model}", "--input", prompts,
                        "--greedy", "--max-new-tokens", "120", "--json", "--device", "cuda", "--dtype", dtype, *engine],
                       capture_output=True, text=True, env=dict(os.environ, LD_LIBRARY_PATH=path))
    if r.returncode:
        print(f"FAILED {model} {dtype} {engine}: {r.stderr[-800:]}")
        return []
    return [json.loads(line) for line in r.stdout.splitlines()]
failed = False
for model in ["llama_gqa", "qwen3_qknorm", "gemma3_window"]:
    eager = {}
    for dtype in ["float32", "bfloat16"]:
        graphs, eager[dtype] = generate(model, dtype), generate(model, dtype, "--no-cuda-graphs")
        same = sum(a["completion_ids"] == b["completion_ids"] for a, b in zip(graphs, eager[dtype]))
        print(f"{model} {dtype} greedy, graphs vs eager: {same}/{len(eager[dtype])} rows identical")
        failed |= dtype == "float32" and (same != len(eager[dtype]) or not eager[dtype])
    unsplit, eager = generate(model, "float32", "--no-split-attention"), eager["float32"]
    same = sum(a["completion_ids"] == b["completion_ids"] for a, b in zip(unsplit, eager))
    print(f"{model} float32 greedy, unsplit graphs vs eager: {same}/{len(eager)} rows identical (another order of sums)")
print("tokens:", "FAILED" if failed else "pass")
PY

"${PYTHON:-python3}" - "$B" "$BASE" "$NEW_PATH" "$OLD_PATH" $SHAPES <<'PY' 2>&1 | tee "$OUT/speed.jsonl"
import importlib.util, json, os, subprocess, sys, tempfile
import torch
from transformers import AutoModelForCausalLM
bundle, base, new_path, old_path, shapes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
spec = importlib.util.spec_from_file_location("generate_bench", f"{bundle}/generate.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
folders = {}
for shape, batch in (s.split(":") for s in shapes):
    if shape not in folders:
        torch.manual_seed(0)
        folders[shape] = tempfile.mkdtemp()
        AutoModelForCausalLM.from_config(bench.model_config(shape)).save_pretrained(folders[shape])
    for build, binary, path in [("new", bundle, new_path), ("baseline", base, old_path)] * 2:
        r = subprocess.run([f"{binary}/bin/grove_bench_generate", folders[shape], batch, "32", "128", "bfloat16", "cuda"],
                           capture_output=True, text=True, env=dict(os.environ, LD_LIBRARY_PATH=path))
        line = {"shape": shape, "batch": int(batch), "build": build}
        line.update(json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr[-800:]})
        print(json.dumps(line), flush=True)
PY
