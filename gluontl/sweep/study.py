"""The Optuna study of a sweep: sampler and pruner by name, seeded, so the same sweep on the same
machine proposes the same trials."""
from __future__ import annotations

from typing import Any

from ..errors import SweepError
from ..metrics import find_metric
from .space import Dim

SAMPLERS = ("tpe", "random", "grid", "cmaes")
PRUNERS = ("median", "halving", "hyperband", "none")


def make_sampler(name: str, seed: int, dims: list[Dim]):
    import optuna

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed)
    if name == "grid":
        loose = [d.key for d in dims if d.kind not in ("choice", "int")]
        if loose:
            raise SweepError(f"--sampler grid needs a finite space, but {', '.join(loose)} "
                             f"{'is a' if len(loose) == 1 else 'are'} continuous range(s); use choice or int "
                             f"there, or another sampler (tpe, random, cmaes).")
        grid = {d.key: d.choices() if d.kind == "choice" else list(range(d.args[0], d.args[1] + 1)) for d in dims}
        return optuna.samplers.GridSampler(grid, seed=seed)
    raise SweepError(f"--sampler '{name}' is not one of {', '.join(SAMPLERS)}.")


def make_pruner(name: str):
    import optuna

    pruners: dict[str, Any] = {
        "median": lambda: optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=1),
        "halving": lambda: optuna.pruners.SuccessiveHalvingPruner(),
        "hyperband": lambda: optuna.pruners.HyperbandPruner(),
        "none": lambda: optuna.pruners.NopPruner()}
    if name not in pruners:
        raise SweepError(f"--pruner '{name}' is not one of {', '.join(PRUNERS)}.")
    return pruners[name]()


def direction(select: str) -> str:
    """Optuna's direction for the recipe's ``train.select``, from the metric registry."""
    metric = find_metric(select)
    if metric is None or metric.direction is None:
        raise SweepError(f"train.select '{select}' has no registered direction, so the sweep cannot rank trials "
                         f"by it; pick a metric with one (gluontl.register_metric).")
    return "maximize" if metric.direction == "max" else "minimize"
