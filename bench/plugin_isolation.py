"""The cost of [[rewards]] isolation = "process": the same reward plugins scoring the same batch
in Grove's process and in a worker process (`grove plugins score NAME --repeat R [--isolation
process]`, which times each score() call inside the host; the worker's cost is the batch's
encoding, two socket crossings and the decoding). Batches of 64 and 512 completions of ~100-400
characters each, as a GRPO step scores them.

usage: .venv/bin/python bench/plugin_isolation.py [--grove build/bin/grove] [--repeat 50]
Run it with nothing else running (2 cores: a competing process distorts both sides).
"""

import argparse
import json
import os
import random
import re
import subprocess
import tempfile


def rows(n, seed=3):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        think = " ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(20, 120)))
        out.append({"prompt": f"What is {rng.randint(0, 99)} + {rng.randint(0, 99)}?",
                    "completion": f"<think>{think}</think><answer>{rng.randint(0, 198)}</answer>",
                    "answer": str(rng.randint(0, 198))})
    return out


def per_call_ms(grove, plugin, config, path, repeat, isolation):
    r = subprocess.run([grove, "plugins", "score", plugin, "--input", path, "--config", config, "--num-generations", "8",
                        "--repeat", str(repeat), "--isolation", isolation], capture_output=True, text=True, check=True)
    return float(re.search(r"then ([0-9.]+) ms per call", r.stderr).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--grove", default="build/bin/grove")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    plugins = [("format", 'preset = "think_answer"'), ("correctness", "")]
    print(f"| plugin | rows | in-process ms/batch | isolated ms/batch | isolation adds |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (64, 512):
            path = os.path.join(tmp, f"rows{n}.jsonl")
            with open(path, "w") as f:
                for row in rows(n):
                    f.write(json.dumps(row) + "\n")
            for plugin, config in plugins:
                a = per_call_ms(args.grove, plugin, config, path, args.repeat, "none")
                b = per_call_ms(args.grove, plugin, config, path, args.repeat, "process")
                print(f"| {plugin} | {n} | {a:.3f} | {b:.3f} | {b - a:+.3f} ms |")


if __name__ == "__main__":
    main()
