"""A sweep end to end on a tiny recipe: trials share the frozen-prefix features (the prefix runs once
per image and view; a deeper cut starts from a shallower one's features), pruned trials stop at once, the report's files round-trip, and a seeded sweep
proposes the same trials with the same numbers."""
import csv
import json

import numpy as np
import optuna
import pytest

import gluontl
from gluontl.data.cache import shared_features
from gluontl.recipe import as_rules, load_recipe, parse_recipe
from gluontl.sweep.runner import _objective
from gluontl.sweep.space import parse_space
from tests import helpers
from tests.sweep import common


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    return helpers.tiny_symbol(tmp_path_factory.mktemp("net"))


@pytest.fixture(scope="module")
def swept(prefix, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweeps")
    return gluontl.sweep(common.recipe(prefix), common.SPACE, trials=4, root=root, sampler="random",
                         pruner="none", quiet=True)


def test_every_trial_reads_one_shared_cache_per_cut(swept):
    log = [json.loads(line) for line in (swept.folder / "features" / "passes.jsonl").read_text().splitlines()]
    cuts = {row["rules"] for row in swept.table}
    assert len(cuts) == 2  # the seeded random sampler picks both cut points in 4 trials
    # each (cut, what) computed once, whatever the number of trials using it
    assert sorted((p["boundary"], p["what"]) for p in log) == sorted(
        {(p["boundary"], p["what"]) for p in log})
    assert {p["boundary"] for p in log} == {"pool0_fwd", "pool1_fwd"}
    # the shallower cut (trial 0) ran the prefix; the deeper one ran conv1 + pool1 on its features
    assert [p.get("from") for p in log if p["boundary"] == "pool1_fwd"] == ["pool0_fwd", "pool0_fwd"]
    n_train, n_val = (next(p["rows"] for p in log if p["what"] == w) for w in ("train view 0", "val"))
    assert swept.prefix_passes == n_train + n_val  # once per (image, view) for the whole sweep
    for data in (swept.folder / "features").glob("*.npy"):  # complete files only, nothing half-written left
        assert np.load(data, mmap_mode="r").shape[0] in (n_train, n_val)


def test_report_round_trips(swept):
    rows = json.loads((swept.folder / "trials.json").read_text())
    assert rows == swept.table and [r["trial"] for r in rows] == [0, 1, 2, 3]
    with open(swept.folder / "trials.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [float(r["value"]) for r in table] == [r["value"] for r in rows]
    assert all(r["state"] == "COMPLETE" and r["seconds"] > 0 for r in rows)
    best = max(rows, key=lambda r: r["value"])
    assert swept.best_value == best["value"]
    # best.yaml is the base recipe with the best trial's values: a complete recipe that loads
    best_yaml = load_recipe(swept.folder / "best.yaml")
    assert best_yaml.train.lr == best["train.lr"] and best_yaml.rules == as_rules(json.loads(best["rules"]))
    assert best_yaml.digest("model", "data") == load_recipe(swept.folder / "recipe.yaml").digest("model", "data")
    # each trial keeps its metrics: its best val_top1 is the table's value
    for r in rows:
        metrics = [json.loads(line) for line in (swept.folder / r["run_dir"] / "metrics.jsonl").read_text().splitlines()]
        assert max(m["val_top1"] for m in metrics if "val_top1" in m) == r["value"]
    assert {p.name for p in (swept.folder / "plots").iterdir()} >= {"history.png", "parallel.png", "intermediate.png"}


def test_show_prints_the_table(swept, capsys):
    code, out, err = helpers.run_cli(capsys, "sweep", "--show", str(swept.folder))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["trial", "state", "val_top1"] and len(lines) == 5


def test_same_sweep_same_trials(prefix, swept, tmp_path):
    again = gluontl.sweep(common.recipe(prefix), common.SPACE, trials=4, root=tmp_path, sampler="random",
                          pruner="none", quiet=True)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in ("seconds", "run_dir")} for r in rows]  # noqa: E731
    assert strip(again.table) == strip(swept.table)


def test_pruned_trial_stops_at_its_first_validation(prefix, tmp_path):
    """ThresholdPruner(lower=2) prunes any accuracy: the trial ends after epoch 1 of 3, PRUNED."""
    recipe = parse_recipe(common.recipe(prefix))
    dims = parse_space({"train.lr": {"log_uniform": [1e-3, 0.1]}}, "s")
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=2.0))
    with shared_features(tmp_path / "features"):
        study.optimize(_objective(tmp_path, recipe, dims, True, ()), n_trials=1)
    trial = study.trials[0]
    assert trial.state == optuna.trial.TrialState.PRUNED
    assert list(trial.intermediate_values) == [1]
    metrics = [json.loads(line) for line in (tmp_path / trial.user_attrs["run_dir"] / "metrics.jsonl").read_text().splitlines()]
    assert max(m.get("epoch", 0) for m in metrics) == 1


def test_trial_0_is_the_recipe_as_written(prefix, swept, tmp_path):
    """The space holds the recipe's own values, so they are trial 0: its number is a plain run's
    (the shared cache gives the very features an own cache does), and the sweep is never worse."""
    from gluontl.train.loop import finetune

    row = swept.table[0]
    assert row["train.lr"] == 0.05 and row["rules"] == json.dumps(common.CUT1, sort_keys=True)
    plain = finetune(parse_recipe(common.recipe(prefix)), runs_root=tmp_path, quiet=True)
    assert row["value"] == plain.best["val_top1"]
    assert swept.best_value >= plain.best["val_top1"]
