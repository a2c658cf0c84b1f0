"""Runs inside ``shared_features`` share their frozen-prefix features through one folder: the same
numbers as a run with its own cache, each (prefix, view) computed once, also by two processes at once."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gluontl.data.cache import prefix_passes, shared_features
from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune
from tests import helpers

ROOT = Path(__file__).resolve().parents[2]
FROZEN = [{"match": "conv0*", "grad_req": "null"}]


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    return helpers.tiny_symbol(tmp_path_factory.mktemp("net"))


def recipe(prefix, **train):
    return parse_recipe(helpers.tiny_recipe(prefix, rules=FROZEN, export=[], seed=0,
                                            **{"epochs": 2, "lr": 0.05, **train}))


def rows(result):
    return [{k: v for k, v in r.items() if k not in ("seconds", "img_per_s")} for r in result.metrics]


def test_shared_runs_train_as_an_own_cache_run(prefix, tmp_path):
    own = finetune(recipe(prefix), runs_root=tmp_path / "own", quiet=True)
    with shared_features(tmp_path / "shared") as folder:
        first = finetune(recipe(prefix), runs_root=tmp_path / "a", quiet=True)
        other_lr = finetune(recipe(prefix, lr=0.01), runs_root=tmp_path / "b", quiet=True)
        again = finetune(recipe(prefix), runs_root=tmp_path / "c", quiet=True)
    assert rows(first) == rows(own) and rows(again) == rows(own)  # bit for bit: the same features and batches
    assert rows(other_lr) != rows(own)
    log = [json.loads(line) for line in (folder / "passes.jsonl").read_text().splitlines()]
    assert [p["what"] for p in log] == ["train view 0", "val"]  # the first run computed, the others read
    assert prefix_passes(folder) == sum(p["rows"] for p in log)
    cards = [json.loads((r.run_dir / "summary.json").read_text())["feature_cache"] for r in (first, other_lr, again)]
    assert cards[0]["cache_fill_seconds"] > 0 and cards[1]["cache_fill_seconds"] == cards[2]["cache_fill_seconds"] == 0
    assert not (first.run_dir / "feature_cache").exists()  # nothing of the shared folder went to the runs
    assert len(list(folder.glob("*.npy"))) == 2  # and nothing of it was removed by them


CONCURRENT = """
import sys
sys.path.insert(0, {root!r})
from gluontl.data.cache import shared_features
from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune
with shared_features({folder!r}):
    finetune(parse_recipe({recipe!r}), runs_root={runs!r}, quiet=True)
"""


def test_two_processes_compute_each_view_once(prefix, tmp_path):
    data = helpers.tiny_recipe(prefix, rules=FROZEN, export=[], seed=0, epochs=1, lr=0.05)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", CONCURRENT.format(
        root=str(ROOT), folder=str(tmp_path / "shared"), recipe=data, runs=str(tmp_path / f"runs{i}"))],
        env=env, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()[-2000:]
    log = [json.loads(line) for line in (tmp_path / "shared" / "passes.jsonl").read_text().splitlines()]
    assert sorted(p["what"] for p in log) == ["train view 0", "val"]
    assert not list((tmp_path / "shared").glob(".*.tmp"))
    metrics = [[json.loads(line) for line in next((tmp_path / f"runs{i}").iterdir()).joinpath(
        "metrics.jsonl").read_text().splitlines()] for i in range(2)]
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("seconds", "img_per_s")} for r in rs]  # noqa: E731
    assert strip(metrics[0]) == strip(metrics[1])
    val = next(p["rows"] for p in log if p["what"] == "val")
    assert np.load(next((tmp_path / "shared").glob("*val.npy")), mmap_mode="r").shape[0] == val


def test_runs_with_more_views_add_only_the_views_missing(prefix, tmp_path):
    """View v is drawn the same whatever train.cache_views is: 2 then 4 views compute 4 views in all."""
    flip = {"train_transform": {"resize": 16, "flip": True}}
    with shared_features(tmp_path / "shared") as folder:
        for views in (2, 4):
            finetune(parse_recipe(helpers.tiny_recipe(prefix, rules=FROZEN, export=[], data=flip, seed=0, epochs=views,
                                                      lr=0.05, cache_views=views)),
                     runs_root=tmp_path / f"runs{views}", quiet=True)
    log = [json.loads(line)["what"] for line in (folder / "passes.jsonl").read_text().splitlines()]
    assert log == ["train view 0", "val", "train view 1", "train view 2", "train view 3"]


DEEPER = [{"match": ["conv0*", "conv1*"], "grad_req": "null"}]


def test_a_deeper_cut_is_made_from_a_shallower_cuts_features(prefix, tmp_path):
    """After a run cut at pool0, a run cut at pool1 runs only conv1 + pool1 on pool0's stored
    features: no image goes through the prefix again, and its features are the direct ones
    within float32 rounding of one 3x3x8 conv (helpers.f32_tol)."""
    def run(rules, folder, name):
        with shared_features(folder):
            finetune(parse_recipe(helpers.tiny_recipe(prefix, rules=rules, export=[], seed=0, epochs=1, lr=0.05)),
                     runs_root=tmp_path / name, quiet=True)

    run(FROZEN, tmp_path / "nested", "a")
    run(DEEPER, tmp_path / "nested", "b")
    run(DEEPER, tmp_path / "direct", "c")
    log = [json.loads(line) for line in (tmp_path / "nested" / "passes.jsonl").read_text().splitlines()]
    assert [(p["boundary"], p["what"], p.get("from")) for p in log] == [
        ("pool0_fwd", "train view 0", None), ("pool0_fwd", "val", None),
        ("pool1_fwd", "train view 0", "pool0_fwd"), ("pool1_fwd", "val", "pool0_fwd")]
    assert prefix_passes(tmp_path / "nested") == log[0]["rows"] + log[1]["rows"]
    direct = json.loads((tmp_path / "direct" / "passes.jsonl").read_text().splitlines()[0])
    assert "from" not in direct and prefix_passes(tmp_path / "direct") > 0
    for what in ("train_view_0", "val"):
        got = next(p for p in (tmp_path / "nested").glob(f"*-{what}.npy")
                   if np.load(p, mmap_mode="r").shape[1] == 16)
        want = next((tmp_path / "direct").glob(f"*-{what}.npy"))
        a, b = np.load(got), np.load(want)
        np.testing.assert_allclose(a, b, rtol=0, atol=helpers.f32_tol(float(np.abs(b).max()), 3 * 3 * 8, depth=2))
