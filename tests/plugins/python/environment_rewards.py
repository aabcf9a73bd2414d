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
