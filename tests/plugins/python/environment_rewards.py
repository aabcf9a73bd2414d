"""Reward functions that read TRL's `environments` argument (the environment instance each
completion's episode ran in), for test_python_environment.cpp."""


def totals(environments, **kwargs):
    """The running total each row's Counter ended its episode with (None: the row has no instance)."""
    return [None if e is None else e.total for e in environments]


def one_echo(environments, **kwargs):
    """1 where the row's environment is the one Echo object (Grove's contract runs every episode)."""
    return [float(type(e).__name__ == "Echo" and e is environments[0]) for e in environments]


def given_environments(completions, **kwargs):
    """1 on every row when `environments` was passed; a function that does not name it runs either way."""
    return [float("environments" in kwargs)] * len(completions)


RECORDED = []  # the completions record_completions was given, batch after batch


def record_completions(completions, **kwargs):
    """Keeps the completions as the function got them; scores 0."""
    RECORDED.append(completions)
    return [0.0] * len(completions)


def tool_messages(completions, **kwargs):
    """How many tool messages each completion holds (an episode given as TRL's messages): 0 for one
    assistant message holding the whole text, which must then be the completion's text."""
    counts = []
    for c in completions:
        tools = sum(m["role"] == "tool" for m in c)
        if tools == 0 and len(c) == 1 and c[0]["content"] not in ("the episode", "It is 7."):
            raise ValueError(f"unexpected single message {c}")
        counts.append(float(tools))
    return counts


def parsed(completions, **kwargs):
    """1 for an episode given as parsed messages, 0 for one given whole (the completion's text)."""
    return [float(c[-1]["content"] != "the episode") for c in completions]
