"""The metric registry: what each number of a run's epoch row is, declared once.

A metric declares its ``metrics.jsonl`` key, the label of the epoch line, its direction (``max``:
higher is better, ``min``: lower), its format, its plot legend (``title``) and its task (None: every
task's rows have it; a built-in metric's task comes from the task's entry in ``gluontl.task_registry``).
Epoch lines, plots, ``train.select``, the best checkpoint and early stopping read it, so the loop names
no metric and never guesses a direction from a name. The built-in metrics are registered
below, each with its task; a user registers more with :func:`register_metric`, and a
metric with ``fn`` is computed by the loop from the validation outputs and labels.

``ema_KEY`` is KEY of the averaged weights (``train.ema``): same direction, label ``ema_LABEL``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal

import numpy as np

from .task_registry import TASKS, metric_tasks

Direction = Literal["max", "min"]
EMA = "ema_"


@dataclasses.dataclass(frozen=True)
class Metric:
    key: str  # the metrics.jsonl key
    direction: Direction | None = "max"  # None: a number to show, not to rank by (lr)
    label: str = ""  # on the epoch line; defaults to the key
    fmt: str = ".4f"
    task: str | tuple[str, ...] | None = None  # its task(s); None: every task
    selectable: bool = True  # may be train.select (and early stopping's monitor)
    fn: Callable[[Any, np.ndarray], float] | None = None  # custom: fn(outputs, labels) over the val split
    title: str = ""  # in a plot's legend (words, not a key); defaults to the label

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.key)
        if not self.title:
            object.__setattr__(self, "title", self.label)
        if isinstance(self.task, str):
            object.__setattr__(self, "task", (self.task,))
        if self.direction not in ("max", "min", None):
            raise ValueError(f"metric {self.key}: direction must be 'max' or 'min', not {self.direction!r}")

    def of(self, task: str) -> bool:
        return self.task is None or task in self.task

    def better(self, a: float, b: float, min_delta: float = 0.0) -> bool:
        """Whether ``a`` improves on ``b`` by more than ``min_delta``."""
        return a < b - min_delta if self.direction == "min" else a > b + min_delta


_REGISTRY: dict[str, Metric] = {}


def register_metric(*metrics: Metric) -> None:
    """Add metrics (a key registered again is replaced: re-running a notebook cell works)."""
    for m in metrics:
        if m.key.startswith(EMA):
            raise ValueError(f"metric {m.key}: ema_ keys come with train.ema; register {m.key.removeprefix(EMA)}")
        if m.fn is not None and not m.key.startswith("val_"):
            raise ValueError(f"metric {m.key}: a computed metric's key starts with val_ (it is a validation "
                             f"number), e.g. val_{m.key}")
        _REGISTRY.pop(m.key, None)
        _REGISTRY[m.key] = m


def unregister_metric(key: str) -> None:
    _REGISTRY.pop(key, None)


def find_metric(key: str) -> Metric | None:
    """The metric of ``key`` (``ema_KEY``: KEY's, relabelled), or None."""
    base = _REGISTRY.get(key.removeprefix(EMA)) if key.startswith(EMA) else _REGISTRY.get(key)
    if base is None or base.key == key:
        return base
    return dataclasses.replace(base, key=key, label=EMA + base.label)


def task_metrics(task: str, *, selectable: bool = False) -> tuple[Metric, ...]:
    """The metrics a ``task`` run's rows can have, in epoch-line order."""
    return tuple(m for m in _REGISTRY.values() if m.of(task) and (not selectable or
                                                                 (m.selectable and m.direction is not None)))


def computed_metrics(task: str) -> tuple[Metric, ...]:
    """The task's metrics the loop computes from validation outputs (``fn``)."""
    return tuple(m for m in task_metrics(task) if m.fn is not None)


def line_fields(row: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, key, format) of every registered metric in ``row``: plain metrics first, then their
    ema_ twins, then those without a direction (lr)."""
    plain = [m for m in _REGISTRY.values() if m.direction is not None]
    order = [*plain, *(find_metric(EMA + m.key) for m in plain if m.key.startswith("val_")),
             *(m for m in _REGISTRY.values() if m.direction is None)]
    return [(m.label, m.key, m.fmt) for m in order if isinstance(row.get(m.key), (int, float))]


def better(row: dict[str, Any], best: dict[str, Any] | None, key: str) -> bool:
    """Whether ``row`` beats ``best`` on metric ``key`` in its registered direction (ties keep the earlier)."""
    if best is None:
        return True
    metric = find_metric(key)
    if metric is None or metric.direction is None:
        raise KeyError(f"{key} is not a registered metric with a direction")
    return metric.better(row[key], best[key])


# The metrics of every task's rows, in epoch-line order (val_acc: val_top1, the name people grep logs for).
# Which task a val_ metric belongs to is the task's to declare (gluontl.task_registry), not repeated here.
register_metric(
    Metric("train_loss", "min", selectable=False),
    Metric("train_acc", "max", title="train top-1", selectable=False),
    *(Metric(key, direction, task=metric_tasks(key), selectable=any(key in t.metrics for t in TASKS.values()), **words)
      for key, direction, words in (
          ("val_loss", "min", {}),
          ("val_top1", "max", {"label": "val_acc", "title": "val top-1"}),
          ("val_balanced_acc", "max", {}),
          ("val_top5", "max", {"title": "val top-5"}),  # only with more than 5 classes; picks no checkpoint
          ("val_map50", "max", {"title": "val mAP@0.5"}), ("val_map", "max", {"title": "val mAP@[.5:.95]"}),
          ("val_miou", "max", {"title": "val mIoU"}), ("val_pixel_acc", "max", {"title": "val pixel acc"}),
          ("val_macro_map", "max", {"title": "val macro mAP"}), ("val_micro_map", "max", {"title": "val micro mAP"}),
          ("val_macro_f1", "max", {"title": "val F1 (per-class thresholds)"}))),
    Metric("lr", None, fmt=".3g", selectable=False))

__all__ = ["Metric", "register_metric", "unregister_metric", "find_metric", "task_metrics", "computed_metrics",
           "line_fields", "better"]
