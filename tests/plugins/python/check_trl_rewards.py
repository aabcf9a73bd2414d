"""TRL's reward functions, unchanged, score fixed completions through Grove's python plugin
(`grove plugins score python`) exactly as TRL's own GRPOTrainer._calculate_rewards scores them.

The reference is TRL's method itself, run on a stand-in trainer that holds only what the method
reads, so the calling convention (which columns, which form, None -> NaN, async functions awaited,
float32) is TRL's, not a copy of it. Scores must be bit-identical.

usage: check_trl_rewards.py GROVE WORK_DIR
"""

import json
import math
import os
import subprocess
import sys
import types

import torch
from accelerate import PartialState
from trl import GRPOTrainer
from trl.trainer.utils import start_event_loop_in_daemon

HERE = os.path.dirname(os.path.abspath(__file__))


def conversational_rows():
    def row(question, answer, solution, ids):
        return {
            "prompt": [{"role": "system", "content": "Reason, then answer."}, {"role": "user", "content": question}],
            "completion": [{"role": "assistant", "content": answer}],
            "completion_ids": ids,
            "solution": solution,
        }

    return [
        row("What is 1/3 + 1/3?", r"<think>add the numerators</think><answer>\boxed{\frac{2}{3}}</answer>", r"$\frac{2}{3}$", [5] * 4),
        row("What is 1/3 + 1/3?", r"<think>hmm</think>The answer is $\frac{1}{3}$", r"$\frac{2}{3}$", [1, 2, 1, 2, 1, 2, 1, 2]),
        row("What is 2 + 2?", "<think>2 and 2</think>\nSo it is $4$.", "$4$", list(range(25))),
        row("What is 2 + 2?", "I would say 5", "$4$", [7, 8, 9] * 9),
        row("Name a prime.", "<think><think>nested</think> 7", "not latex at all: {", [3] * 30),
        row("Name a prime.", "", "$7$", []),
    ]


def standard_rows():
    def row(prompt, completion, ground_truth, task, ids):
        return {"prompt": prompt, "completion": completion, "completion_ids": ids, "ground_truth": ground_truth, "task": task}

    return [
        row("Solve 2x + 3 = 7.", r" The solution is \boxed{2}.", "2", "math", [1, 2]),
        row("Solve 3x - 5 = 10.", r" The solution is \boxed{6}.", "5", "math", [3]),
        row("Write a sum function.", "def add(a, b): return a + b", "", "code", [4, 5, 6]),
        row("What is 2+2?", "4, of course: twenty chars", "4", "math", []),
        row("Say nothing.", "", "", "code", [9] * 12),
        row("Unicode: é ü 中文", "réponse — 答案 \\boxed{中}", "中", "math", [10, 11]),
    ]


# (name in the report, module, function, factory_args or None, kwargs, rows)
CASES = [
    ("accuracy_reward", "trl.rewards", "accuracy_reward", None, {}, conversational_rows),
    ("think_format_reward", "trl.rewards", "think_format_reward", None, {}, conversational_rows),
    ("reasoning_accuracy_reward", "trl.rewards", "reasoning_accuracy_reward", None, {}, conversational_rows),
    (
        "get_soft_overlong_punishment",
        "trl.rewards",
        "get_soft_overlong_punishment",
        {"max_completion_len": 24, "soft_punish_cache": 10},
        {},
        conversational_rows,
    ),
    (
        "get_repetition_penalty_reward",
        "trl.rewards",
        "get_repetition_penalty_reward",
        {"ngram_size": 2, "max_penalty": -1.5},
        {},
        conversational_rows,
    ),
    ("get_cosine_scaled_reward", "trl.rewards", "get_cosine_scaled_reward", {"max_len": 20}, {}, conversational_rows),
    ("length_near_twenty", "guide_style_rewards.py", "length_near_twenty", None, {}, standard_rows),
    ("think_then_answer", "guide_style_rewards.py", "think_then_answer", None, {}, conversational_rows),
    ("boxed_matches", "guide_style_rewards.py", "boxed_matches", None, {}, standard_rows),
    ("non_empty_later", "guide_style_rewards.py", "non_empty_later", None, {}, standard_rows),
    ("math_only", "guide_style_rewards.py", "math_only", None, {}, standard_rows),
    ("progress_scaled", "guide_style_rewards.py", "progress_scaled", None, {"bonus": 0.25}, standard_rows),
]


def toml_value(value):
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def grove_scores(grove, module, function, factory_args, kwargs, rows, work):
    path = os.path.join(work, f"{function}.jsonl")
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    config = f"module = {toml_value(module)}\nfunction = {toml_value(function)}\n"
    if factory_args is not None:
        config += f"factory_args = {toml_value(factory_args)}\n"
    if kwargs:
        config += f"kwargs = {toml_value(kwargs)}\n"
    out = subprocess.run(
        [grove, "plugins", "score", "python", "--input", path, "--config", config],
        cwd=HERE,  # the guide's module is found relative to the folder `--config` is read in
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"grove plugins score failed for {function}:\n{out.stderr}")
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    scores = [math.nan if line["score"] is None else line["score"] for line in lines if "row" in line]
    logged = next((line["logged"] for line in lines if "logged" in line), {})
    extras = {}  # each column's values in row order, as TRL's completions table gets them
    for line in lines:
        for column, value in line.get("extra", {}).items():
            extras.setdefault(column, []).append(value)
    return torch.tensor(scores, dtype=torch.float32), logged, extras


def trl_scores(function, rows):
    """GRPOTrainer._calculate_rewards on a stand-in trainer, with the completions in TRL's form."""
    inputs = [{k: v for k, v in r.items() if k not in ("completion", "completion_ids")} for r in rows]
    prompts = [r["prompt"] for r in rows]
    completions = [r["completion"] for r in rows]
    metrics, extras = {}, {}
    trainer = types.SimpleNamespace(
        accelerator=types.SimpleNamespace(device="cpu", is_main_process=True),
        args=types.SimpleNamespace(report_to=[]),
        state=types.SimpleNamespace(global_step=0, max_steps=0),
        reward_funcs=[function],
        reward_processing_classes=[None],
        reward_func_names=[getattr(function, "__name__", "reward")],
        _log_completion_extra=lambda column, values: extras.setdefault(column, []).extend(values),
        _log_metric=lambda name, value: metrics.setdefault(name, []).append(value),
        environments=None,
        async_loop=ASYNC_LOOP,
    )
    scores = GRPOTrainer._calculate_rewards(trainer, inputs, prompts, completions, [r["completion_ids"] for r in rows])
    return scores[:, 0], metrics, extras


def load_function(module, function, factory_args):
    import importlib

    mod = importlib.import_module(module[:-3] if module.endswith(".py") else module)
    f = getattr(mod, function)
    return f(**factory_args) if factory_args is not None else f


def main():
    grove, work = os.path.abspath(sys.argv[1]), sys.argv[2]
    os.makedirs(work, exist_ok=True)
    sys.path.insert(0, HERE)
    failures = 0
    for name, module, function, factory_args, kwargs, make_rows in CASES:
        rows = make_rows()
        reference = load_function(module, function, factory_args)
        if kwargs:
            reference = (lambda f, extra: lambda **a: f(**a, **extra))(reference, kwargs)
            reference.__name__ = function
        expected, expected_metrics, expected_extras = trl_scores(reference, rows)
        got, logged, extras = grove_scores(grove, module, function, factory_args, kwargs, rows, work)
        same = got.shape == expected.shape and bool(
            torch.all((got == expected) | (torch.isnan(got) & torch.isnan(expected)))
        )
        same_metrics = expected_metrics == logged and expected_extras == extras
        print(f"{'ok  ' if same and same_metrics else 'FAIL'} {name}: grove {got.tolist()} trl {expected.tolist()}"
              + (f" metrics {logged}" if logged or expected_metrics else "")
              + (f" extra columns {extras}" if extras or expected_extras else ""))
        if not same_metrics:
            print(f"     logged values differ: grove {logged} {extras}, trl {expected_metrics} {expected_extras}")
        failures += not (same and same_metrics)
    # the comparison must be able to fail: some rows differ between functions, and NaN appears
    if failures:
        raise SystemExit(f"{failures} of {len(CASES)} reward functions scored differently through Grove")
    print(f"all {len(CASES)} reward functions give TRL's scores through Grove")


if __name__ == "__main__":
    PartialState()  # TRL's method gathers and logs through accelerate, one CPU process here
    _, ASYNC_LOOP, _ready = start_event_loop_in_daemon(name="check-async")
    _ready.wait()
    main()
