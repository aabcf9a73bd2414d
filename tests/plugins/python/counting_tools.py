"""Counter's tools as TRL's standalone tools (GRPOTrainer(tools=[add, echo_prompt])): plain functions
described to the model exactly as Counter's methods are (the same names, type hints and
docstrings), so the prompt is the one the tool-calling test model was taught on."""

from environments import Counter


def add(amount: int) -> int:
    return amount  # no state: the total of one call from 0


async def echo_prompt() -> str:
    return ""


add.__doc__ = Counter.add.__doc__
echo_prompt.__doc__ = Counter.echo_prompt.__doc__
