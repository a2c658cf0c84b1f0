"""The callback protocol: the hooks a run calls and what they see (``RunInfo``, ``Step``).
Registry and built-in callbacks: ``gluontl.train.callbacks``."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..recipe import Recipe


@dataclasses.dataclass(frozen=True)
class Step:
    """One optimizer step: ``loss`` per image of the step's batch, ``images`` in it (all workers')."""
    step: int  # the global step after this update
    epoch: int  # 0-based
    batch: int  # 0-based batch in the epoch
    loss: float
    images: int
    lr: float
    img_per_s: float = 0.0  # images (all workers') per second since the step before, data included


class RunInfo:
    """What a callback sees of the run, and the one thing it may ask of it: to stop."""

    def __init__(self, recipe: Recipe, run_dir: Path, rank: int, workers: int) -> None:
        self.recipe, self.run_dir, self.rank, self.workers = recipe, run_dir, rank, workers
        self.epoch = 0  # 0-based, the epoch being trained
        self.global_step = 0
        self.batches_per_epoch = 1  # training batches per epoch (per worker; ``train.accumulate`` of them make a step)
        self.stop_reason: str | None = None  # set by request_stop

    @property
    def is_root(self) -> bool:
        """Only rank 0 writes to the run folder."""
        return self.rank == 0

    def request_stop(self, reason: str) -> None:
        """End the run after this validation (its checkpoints written), saying ``reason``."""
        self.stop_reason = self.stop_reason or reason


class Callback:
    """The hooks, each a no-op here: subclass and override those you need."""

    name: str = ""  # the key of this callback's state in a checkpoint; default: the class name

    def on_run_start(self, run: RunInfo) -> None: ...

    def on_epoch_start(self, run: RunInfo, epoch: int) -> None: ...

    def on_step(self, run: RunInfo, step: Step) -> None: ...

    def on_validation(self, run: RunInfo, row: dict[str, Any]) -> None:
        """``row``: the epoch's metrics.jsonl row, validation numbers included."""

    def on_epoch_end(self, run: RunInfo, row: dict[str, Any]) -> None: ...

    def on_run_end(self, run: RunInfo) -> None: ...

    def on_exception(self, run: RunInfo, error: BaseException) -> None: ...

    def on_exported(self, run: RunInfo, files: list[Path]) -> None:
        """After ``gluontl.finetune`` wrote the recipe's verified exports (rank 0)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


__all__ = ["Callback", "RunInfo", "Step"]
