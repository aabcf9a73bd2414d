"""A tool environment written for TRL's GRPOTrainer(environment_factory=CalculatorEnv), used unchanged
by Grove's python_environment plugin: one instance per episode, reset with the dataset row; its
public method is the model's tool (described to the model from its type hints and docstring); the
episode's reward comes from the environment's own state (get_reward)."""


class CalculatorEnv:
    def reset(self, prompt, answer, **kwargs):
        self.answer = answer
        self.last_result = None

    def multiply(self, a: int, b: int) -> int:
        """Multiplies two integers.

        Args:
            a: The first integer.
            b: The second integer.

        Returns:
            The product of a and b.
        """
        self.last_result = a * b
        return self.last_result

    def get_reward(self) -> float:
        """1.0 when the tool's last result is the answer."""
        return 1.0 if self.last_result == self.answer else 0.0
