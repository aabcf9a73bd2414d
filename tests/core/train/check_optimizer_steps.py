"""Grove's AdamW and Adafactor against torch.optim.AdamW and transformers' Adafactor (as Trainer
sets them up, weight decay by parameter group) when some tensors have no gradient in some steps,
as an expert that no token reached: torch skips such a tensor and counts its steps on its own.
    check_optimizer_steps.py TENSORS.safetensors STEPS LR BETA2 WEIGHT_DECAY
TENSORS: initial.I, decays.I (1 or 0), grad.S.I (absent: no gradient at step S), and Grove's
results adamw.I and adafactor.I."""
import sys

import torch
from safetensors.torch import load_file
from transformers.optimization import Adafactor

path, steps = sys.argv[1], int(sys.argv[2])
lr, beta2, weight_decay = map(float, sys.argv[3:6])
saved = load_file(path)
count = sum(1 for key in saved if key.startswith("initial."))


def trained(make_optimizer):
    params = [torch.nn.Parameter(saved[f"initial.{i}"].clone()) for i in range(count)]
    decays = [bool(saved[f"decays.{i}"].item()) for i in range(count)]
    optimizer = make_optimizer([
        {"params": [p for p, d in zip(params, decays) if d], "weight_decay": weight_decay},
        {"params": [p for p, d in zip(params, decays) if not d], "weight_decay": 0.0}])
    for step in range(steps):
        for i, p in enumerate(params):
            grad = saved.get(f"grad.{step}.{i}")
            p.grad = None if grad is None else grad.clone()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return params


references = {
    "adamw": trained(lambda groups: torch.optim.AdamW(groups, lr=lr, betas=(0.9, beta2), eps=1e-8)),
    "adafactor": trained(lambda groups: Adafactor(groups, lr=lr, scale_parameter=False, relative_step=False,
                                                  warmup_init=False)),
}
failures = []
for name, params in references.items():
    worst = max((p.detach() - saved[f"{name}.{i}"]).abs().max().item() for i, p in enumerate(params))
    print(f"{name}: largest difference from the reference {worst:.3g}")
    if worst > 1e-6:
        failures.append(f"{name}: Grove's weights differ from the reference by {worst:.3g}")
if failures:
    sys.exit("\n".join(failures))
