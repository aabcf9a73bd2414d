"""Writes problems.jsonl: one-digit sums and differences as chat prompts with a LaTeX `solution`
column, the form TRL's accuracy_reward expects. Seeded, so it writes the same file every time.
usage: python make_problems.py [OUT]"""
import json
import random
import sys

rng = random.Random(7)
with open(sys.argv[1] if len(sys.argv) > 1 else "problems.jsonl", "w") as out:
    for _ in range(64):
        a, b, op = rng.randint(0, 9), rng.randint(0, 9), rng.choice("+-")
        question = f"What is {a} {op} {b}? Put the final answer in \\boxed{{}}."
        prompt = [{"role": "user", "content": question}]
        out.write(json.dumps({"prompt": prompt, "solution": f"${a + b if op == '+' else a - b}$"}) + "\n")
