"""The task seam: what differs between tasks, over a run's whole life, and nothing else.

The training loop (``gluontl.train.loop``) owns contexts, accumulation, schedules, checkpoints,
resume, the feature cache decision, progress and logs; ``gluontl.train.runs`` owns what a
finished run folder is. A task owns its data, the model it builds from the recipe, the forward +
loss of a batch, its metrics, its run card, and what a finished run does: load, evaluate,
predict (from the run or from its ONNX export) and export. Neither the loop, the run-folder code
nor the CLI names a task: a new task is a new module implementing :class:`Task` and one entry in
``gluontl.task_registry.TASKS`` (its code, recipe section, metrics, data sources and curves).
"""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import mxnet as mx

from ..mxinternals import clear_cached_op
from ..recipe import QuantizeSpec, Recipe, TransformSpec
from ..task_registry import TASKS
from ..data.transforms import META_TASK, onnx_metadata

if TYPE_CHECKING:
    from ..pipeline import Prepared

Batch = tuple[mx.nd.NDArray, mx.nd.NDArray]


@dataclasses.dataclass
class PredictOptions:
    topk: int = 5  # classification: how many classes per image
    score: float = 0.25  # detection: the lowest score shown
    out: Path | None = None  # drawn images and their JSON; None: the task's default place
    tag: str = "best"  # the run checkpoint
    tta: str | None = None  # classifiers: probabilities averaged over these views (gluontl.data.tta)


@dataclasses.dataclass
class Report:
    values: dict[str, Any]  # what the Python API returns
    lines: list[str]  # what the CLI prints, nothing else


class Task(Protocol):
    name: str  # the recipe's task; set from its gluontl.task_registry entry
    metrics: Sequence[str]  # what `best` records; train.select is one of them (from the entry)
    curves: Sequence[str]  # metrics.jsonl keys that plot draws beside loss and lr (from the entry)

    def prepare(self, recipe: Recipe, ctx=None, *, apply: bool = True) -> Prepared:
        """The recipe's model restored, with its rules planned (and applied): plan, finetune and the API."""

    def plan_notes(self, recipe: Recipe, prep: Prepared) -> tuple[str, list[str], dict[str, Any]]:
        """What the plan adds for this task: its feature-cache line, more lines, more JSON keys."""

    def setup(self, recipe: Recipe, ctx: mx.Context, *, seed: int) -> tuple[Any, Any]:
        """(Prepared model, Loaders), each checked against the other."""

    def check(self, recipe: Recipe, prep: Any, loaders: Any, ctx: mx.Context, guards: Any) -> None:
        """Checks of a new run before its folder exists (guards against runs that cannot learn)."""

    def feed(self, net, plan, recipe: Recipe, loaders, ctx: mx.Context, folder: Path, quiet: bool, previous):
        """What trains and what it is fed (``gluontl.data.cache.Feed``)."""

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

    def load(self, run: Path, recipe: Recipe, tag: str, ctx=None):
        """A finished run's model with checkpoint ``tag`` restored, hybridized for inference."""

    def evaluate_run(self, run: Path, recipe: Recipe, net, split: str, tag: str, tta: str | None = None) -> Report:
        """``tta``: a classifier's probabilities averaged over views (``gluontl.data.tta``); the
        run commands refuse it for a task whose registry entry has no ``tta``."""

    def predict_run(self, run: Path, recipe: Recipe, net, images: list[str], opts: PredictOptions) -> Report:
        """``values["rows"]``: one JSON-able record per image (what ``predict --json`` prints)."""

    def predict_onnx(self, path: Path, images: list[str], opts: PredictOptions) -> Report:
        """:meth:`predict_run` with the run's ONNX export in onnxruntime, from the file alone."""

    def export_run(self, run: Path, recipe: Recipe, net, out_dir: Path, formats: list[str], force: bool,
                   quantize: QuantizeSpec | None, echo: Callable[[str], None]) -> list[Path]:
        """Verified files; an ONNX file's metadata names the task (``gluontl.task``). With
        ``quantize`` also an int8 ONNX file, judged by the task's metric (``gluontl.export.quantize``)."""


class EndToEnd:
    """``check`` and ``feed`` of a task that trains on augmented images end to end: no feature
    cache (its Feed is the loaders), and of the guards only the weights check (the feature
    guards judge a frozen prefix's output)."""

    feed_note: str  # the feature-cache line of the run's log and plan

    def check(self, recipe: Recipe, prep, loaders, ctx: mx.Context, guards) -> None:
        from ..data.guards import check_weights

        guards.handle(check_weights(recipe, prep))

    def feed(self, net, plan, recipe: Recipe, loaders, ctx, folder: Path, quiet: bool, previous):
        from ..data.cache import Feed

        if previous is not None:
            clear_cached_op(previous.net)  # traced with the old grad_req
            return previous
        return Feed(net, loaders, log=self.feed_note)


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


def task_named(name: str) -> Task:
    """The task's code (its registry entry's ``code``), told what the entry declares."""
    entry = TASKS[name]
    module, _, cls = entry.code.partition(":")
    task = getattr(importlib.import_module(module), cls)()
    task.name, task.metrics, task.curves = name, entry.metrics, entry.curves
    return task


def get_task(recipe: Recipe) -> Task:
    return task_named(recipe.task)


def every_curve() -> tuple[str, ...]:
    """The curves of every task, for a metrics log without its recipe (what ran is unknown)."""
    return tuple(dict.fromkeys(c for t in TASKS.values() for c in t.curves))


LEGACY_TASK_KEYS = {"gluontl.nms": "detection"}  # exports from before gluontl.task: a detector's NMS settings


def onnx_task(path: str | Path) -> Task:
    """The task of a gluontl ONNX export, from its metadata (a file without any: refused by
    ``onnx_metadata``, naming the file)."""
    from ..export.openvino_ir import deployed_metadata

    meta = deployed_metadata(Path(path))  # an ONNX file's metadata_props, or an OpenVINO IR's runtime info
    name = meta.get(META_TASK) or next((t for k, t in LEGACY_TASK_KEYS.items() if k in meta), "classification")
    if name not in TASKS:
        from ..errors import ExportError

        raise ExportError(f"'{path}' was exported by a gluontl {name} run, a task this gluontl does not know "
                          f"({', '.join(TASKS)}); use the gluontl that exported it.")
    return task_named(name)
