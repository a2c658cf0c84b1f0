"""Hyper-parameter sweeps over recipes (``gluontl sweep``, ``gluontl.sweep(...)``): an Optuna study
whose trials are recipes run by the normal loop, sharing one frozen-prefix feature cache on disk.
The package is callable, so ``gluontl.sweep(recipe, space, trials=16)`` works whether or not
``gluontl.sweep`` was imported as a module first."""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any, Mapping, Sequence


def sweep(recipe: Any, space: Mapping[str, Any] | str | os.PathLike, *, trials: int = 16, jobs: int = 1,
          timeout: float | None = None, root: str | Path = "sweeps", name: str | None = None,
          sampler: str = "tpe", pruner: str = "median", storage: str | None = None, quiet: bool = False,
          callbacks: Sequence[Any] = (), study_callbacks: Sequence[Any] = ()):
    """Run a sweep of ``trials`` over ``space`` (a mapping or YAML file of dotted recipe keys to
    distributions) on ``recipe`` (a Recipe, a dict or a YAML path) into ``root/NAME``; returns a
    ``SweepResult``: ``table`` (a row per trial) and ``best_recipe`` (a complete Recipe), with the
    folder, best value and prefix passes. ``callbacks`` go to every trial's run."""
    from .runner import parse, sweep as run

    r, dims, data, origin = parse(recipe, space)
    return run(r, dims, trials=trials, jobs=jobs, timeout=timeout, root=root, name=name, sampler=sampler,
               pruner=pruner, storage_url=storage, quiet=quiet, callbacks=callbacks, study_callbacks=study_callbacks,
               space_data=data, origin=origin)


def resume(folder: str | Path, recipe: Any = None, *, jobs: int = 1, timeout: float | None = None,
           quiet: bool = False, callbacks: Sequence[Any] = ()):
    """Continue the sweep in ``folder`` (``recipe``, if given, must be the one it ran)."""
    from ..recipe import as_recipe
    from .runner import resume as run

    return run(folder, None if recipe is None else as_recipe(recipe), jobs=jobs, timeout=timeout, quiet=quiet,
               callbacks=callbacks)


class _Callable(types.ModuleType):
    def __call__(self, *args: Any, **kw: Any):
        return sweep(*args, **kw)


sys.modules[__name__].__class__ = _Callable
