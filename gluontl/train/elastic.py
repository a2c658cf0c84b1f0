"""A resume on another worker count (elastic, as torchrun's): the global batch and the data order stay.

Each epoch's seeded order is cut into steps of ``workers × batch_size`` images, and worker r of W
takes every W-th image of a step, so step b trains the same images on any W with the same
product: on M workers the per-worker batch becomes ``global / M``. What changes is only the
order in which the parameter server (or one process) adds the per-image gradients, so the result
equals the uninterrupted run's within float32 summation error.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import TrainError
from ..recipe import Recipe


def global_batch(recipe: Recipe, meta: dict[str, Any]) -> int:
    """The images of one step of the checkpointed run: recorded since elastic resumes, else its
    worker count × the recipe's per-worker batch."""
    return int(meta.get("global_batch") or meta.get("workers", 1) * recipe.data.batch_size)


def rebatch(run_dir: Path, recipe: Recipe, meta: dict[str, Any], workers: int) -> Recipe:
    """``recipe`` with the per-worker batch that keeps the checkpoint's global batch on ``workers``."""
    total, before = global_batch(recipe, meta), meta.get("workers", 1)
    if total % workers:
        fits = [m for m in range(1, total + 1) if total % m == 0 and m <= 64]
        raise TrainError(f"Cannot resume {run_dir} on {workers} worker(s): it was trained on {before} with a global "
                         f"batch of {total} images a step ({before} × data.batch_size {total // before}), which "
                         f"{workers} workers cannot share equally, and the global batch decides the result. Resume "
                         f"it on a worker count that divides {total} ({', '.join(map(str, fits))}), or start a new "
                         f"run from its weights with --init-from {run_dir}.")
    data = recipe.data.model_copy(update={"batch_size": total // workers})
    return recipe.model_copy(update={"data": data})
