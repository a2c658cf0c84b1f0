"""Numerical faults: NaN/Inf steps are skipped and counted; too many stop the run with the last
good checkpoint intact and a message saying what to try."""
import json

import mxnet as mx
import numpy as np
import helpers
import pytest

from gluontl.errors import TrainError
from gluontl.recipe import parse_recipe
from gluontl.data import checkpoint
from gluontl.train.loop import finetune

DATA = helpers.DIGITS_5_9


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return helpers.tiny_symbol(tmp_path_factory.mktemp("nan"), deep=False)


def test_diverging_run_stops_with_last_good_checkpoint(tiny, tmp_path):
    # epoch 1 trains normally; from epoch 2 the lr is 1e30 and every loss is NaN/Inf
    r = parse_recipe({"name": "nan", "model": {"source": f"symbol:{tiny}", "input_shape": [3, 16, 16]},
                      "data": DATA, "train": {"epochs": 3, "lr": 0.05, "max_bad_steps": 3,
                                              "schedule": {"kind": "multistep", "milestones": [1], "factor": 1e31}}})
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
