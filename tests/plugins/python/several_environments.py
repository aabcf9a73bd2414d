"""Several TRL environments in one run (TRL's environment_factory={name: factory}), each row
choosing one by its `environment` column, which reset() does not get."""


class _Strict:
    def reset(self, prompt, target, **kwargs):
        if kwargs:  # TRL passes the row's columns but `environment`: nothing else is in these rows
            raise ValueError(f"reset() got columns it should not: {sorted(kwargs)}")
        self.target = target
        self.count = 0


class Meter(_Strict):
    def read(self) -> int:
        """Reads the meter.

        Returns:
            The reading.
        """
        self.count += 1
        return self.count

    def get_reward(self):
        return 1.0 if self.target == 0 else 0.5


class Scale(_Strict):
    def weigh(self, grams: int) -> int:
        """Weighs something.

        Args:
            grams: how heavy it is.
        """
        return grams

    def get_reward(self):
        return 0.25 * self.target


class Notes(_Strict):
    """Tools but no get_reward(): its rows have no reward of an environment."""

    def jot(self, text: str) -> str:
        """Jots a note down.

        Args:
            text: the note.
        """
        return text


class Dial:
    """Writes its own prompt: its rows have no `prompt`, and reset() gets none (TRL passes the row's
    columns as they are, without `environment`)."""

    def reset(self, target, **kwargs):
        if kwargs:
            raise ValueError(f"reset() got columns it should not: {sorted(kwargs)}")
        self.target = target
        return f"Turn the dial to {target}."

    def turn(self, notches: int) -> int:
        """Turns the dial.

        Args:
            notches: how far.
        """
        return notches

    def get_reward(self):
        return 0.1 * self.target
