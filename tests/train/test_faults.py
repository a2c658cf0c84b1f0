"""Numerical faults: NaN/Inf steps are skipped and counted; too many stop the run with the last
good checkpoint intact and a message saying what to try."""
import json

import mxnet as mx
import numpy as np
from tests import helpers
import pytest

from gluontl.errors import TrainError
from gluontl.recipe import parse_recipe
from gluontl.data import checkpoint
from gluontl.train.loop import finetune


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return helpers.tiny_symbol(tmp_path_factory.mktemp("nan"), deep=False)


def test_diverging_run_stops_with_last_good_checkpoint(tiny, tmp_path):
    # epoch 1 trains normally; from epoch 2 the lr is 1e30 and every loss is NaN/Inf
    r = parse_recipe(helpers.tiny_recipe(tiny, name="nan", epochs=3, lr=0.05, max_bad_steps=3,
                                         schedule={"kind": "multistep", "milestones": [1], "factor": 1e31}))
    with pytest.raises(TrainError) as e:
        finetune(r, runs_root=tmp_path, quiet=True)
    msg = str(e.value)
    assert "NaN/Inf" in msg and "lower train.lr" in msg.lower() and "clip_gradient" in msg
    run = tmp_path / "nan"
    meta = checkpoint.load(run / "checkpoints", "last")  # hashes verified
    assert meta["epoch"] == 1
    params = mx.nd.load(str(run / "checkpoints" / "last.params"))
    assert all(np.isfinite(v.asnumpy()).all() for v in params.values())
    epochs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if '"epoch"' in l]
    assert [row["epoch"] for row in epochs] == [1]


def test_a_lora_factor_gone_nan_behind_a_relu_stops_the_run_naming_it(tiny, tmp_path, capsys):
    """B of the conv's adapter set to NaN after step 1: the conv outputs NaN, its relu turns that into 0, so
    every loss stays finite (this run used to finish silently); the weights check stops it before
    any checkpoint is written, naming the parameter, and the CLI exits 2."""
    from gluontl.runfolder import checkpoint_files, file_sha256

    r = parse_recipe(helpers.tiny_recipe(tiny, name="lora", epochs=1, lr=0.01, export=[],
                                         rules=[{"type": ["Conv"], "adapter": {"rank": 2}}]))  # the one conv (names vary by process)
    finetune(r, runs_root=tmp_path, quiet=True, stop_after_steps=1)
    folder = tmp_path / "lora" / "checkpoints"
    meta = json.loads((folder / "last.json").read_text())
    path = checkpoint_files(folder, "last", meta)["params"]
    params = mx.nd.load(str(path))
    b = next(k for k in params if k.endswith(".lora_b.weight"))
    assert params[b].asnumpy().any()  # step 1 moved it
    params[b] = mx.nd.full(params[b].shape, np.nan)
    mx.nd.save(str(path), params)
    (folder / "last.json").write_text(json.dumps({**meta, "params_sha256": file_sha256(path)}))
    recorded = (folder / "last.json").read_text()
    code, out, err = helpers.run_cli(capsys, "finetune", "--resume", str(tmp_path / "lora"))
    assert code == 2 and "Traceback" not in err
    # A is named: its gradient Bᵀ·δ is NaN too, and it comes first
    assert f"Parameter '{b[:-len('lora_b.weight')]}lora_a.weight' holds NaN/Inf after step 44" in err and "train.lr" in err
    assert str(folder) in err
    flat = " ".join(err.split())  # the hint names the adapter rule and the factors' lr_mult (default 0.4 / (16/2)^2)
    assert "2 LoRA factors at lr_mult 0.00625 (decided by rule 1)" in flat and "lr_mult: 0.000625" in flat
    assert (folder / "last.json").read_text() == recorded  # the epoch's NaN weights were not checkpointed
    assert not (folder / "best.json").exists()
