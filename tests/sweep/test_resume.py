"""A sweep killed mid-trial and resumed ends with all its trials, none run twice, the killed one
marked failed; a resume whose recipe changed is refused before anything is written."""
import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests import helpers
from tests.sweep import common

ROOT = Path(__file__).resolve().parents[2]
KILLED = """
import os, signal, sys
sys.path.insert(0, {root!r})
import gluontl
from gluontl.train.hooks import Callback

class KillInTrial5(Callback):
    def on_step(self, run, step):
        if run.run_dir.name.endswith("-t0005"):
            os.kill(os.getpid(), signal.SIGKILL)

gluontl.sweep({recipe!r}, {space!r}, trials=7, root={root_dir!r}, sampler="random", pruner="none",
              quiet=True, callbacks=[KillInTrial5()])
"""


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    prefix = helpers.tiny_symbol(tmp)
    recipe = common.write(tmp, common.recipe(prefix, epochs=1), "r.yaml")
    space = {"train.lr": {"log_uniform": [1e-3, 0.3]}}
    script = KILLED.format(root=str(ROOT), recipe=str(recipe), space=space, root_dir=str(tmp / "sweeps"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == -9, done.stderr[-2000:]
    return tmp, recipe, tmp / "sweeps" / "t"


@pytest.mark.parametrize("option, needles", [
    ("--recipe", ["differs from the one sweep", "recipe.yaml"]),
    ("--space", ["space given differs", "sweep.json"])])
def test_a_changed_recipe_or_space_is_refused(killed, capsys, option, needles):
    tmp, recipe, folder = killed
    changed = common.write(tmp, common.recipe(str(tmp / "tiny"), epochs=2) if option == "--recipe" else
                           {"train.lr": {"log_uniform": [1e-4, 0.3]}}, "changed.yaml")
    before = sorted(str(p) for p in tmp.rglob("*"))
    code, out, err = helpers.run_cli(capsys, "sweep", "--resume", str(folder), option, str(changed))
    helpers.assert_one_paragraph(code, out, err, [*needles, str(folder)])
    assert sorted(str(p) for p in tmp.rglob("*")) == before


def test_resume_finishes_without_duplicates(killed, capsys):
    tmp, recipe, folder = killed
    study = optuna.load_study(study_name=folder.name, storage=f"sqlite:///{folder / 'study.db'}")
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 5 + ["RUNNING"]
    code, out, err = helpers.run_cli(capsys, "sweep", "--resume", str(folder), "--recipe", str(recipe), "-q")
    assert code == 0, err
    study = optuna.load_study(study_name=folder.name, storage=f"sqlite:///{folder / 'study.db'}")
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE"] * 5 + ["FAIL"] + ["COMPLETE"] * 2  # 7 trials done, the killed one failed
    assert [t.number for t in study.trials] == list(range(8))
    runs = [t.user_attrs.get("run_dir") for t in study.trials if t.state.name == "COMPLETE"]
    assert len(set(runs)) == 7 and all((folder / r / "metrics.jsonl").is_file() for r in runs)
    rows = json.loads((folder / "trials.json").read_text())
    assert [r["state"] for r in rows] == states
