"""What a process shows people: console lines, progress bars and a distributed worker's own log.

Progress bars redraw themselves with carriage returns, which only a terminal shows as
intended: redirected to a file or a CI log, one epoch of bars is hundreds of lines. So bars
appear only when stderr is a TTY (and not ``-q``); otherwise every epoch is one plain line,
and ``-q`` keeps those lines and the final one, dropping the rest of the chatter. At the bottom
of the house: data loading shows progress too, not only the training loop.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator


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


@contextlib.contextmanager
def root_log_level(level: int) -> Iterator[None]:
    """Libraries that log on the root logger (onnxruntime's and MXNet's quantizers): raise its level for a while."""
    root = logging.getLogger()
    before = root.level
    root.setLevel(level)
    try:
        yield
    finally:
        root.setLevel(before)
