"""A TRL environment that owns its data (TRL's GRPOTrainer without a train_dataset, Grove without
data.source): reset() writes the whole prompt into the placeholder's empty user message."""

from environments import Counter


class CountToOne(Counter):
    def reset(self, prompt, **kwargs):
        # what TRL resets an environment with when it owns the data: the placeholder prompt, nothing else
        if prompt != [{"role": "user", "content": ""}] or kwargs:
            raise ValueError(f"reset() got prompt={prompt!r} and {kwargs!r}, not TRL's placeholder row")
        super().reset(prompt=prompt, target=1)
        return "Count to 1."
