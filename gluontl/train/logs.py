"""What a run tells people: console lines, ``metrics.jsonl`` and TensorBoard events.

Progress bars redraw themselves with carriage returns, which only a terminal shows as
intended: redirected to a file or a CI log, one epoch of bars is hundreds of lines. So bars
appear only when stderr is a TTY (and not ``-q``); otherwise every epoch is one plain line,
and ``-q`` keeps those lines and the final one, dropping the rest of the chatter.

``metrics.jsonl`` is the record; the TensorBoard events in the same folder carry the same
numbers under the same names (``step/KEY`` per logged step, ``epoch/KEY`` per epoch), at the
run's global step, so ``tensorboard --logdir runs`` shows every run.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Iterable

from ..atomic import write_text
from ..errors import TrainError


def bars_on(quiet: bool) -> bool:
    """Progress bars only for a person watching a terminal (never from a muted worker)."""
    try:
        return not quiet and sys.stderr.isatty() and all(log.echo for log in _logs)
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


_logs: list["WorkerLog"] = []  # open worker logs (logs/worker-RANK.log) that get every shown line


class WorkerLog:
    """Every line this process shows, also in its own log file (a distributed worker's
    ``logs/worker-RANK.log``, which survives when the launcher's console is gone), and the
    error that ended it. ``echo=False`` (every rank but 0): only there, so a job's console has
    one line per epoch, not one per worker. Lines shown before the run folder, and so the file,
    is known (:meth:`open`) are kept and written first."""

    def __init__(self, echo: bool = True) -> None:
        self.echo = echo
        self.fh: Any = None
        self.early: list[str] = []

    def open(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = open(path, "a", encoding="utf-8", buffering=1)
        self.fh.writelines(line + "\n" for line in self.early)
        self.early = []

    def write(self, line: str) -> None:
        if self.fh is None:
            self.early.append(line)
        else:
            self.fh.write(line + "\n")

    def __enter__(self) -> "WorkerLog":
        _logs.append(self)
        return self

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        _logs.remove(self)
        if self.fh is not None:
            if err is not None:
                self.fh.write(f"error: {type(err).__name__}: {err}\n")
            self.fh.close()


def show(msg: str, quiet: bool = False) -> None:
    """Print a line the run's log always keeps (epoch lines, the result), above any bar."""
    for log in _logs:
        log.write(msg)
    if not all(log.echo for log in _logs):
        return
    if bars_on(quiet):
        from tqdm import tqdm

        tqdm.write(msg)
    else:
        print(msg, flush=True)  # flushed: `tail -f` of a redirected log follows the run


def alert(msg: str) -> None:
    """An error about to end this process (the watchdog's): on the console whatever the rank,
    and in the worker's log."""
    for log in _logs:
        log.write(msg)
    print(msg, file=sys.stderr, flush=True)


def say(quiet: bool, msg: str) -> None:
    """Print a line of chatter (threads, cache choices), which ``-q`` drops."""
    if not quiet:
        show(msg)


def progress(items: Iterable, quiet: bool, **bar: Any) -> Iterable:
    """``items`` behind a tqdm bar on a terminal, unchanged otherwise."""
    if not bars_on(quiet):
        return items
    from tqdm import tqdm

    return tqdm(items, leave=False, dynamic_ncols=True, **bar)


# (label on the line, metrics key, format); val_acc is val_top1, the name people grep logs for
_EPOCH_FIELDS = (("train_loss", "train_loss", ".4f"), ("train_acc", "train_acc", ".4f"),
                 ("val_loss", "val_loss", ".4f"), ("val_acc", "val_top1", ".4f"),
                 ("val_balanced_acc", "val_balanced_acc", ".4f"), ("val_top5", "val_top5", ".4f"),
                 ("val_map50", "val_map50", ".4f"), ("val_map", "val_map", ".4f"), ("lr", "lr", ".3g"))


def epoch_line(row: dict[str, Any], epochs: int) -> str:
    """``epoch 3/10 train_loss 0.4120 train_acc 0.8700 val_loss … val_acc … lr … time 12.3s``:
    of the fields above, those the row has (a run without validation has no val_*)."""
    parts = [f"epoch {row['epoch']}/{epochs}"]
    for label, key, fmt in _EPOCH_FIELDS:
        if isinstance(row.get(key), (int, float)):
            parts.append(f"{label} {row[key]:{fmt}}")
    if "seconds" in row:
        parts.append(f"time {row['seconds']:.1f}s")
    return " ".join(parts)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            break  # a torn last line from kill -9
    return rows


_NOT_SCALARS = ("step", "epoch", "epoch_f")


class MetricsLog:
    """``metrics.jsonl`` plus its TensorBoard mirror in the run folder.

    ``resume_step``: the checkpoint's global step. Rows logged after it (the run died before
    its next checkpoint) are produced again, so they are dropped from the file and the event
    writer purges them (``purge_step``) instead of showing each such step twice.
    """

    def __init__(self, run_dir: Path, resume_step: int | None = None, record: bool = True) -> None:
        self.path = run_dir / "metrics.jsonl"
        self.rows: list[dict[str, Any]] = read_metrics(self.path)
        self.record = record  # False: rows in memory only (a distributed worker other than rank 0)
        if not record:
            return
        if resume_step is not None:
            self.rows = [r for r in self.rows if r.get("step", -1) <= resume_step]
            write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.rows), TrainError)
        from tensorboardX import SummaryWriter

        # Event files are named by the second they were opened; a resume within the same second
        # would reopen (and truncate) the previous file, so the nanoseconds keep names unique
        # and in order.
        self.events = SummaryWriter(str(run_dir), purge_step=None if resume_step is None else resume_step + 1,
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


__all__ = ["MetricsLog", "WorkerLog", "alert", "bars_on", "epoch_line", "progress", "read_metrics", "say", "show"]
