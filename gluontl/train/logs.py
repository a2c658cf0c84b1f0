"""What a run records: its epoch lines, ``metrics.jsonl`` and TensorBoard events (the console
itself, bars and worker logs, is ``gluontl/console.py``).

``metrics.jsonl`` is the record; the TensorBoard events in the same folder carry the same
numbers under the same names (``step/KEY`` per logged step, ``epoch/KEY`` per epoch), at the
run's global step, so ``tensorboard --logdir runs`` shows every run.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..atomic import write_text
from ..console import show
from ..errors import TrainError
from ..metrics import line_fields
from ..readers import read_json_lines
from ..runfolder import RunFolder


def epoch_line(row: dict[str, Any], epochs: int) -> str:
    """``epoch 3/10 train_loss 0.4120 train_acc 0.8700 val_loss … val_acc … lr … time 12.3s``:
    every registered metric the row has (``gluontl.metrics``; a run without validation has no val_*)."""
    parts = [f"epoch {row['epoch']}/{epochs}"]
    for label, key, fmt in line_fields(row):
        parts.append(f"{label} {row[key]:{fmt}}")
    if "seconds" in row:
        parts.append(f"time {row['seconds']:.1f}s")
    return " ".join(parts)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The complete rows of ``metrics.jsonl`` (a broken row, torn by kill -9 or damaged, is left out)."""
    return read_json_lines(path, TrainError, "the metrics log")[0]


_NOT_SCALARS = ("step", "epoch", "epoch_f")


def _step(row: dict[str, Any]) -> float:
    """A row's global step; a row whose step is no number sorts after every checkpoint (dropped on resume)."""
    step = row.get("step", -1)
    return step if isinstance(step, (int, float)) and not isinstance(step, bool) else float("inf")


class MetricsLog:
    """``metrics.jsonl`` plus its TensorBoard mirror in the run folder.

    ``resume_step``: the checkpoint's global step. Rows logged after it (the run died before
    its next checkpoint) are produced again, so they are dropped from the file and the event
    writer purges them (``purge_step``) instead of showing each such step twice.
    """

    def __init__(self, run_dir: Path, resume_step: int | None = None, record: bool = True) -> None:
        self.path = RunFolder(run_dir).metrics_path
        self.rows, self.skipped = read_json_lines(self.path, TrainError, "the metrics log")
        self.record = record  # False: rows in memory only (a distributed worker other than rank 0)
        if not record:
            return
        if resume_step is not None:
            self.rows = [r for r in self.rows if _step(r) <= resume_step]
            if self.skipped:  # the complete rows stay; the broken ones are said, not kept
                show(f"{self.path}: skipped {self.skipped} broken row{'s' * (self.skipped != 1)} (not JSON "
                     f"objects); kept the {len(self.rows)} complete row{'s' * (len(self.rows) != 1)} up to "
                     f"step {resume_step}.")
            write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.rows), TrainError)
        from tensorboardX import SummaryWriter

        # Event files are named by the second they were opened; a resume within the same second
        # would reopen (and truncate) the previous file, so the nanoseconds keep names unique
        # and in order.
        self.events = SummaryWriter(str(RunFolder(run_dir).events_dir),
                                    purge_step=None if resume_step is None else resume_step + 1,
                                    filename_suffix=f".{time.time_ns()}", flush_secs=30)

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if not self.record:
            return
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
        kind = "epoch" if "epoch" in row else "step"
        for key, value in row.items():
            if key not in _NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.events.add_scalar(f"{kind}/{key}", value, row["step"])
        if kind == "epoch":
            self.events.flush()

    def close(self) -> None:
        if self.record:
            self.events.close()


__all__ = ["MetricsLog", "epoch_line", "read_metrics"]
