"""--jobs 2: two processes on one SQLite study run the trial count between them, none twice, and
read one feature cache."""
import json

import optuna

from tests import helpers
from tests.sweep import common


def test_two_processes_share_the_study_and_the_cache(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prefix = helpers.tiny_symbol(tmp_path)
    r = common.write(tmp_path, common.recipe(prefix, epochs=1), "r.yaml")
    s = common.write(tmp_path, {"train.lr": {"log_uniform": [1e-3, 0.3]}}, "s.yaml")
    code, out, err = helpers.run_cli(capsys, "sweep", "--recipe", str(r), "--space", str(s), "--trials", "4",
                                     "--jobs", "2", "--pruner", "none", "-q")
    assert code == 0, err
    folder = tmp_path / "sweeps" / "t"
    trials = optuna.load_study(study_name="t", storage=f"sqlite:///{folder / 'study.db'}").trials
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert 4 <= len(done) <= 5 and len(trials) == len(done)  # each process finishes the trial it started
    assert len({t.user_attrs["run_dir"] for t in done}) == len(done)
    assert len({t.params["train.lr"] for t in done}) == len(done)  # the processes' samplers are seeded apart
    log = [json.loads(line)["what"] for line in (folder / "features" / "passes.jsonl").read_text().splitlines()]
    assert sorted(log) == ["train view 0", "val"]
