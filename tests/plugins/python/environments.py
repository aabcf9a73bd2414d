"""Environments written in Python for test_python_environment.cpp: TRL environment_factory classes
(tools called from Hermes tool calls, with and without get_reward) and Grove's own contract."""

import asyncio


class Counter:
    """TRL's protocol: reset with the dataset row, public methods as tools, get_reward at the end."""

    made = 0

    def __init__(self, start=0):
        Counter.made += 1
        self.start = start
        self.total = start

    def reset(self, prompt, target, **kwargs):
        self.total = self.start
        self.target = target
        self.first_message = prompt[0]["content"] if isinstance(prompt, list) else prompt

    def add(self, amount: int) -> int:
        """Adds to the running total.

        Args:
            amount: how much to add.

        Returns:
            The new total.
        """
        if amount < 0:
            raise ValueError("amount must be >= 0")
        return self._bump(amount)

    async def echo_prompt(self) -> str:
        """The first message of the prompt this episode was reset with."""
        return self.first_message

    def _bump(self, amount):  # private: never a tool
        self.total += amount
        return self.total

    def get_reward(self):
        return 1.0 if self.total == self.target else 0.0


class Abacus:
    """TRL's protocol without get_reward(): a tool, but no reward of its own."""

    def reset(self, **kwargs):
        self.beads = 0

    def slide(self, beads: int) -> int:
        """Slides beads across.

        Args:
            beads: how many.
        """
        self.beads += beads
        return self.beads


class Chatty(Counter):
    """reset() returns text for the prompt, which Grove refuses with a message."""

    def reset(self, prompt, target, **kwargs):
        super().reset(prompt, target)
        return "Your total starts at 0."


class Census(Counter):
    """reset() says how many Counters have been made: whether instances are reused."""

    def reset(self, prompt, target, **kwargs):
        super().reset(prompt, target)
        return f"{Counter.made} made"


class Tally(Counter):
    """A Counter by another name: a factory that makes both is scored on the first one's class only."""


def alternating_counters(made=[0]):  # noqa: B006 (the count of calls, kept between them)
    """A factory that makes a Counter, then a Tally, then a Counter, ..."""
    made[0] += 1
    return Counter() if made[0] % 2 else Tally()


class Echo:
    """Grove's contract in Python: turns end at "</say>", the answer repeats what was said."""

    stop_strings = ["</say>"]

    def step(self, turns):
        answers = []
        for t in turns:
            said = t.text.rsplit("<say>", 1)[-1].replace("</say>", "") if "<say>" in t.text else None
            if said is None:
                answers.append(None)  # no call: the episode ends
            else:
                answers.append({"observation": f"<heard>{said}</heard>", "tool_calls": 1,
                                "tool_failures": int(said == "")})
        return answers

    def score_episodes(self, episodes):
        return [float(e.text.count("<heard>")) if e.row.get("scored", True) else None for e in episodes]


class Nothing:
    """Neither reset() nor step(): not an environment."""


class Narrator:
    """Grove's contract, answering every turn (it ends at any "e"): a model of any skill meets it, so
    a short `grove generate` exercises the host's path. The answer names the turn and the prompt's
    first message, which arrives as the dataset gave it (messages)."""

    stop_strings = ["e"]

    def step(self, turns):
        return [f"[turn {t.turn}: {t.prompt[0]['content'] if isinstance(t.prompt, list) else t.prompt}]" for t in turns]


# TRL's standalone tools (GRPOTrainer(tools=[...])): functions, one of them async


def multiply(a: int, b: int) -> int:
    """Multiplies two integers.

    Args:
        a: the first factor.
        b: the second factor.
    """
    return a * b


async def say_later(text: str) -> str:
    """Says the text back, after a pause.

    Args:
        text: what to say.
    """
    await asyncio.sleep(0.001)
    return text
