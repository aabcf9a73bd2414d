"""Writes problems.jsonl: 3-digit products as chat prompts with an integer `answer` column. Seeded,
so it writes the same file every time.  usage: python make_problems.py [OUT]"""
import json
import random
import sys

rng = random.Random(11)
with open(sys.argv[1] if len(sys.argv) > 1 else "problems.jsonl", "w") as out:
    for _ in range(64):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        prompt = [{"role": "user", "content": f"What is {a} * {b}? Use the multiply tool."}]
        out.write(json.dumps({"prompt": prompt, "answer": a * b}) + "\n")
