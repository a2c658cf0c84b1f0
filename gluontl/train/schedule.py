"""Learning-rate schedules as a pure function of the global step.

A pure function (not MXNet's stateful LRScheduler) makes resume exact: the lr at step
``s`` does not depend on how the run got there.
"""
from __future__ import annotations

import math

from ..recipe import ScheduleSpec


def lr_at(spec: ScheduleSpec, base_lr: float, step: int, steps_per_epoch: int, epochs: int) -> float:
    total = max(1, steps_per_epoch * epochs)
    warm = int(round(spec.warmup_epochs * steps_per_epoch))
    if step < warm:
        return base_lr * (step + 1) / warm
    epoch = step / max(1, steps_per_epoch)
    if spec.kind == "constant":
        return base_lr
    if spec.kind == "step":
        every = spec.step or max(1, epochs // 3)
        return base_lr * spec.factor ** int(epoch // every)
    if spec.kind == "multistep":
        return base_lr * spec.factor ** sum(epoch >= m for m in spec.milestones)
    progress = min(1.0, (step - warm) / max(1, total - warm))
    if spec.kind == "cosine":
        return spec.final_lr + (base_lr - spec.final_lr) * 0.5 * (1 + math.cos(math.pi * progress))
    return spec.final_lr + (base_lr - spec.final_lr) * (1 - progress) ** spec.power  # poly
