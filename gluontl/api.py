"""Front doors the CLI shares with Python users, so a script gets the run folder the command does."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from .pipeline import Prepared
from .recipe import Recipe, as_recipe
from .tasks import get_task
from .train.loop import RunResult, finetune as _train
from .train.runs import export_run, init_from as start_from


def prepare(recipe: Recipe | Mapping[str, Any] | str | os.PathLike, *, ctx=None, apply: bool = True) -> Prepared:
    """The recipe's model built by its task, weights restored, rules planned (and applied): what
    ``gluontl plan`` shows and ``finetune`` starts from, for any task."""
    recipe = as_recipe(recipe)
    return get_task(recipe).prepare(recipe, ctx, apply=apply)


def finetune(recipe: Recipe | Mapping[str, Any] | str | os.PathLike, *, runs_root: str | Path = "runs",
             resume: str | Path | None = None, init_from: str | Path | None = None, quiet: bool = False,
             stop_after_steps: int | None = None, export: bool = True) -> RunResult:
    """``gluontl finetune``: train per ``recipe`` (a ``Recipe``, a dict of a recipe file's keys or a
    YAML path) into ``runs_root/NAME``, then write the recipe's ``export:`` section into
    ``RUN/export/`` (listed in ``RunResult.exported``; a resume replaces its earlier export).

    ``init_from`` (``RUN``, ``RUN/best``, ``RUN/last``) starts a new run from another run's weights,
    as ``--init-from`` does. A run stopped early (``stop_after_steps``, a signal) or already finished exports nothing, and in a distributed
    job only rank 0 does; ``export=False`` skips it (``gluontl.export_run`` exports later).
    """
    recipe = as_recipe(recipe)
    if init_from is not None:
        recipe = start_from(recipe, init_from)
    result = _train(recipe, runs_root=runs_root, resume=resume, quiet=quiet, stop_after_steps=stop_after_steps)
    if export and recipe.export.formats and result.is_root and not (result.stopped_early or result.finished_before):
        result.exported = export_run(result.run_dir, force=resume is not None)
    return result
