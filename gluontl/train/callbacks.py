"""Callbacks: code the loop calls at a run's boundaries, so what watches or steers a run is not a
branch inside the loop (Lightning's ``callbacks/``, mmengine's hooks).

Hooks, in the order the loop calls them::

    on_run_start
    per epoch: on_epoch_start, on_step (after each optimizer step), on_validation (validated
               epochs only: every train.val_every-th and the last), on_epoch_end
    on_run_end  (or on_exception, when the run fails or is interrupted)
    on_exported (gluontl.finetune / the CLI, after the recipe's export: files were written)

A callback that keeps state returns it from ``state_dict`` (JSON-able); it is saved in every
checkpoint and handed back to ``load_state_dict`` on ``--resume``, so a resumed run's callbacks
are the uninterrupted run's. ``on_validation`` may ask the run to stop (:meth:`RunInfo.request_stop`);
in a distributed run the workers agree on it as on a signal, so all stop at the same step.

Built-in callbacks are named in the recipe (``train.callbacks: [{early_stopping: {...}}, {csv: {}}]``);
:func:`register_callback` adds names, and ``gluontl.finetune(recipe, callbacks=[...])`` takes instances.
"""
from __future__ import annotations

import contextlib
import csv
import io
import math
from typing import Any, Callable, Iterable, Iterator

from ..atomic import write_text
from ..errors import TrainError
from ..metrics import find_metric
from ..recipe import CALLBACK_SPECS, CsvSpec, EarlyStoppingSpec, MlflowSpec, Recipe
from ..runfolder import RunFolder
from .hooks import Callback, RunInfo, Step
from .mlflow_log import MlflowLogger


_FACTORIES: dict[str, Callable[[Any], Callback]] = {}


def register_callback(name: str, factory: Callable[[Any], Callback], spec: type | None = None) -> None:
    """Make ``name`` usable in ``train.callbacks``: ``factory(settings)`` builds the callback, where
    settings are ``spec`` validated (a pydantic model) or, without one, the mapping as written."""
    CALLBACK_SPECS[name] = spec
    _FACTORIES[name] = factory


def build(recipe: Recipe, extra: list[Callback] | tuple[Callback, ...] = ()) -> list[Callback]:
    """The recipe's named callbacks, then ``extra`` (the Python API's), each with a unique state key."""
    out = [_FACTORIES[name](settings) for item in recipe.train.callbacks for name, settings in item.items()]
    out += list(extra)
    seen: set[str] = set()
    for cb in out:
        if not isinstance(cb, Callback):
            raise TrainError(f"{cb!r} is not a gluontl Callback; subclass gluontl.Callback and override its hooks.")
        key = key_of(cb)
        if key in seen:
            raise TrainError(f"Two callbacks share the state key '{key}'; give one a distinct `name` attribute.")
        seen.add(key)
    return out


def key_of(cb: Callback) -> str:
    return cb.name or type(cb).__name__


class Callbacks:
    """The run's callbacks called in order, the loop's own (``engine``, see ``train/engine.py``)
    before the user's (``list``); the user's states as one JSON-able mapping."""

    def __init__(self, callbacks: list[Callback], info: RunInfo, engine: list[Any] = ()) -> None:
        self.list, self.info, self.engine = callbacks, info, list(engine)

    def call(self, hook: str, *args: Any) -> None:
        for cb in (*self.engine, *self.list):
            getattr(cb, hook)(self.info, *args)

    def call_engine(self, hook: str, *args: Any) -> None:
        """One of the engine's own hooks (``on_batch``, ``on_replan``, ``on_measured``, ``on_row``, ``on_saved``)."""
        for cb in self.engine:
            getattr(cb, hook)(self.info, *args)

    def batches(self, items: Iterable, epoch: int, skip: int, total: int) -> Iterable:
        for cb in self.engine:
            items = cb.batches(self.info, items, epoch, skip, total)
        return items

    @contextlib.contextmanager
    def evaluating(self, epoch: int, val: dict[str, Any], evaluate: Callable[[], dict[str, Any]]) -> Iterator[bool]:
        """Every engine callback's ``evaluating`` block; whether one swapped other weights in."""
        with contextlib.ExitStack() as stack:
            yield any([stack.enter_context(cb.evaluating(self.info, epoch, val, evaluate)) for cb in self.engine])

    def engine_state(self, part: str) -> dict[str, Any]:
        """The engine callbacks' ``checkpoint_record``, ``plan_notes`` or ``summary``, merged."""
        return {k: v for cb in self.engine for k, v in getattr(cb, part)().items()}

    def checkpoint_arrays(self) -> Any:
        return next((a for a in (cb.checkpoint_arrays() for cb in self.engine) if a is not None), None)

    def engine_of(self, kind: type) -> Any:
        """The engine callback of class ``kind`` (or None)."""
        return next((cb for cb in self.engine if isinstance(cb, kind)), None)

    def state(self) -> dict[str, Any]:
        return {key_of(cb): cb.state_dict() for cb in self.list}

    def load(self, states: dict[str, Any] | None) -> None:
        for cb in self.list:
            if states and key_of(cb) in states:
                cb.load_state_dict(states[key_of(cb)])


class EarlyStopping(Callback):
    """Stop when ``monitor`` has not improved by more than ``min_delta`` for ``patience``
    validations, or at once when it reaches ``stopping_threshold``, passes ``divergence_threshold``
    or is not finite (``check_finite``): Lightning's ``EarlyStopping``, counted in validations."""

    name = "early_stopping"

    def __init__(self, spec: EarlyStoppingSpec | None = None, **settings: Any) -> None:
        self.spec = spec or EarlyStoppingSpec(**settings)
        self.best: float | None = None
        self.wait = 0
        self.stopped: dict[str, Any] | None = None  # {"epoch", "step", "reason"} once it stopped the run

    def on_run_start(self, run: RunInfo) -> None:
        self.monitor = self.spec.monitor or run.recipe.train.select
        self.mode = self.spec.mode or find_metric(self.monitor).direction

    def decide(self, value: float) -> str | None:
        """The reason to stop after a validation with ``value``, or None; updates best and wait."""
        s, worse = self.spec, (lambda a, b: a < b) if self.mode == "max" else (lambda a, b: a > b)
        if s.check_finite and not math.isfinite(value):
            return f"{self.monitor} = {value} is not finite"
        if s.stopping_threshold is not None and worse(s.stopping_threshold, value):
            return f"{self.monitor} {value:.4g} reached stopping_threshold {s.stopping_threshold:g}"
        if s.divergence_threshold is not None and worse(value, s.divergence_threshold):
            return f"{self.monitor} {value:.4g} is past divergence_threshold {s.divergence_threshold:g}"
        delta = s.min_delta if self.mode == "max" else -s.min_delta
        if self.best is None or (value > self.best + delta if self.mode == "max" else value < self.best + delta):
            self.best, self.wait = value, 0
            return None
        self.wait += 1
        if self.wait >= s.patience:
            return (f"{self.monitor} did not improve by more than {s.min_delta:g} on {self.best:.4g} in "
                    f"{self.wait} validation{'s' * (self.wait != 1)} (patience {s.patience})")
        return None

    def on_validation(self, run: RunInfo, row: dict[str, Any]) -> None:
        if self.monitor not in row:
            raise TrainError(f"early_stopping monitors {self.monitor}, which this run's validation does not give "
                             f"(it gives {', '.join(k for k in row if k.startswith(('val_', 'ema_')))}).")
        reason = self.decide(float(row[self.monitor]))
        if reason is not None:
            self.stopped = {"epoch": row["epoch"], "step": row["step"], "reason": reason}
            run.request_stop(f"early stopping: {reason}")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "wait": self.wait, "stopped": self.stopped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.wait, self.stopped = state.get("best"), int(state.get("wait", 0)), state.get("stopped")


class CsvLogger(Callback):
    """Every epoch row as a line of ``RUN/metrics.csv`` (columns: the keys in order of appearance),
    rewritten whole each epoch so a resumed or extended run's file has its rows once."""

    name = "csv"

    def __init__(self, spec: CsvSpec | None = None) -> None:
        self.spec = spec or CsvSpec()
        self.rows: list[dict[str, Any]] = []

    def on_epoch_end(self, run: RunInfo, row: dict[str, Any]) -> None:
        self.rows.append(dict(row))
        if not run.is_root:
            return
        columns = list(dict.fromkeys(k for r in self.rows for k in r))
        out = io.StringIO()
        writer = csv.DictWriter(out, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        write_text(RunFolder(run.run_dir).user_file(self.spec.file), out.getvalue(), TrainError)

    def state_dict(self) -> dict[str, Any]:
        return {"rows": self.rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rows = list(state.get("rows", []))


register_callback("early_stopping", EarlyStopping, EarlyStoppingSpec)
register_callback("csv", CsvLogger, CsvSpec)


register_callback("mlflow", MlflowLogger, MlflowSpec)  # mlflow itself is imported by a run that names it

__all__ = ["Callback", "RunInfo", "Step", "EarlyStopping", "CsvLogger", "MlflowLogger", "register_callback"]
