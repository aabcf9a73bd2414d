"""transformers' own decisions about the best checkpoint, for BestCheckpoint.* (test_best_checkpoint.cpp).

Usage: transformers_best_checkpoint.py CASES.json OUT.json

CASES.json holds
  "settings":    TrainingArguments keyword arguments; each gives {"metric_for_best_model",
                 "greater_is_better"} as TrainingArguments and Trainer resolve them, or {"error": message}
                 when either refuses them;
  "evaluations": {"greater_is_better", "values", "patience", "threshold"}; each gives, per value in
                 order, [whether Trainer._determine_best_metric finds it a new best, whether an
                 EarlyStoppingCallback(patience, threshold) stops training there] (patience null: no callback);
  "rotations":   {"steps", "limit", "best"}; each gives the checkpoint steps Trainer._rotate_checkpoints
                 deletes from folders checkpoint-<step> with save_total_limit = limit and the best
                 checkpoint's step `best` (or null).
"""
import json
import os
import sys
import tempfile
import types

import torch
from transformers import EarlyStoppingCallback, Trainer, TrainerControl, TrainingArguments


def resolved_settings(kwargs, output_dir):
    try:
        args = TrainingArguments(output_dir=output_dir, report_to=[], logging_steps=10, **kwargs)
        # the Trainer refuses what TrainingArguments lets through (save_strategy="best" without a metric)
        Trainer(model=torch.nn.Linear(1, 1), args=args, eval_dataset=[{}])
    except ValueError as error:
        return {"error": str(error)}
    return {"metric_for_best_model": args.metric_for_best_model, "greater_is_better": args.greater_is_better}


def new_bests(case):
    args = types.SimpleNamespace(metric_for_best_model="m", greater_is_better=case["greater_is_better"],
                                 save_strategy="steps")
    trainer = types.SimpleNamespace(
        args=args, state=types.SimpleNamespace(best_metric=None, best_global_step=None, global_step=0))
    stopping = None
    if case["patience"] is not None:
        stopping = EarlyStoppingCallback(early_stopping_patience=case["patience"],
                                         early_stopping_threshold=case["threshold"])
    control = TrainerControl()
    found = []
    for step, value in enumerate(case["values"], start=1):
        trainer.state.global_step = step
        metrics = {"eval_m": value}
        if stopping:  # Trainer._evaluate calls the callbacks' on_evaluate before it judges the best
            stopping.on_evaluate(args, trainer.state, control, metrics)
        found.append([bool(Trainer._determine_best_metric(trainer, metrics, None)), control.should_training_stop])
    return found


def deleted(case):
    with tempfile.TemporaryDirectory() as output_dir:
        for step in case["steps"]:
            os.mkdir(os.path.join(output_dir, f"checkpoint-{step}"))
        best = case["best"]
        trainer = types.SimpleNamespace(
            args=types.SimpleNamespace(save_total_limit=case["limit"]),
            state=types.SimpleNamespace(
                best_model_checkpoint=None if best is None else os.path.join(output_dir, f"checkpoint-{best}")))
        trainer._sorted_checkpoints = types.MethodType(Trainer._sorted_checkpoints, trainer)
        Trainer._rotate_checkpoints(trainer, use_mtime=False, output_dir=output_dir)
        left = {int(name.split("-")[1]) for name in os.listdir(output_dir)}
        return sorted(set(case["steps"]) - left)


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    with tempfile.TemporaryDirectory() as output_dir:
        out = {
            "settings": [resolved_settings(kwargs, output_dir) for kwargs in cases["settings"]],
            "evaluations": [new_bests(case) for case in cases["evaluations"]],
            "rotations": [deleted(case) for case in cases["rotations"]],
        }
    with open(sys.argv[2], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
