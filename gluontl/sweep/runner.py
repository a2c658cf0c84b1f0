"""A sweep's trials: each one a recipe from the space, trained by the normal loop inside the sweep's
shared feature folder, reporting every validation to Optuna and stopping at once when pruned.

sweeps/NAME/ holds sweep.json (what the sweep is: recipe and space digests, sampler, pruner,
trial count), recipe.yaml and space.yaml as given, study.db (the default storage), features/ (the
shared frozen-prefix cache), trials/ (each trial's run folder, metrics kept) and the report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from ..atomic import write_text
from ..console import show
from ..data.cache import prefix_passes, shared_features
from ..errors import GluontlError, SweepError
from ..readers import read_json
from ..pipeline import with_input_name
from ..recipe import Recipe, load_recipe
from ..runfolder import RunFolder
from ..train.hooks import Callback, RunInfo
from . import report, storage
from .space import Dim, baseline, check_space, parse_space, with_params
from .study import direction, make_pruner, make_sampler

FORMAT = 1


@dataclass
class Settings:
    """What sweep.json records: a resume runs the same study."""

    trials: int
    sampler: str = "tpe"
    pruner: str = "median"
    storage: str | None = None
    seed: int = 0
    recipe_digest: str = ""
    space: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepResult:
    """The study's table (one row per trial), the best trial's complete recipe and where it all is."""

    folder: Path
    table: list[dict[str, Any]]
    best_recipe: Recipe | None
    best_value: float | None
    prefix_passes: int
    exported: list[Path]


class ReportToTrial(Callback):
    """Every validation's ``train.select`` value to ``trial.report``; a pruned trial stops here."""

    name = "optuna_trial"

    def __init__(self, trial, select: str) -> None:
        self.trial, self.select, self.pruned = trial, select, False

    def on_validation(self, run: RunInfo, row: dict[str, Any]) -> None:
        if self.select in row:
            self.trial.report(float(row[self.select]), row["epoch"])
            if self.trial.should_prune():
                self.pruned = True
                run.request_stop(f"pruned by the sweep at epoch {row['epoch']}")


def _new_folder(root: Path, name: str) -> Path:
    for i in range(1, 10_000):
        folder = root / (name if i == 1 else f"{name}-{i}")
        try:
            folder.mkdir(parents=True)
            return folder
        except FileExistsError:
            continue
    raise SweepError(f"{root} holds 10,000 sweeps named {name}; remove some.")


def _open_study(folder: Path, settings: Settings, dims: list[Dim], recipe: Recipe, heartbeat: bool = True,
                worker: int = 0):
    """The study; ``worker`` k > 0 (a --jobs process) seeds its sampler seed + k, so processes do
    not propose the same trials."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=storage.open_storage(settings.storage, folder, heartbeat),
                               sampler=make_sampler(settings.sampler, settings.seed + worker, dims),
                               pruner=make_pruner(settings.pruner), study_name=folder.name,
                               direction=direction(recipe.train.select), load_if_exists=True)


def _done(study) -> int:
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def _objective(folder: Path, recipe: Recipe, dims: list[Dim], quiet: bool, callbacks: Sequence[Callback]):
    from ..train.loop import finetune

    def objective(trial) -> float:
        import optuna

        values = {d.key: d.suggest(trial) for d in dims}
        values["name"] = f"{recipe.name}-t{trial.number:04d}"
        r = with_params(recipe, values, origin=f"trial {trial.number}")
        reporter = ReportToTrial(trial, r.train.select)
        start = time.perf_counter()
        result = finetune(r, runs_root=folder / "trials", quiet=True, callbacks=[reporter, *callbacks])
        trial.set_user_attr("run_dir", str(result.run_dir.relative_to(folder)))
        trial.set_user_attr("seconds", round(time.perf_counter() - start, 3))
        trial.set_user_attr("epochs", len([row for row in result.metrics if "epoch" in row]))
        if reporter.pruned:
            raise optuna.TrialPruned()
        if not result.best or r.train.select not in result.best:
            raise SweepError(f"trial {trial.number} ended without a {r.train.select} value ({result.run_dir}).")
        return float(result.best[r.train.select])

    return objective


def _progress(total: int, select: str, quiet: bool):
    def line(study, trial) -> None:
        value = f"{select} {trial.value:.4g}" if trial.value is not None else trial.state.name.lower()
        try:
            best = f"best {study.best_value:.4g} (trial {study.best_trial.number})"
        except ValueError:
            best = "no complete trial yet"
        params = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
        show(f"trial {trial.number + 1}/{total}: {trial.state.name} {value}; {best}; "
             f"{trial.user_attrs.get('seconds', 0):.1f}s; {params}", quiet)

    return line


def _optimize(folder: Path, settings: Settings, recipe: Recipe, dims: list[Dim], timeout: float | None,
              quiet: bool, callbacks: Sequence[Callback] = (), study_callbacks: Sequence[Any] = (),
              worker: int = 0) -> None:
    """Run trials in this process until the study holds ``settings.trials`` complete or pruned ones
    (with other processes on the study, up to one more per process: each finishes its trial)."""
    from optuna.study import MaxTrialsCallback
    from optuna.trial import TrialState

    study = _open_study(folder, settings, dims, recipe, worker=worker)
    left = settings.trials - _done(study)
    if left <= 0:
        return
    with shared_features(folder / "features"):
        study.optimize(_objective(folder, recipe, dims, quiet, callbacks), n_trials=left, timeout=timeout,
                       catch=(GluontlError,), gc_after_trial=True,
                       callbacks=[MaxTrialsCallback(settings.trials, states=(TrialState.COMPLETE, TrialState.PRUNED)),
                                  _progress(settings.trials, recipe.train.select, quiet), *study_callbacks])


def start(recipe: Recipe, dims: list[Dim], *, trials: int, root: str | Path = "sweeps", name: str | None = None,
          sampler: str = "tpe", pruner: str = "median", storage_url: str | None = None,
          space_data: dict[str, Any] | None = None, origin: str = "the sweep space") -> tuple[Path, Settings]:
    """Check everything, then make the sweep folder: nothing is written before the checks pass."""
    recipe = with_input_name(recipe)  # trials' recipes and best.yaml name the model's own input, as runs do
    if trials < 1:
        raise SweepError(f"--trials {trials}: a sweep runs at least one trial.")
    if recipe.train.lr == "auto":
        raise SweepError("train.lr: auto would run a range test in every trial; set train.lr to a number or "
                         "sweep it (train.lr: {log_uniform: [1.0e-4, 1.0e-1]}).")
    check_space(recipe, dims, origin)
    direction(recipe.train.select)
    make_sampler(sampler, 0, dims), make_pruner(pruner)
    settings = Settings(trials=trials, sampler=sampler, pruner=pruner, storage=storage_url, seed=recipe.train.seed,
                        recipe_digest=recipe.digest(), space=space_data or {d.key: {d.kind: list(d.args)} for d in dims})
    if storage_url is not None:  # an unreachable --storage fails here, before the folder is made
        storage.open_storage(storage_url, Path(root), heartbeat=False)
    first = baseline(recipe, dims)
    folder = _new_folder(Path(root), name or recipe.name)
    if first is not None:  # trial 0 is the recipe as written, when the space holds it
        _open_study(folder, settings, dims, recipe).enqueue_trial(first)
    else:
        _open_study(folder, settings, dims, recipe)
    write_text(folder / RunFolder.RECIPE, yaml.safe_dump(recipe.as_written(), sort_keys=False), SweepError)
    write_text(folder / "sweep.json", json.dumps({"format": FORMAT, **settings.__dict__}, indent=1), SweepError)
    return folder, settings


def load(folder: str | Path, recipe: Recipe | None = None, space: dict[str, Any] | None = None
         ) -> tuple[Path, Settings, Recipe, list[Dim]]:
    """A sweep folder's settings, recipe and space; ``recipe`` and ``space`` (given again on resume)
    must be the ones it ran."""
    folder = Path(folder)
    if not (folder / "sweep.json").is_file():
        raise SweepError(f"'{folder}' is not a sweep folder (no sweep.json); pass sweeps/NAME as made by "
                         f"`gluontl sweep --recipe R.yaml --space S.yaml`.")
    data = read_json(folder / "sweep.json", SweepError, "the sweep record")
    data.pop("format", None)
    settings = Settings(**data)
    stored = load_recipe(folder / RunFolder.RECIPE)
    recipe = None if recipe is None else with_input_name(recipe)
    if recipe is not None and recipe.digest() != settings.recipe_digest:
        raise SweepError(f"The recipe '{recipe.name}' differs from the one sweep {folder} ran (recipe digest "
                         f"{recipe.digest()} vs {settings.recipe_digest}), so its trials could not be compared. "
                         f"Resume with the recipe unchanged (it is kept in {folder / RunFolder.RECIPE}), or start a "
                         f"new sweep.")
    if space is not None and json.loads(json.dumps(space)) != settings.space:
        raise SweepError(f"The space given differs from the one sweep {folder} ran ({json.dumps(settings.space)}), "
                         f"so its trials could not be compared. Resume without --space (the sweep keeps its own "
                         f"in {folder / 'sweep.json'}), or start a new sweep.")
    return folder, settings, stored, parse_space(settings.space, str(folder / "sweep.json"))


def run(folder: Path, settings: Settings, recipe: Recipe, dims: list[Dim], *, jobs: int = 1,
        timeout: float | None = None, quiet: bool = False, callbacks: Sequence[Callback] = (),
        study_callbacks: Sequence[Any] = (), dashboard: bool = False) -> SweepResult:
    """Run the sweep to its trial count (``jobs`` processes on one study), then write its report."""
    from .dashboard import serve

    board = serve(settings.storage, folder, lambda line: show(line, False)) if dashboard else None
    workers = [subprocess.Popen([sys.executable, "-m", "gluontl", "sweep", "--worker", str(folder)]
                                + (["--timeout", str(timeout)] if timeout else []),
                                env={**os.environ, "GLUONTL_SWEEP_WORKER": str(k)}) for k in range(1, jobs)]
    try:
        _optimize(folder, settings, recipe, dims, timeout, quiet, callbacks, study_callbacks)
    finally:
        for w in workers:
            w.wait()
        if board is not None:
            board.stop()
    return finish(folder, settings, recipe, dims, quiet)


def work(folder: str | Path, timeout: float | None = None) -> None:
    """One more process on a running sweep (what ``--jobs K`` starts K - 1 of)."""
    folder, settings, recipe, dims = load(folder)
    _optimize(folder, settings, recipe, dims, timeout, quiet=True, worker=int(os.environ.get("GLUONTL_SWEEP_WORKER", 1)))


def resume(folder: str | Path, recipe: Recipe | None = None, space: dict[str, Any] | None = None,
           **kw: Any) -> SweepResult:
    """Continue a killed sweep: trials its dead process left running are marked failed, then the
    sweep runs until it holds its trial count."""
    folder, settings, stored, dims = load(folder, recipe, space)
    study = _open_study(folder, settings, dims, stored)
    failed = storage.fail_stale(study)
    if failed:
        show(f"resuming {folder}: trial(s) {', '.join(str(n) for n in failed)} were running when it stopped, "
             f"marked failed", kw.get("quiet", False))
    return run(folder, settings, stored, dims, **kw)


def finish(folder: Path, settings: Settings, recipe: Recipe, dims: list[Dim], quiet: bool) -> SweepResult:
    """The report, and the best trial's export."""
    from ..train.runs import export_run

    study = _open_study(folder, settings, dims, recipe)
    table = report.table(study)
    best_recipe, best_value, exported = None, None, []
    try:
        best = study.best_trial
    except ValueError:
        best = None
    if best is not None:
        best_value = best.value
        best_recipe = with_params(recipe, {d.key: _value(d, best.params[d.key]) for d in dims if d.key in best.params})
        run_dir = folder / best.user_attrs["run_dir"]
        if recipe.export.formats:
            exported = export_run(run_dir, force=True)
    passes = prefix_passes(folder / "features")
    report.write(folder, study, table, best_recipe, passes, quiet)
    return SweepResult(folder, table, best_recipe, best_value, passes, exported)


def _value(dim: Dim, stored: Any) -> Any:
    return dim.args[dim.choices().index(stored)] if dim.kind == "choice" else stored


def sweep(recipe: Recipe, dims: list[Dim], *, trials: int = 16, jobs: int = 1, timeout: float | None = None,
          root: str | Path = "sweeps", name: str | None = None, sampler: str = "tpe", pruner: str = "median",
          storage_url: str | None = None, quiet: bool = False, callbacks: Sequence[Callback] = (),
          study_callbacks: Sequence[Any] = (), space_data: dict[str, Any] | None = None,
          origin: str = "the sweep space", dashboard: bool = False) -> SweepResult:
    recipe = with_input_name(recipe)
    folder, settings = start(recipe, dims, trials=trials, root=root, name=name, sampler=sampler, pruner=pruner,
                             storage_url=storage_url, space_data=space_data, origin=origin)
    show(f"sweep {folder}: {trials} trials, sampler {sampler}, pruner {pruner}, objective {recipe.train.select} "
         f"({direction(recipe.train.select)})", quiet)
    return run(folder, settings, recipe, dims, jobs=jobs, timeout=timeout, quiet=quiet, callbacks=callbacks,
               study_callbacks=study_callbacks, dashboard=dashboard)


def parse(recipe: Any, space: Any) -> tuple[Recipe, list[Dim], dict[str, Any], str]:
    """A recipe (Recipe, dict or YAML path) and a space (dict or YAML path) as the API takes them."""
    from ..readers import read_yaml
    from ..recipe import as_recipe

    r = as_recipe(recipe)
    data = space if isinstance(space, dict) else read_yaml(space, SweepError, "the sweep space")
    origin = "the space dict" if isinstance(space, dict) else str(space)
    return r, parse_space(data, origin), data, origin


def show_table(folder: str | Path) -> str:
    """``gluontl sweep --show``: the trial table of a sweep folder."""
    folder, settings, recipe, dims = load(folder)
    return report.format_table(report.table(_open_study(folder, settings, dims, recipe)), recipe.train.select)
