#!/bin/bash
# Grove's decode engines on a GPU, side by side: the CUDA graph engine (with sampling after each
# replay, or captured in the graph too: --capture-sampling) against the eager loop.
# First the tokens they generate on the tiny model (greedy and sampled, float32 and bf16; they must
# be identical), then Grove's tokens/s with each at the kit's shapes (random models, prompts of 32,
# 128 new tokens, bf16), each run twice, alternately. Run from the repository root on the GPU machine:
#     bash tools/device/compare_engines.sh [BUNDLE]      (default build/device-bundle)
set -u
B=${1:-build/device-bundle}
export LD_LIBRARY_PATH=$B/lib:$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__)+"/lib")')
for f in $B/lib/*.xz; do [ -e "${f%.xz}" ] || python3 -c 'import lzma, sys; open(sys.argv[2], "wb").write(lzma.open(sys.argv[1]).read())' "$f" "${f%.xz}"; done
M=$B/models/tiny/llama_gqa
python3 - <<'PY' > /tmp/p.jsonl
import json
for t in ["What is 2 + 2?","Tell me a story about","x","The capital of France is","1 2 3 4 5 6 7 8 9","Once upon a time there","a b","Hello"]*3:
    print(json.dumps({"prompt":t}))
PY
for mode in "--greedy" "--temperature 1.3 --top-k 50 --seed 3" "--temperature 1.0 --repetition-penalty 1.3 --seed 4"; do
  for dt in float32 bfloat16; do
    $B/bin/grove generate --model $M --input /tmp/p.jsonl $mode --max-new-tokens 40 --json --device cuda --dtype $dt > /tmp/g.jsonl || echo "graphs FAILED"
    $B/bin/grove generate --model $M --input /tmp/p.jsonl $mode --max-new-tokens 40 --json --device cuda --dtype $dt --no-cuda-graphs > /tmp/e.jsonl || echo "eager FAILED"
    $B/bin/grove generate --model $M --input /tmp/p.jsonl $mode --max-new-tokens 40 --json --device cuda --dtype $dt --capture-sampling > /tmp/c.jsonl || echo "captured FAILED"
    python3 -c "
import json
g, e, c = ([json.loads(l) for l in open(f'/tmp/{x}.jsonl')] for x in 'gec')
same=sum(a['completion_ids']==b['completion_ids'] for a,b in zip(g,e))
captured=sum(a['completion_ids']==b['completion_ids'] for a,b in zip(c,g))
print('$dt', '$mode', 'rows identical graphs vs eager:', same, 'of', len(g), '; captured vs graphs:', captured, 'of', len(g))"
  done
done
echo "bench: shape batch dtype engine tokens/s"
python3 - "$B" <<'PY'
import sys, json, subprocess, tempfile, importlib.util, torch
spec = importlib.util.spec_from_file_location("g", sys.argv[1] + "/generate.py"); g = importlib.util.module_from_spec(spec); spec.loader.exec_module(g)
from transformers import AutoModelForCausalLM
for shape in ["smollm2-135m", "qwen2.5-0.5b"]:
    torch.manual_seed(0)
    folder = tempfile.mkdtemp()
    AutoModelForCausalLM.from_config(g.model_config(shape)).save_pretrained(folder)
    for batch in [64, 512]:
        for engine in ["eager", "graphs", "captured", "unsplit", "unfused", "unfused+unsplit"] * 2:
            r = subprocess.run([sys.argv[1] + "/bin/grove_bench_generate", folder, str(batch), "32", "128", "bfloat16", "cuda", engine], capture_output=True, text=True)
            print(shape, batch, engine, r.stdout.strip() or r.stderr[-1500:], flush=True)
PY
