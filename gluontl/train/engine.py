"""The loop's own callbacks: what every run records and checks besides training (the metrics log
and TensorBoard, the console's epoch lines, the weights' moving average, the first-epoch guards),
written against the hooks user callbacks get, so ``_Run`` holds only the run itself.

They run before the user's callbacks at each hook, and have three hooks of their own, at the
places the loop had these steps inline (the console, the log and the checkpoints keep their order):
``on_batch`` after every finite batch (accumulation included), ``on_row`` when an epoch's row is
complete (before any user callback sees it), ``on_saved`` after the epoch's ``last`` checkpoint.
They keep no checkpointed state: a resume rebuilds them from the run folder.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..console import show
from ..data.guards import GuardLog
from .ema import Ema
from .hooks import Callback, RunInfo, Step
from .logs import MetricsLog, epoch_line


@dataclasses.dataclass(frozen=True)
class Batch:
    """One finite training batch: its loss per image and the images in it (all workers')."""
    epoch: int
    index: int  # 0-based batch in the epoch
    loss: float
    images: int


class EngineCallback(Callback):
    """A callback of the loop itself: the user hooks plus the engine's own."""

    def on_batch(self, run: RunInfo, batch: Batch) -> None: ...

    def on_row(self, run: RunInfo, row: dict[str, Any]) -> None: ...

    def on_saved(self, run: RunInfo, row: dict[str, Any]) -> None: ...

    def close(self, completed: bool) -> None: ...


class Record(EngineCallback):
    """``metrics.jsonl`` and its TensorBoard mirror: a step row every ``train.log_every`` optimizer
    steps, every epoch's row (``gluontl/train/logs.py``)."""

    def __init__(self, run_dir: Path, resume_step: int | None, root: bool, log_every: int) -> None:
        self.log, self.log_every = MetricsLog(run_dir, resume_step=resume_step, record=root), log_every

    def on_step(self, run: RunInfo, step: Step) -> None:
        if step.step % self.log_every == 0:
            self.log.write({"step": step.step, "epoch_f": step.epoch + (step.batch + 1) / run.batches_per_epoch,
                            "loss": step.loss, "lr": step.lr, "img_per_s": step.img_per_s})

    def on_row(self, run: RunInfo, row: dict[str, Any]) -> None:
        self.log.write(row)

    def close(self, completed: bool) -> None:
        self.log.close()


class EpochLines(EngineCallback):
    """The console's line per epoch (``-q`` keeps it in the worker's log only)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def on_row(self, run: RunInfo, row: dict[str, Any]) -> None:
        show(epoch_line(row, run.recipe.train.epochs), self.quiet)


class Average(EngineCallback):
    """``train.ema``: the average takes each optimizer step's weights. Validating and saving the
    average are the loop's (it swaps the average into the model)."""

    def __init__(self, ema: Ema, net) -> None:
        self.ema, self.net = ema, net

    def on_step(self, run: RunInfo, step: Step) -> None:
        self.ema.update(self.net)


class FirstEpochGuards(EngineCallback):
    """``train.guards``' checks of epoch 1 (a stuck or exploding loss, ...) over its batch losses,
    once its checkpoint is written; a resumed run was checked when it ran epoch 1."""

    def __init__(self, guards: GuardLog, task, loaders, resumed: bool) -> None:
        self.guards, self.task, self.loaders, self.resumed = guards, task, loaders, resumed
        self.losses: list[float] = []  # per-image loss of each finite batch of epoch 1

    def on_batch(self, run: RunInfo, batch: Batch) -> None:
        if batch.epoch == 0:
            self.losses.append(batch.loss)

    def on_saved(self, run: RunInfo, row: dict[str, Any]) -> None:
        if row["epoch"] == 1 and not self.resumed:
            self.guards.handle(self.task.first_epoch(self.losses, row["step"], self.loaders))


__all__ = ["Average", "Batch", "EngineCallback", "EpochLines", "FirstEpochGuards", "Record"]
