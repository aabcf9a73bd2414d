"""A reward written for TRL, used unchanged by Grove's python plugin: it reads the training
progress (trainer_state) and logs a metric by name (log_metric), both as GRPOTrainer provides."""


def concise(completions, completion_ids, trainer_state, log_metric, target_tokens=24, **kwargs):
    """0 for a reply at or under target_tokens, then down to -1 at twice that; the penalty phases in
    over the first half of training."""
    ramp = min(1.0, 2 * trainer_state.global_step / max(trainer_state.max_steps, 1))
    log_metric("concise/ramp", ramp)
    over = [max(0, len(ids) - target_tokens) / target_tokens for ids in completion_ids]
    return [-ramp * min(1.0, x) for x in over]
