"""Weights produced by another recipe: the local stand-in for a zoo download.

``model.weights_from: recipes/digits_pretrain.yaml`` says how ``model.weights`` is made
when it does not exist yet: run that recipe once, keep its best parameters at the
``weights`` path, and reuse the file from then on.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

from ..atomic import atomic_write
from ..errors import RecipeError, TrainError
from ..home import gluontl_home
from ..recipe import Recipe, load_recipe
from ..runfolder import RunFolder


def ensure_weights(recipe: Recipe, finetune: Callable, *, quiet: bool = False, depth: int = 0) -> None:
    """``finetune`` (the loop's) trains the ``weights_from`` recipe: passed in, so this module sits
    below the loop that calls it."""
    spec = recipe.model
    if not spec.weights or Path(spec.weights).is_file() or not spec.weights_from:
        return
    if depth > 3:
        raise RecipeError(f"model.weights_from chain is deeper than 3 recipes at '{spec.weights_from}'; "
                          f"is it circular?")
    target = Path(spec.weights).resolve()
    allowed = (Path.cwd().resolve(), gluontl_home().resolve())
    if not any(target.is_relative_to(root) for root in allowed):
        raise RecipeError(f"model.weights '{spec.weights}' is where weights_from would write, but it lies "
                          f"outside the working directory and $GLUONTL_HOME ({allowed[1]}); gluontl only "
                          f"writes files there. Use a path such as .cache/pretrain/NAME.params.")
    source = load_recipe(spec.weights_from)
    if not quiet:
        print(f"'{spec.weights}' does not exist yet: making it with {spec.weights_from} (one time)")
    ensure_weights(source, finetune, quiet=quiet, depth=depth + 1)
    result = finetune(source, runs_root=Path(spec.weights).parent / "runs", quiet=quiet)
    best = RunFolder(result.run_dir).checkpoint_params("best")
    if not best.is_file():
        raise TrainError(f"{spec.weights_from} finished without a best checkpoint in {result.run_dir}.")
    Path(spec.weights).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(spec.weights, lambda tmp: shutil.copyfile(best, tmp), TrainError)
