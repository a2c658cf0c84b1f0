"""Interruption: SIGINT checkpoints and exits; kill -9 at any moment leaves a valid checkpoint;
resuming reaches the same final metrics as an uninterrupted run.

Signals are sent at points of observable progress (rows in metrics.jsonl), never after a
sleep, so each run interrupts the same moment of training whatever the machine's speed.
"""
import json
import os
import signal
import subprocess
import sys
import time

from tests import helpers
import pytest

RECIPE = """
name: tiny
model: {{source: "symbol:{prefix}", input_shape: [3, 16, 16]}}
data:
  source: demo:digits
  classes: ["5", "6", "7", "8", "9"]
  batch_size: 16
  train_transform: {{resize: 16}}
  val_transform: {{resize: 16}}
train: {{epochs: 4, lr: 0.05, log_every: 1}}
export: {{formats: []}}
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("intr")
    recipe = d / "tiny.yaml"
    recipe.write_text(RECIPE.format(prefix=helpers.tiny_symbol(d, deep=False)))
    ref = _run(recipe, d / "ref")
    assert ref.returncode == 0, ref.stderr
    return d, recipe, _epochs(d / "ref" / "tiny")


def _cmd(recipe, runs, resume=None):
    cmd = [sys.executable, "-m", "gluontl", "finetune", "--recipe", str(recipe), "--runs", str(runs), "-q"]
    return cmd + (["--resume", str(resume)] if resume else [])


def _run(recipe, runs, resume=None):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(_cmd(recipe, runs, resume), capture_output=True, text=True, env=env, timeout=300)


def _epochs(run_dir):
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows if "epoch" in r]


def _progress(run_dir):
    """(epochs completed, step rows logged since the last epoch row) per metrics.jsonl."""
    epochs, since = 0, 0
    path = run_dir / "metrics.jsonl"
    for line in (path.read_text().splitlines() if path.is_file() else []):
        try:
            row = json.loads(line)
        except ValueError:  # the line being written
            break
        epochs, since = (row["epoch"], 0) if "epoch" in row else (epochs, since + 1)
    return epochs, since


def _wait_for(pred, proc, what, timeout=300):
    """Poll until ``pred()``; fail loudly if the process ends first or ``timeout`` s pass."""
    end = time.monotonic() + timeout
    while not pred():
        code = proc.poll()
        assert code is None, f"the run exited ({code}) before {what}"
        assert time.monotonic() < end, f"no {what} within {timeout} s"
        time.sleep(0.02)


def _interrupt(recipe, runs, sig, steps=40):
    """Start a run, send ``sig`` after ``steps`` logged steps; (exit code, stderr)."""
    proc = subprocess.Popen(_cmd(recipe, runs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    _wait_for(lambda: _progress(runs / "tiny")[1] >= steps, proc, f"{steps} logged steps")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_sigint_checkpoints_and_resume_matches(setup):
    d, recipe, ref = setup
    runs = d / "sigint"
    code, err = _interrupt(recipe, runs, signal.SIGINT)
    assert code == 130, err  # 128 + SIGINT: a shell loop over runs stops too
    assert "Traceback" not in err
    assert f"Resume with: gluontl finetune --resume {runs / 'tiny'}" in " ".join(err.split())
    meta = json.loads((runs / "tiny" / "checkpoints" / "last.json").read_text())
    assert meta["global_step"] >= 40
    # resume with the run's own recipe.yaml (no --recipe), as the stop message says
    done = subprocess.run([sys.executable, "-m", "gluontl", "finetune", "--resume", str(runs / "tiny"), "-q"],
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert done.returncode == 0, done.stderr
    assert _epochs(runs / "tiny") == ref


def test_sigterm_checkpoints_and_exits_143(setup):
    d, recipe, _ = setup
    runs = d / "sigterm"
    code, err = _interrupt(recipe, runs, signal.SIGTERM, steps=5)
    assert code == 143, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    meta = json.loads((runs / "tiny" / "checkpoints" / "last.json").read_text())
    assert meta["global_step"] >= 5


# (epochs completed, steps into the next epoch) at which each attempt is killed: mid-epoch with
# an epoch-end checkpoint behind it; the moment an epoch's row is logged, i.e. while its
# checkpoints are being written; one step into an epoch, just after those writes.
KILL_AT = [(1, 5), (2, 0), (3, 1)]


def test_kill_9_at_progress_points_then_resume_matches(setup, tmp_path):
    from gluontl.data import checkpoint

    d, recipe, ref = setup
    runs = d / "kill"
    run_dir = runs / "tiny"
    for at in KILL_AT:
        resume = run_dir if (run_dir / "checkpoints" / "last.json").is_file() else None
        with open(tmp_path / "stderr", "w+") as err:
            proc = subprocess.Popen(_cmd(recipe, runs, resume), stdout=subprocess.DEVNULL, stderr=err,
                                    env=dict(os.environ, OMP_NUM_THREADS="1"))
            try:
                _wait_for(lambda: _progress(run_dir) >= at, proc, f"progress {at}")
            finally:
                proc.kill()
                code = proc.wait(timeout=60)
            err.seek(0)
            assert code == -signal.SIGKILL, (at, code, err.read())
        # whatever the moment, the checkpoint on disk is complete and self-consistent, and it is
        # the last epoch's (or, killed between an epoch's row and its checkpoint, the one before)
        meta = checkpoint.load(run_dir / "checkpoints", "last")
        epochs, steps_after = _progress(run_dir)
        assert meta["epoch"] in ((epochs,) if steps_after else (epochs - 1, epochs)), (at, meta)
    done = _run(recipe, runs, resume=run_dir)
    assert done.returncode == 0, done.stderr
    assert _epochs(run_dir) == ref
    assert not list((run_dir / "checkpoints").glob("*.tmp"))  # stale temp files of killed writes are gone
