"""gluontl/runfolder.py: a run folder written by an older gluontl (``tests/fixtures/old_run``, made by
main at 7a6ec71 with ``scripts/make_old_run.py``) still evaluates, exports and resumes with today's
code (issue 32). The references are the folder's own stored files, read with plain MXNet, numpy and
onnx, never through gluontl."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from typer.testing import CliRunner

from gluontl.cli import app
from gluontl.runfolder import RunFolder
from gluontl.train.runs import evaluate
from tests.helpers import f32_tol

FIXTURE = Path(__file__).parent / "fixtures" / "old_run"


@pytest.fixture
def old(tmp_path, monkeypatch) -> Path:
    """A copy of the fixture, run from its folder (the recipe names its net as ``symbol:tiny``)."""
    shutil.copytree(FIXTURE, tmp_path / "fx")
    monkeypatch.chdir(tmp_path / "fx")
    return Path("old")


def _arrays(path: Path) -> dict[str, np.ndarray]:
    return {k: v.asnumpy() for k, v in mx.nd.load(str(path)).items()}


def _cli(*args: str) -> str:
    res = CliRunner().invoke(app, list(args))
    assert res.exit_code == 0, (res.output, res.exception)
    return res.output


def test_the_fixture_was_written_by_the_old_code():
    assert (FIXTURE / "MADE_BY").read_text().startswith("gluontl 7a6ec71")
    assert RunFolder(FIXTURE / "old").is_run() and RunFolder.resolve(FIXTURE / "old" / "last") is not None


def test_an_old_run_evaluates_and_exports_its_stored_weights(old):
    rows = [json.loads(line) for line in (old / "metrics.jsonl").read_text().splitlines()]
    stored = [r for r in rows if "val_top1" in r][-1]
    out = evaluate(old)
    # the stored weights on the stored split: the validation finetune logged (one image may flip
    # between CPUs whose kernels add in another order; 179 images)
    assert abs(out["val_top1"] - stored["val_top1"]) <= 1 / 179 + 1e-12
    _cli("export", str(old), "--format", "onnx", "--out", "exported")
    (onnx_file,) = Path("exported").glob("*.onnx")
    inits = [numpy_helper.to_array(t) for t in onnx.load(str(onnx_file)).graph.initializer]
    best = _arrays(old / "checkpoints" / "best.params")
    for name, w in best.items():  # every trained array is in the graph, unchanged
        assert any(i.shape == w.shape and np.array_equal(i, w) for i in inits), name


def test_an_old_run_resumes_from_its_stored_weights_and_momentum(old):
    """Extended by one epoch at a learning rate of 5e-32 (a multistep schedule from epoch 1: a
    resume may change the schedule), a gradient moves no weight, so SGD's update is the stored
    momentum alone: ``m ← 0.9 m; w ← w + m`` per step, i.e. after S steps
    ``w = w₀ + (0.9 + 0.9² + … + 0.9^S) m₀`` from the stored ``last.params`` and ``last.states``."""
    ckpts = old / "checkpoints"
    meta = json.loads((ckpts / "last.json").read_text())
    w0, m0 = _arrays(ckpts / "last.params"), _arrays(ckpts / "last.states")
    rows_before = (old / "metrics.jsonl").read_text()
    steps = meta["global_step"]
    assert meta["epoch"] == 1 and steps == 44 and meta["optimizer"]["num_update"] == steps

    _cli("finetune", "--resume", str(old), "--set", "train.epochs=2", "--set", "train.schedule.kind=multistep",
         "--set", "train.schedule.milestones=[1]", "--set", "train.schedule.factor=1e-30")

    after = json.loads((ckpts / "last.json").read_text())
    assert (after["epoch"], after["global_step"], after["optimizer"]["num_update"]) == (2, 2 * steps, 2 * steps)
    # the engine's callbacks (best checkpoint, average) write the record as the old code did, in its key
    # order, and continue the stored average and best: one more epoch's updates, best over both epochs
    assert list(after) == list(meta)
    assert (meta["ema"]["updates"], after["ema"]["updates"]) == (steps, 2 * steps)
    row2 = [json.loads(line) for line in (old / "metrics.jsonl").read_text().splitlines()][-1]
    assert row2["epoch"] == 2
    beat = row2["val_top1"] > meta["best"]["val_top1"]  # the recipe selects val_top1; ties keep the earlier
    assert after["best"]["epoch"] == 2 if beat else after["best"] == meta["best"]
    assert after["callbacks"]["csv"]["rows"][0] == meta["callbacks"]["csv"]["rows"][0]
    assert (old / "metrics.jsonl").read_text().startswith(rows_before)  # epoch 1's rows kept as written
    w1 = _arrays(ckpts / "last.params")
    decay = sum(0.9 ** k for k in range(1, steps + 1))
    by_shape = {m.shape: m for m in m0.values()}  # the tiny net's six arrays differ in shape
    assert len(by_shape) == len(w0) == 6
    for name, w in w0.items():
        m = by_shape[w.shape].astype(np.float64)
        want = w.astype(np.float64) + decay * m
        assert not np.array_equal(w1[name], w)  # it moved ...
        # ... by the stored momentum: S float32 additions of terms up to |w| + 9|m| each
        np.testing.assert_array_less(np.abs(w1[name] - want), f32_tol(np.abs(w) + 10 * np.abs(m), steps) + 1e-30)
    # the resume exported the run, as a finished finetune does
    assert list(RunFolder(old).export_dir.glob("*.onnx"))
