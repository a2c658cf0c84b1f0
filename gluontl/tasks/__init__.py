"""The task seam: what differs between classification and detection, and nothing else.

The training loop (``gluontl.train.loop``) owns contexts, accumulation, schedules, checkpoints,
resume, the feature cache decision, progress and logs; a task owns its data, the model it
builds from the recipe, the forward + loss of a batch, its metrics and its run card. A new task
is a new module implementing :class:`Task` and one entry in ``TASKS``.
"""
from __future__ import annotations

import importlib
from pathlib import Path
import dataclasses
from typing import Any, Callable, Protocol, Sequence

import mxnet as mx

from ..recipe import TASK_METRICS, Recipe, TransformSpec

Batch = tuple[mx.nd.NDArray, mx.nd.NDArray]


@dataclasses.dataclass
class PredictOptions:
    topk: int = 5  # classification: how many classes per image
    score: float = 0.25  # detection: the lowest score shown
    out: Path | None = None  # drawn images and their JSON; None: the task's default place
    tag: str = "best"  # the run checkpoint


@dataclasses.dataclass
class Report:
    values: dict[str, Any]  # what the Python API returns
    lines: list[str]  # what the CLI prints, nothing else


class Task(Protocol):
    metrics: Sequence[str]  # what `best` records; train.select is one of them

    def setup(self, recipe: Recipe, ctx: mx.Context, *, seed: int) -> tuple[Any, Any]:
        """(Prepared model, Loaders), each checked against the other."""

    def check(self, recipe: Recipe, prep: Any, loaders: Any, ctx: mx.Context, guards: Any) -> None:
        """Checks of a new run before its folder exists (guards against runs that cannot learn)."""

    def feed(self, net, plan, recipe: Recipe, loaders, ctx: mx.Context, folder: Path, quiet: bool, previous):
        """What trains and what it is fed (``gluontl.train.cache.Feed``)."""

    def forward(self, net, xs: list[mx.nd.NDArray], ys: list[mx.nd.NDArray]
                ) -> tuple[list[mx.nd.NDArray], list[mx.nd.NDArray] | None]:
        """Inside ``autograd.record``: per-context losses whose sum over images, divided by the
        image count, is the objective; and per-context counts of correct answers, read after
        backward (None: no such notion for the task)."""

    def evaluate(self, net, batches, ctxs: list[mx.Context]) -> dict[str, Any]:
        """Validation metrics; numbers go to the metrics log, other values to evaluate's report."""

    def first_epoch(self, batch_losses: list[float], steps: int, loaders) -> list:
        """Guard findings after epoch 1."""

    def card(self, recipe: Recipe, loaders) -> dict[str, Any]:
        """The run's preprocess.json: what predict and exports read (with :meth:`transforms`)."""

    def transforms(self, recipe: Recipe) -> dict[str, dict[str, str | None]]:
        """The train and val pipelines the run uses (:func:`transform_record`), for the plan and the card."""


def transform_record(recipe: Recipe, describe: Callable[[TransformSpec, bool], str]
                     ) -> dict[str, dict[str, str | None]]:
    """``{"train": {"steps": ..., "default": ...}, "val": ...}``: each pipeline as ``describe``
    words it, and why it is gluontl's default (None: the recipe's own)."""
    data = recipe.data
    return {split: {"steps": describe(getattr(data, key), split == "train"), "default": data.transform_default(key)}
            for split, key in (("train", "train_transform"), ("val", "val_transform"))}


def transform_lines(record: dict[str, dict[str, str | None]]) -> list[str]:
    """A :func:`transform_record` as the plan prints it."""
    return [f"{split} transform: {r['steps']}" + (f"  [{r['default']}]" if r["default"] else "")
            for split, r in record.items()]


def split(x: mx.nd.NDArray, ctxs: list[mx.Context]) -> list[mx.nd.NDArray]:
    """``x`` split along the batch over the contexts; a batch smaller than the context list (the
    last one of an epoch) goes to the first contexts only, where split_and_load would fail."""
    return mx.gluon.utils.split_and_load(x, ctxs[:max(1, min(len(ctxs), x.shape[0]))], even_split=False)


TASKS = {"classification": "gluontl.tasks.classification:Classification",
         "detection": "gluontl.tasks.detection:Detection",
         "segmentation": "gluontl.tasks.segmentation:Segmentation"}


def get_task(recipe: Recipe) -> Task:
    module, _, cls = TASKS[recipe.task].partition(":")
    task = getattr(importlib.import_module(module), cls)()
    task.metrics = TASK_METRICS[recipe.task]
    return task
