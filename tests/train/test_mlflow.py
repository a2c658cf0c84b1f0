"""train.callbacks mlflow against a real local file store and a real `mlflow server` on 127.0.0.1
(started here); MlflowClient reads back what the run logged. Needs the [mlflow] extra."""
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from tests import helpers

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

import gluontl  # noqa: E402


def recipe(prefix, uri, epochs=3):
    return {"name": "m", "model": {"source": f"symbol:{prefix}", "input_shape": [3, 16, 16]},
            "data": helpers.DIGITS_5_9, "export": {"formats": ["onnx"]},
            "train": {"epochs": epochs, "lr": 0.05, "log_every": 1,
                      "callbacks": [{"mlflow": {"experiment": "tests", **({"tracking_uri": uri} if uri else {})}}]}}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return helpers.tiny_symbol(tmp_path_factory.mktemp("tiny"), deep=False)


def check_logged(uri, result):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("tests")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.data.params["train.lr"] == "0.05" and run.data.params["data.batch_size"] == "16"
    assert run.data.tags["gluontl.task"] == "classification" and run.info.status == "FINISHED"
    epochs = [r for r in result.metrics if "epoch" in r]
    history = client.get_metric_history(run.info.run_id, "epoch/val_top1")
    assert [(m.step, m.value) for m in history] == [(r["step"], r["val_top1"]) for r in epochs]
    steps = [r for r in result.metrics if "loss" in r]
    assert [m.value for m in client.get_metric_history(run.info.run_id, "loss")] == pytest.approx(
        [r["loss"] for r in steps], rel=1e-6)
    exported = [f.path for f in client.list_artifacts(run.info.run_id, "export")]
    assert [p for p in exported if p.endswith(".onnx")], exported
    assert "preprocess.json" in [f.path for f in client.list_artifacts(run.info.run_id)]


def test_the_default_local_store_gets_params_metrics_and_the_onnx(tiny, tmp_path, monkeypatch):
    """No tracking_uri, no MLFLOW_TRACKING_URI: a SQLite store and artifacts beside the run folders."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = gluontl.finetune(recipe(tiny, None), runs_root=tmp_path / "runs", quiet=True)
    check_logged(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}", result)
    assert list((tmp_path / "runs" / "mlartifacts").rglob("*.onnx"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_real_mlflow_server_gets_the_run(tiny, tmp_path, monkeypatch):
    port = free_port()
    cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
           "--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
           "--artifacts-destination", str(tmp_path / "artifacts"), "--workers", "1"]
    server = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        uri = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 180
        while True:  # until the server answers its health check (polled, as test_interrupt polls its runs)
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=30) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < end, "mlflow server did not start in 180 s"
            time.sleep(0.1)
        # its first API request sets up the store (seconds on a loaded machine): made here, with the
        # client's own retries, so the run's one quick reachability request finds a ready server
        MlflowClient(tracking_uri=uri).search_experiments()
        monkeypatch.chdir(tmp_path)
        r = recipe(tiny, None)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the URI from the environment
        result = gluontl.finetune(r, runs_root=tmp_path / "runs", quiet=True)
        check_logged(uri, result)
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_an_unreachable_server_exits_2_before_any_training(tiny, tmp_path):
    port = free_port()  # nothing listens there
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe(tiny, f"http://127.0.0.1:{port}")))
    done = subprocess.run([sys.executable, "-m", "gluontl", "finetune", "-r", str(path), "--runs",
                           str(tmp_path / "runs"), "-q"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and f"Cannot reach the MLflow tracking store 'http://127.0.0.1:{port}'" \
        in " ".join(done.stderr.split())
    # not one step was trained: no metrics, no checkpoint (a new run that ends before its first
    # checkpoint leaves no folder at all)
    assert not [*(tmp_path / "runs").glob("*/metrics.jsonl"), *(tmp_path / "runs").glob("*/checkpoints/*")]
