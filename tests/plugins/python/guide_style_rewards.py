"""Reward functions of the kinds TRL's GRPO guide shows users how to write, in our own words:
length shaping, a regex format check, an answer compared with a dataset column, an async function,
a task-selective function that returns None, and one that reads trainer_state and logs a metric.
check_trl_rewards.py calls each through Grove's python plugin and directly, through TRL's trainer."""

import asyncio
import re


def length_near_twenty(completions, **kwargs):
    """Standard form: the closer a completion is to 20 characters, the higher."""
    return [-abs(20 - len(text)) for text in completions]


def think_then_answer(completions, **kwargs):
    """Conversational form: 1.0 when the whole reply is <think>...</think><answer>...</answer>."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    return [1.0 if re.match(pattern, c[0]["content"]) else 0.0 for c in completions]


def boxed_matches(completions, ground_truth, **kwargs):
    """Standard form: 1.0 when the first \\boxed{...} holds the ground_truth column's text."""
    found = [re.search(r"\\boxed\{(.*?)\}", text) for text in completions]
    return [1.0 if m is not None and m.group(1) == truth else 0.0 for m, truth in zip(found, ground_truth)]


async def non_empty_later(prompts, completions, **kwargs):
    """An async reward: awaits (as a call to a remote judge would), then 1.0 for a non-empty reply."""
    await asyncio.sleep(0.001)
    return [1.0 if text else 0.0 for text in completions]


def math_only(prompts, completions, task, **kwargs):
    """Scores only the rows whose task column is "math" (None elsewhere: not applicable)."""
    return [(1.0 if "4" in text else -1.0) if t == "math" else None for text, t in zip(completions, task)]


def progress_scaled(completions, trainer_state, log_metric, log_extra, bonus=1.0, **kwargs):
    """Reads the training progress, logs a metric by name and a value per completion (its length, and
    whether it is long); `bonus` comes from the manifest's kwargs."""
    scale = (trainer_state.global_step + 1) / max(trainer_state.max_steps, 1)
    log_metric("progress_scaled/scale", scale)
    log_extra("progress_scaled/length", [len(text) for text in completions])
    log_extra("progress_scaled/kind", ["long" if len(text) > 8 else "short" for text in completions])
    return [bonus * scale * len(text) for text in completions]
