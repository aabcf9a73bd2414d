"""An environment that takes its interpreter down: the isolation test's Python case."""
import ctypes


class Segfaults:
    """Answers like Echo until a turn says "crash", then reads address 0 (SIGSEGV)."""

    stop_strings = ["</say>"]

    def step(self, turns):
        if any("crash" in t.text for t in turns):
            ctypes.string_at(0)
        return [{"observation": "<heard/>", "tool_calls": 1} for _ in turns]
