"""The python plugin's cost per batch: TRL reward functions called through Grove (`grove plugins
score python --repeat R`, which times the plugin's score() call inside the host) against the same
functions called directly in Python with TRL's arguments, on one batch of 512 completions.

usage: .venv/bin/python bench/python_rewards.py [--grove build/bin/grove] [--rows 512] [--repeat 10]
Run it with nothing else running (2 cores: a competing process distorts both sides).
"""

import argparse
import json
import os
import random
import re
import subprocess
import tempfile
import time
import types


def rows(n, seed=5):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        right = rng.random() < 0.5
        answer = a + b if right else a + b + rng.randint(1, 9)
        think = "<think>" + " ".join(str(rng.randint(0, 9)) for _ in range(rng.randint(5, 60))) + "</think>"
        text = (think if rng.random() < 0.7 else "") + f"The sum is $\\boxed{{{answer}}}$."
        out.append({
            "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
            "completion": [{"role": "assistant", "content": text}],
            "completion_ids": [rng.randint(0, 30000) for _ in range(rng.randint(8, 120))],
            "solution": f"${a + b}$",
        })
    return out


FUNCTIONS = [  # (label, config TOML, loader)
    ("accuracy_reward", 'module = "trl.rewards"\nfunction = "accuracy_reward"',
     lambda: __import__("trl.rewards", fromlist=["accuracy_reward"]).accuracy_reward),
    ("think_format_reward", 'module = "trl.rewards"\nfunction = "think_format_reward"',
     lambda: __import__("trl.rewards", fromlist=["think_format_reward"]).think_format_reward),
    ("get_repetition_penalty_reward(3, -1)",
     'module = "trl.rewards"\nfunction = "get_repetition_penalty_reward"\nfactory_args = { ngram_size = 3, max_penalty = -1.0 }',
     lambda: __import__("trl.rewards", fromlist=["x"]).get_repetition_penalty_reward(ngram_size=3, max_penalty=-1.0)),
]


def direct_ms(function, batch, repeat):
    kwargs = dict(prompts=[r["prompt"] for r in batch], completions=[r["completion"] for r in batch],
                  completion_ids=[r["completion_ids"] for r in batch], solution=[r["solution"] for r in batch],
                  trainer_state=types.SimpleNamespace(global_step=0, max_steps=0),
                  log_metric=lambda *a: None, log_extra=lambda *a: None)
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        function(**kwargs)
        seconds.append(time.perf_counter() - start)
    return sum(seconds[1:]) / (repeat - 1) * 1e3


def grove_ms(grove, config, path, repeat):
    out = subprocess.run([grove, "plugins", "score", "python", "--input", path, "--config", config,
                          "--repeat", str(repeat)], capture_output=True, text=True, check=True)
    return float(re.search(r"then ([0-9.e+-]+) ms per call", out.stderr).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grove", default="build/bin/grove")
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    batch = rows(args.rows)
    path = os.path.join(tempfile.mkdtemp(), "rows.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in batch)
    print(f"| reward function ({args.rows} completions) | Python, direct (ms) | through Grove (ms) | overhead (ms) | ratio |")
    print("|---|---|---|---|---|")
    for label, config, load in FUNCTIONS:
        direct = direct_ms(load(), batch, args.repeat)
        through = grove_ms(args.grove, config, path, args.repeat)
        print(f"| {label} | {direct:.2f} | {through:.2f} | {through - direct:+.2f} | {through / direct:.2f} |")


if __name__ == "__main__":
    main()
