"""Front doors the CLI shares with Python users, so a script gets the run folder the command does."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from .atomic import write_text
from .console import show
from .errors import TrainError
from .pipeline import Prepared
from .recipe import Recipe, as_recipe, load_recipe
from .runfolder import RunFolder
from .tasks import get_task
from .train.callbacks import Callback
from .train.loop import RunResult, finetune as _train
from .train.lrfind import Found, lr_find as _lr_find
from .train.runs import export_run, init_from as start_from


def prepare(recipe: Recipe | Mapping[str, Any] | str | os.PathLike, *, ctx=None, apply: bool = True) -> Prepared:
    """The recipe's model built by its task, weights restored, rules planned (and applied): what
    ``gluontl plan`` shows and ``finetune`` starts from, for any task."""
    recipe = as_recipe(recipe)
    return get_task(recipe).prepare(recipe, ctx, apply=apply)


def finetune(recipe: Recipe | Mapping[str, Any] | str | os.PathLike, *, runs_root: str | Path = "runs",
             resume: str | Path | None = None, init_from: str | Path | None = None, quiet: bool = False,
             stop_after_steps: int | None = None, export: bool = True,
             callbacks: Sequence[Callback] = ()) -> RunResult:
    """``gluontl finetune``: train per ``recipe`` (a ``Recipe``, a dict of a recipe file's keys or a
    YAML path) into ``runs_root/NAME``, then write the recipe's ``export:`` section into
    ``RUN/export/`` (listed in ``RunResult.exported``; a resume replaces its earlier export).

    ``init_from`` (``RUN``, ``RUN/best``, ``RUN/last``) starts a new run from another run's weights,
    as ``--init-from`` does. A run stopped early (``stop_after_steps``, a signal) or already finished exports nothing, and in a distributed
    job only rank 0 does; ``export=False`` skips it (``gluontl.export_run`` exports later).
    ``callbacks``: :class:`gluontl.Callback` instances called after the recipe's ``train.callbacks``
    (docs/callbacks.md); a run a callback ends early (early stopping) is complete and exports.
    """
    recipe = as_recipe(recipe)
    if init_from is not None:
        recipe = start_from(recipe, init_from)
    recipe, found = _auto_lr(recipe, runs_root, resume, quiet)
    result = _train(recipe, runs_root=runs_root, resume=resume, quiet=quiet, stop_after_steps=stop_after_steps,
                    callbacks=list(callbacks))
    if found is not None and result.is_root:  # the run's recipe.yaml holds the number; this says where it came from
        write_text(RunFolder(result.run_dir).lr_find_path, json.dumps(found.to_json(), indent=1), TrainError)
    if export and recipe.export.formats and result.is_root and not (result.stopped_early or result.finished_before):
        result.exported = export_run(result.run_dir, force=resume is not None)
        if result.callbacks is not None:
            result.callbacks.call("on_exported", result.exported)
    return result


def lr_find(recipe: Recipe | Mapping[str, Any] | str | os.PathLike, *, runs_root: str | Path = "runs",
            steps: int = 100, start: float = 1e-7, end: float = 10.0, quiet: bool = False) -> Found:
    """``gluontl lr-find``: fastai's learning-rate range test on the recipe's model and data; its
    plot and record go to ``runs_root/NAME-lr-find/``, and no weights are written."""
    return _lr_find(as_recipe(recipe), runs_root=runs_root, steps=steps, start=start, end=end, quiet=quiet)


def _auto_lr(recipe: Recipe, runs_root: str | Path, resume: str | Path | None, quiet: bool
             ) -> tuple[Recipe, Found | None]:
    """``train.lr: auto`` made a number: the range test's suggestion, or the one a resumed run trained with."""
    if recipe.train.lr != "auto":
        return recipe, None
    if resume is not None:
        lr = load_recipe(RunFolder(resume).recipe_path).train.lr
        return recipe.model_copy(update={"train": recipe.train.model_copy(update={"lr": lr})}), None
    if os.environ.get("DMLC_ROLE") == "worker" or "HOROVOD_RANK" in os.environ:
        raise TrainError("train.lr: auto in a distributed job would run the range test in every worker; run "
                         "`gluontl lr-find --recipe RECIPE` once and set train.lr to its suggestion.")
    found = _lr_find(recipe, runs_root=runs_root, quiet=quiet)
    show(f"train.lr: auto -> {found.suggested:.3g} (lr-find minimum, {found.seconds:.1f}s; plot {found.plot})", quiet)
    return recipe.model_copy(update={"train": recipe.train.model_copy(update={"lr": found.suggested})}), found
