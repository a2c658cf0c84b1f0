"""data.sampler and train.loss through the training loop: a run stopped mid-epoch and resumed is the
uninterrupted run bit for bit (the sampler's order and the loss's class weights come back alike)."""
import json

import numpy as np
from tests import helpers

from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune

SAMPLED = {"classes": ["5", "6"], "sampler": "sqrt", "batch_size": 16}  # 18 steps an epoch: a cheap test


def recipe(prefix):
    r = helpers.tiny_recipe(prefix, data=SAMPLED, epochs=2, lr=0.05, log_every=1,
                            loss={"kind": "focal", "gamma": 2.0, "class_weights": "balanced"})
    return parse_recipe({**r, "surgery": {"drop_last": True, "head": {"classes": 2}}})


def test_resume_mid_epoch_with_sampler_and_focal_loss_is_exact(tiny_symbol, tmp_path):
    full = finetune(recipe(tiny_symbol), runs_root=tmp_path / "a", quiet=True)
    part = finetune(recipe(tiny_symbol), runs_root=tmp_path / "b", quiet=True, stop_after_steps=25)
    assert part.stopped_early
    assert json.loads((part.run_dir / "checkpoints" / "last.json").read_text())["batch_in_epoch"] == 7  # of epoch 1
    done = finetune(recipe(tiny_symbol), runs_root=tmp_path / "b", quiet=True, resume=part.run_dir)
    assert helpers.without_timings(done.metrics) == helpers.without_timings(full.metrics)
    a, b = helpers.checkpoint_params(full.run_dir), helpers.checkpoint_params(done.run_dir)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
