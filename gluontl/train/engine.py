"""The loop's own callbacks: what every run records and checks besides training (the metrics log
and TensorBoard, the console's epoch lines and progress bar, the weights' moving average, the best
checkpoint, the guards), written against the hooks user callbacks get, so ``_Run`` holds only the
run itself: model, trainer, feed, counters.

They run before the user's callbacks at each hook, and have hooks of their own, at the places the
loop had these steps inline (the console, the log and the checkpoints keep their order):
``batches`` wraps an epoch's batches (the bar), ``on_batch`` after every finite batch (accumulation
included), ``on_replan`` when the rules changed what trains, ``evaluating`` around validation
(other weights swapped in and measured: the average), ``on_measured`` when the weights a row's
metrics were measured on are in the model (the best checkpoint), ``on_row`` when an epoch's row is
complete (before any user callback sees it), ``on_saved`` after the epoch's ``last`` checkpoint.

What they keep across a resume goes into the checkpoint in the format it always had (``best`` in
the record, the average as the generation's ``ema`` file), not as user-callback state, so runs
written before them resume; the rest is rebuilt from the run folder.
"""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import mxnet as mx

from ..console import progress, show
from ..data import checkpoint
from ..data.guards import GuardLog
from ..errors import TrainError
from ..metrics import better
from ..recipe import selectable
from ..runfolder import RunFolder
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
    epoch_loss: float = 0.0  # per image over the epoch so far, this batch included
    lr: float = 0.0
    img_per_s: float = 0.0


class EngineCallback(Callback):
    """A callback of the loop itself: the user hooks plus the engine's own."""

    def batches(self, run: RunInfo, items: Iterable, epoch: int, skip: int, total: int) -> Iterable:
        """The epoch's batches from ``skip`` of ``total``, wrapped (the progress bar) or as they are."""
        return items

    def on_batch(self, run: RunInfo, batch: Batch) -> None: ...

    def on_replan(self, run: RunInfo, net) -> None:
        """The epoch's rules changed what trains (a new trainer was built)."""

    def evaluating(self, run: RunInfo, epoch: int, val: dict[str, Any],
                   evaluate: Callable[[], dict[str, Any]]) -> contextlib.AbstractContextManager[bool]:
        """Around an epoch's validation: other weights in the model and their metrics added to
        ``val`` (yields True), or nothing (False)."""
        return contextlib.nullcontext(False)

    def on_measured(self, run: RunInfo, row: dict[str, Any], averaged: bool) -> None:
        """The weights ``row`` measured are in the model: the average's (``ema_*``) or the model's own."""

    def on_row(self, run: RunInfo, row: dict[str, Any]) -> None: ...

    def on_saved(self, run: RunInfo, row: dict[str, Any]) -> None: ...

    def checkpoint_record(self) -> dict[str, Any]:
        """Entries of every checkpoint's record (``checkpoints/TAG.json``)."""
        return {}

    def checkpoint_arrays(self) -> tuple[dict[str, mx.nd.NDArray], dict[str, Any]] | None:
        """Named arrays (and their record) for the checkpoint's ``ema`` file."""
        return None

    def plan_notes(self) -> dict[str, str]:
        """Lines for plan.txt (and entries of plan.json) saying what this callback does to the run."""
        return {}

    def summary(self) -> dict[str, Any]:
        """Entries of summary.json."""
        return {}

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


class Console(EngineCallback):
    """The console: a progress bar per epoch (on a terminal) with the running loss, lr and speed,
    and a line per epoch (``-q`` keeps it in the worker's log only)."""

    def __init__(self, quiet: bool) -> None:
        self.quiet, self.bar = quiet, None

    def batches(self, run: RunInfo, items: Iterable, epoch: int, skip: int, total: int) -> Iterable:
        self.bar = progress(items, self.quiet, total=total, initial=skip,
                            desc=f"epoch {epoch + 1}/{run.recipe.train.epochs}")
        return self.bar

    def on_batch(self, run: RunInfo, batch: Batch) -> None:
        if hasattr(self.bar, "set_postfix"):
            self.bar.set_postfix(loss=f"{batch.epoch_loss:.4f}", lr=f"{batch.lr:.3g}", img_s=f"{batch.img_per_s:.0f}")

    def on_row(self, run: RunInfo, row: dict[str, Any]) -> None:
        show(epoch_line(row, run.recipe.train.epochs), self.quiet)


class Average(EngineCallback):
    """``train.ema``: the average takes each optimizer step's weights, is validated (its metrics as
    ``ema_*``) with it swapped into the model, and is saved as each checkpoint's ``ema`` file."""

    def __init__(self, ema: Ema, net, aux: Callable[[], list[str]], context: Callable[[int], tuple]) -> None:
        """Under ``batch_norm: recompute``, ``aux()`` names the BatchNorm statistics the plan has and
        ``context(epoch)`` gives ``Ema.recompute_bn`` the run's arguments for ``epoch``."""
        self.ema, self.net, self.aux, self.context = ema, net, aux, context

    @classmethod
    def open(cls, run: RunInfo, net, resumed: bool, aux: Callable[[], list[str]],
             context: Callable[[int], tuple]) -> "Average":
        """The average, a resume's from its ``last`` checkpoint, tracking every parameter that trains now."""
        ema, run_dir = Ema(run.recipe.train.ema), run.run_dir
        if resumed:
            loaded = checkpoint.load_ema(RunFolder(run_dir).checkpoints_dir, "last")
            if loaded is None:
                raise TrainError(f"Cannot resume {run_dir} with train.ema: its checkpoint holds no average (the run "
                                 f"was started without train.ema). Start a new run from its weights with "
                                 f"--init-from {run_dir}.")
            ema.load(*loaded, net, f"'{RunFolder(run_dir).checkpoint('last')}'")
        ema.track(net)
        return cls(ema, net, aux, context)

    def on_replan(self, run: RunInfo, net) -> None:
        self.ema.track(net)

    def on_step(self, run: RunInfo, step: Step) -> None:
        self.ema.update(self.net)

    @contextlib.contextmanager
    def evaluating(self, run: RunInfo, epoch: int, val: dict[str, Any],
                   evaluate: Callable[[], dict[str, Any]]) -> Iterator[bool]:
        """The average in the model (BatchNorm statistics recomputed for it if the recipe says so)."""
        recompute = self.ema.spec.batch_norm == "recompute"
        with self.ema.applied(self.net, self.aux() if recompute else ()):
            self.ema.recompute_bn(*self.context(epoch))
            val.update({f"ema_{k}": v for k, v in evaluate().items()})
            yield True

    def checkpoint_arrays(self) -> tuple[dict[str, mx.nd.NDArray], dict[str, Any]]:
        return self.ema.arrays(), self.ema.record()

    def plan_notes(self) -> dict[str, str]:
        return {"ema": self.ema.line()}


class KeepBest(EngineCallback):
    """``checkpoints/best``: the weights of the validation that beats every earlier one on
    ``train.select`` in its registered direction (ties keep the earlier), saved while they are in
    the model (the average's, for an ``ema_`` metric). ``best`` (the epoch and its metrics) is in
    every checkpoint's record, so a resume compares with the same best."""

    def __init__(self, run: RunInfo, best: dict[str, Any] | None, averaged: bool, save: Callable[[int], None]) -> None:
        picks = selectable(run.recipe.task)
        self.select, self.best, self.save = run.recipe.train.select, best, save
        self.metrics = (*picks, *(f"ema_{m}" for m in picks if averaged))

    def on_measured(self, run: RunInfo, row: dict[str, Any], averaged: bool) -> None:
        if averaged == self.select.startswith("ema_") and better(row, self.best, self.select):
            self.best = {"epoch": row["epoch"], "select": self.select, **{k: row[k] for k in self.metrics}}
            self.save(row["epoch"])

    def checkpoint_record(self) -> dict[str, Any]:
        return {"best": self.best}


class Guards(EngineCallback):
    """``train.guards``: the run start's checks are the task's (``log`` collects them); epoch 1's
    (a stuck or exploding loss, ...) run here over its batch losses, once its checkpoint is written
    (a resumed run was checked when it ran epoch 1). Warnings go to summary.json."""

    def __init__(self, log: GuardLog, task, loaders, resumed: bool) -> None:
        self.log, self.task, self.loaders, self.resumed = log, task, loaders, resumed
        self.losses: list[float] = []  # per-image loss of each finite batch of epoch 1

    def on_batch(self, run: RunInfo, batch: Batch) -> None:
        if batch.epoch == 0:
            self.losses.append(batch.loss)

    def on_saved(self, run: RunInfo, row: dict[str, Any]) -> None:
        if row["epoch"] == 1 and not self.resumed:
            self.log.handle(self.task.first_epoch(self.losses, row["step"], self.loaders))

    def summary(self) -> dict[str, Any]:
        return {"warnings": self.log.warnings}


__all__ = ["Average", "Batch", "Console", "EngineCallback", "Guards", "KeepBest", "Record"]
