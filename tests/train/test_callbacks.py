"""Callbacks: every hook called in its order and count, their state resumed exactly; computed metrics
as train.select; the CSV logger."""
import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests import helpers

from gluontl.errors import Interrupted
from gluontl.metrics import Metric, register_metric, unregister_metric
from gluontl.recipe import parse_recipe
from gluontl.train.callbacks import Callback
from gluontl.train.loop import finetune

DATA = helpers.DIGITS_5_9


@pytest.fixture(scope="module")
def tiny_symbol(tmp_path_factory):
    return helpers.tiny_symbol(tmp_path_factory.mktemp("tiny"), deep=False)


def recipe(prefix, **train):
    return parse_recipe({"name": "t", "model": {"source": f"symbol:{prefix}", "input_shape": [3, 16, 16]},
                         "data": DATA, "export": {"formats": []},
                         "train": {"epochs": 3, "lr": 0.05, "log_every": 1, **train}})


class Recorder(Callback):
    """Every hook call as a tuple; the list is its state, so a resumed run's record continues the first's."""

    name = "recorder"

    def __init__(self, kill_after_epoch=None):
        self.calls, self.kill_after_epoch = [], kill_after_epoch

    def on_run_start(self, run):
        self.calls.append(("run_start",))

    def on_epoch_start(self, run, epoch):
        self.calls.append(("epoch_start", epoch))

    def on_step(self, run, step):
        assert np.isfinite(step.loss) and step.images > 0 and step.lr > 0
        self.calls.append(("step", step.epoch, step.batch, step.step))

    def on_validation(self, run, row):
        assert "val_top1" in row
        self.calls.append(("validation", row["epoch"]))

    def on_epoch_end(self, run, row):
        self.calls.append(("epoch_end", row["epoch"]))
        if row["epoch"] == self.kill_after_epoch:
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill` would: the loop stops at its next step boundary

    def on_run_end(self, run):
        self.calls.append(("run_end",))

    def on_exception(self, run, error):
        self.calls.append(("exception", type(error).__name__))

    def state_dict(self):
        return {"calls": [list(c) for c in self.calls]}

    def load_state_dict(self, state):
        self.calls = [tuple(c) for c in state["calls"]]


def expected(batches, epochs=3, validated=(1, 2, 3)):
    """The hook calls of an uninterrupted run, written out from the documented order."""
    calls, step = [("run_start",)], 0
    for e in range(epochs):
        calls.append(("epoch_start", e))
        for b in range(batches):
            step += 1
            calls.append(("step", e, b, step))
        if e + 1 in validated:
            calls.append(("validation", e + 1))
        calls.append(("epoch_end", e + 1))
    return calls + [("run_end",)]


def batches_per_epoch(result):
    return [r for r in result.metrics if "epoch" in r][0]["step"]


def test_every_hook_in_order_and_count(tiny_symbol, tmp_path):
    rec = Recorder()
    result = finetune(recipe(tiny_symbol), runs_root=tmp_path, quiet=True, callbacks=[rec])
    n = batches_per_epoch(result)
    assert n > 1 and rec.calls == expected(n)
    assert [r["epoch"] for r in result.metrics if "epoch" in r] == [1, 2, 3]


def test_val_every_2_validates_after_epochs_2_and_3(tiny_symbol, tmp_path):
    rec = Recorder()
    result = finetune(recipe(tiny_symbol, val_every=2), runs_root=tmp_path, quiet=True, callbacks=[rec])
    assert rec.calls == expected(batches_per_epoch(result), validated=(2, 3))


def test_a_run_killed_after_epoch_1_resumes_into_the_uninterrupted_order(tiny_symbol, tmp_path):
    full = Recorder()
    ref = finetune(recipe(tiny_symbol), runs_root=tmp_path / "a", quiet=True, callbacks=[full])
    first = Recorder(kill_after_epoch=1)
    with pytest.raises(Interrupted):
        finetune(recipe(tiny_symbol), runs_root=tmp_path / "b", quiet=True, callbacks=[first])
    assert first.calls[-1] == ("exception", "Interrupted")
    run_dir = tmp_path / "b" / "t"
    meta = json.loads((run_dir / "checkpoints" / "last.json").read_text())
    assert (meta["epoch"], meta["batch_in_epoch"]) == (1, 0)
    second = Recorder()
    resumed = finetune(recipe(tiny_symbol), runs_root=tmp_path / "b", resume=run_dir, quiet=True, callbacks=[second])
    # the state came back from the checkpoint: the first process's calls up to it, then the resumed run's
    n = batches_per_epoch(ref)
    epoch_1 = n + 4  # run_start, epoch_start, n steps, validation, epoch_end
    assert second.calls == expected(n)[:epoch_1] + [("run_start",)] + expected(n)[epoch_1:]
    assert full.calls == expected(n)
    strip = [{k: v for k, v in r.items() if k not in ("seconds", "img_per_s")} for r in resumed.metrics]
    assert strip == [{k: v for k, v in r.items() if k not in ("seconds", "img_per_s")} for r in ref.metrics]


KILLED = """
import os, signal, sys
from tests.train.test_callbacks import Recorder, recipe
from gluontl.train.loop import finetune

class Killed(Recorder):
    def on_epoch_start(self, run, epoch):
        if epoch == 1:  # epoch 1's checkpoint is on disk: die as kill -9 would, no handler, no hook
            os.kill(os.getpid(), signal.SIGKILL)
        super().on_epoch_start(run, epoch)

finetune(recipe(sys.argv[1]), runs_root=sys.argv[2], quiet=True, callbacks=[Killed()])
"""


def test_a_run_killed_9_after_epoch_1_resumes_into_the_uninterrupted_order(tiny_symbol, tmp_path):
    """A real kill (SIGKILL, in a child process) after epoch 1's checkpoint: no on_exception, and the
    resumed run's calls are the uninterrupted run's (the first process's from the checkpoint)."""
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", KILLED, tiny_symbol, str(tmp_path)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    run_dir = tmp_path / "t"
    meta = json.loads((run_dir / "checkpoints" / "last.json").read_text())
    assert (meta["epoch"], meta["batch_in_epoch"]) == (1, 0)
    second = Recorder()
    resumed = finetune(recipe(tiny_symbol), runs_root=tmp_path, resume=run_dir, quiet=True, callbacks=[second])
    n = batches_per_epoch(resumed)
    epoch_1 = n + 4  # run_start, epoch_start, n steps, validation, epoch_end
    assert second.calls == expected(n)[:epoch_1] + [("run_start",)] + expected(n)[epoch_1:]


def test_a_python_metric_picks_the_best_epoch(tiny_symbol, tmp_path):
    """val_wrong: the count of wrong answers, lower is better; the best checkpoint is the epoch
    with the fewest, computed here from the rows' val_top1 (same images, so wrong = n * (1 - top1))."""
    def wrong(outputs, labels):
        return float((outputs.argmax(axis=1) != labels).sum())

    register_metric(Metric("val_wrong", "min", task="classification", fmt=".0f", fn=wrong))
    try:
        result = finetune(recipe(tiny_symbol, select="val_wrong", lr=0.2), runs_root=tmp_path, quiet=True)
    finally:
        unregister_metric("val_wrong")
    rows = [r for r in result.metrics if "epoch" in r]
    n_val = round(rows[0]["val_wrong"] / (1 - rows[0]["val_top1"]))
    assert [r["val_wrong"] for r in rows] == [round(n_val * (1 - r["val_top1"])) for r in rows]
    assert len({r["val_wrong"] for r in rows}) > 1  # the direction decides which epoch is best
    best = min(rows, key=lambda r: (r["val_wrong"], r["epoch"]))
    assert result.best["epoch"] == best["epoch"] and result.best["select"] == "val_wrong"


def test_an_unknown_select_names_the_key_and_the_choices(tiny_symbol):
    from gluontl.errors import RecipeError

    with pytest.raises((RecipeError, ValueError)) as e:
        recipe(tiny_symbol, select="val_f1")
    assert "val_f1" in str(e.value) and "val_top1, val_balanced_acc, val_loss" in str(e.value)


def test_csv_logger_writes_every_epoch_row_once_across_a_resume(tiny_symbol, tmp_path):
    r = recipe(tiny_symbol, callbacks=[{"csv": {}}])
    part = finetune(r, runs_root=tmp_path, quiet=True, stop_after_steps=9)  # inside epoch 2
    assert part.stopped_early
    done = finetune(r, runs_root=tmp_path, resume=part.run_dir, quiet=True)
    with open(done.run_dir / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    epochs = [r for r in done.metrics if "epoch" in r]
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    assert [float(r["val_top1"]) for r in rows] == [e["val_top1"] for e in epochs]
