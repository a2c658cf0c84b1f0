"""A run folder's records against damage (issue 36): a broken metrics row costs that row alone, a
resume keeps every complete row up to its checkpoint and says how many it skipped; each record
corrupted in turn (metrics, checkpoint record, plan, card, feature-cache record) and then resumed
and exported either keeps every complete record or is refused with nothing changed; and the
run-folder readers fuzzed (tests/fuzzing.py) with mutations of this real run's files."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from tests import helpers
import mxnet as mx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gluontl
from tests.fuzzing import fuzz, fuzz_settings, mutated
from gluontl.recipe import parse_recipe
from gluontl.train.logs import MetricsLog, read_metrics

STEPS = 60  # epoch 1 is 44 steps: the run has best (epoch 1) and last (step 60) checkpoints


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A real run stopped in its second epoch, with a frozen prefix (so a feature cache)."""
    d = tmp_path_factory.mktemp("records")
    sym = helpers.tiny_symbol(d, deep=True)
    r = parse_recipe({"name": "rec", "model": {"source": sym, "input_shape": [3, 16, 16]}, "data": helpers.DIGITS_5_9,
                      "rules": [{"match": "*conv0*", "grad_req": "null"}],
                      "train": {"epochs": 2, "log_every": 4, "cache_features": "on", "seed": 0},
                      "export": {"formats": ["onnx"]}}, origin="test")
    result = gluontl.finetune(r, runs_root=d / "runs", quiet=True, stop_after_steps=STEPS)
    assert result.stopped_early
    return result.run_dir


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to / "rec")
    return to / "rec"


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------- the finding: one broken row

def test_a_broken_middle_row_costs_that_row_alone(tmp_path, run):
    """On main a broken row in the middle ended the read: the resume kept the rows before it only."""
    folder = _copy(run, tmp_path)
    path = folder / "metrics.jsonl"
    rows = _rows(path)
    assert len(rows) >= 7
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = '{"step": 12, "loss": 0.5, "l\n'  # a damaged row, not the torn last line
    path.write_text("".join(lines))
    want = rows[:2] + rows[3:]
    assert read_metrics(path) == want
    log = MetricsLog(folder, resume_step=STEPS)
    log.close()
    assert log.skipped == 1 and log.rows == want and _rows(path) == want


def test_resume_keeps_every_complete_row_and_says_what_it_skipped(tmp_path, run, capsys):
    """Through the CLI as a user would: the resume exits 0, keeps every complete row up to its
    checkpoint (5 of 7 were lost on main), and names the count it skipped."""
    folder = _copy(run, tmp_path)
    path = folder / "metrics.jsonl"
    rows = _rows(path)
    lines = path.read_text().splitlines(keepends=True)
    lines[3] = "\x00\xff garbage\n"
    path.write_text("".join(lines), encoding="utf-8", errors="surrogateescape")
    code, out, err = helpers.run_cli(capsys, "finetune", "--resume", str(folder), "-q")
    assert code == 0, err
    assert "skipped 1 broken row" in out + err
    after = _rows(path)
    kept = [r for r in rows[:3] + rows[4:] if r["step"] <= STEPS]
    assert after[:len(kept)] == kept
    assert [r["step"] for r in after[len(kept):]] and all(r["step"] > STEPS for r in after[len(kept):])


# ---------------------------------------------------------------- nothing lost

CORRUPTIONS = {
    "metrics.jsonl": lambda b: b.replace(b"\n", b"\n\xff{not json\n", 3).replace(b"\n\xff{not json\n", b"\n", 2),
    "checkpoints/last.json": lambda b: b[: len(b) // 2],
    "plan.json": lambda b: b"[" * 100000,
    "preprocess.json": lambda b: b[:-20],
    "feature_cache/train_view_0.json": lambda b: b.replace(b'"rows": ', b'"rows": 1e999, "x": '),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_each_record_corrupted_then_resumed_and_exported_loses_nothing(tmp_path, run, capsys, name):
    folder = _copy(run, tmp_path)
    path = folder / name
    path.write_bytes(CORRUPTIONS[name](path.read_bytes()))
    before = _snapshot(folder)
    complete = [r for r in read_metrics(run / "metrics.jsonl") if r["step"] <= STEPS]
    code, out, err = helpers.run_cli(capsys, "finetune", "--resume", str(folder), "-q")
    assert code in (0, 2), err
    if code == 2:
        assert name in err or str(path) in err, err
        assert _snapshot(folder) == before, "a refused resume changed the run folder"
    else:
        assert _rows(folder / "metrics.jsonl")[:len(complete)] == complete
        assert json.loads((folder / "checkpoints" / "last.json").read_text())["epoch"] == 2
    code, out, err = helpers.run_cli(capsys, "export", str(folder), "--out", str(tmp_path / "export"))
    assert code == 0, err
    assert (tmp_path / "export" / "rec.onnx").is_file()


# ---------------------------------------------------------------- fuzzing the run-folder readers

@pytest.fixture(scope="module")
def seeds(run) -> dict[str, bytes]:
    return {name: (run / name).read_bytes() for name in
            ("metrics.jsonl", "preprocess.json", "recipe.yaml", "feature_cache/train_view_0.json",
             "feature_cache/train_view_0.npy")}


@pytest.mark.fuzz
@fuzz_settings(30)
@given(data=st.data())
def test_fuzz_metrics_log(tmp_path_factory, seeds, data):
    metrics = data.draw(mutated(seeds["metrics.jsonl"], (b'{"step": "x"}\n', b'[1, 2]\n', b'{"step": 1e999}\n')))
    fuzz("metrics", tmp_path_factory.getbasetemp(), {"metrics.jsonl": metrics}, data.draw(st.integers(-1, 100)))


@pytest.mark.fuzz
@fuzz_settings(30)
@given(data=st.data())
def test_fuzz_run_card(tmp_path_factory, seeds, data):
    card = data.draw(mutated(seeds["preprocess.json"], (b'"classes": 5', b'"steps": [{"op": "x"}]')))
    fuzz("card", tmp_path_factory.getbasetemp(), {"preprocess.json": card, "recipe.yaml": seeds["recipe.yaml"]})


@pytest.mark.fuzz
@fuzz_settings(30)
@given(data=st.data())
def test_fuzz_feature_cache_record(tmp_path_factory, seeds, data):
    """The run's record, for its first 3 rows (a 1.4 MB file per example would be all the time)."""
    record = dict(json.loads(seeds["feature_cache/train_view_0.json"]), rows=3)
    npy = seeds["feature_cache/train_view_0.npy"]
    header = npy.index(b"\n") + 1
    small = npy[:header].replace(b"(717,", b"(3,  ") + npy[header:header + 3 * 8 * 8 * 8 * 4]
    files = {"train.json": json.dumps(record).encode(), "train.npy": small}
    which = data.draw(st.sampled_from(sorted(files)))
    files[which] = data.draw(mutated(files[which], (b"'shape': (99999999999, 8)", b"'descr': '|O'")))
    fuzz("cache_record", tmp_path_factory.getbasetemp(), files, record)


@pytest.fixture(scope="module")
def checkpoint_files(tmp_path_factory) -> dict[str, bytes]:
    """A real checkpoint (gluontl's writer) of the Dense net the fuzz target restores into."""
    from gluontl.data import checkpoint

    folder = tmp_path_factory.mktemp("ckpt") / "checkpoints"
    folder.mkdir()
    mx.random.seed(0)
    net = mx.gluon.nn.Dense(2, in_units=3, prefix="dense0_")
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    x, y = mx.nd.array(np.random.RandomState(0).randn(4, 3)), mx.nd.array([0, 1, 0, 1])
    with mx.autograd.record():
        loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
    loss.backward()
    trainer.step(4)
    checkpoint.save(folder, "last", net, trainer, {"epoch": 1, "batch_in_epoch": 0, "global_step": 1})
    return {f"checkpoints/{p.name}": p.read_bytes() for p in folder.iterdir()}


@pytest.mark.fuzz
@fuzz_settings(30)
@given(data=st.data())
def test_fuzz_checkpoint(tmp_path_factory, checkpoint_files, data):
    """The record mutated, or a params/states file mutated with its hash recorded anew (whoever
    edits a run folder can do that): mx.nd.load meets arbitrary bytes."""
    files = dict(checkpoint_files)
    meta = json.loads(files["checkpoints/last.json"])
    kind = data.draw(st.sampled_from(["record", "params", "states"]))
    if kind == "record":
        files["checkpoints/last.json"] = data.draw(mutated(files["checkpoints/last.json"],
                                                           (b'"params_file": "../x"', b'"optimizer": 5')))
    else:
        name = f"checkpoints/{meta[f'{kind}_file']}"
        files[name] = data.draw(mutated(files[name]))
        meta[f"{kind}_sha256"] = hashlib.sha256(files[name]).hexdigest()
        files["checkpoints/last.json"] = json.dumps(meta).encode()
    fuzz("checkpoint", tmp_path_factory.getbasetemp(), files)
