"""``train.callbacks: [{mlflow: {...}}]``: the run in an MLflow tracking store (``pip install gluontl[mlflow]``).

Params: the recipe flattened (``train.lr``, ``data.batch_size``, ...). Metrics: each optimizer
step's ``loss`` and ``lr``, and every epoch row's numbers, at the run's global step. Tags: task,
model source, gluontl version. Artifacts: the plan, the run card, summary.json and the verified
exports. The store: ``tracking_uri`` of the recipe, else ``MLFLOW_TRACKING_URI``, else a local
SQLite store ``mlflow.db`` (artifacts in ``mlartifacts/``) beside the run folders. A store that cannot be reached fails at run start,
before any training, and a resume continues the same MLflow run (its id is the callback's state).
Only rank 0 logs.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import TrainError
from ..recipe import MlflowSpec
from ..runfolder import RunFolder
from .hooks import Callback, RunInfo, Step

_BATCH = 100  # MLflow's log_batch takes at most 100 params and 1000 metrics per call


def _flat(data: Any, prefix: str = "") -> dict[str, str]:
    if isinstance(data, dict):
        return {k: v for key, value in data.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    if isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        return {k: v for i, value in enumerate(data, 1) for k, v in _flat(value, f"{prefix}{i}.").items()}
    return {prefix[:-1]: str(data)[:6000]}


class MlflowLogger(Callback):
    name = "mlflow"

    def __init__(self, spec: MlflowSpec | None = None) -> None:
        self.spec = spec or MlflowSpec()
        self.run_id: str | None = None
        self.client = None
        self.pending: list = []  # step metrics, sent with the epoch's

    def on_run_start(self, run: RunInfo) -> None:
        if not run.is_root:
            return
        try:
            from mlflow.entities import Metric, Param, RunTag
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise TrainError("train.callbacks mlflow needs the mlflow package, which is not installed: "
                             "`pip install gluontl[mlflow]` (or remove the mlflow callback).") from None
        self._Metric = Metric
        local = run.run_dir.resolve().parent  # the default store: SQLite + artifacts beside the run folders
        uri = self.spec.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{local / 'mlflow.db'}"
        artifacts = None if self.spec.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") else \
            (local / "mlartifacts").as_uri()
        self.client = client = MlflowClient(tracking_uri=uri)
        old = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
        os.environ.update(MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="10")
        try:  # one request, without MLflow's minutes of retries: an unreachable store fails now
            experiment = client.get_experiment_by_name(self.spec.experiment)
            experiment_id = (experiment.experiment_id if experiment else
                             client.create_experiment(self.spec.experiment, artifacts))
        except Exception as e:  # whatever the store's client raises (connection, HTTP, permission)
            raise TrainError(f"Cannot reach the MLflow tracking store '{uri}' (from "
                             f"{'train.callbacks mlflow.tracking_uri' if self.spec.tracking_uri else 'MLFLOW_TRACKING_URI' if os.environ.get('MLFLOW_TRACKING_URI') else 'the default local store'}"
                             f"): {str(e).splitlines()[0][:300] if str(e) else type(e).__name__}. Nothing was "
                             f"trained. Start the server (or fix the URI), or remove the mlflow callback; "
                             f"without tracking_uri and MLFLOW_TRACKING_URI runs go to a local mlflow.db beside the run folders.") from None
        finally:
            for k, v in old.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        if self.run_id is not None:  # a resume: the same MLflow run goes on
            client.update_run(self.run_id, status="RUNNING")
            return
        from importlib.metadata import PackageNotFoundError, version

        try:
            __version__ = version("gluontl")
        except PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
            __version__ = "unknown"
        recipe = run.recipe
        tags = {"gluontl.task": recipe.task, "gluontl.model_source": recipe.model.source,
                "gluontl.version": __version__, "gluontl.run_dir": str(run.run_dir)}
        self.run_id = client.create_run(experiment_id, run_name=self.spec.run_name or run.run_dir.name,
                                        tags=tags).info.run_id
        params = [Param(k, v) for k, v in _flat(recipe.as_written()).items()]
        for i in range(0, len(params), _BATCH):
            client.log_batch(self.run_id, params=params[i:i + _BATCH])
        client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    def _metric(self, key: str, value: float, step: int):
        import time

        return self._Metric(key, float(value), int(time.time() * 1000), step)

    def on_step(self, run: RunInfo, step: Step) -> None:
        if self.client is not None and self.spec.log_steps:
            self.pending += [self._metric("loss", step.loss, step.step), self._metric("lr", step.lr, step.step)]

    def on_epoch_end(self, run: RunInfo, row: dict[str, Any]) -> None:
        if self.client is None:
            return
        numbers = [self._metric(f"epoch/{k}", v, row["step"]) for k, v in row.items()
                   if k not in ("step", "epoch") and isinstance(v, (int, float)) and not isinstance(v, bool)]
        metrics, self.pending = self.pending + numbers, []
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def on_run_end(self, run: RunInfo) -> None:
        if self.client is None:
            return
        for path in RunFolder(run.run_dir).artifacts:
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path))
        self.client.set_terminated(self.run_id, "FINISHED")

    def on_exported(self, run: RunInfo, files: list[Path]) -> None:
        if self.client is not None:
            for path in files:
                self.client.log_artifact(self.run_id, str(path), "export")

    def on_exception(self, run: RunInfo, error: BaseException) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id, "KILLED" if type(error).__name__ == "Interrupted" else "FAILED")

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.run_id = state.get("run_id")
