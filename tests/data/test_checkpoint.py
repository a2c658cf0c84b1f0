"""Checkpoints: the JSON names and hashes (SHA-256) one generation of params/states files and
commits it atomically; a resume trusts nothing whose hash does not match, unpickles nothing at
all, and restores the exact arrays and optimizer state. ``TAG.params``/``TAG.states`` are hard
links to the committed generation for readers of the run folder."""
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from tests import helpers
from tests.helpers import assert_one_paragraph

from gluontl.errors import TrainError
from gluontl.naming import named_params
from gluontl.recipe import parse_recipe
from gluontl.data import checkpoint
from gluontl.train.loop import finetune


def _net(seed):
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(4, activation="relu"), mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((2, 5)))
    return net


def _trainer(net):
    return mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})


def _step(net, trainer, seed):
    rs = np.random.RandomState(seed)
    x, y = mx.nd.array(rs.randn(6, 5)), mx.nd.array(rs.randint(0, 3, 6))
    with mx.autograd.record():
        loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
    loss.backward()
    trainer.step(6)


def _values(net):
    return {n: e.param.data().asnumpy().copy() for n, e in named_params(net).items()}


@pytest.fixture
def saved(tmp_path):
    """A checkpoint of a net after two momentum steps (non-zero optimizer state)."""
    net = _net(1)
    trainer = _trainer(net)
    _step(net, trainer, 0)
    _step(net, trainer, 1)
    checkpoint.save(tmp_path, "last", net, trainer, {"epoch": 3, "global_step": 17})
    return tmp_path, net, trainer


def test_save_records_the_files_hashes_and_counters(saved):
    folder, net, _ = saved
    meta = json.loads((folder / "last.json").read_text())
    for kind in ("params", "states"):
        assert meta[f"{kind}_sha256"] == hashlib.sha256((folder / f"last.{kind}").read_bytes()).hexdigest()
    assert checkpoint.load(folder, "last") == meta
    assert meta["epoch"] == 3 and meta["global_step"] == 17
    on_disk = {k: v.asnumpy() for k, v in mx.nd.load(str(folder / "last.params")).items()}
    want = _values(net)
    assert list(on_disk) == list(want)  # structural names, as restore and weights: read them
    for n in want:
        np.testing.assert_array_equal(on_disk[n], want[n])
    assert not list(folder.glob("*.tmp")) and not list(folder.glob(".*.tmp"))  # no half-written leftovers
    named = {meta["params_file"], meta["states_file"]}
    assert sorted(p.name for p in folder.iterdir()) == sorted(["last.json", "last.params", "last.states", *named])
    for kind in ("params", "states"):
        assert os.path.samefile(folder / f"last.{kind}", folder / meta[f"{kind}_file"])


def test_a_new_save_replaces_the_previous_generation(saved):
    folder, net, trainer = saved
    first = json.loads((folder / "last.json").read_text())
    _step(net, trainer, 3)
    checkpoint.save(folder, "last", net, trainer, {"epoch": 4})
    second = checkpoint.load(folder, "last")
    assert second["params_file"] != first["params_file"] and second["epoch"] == 4
    assert not (folder / first["params_file"]).exists() and not (folder / first["states_file"]).exists()
    assert len(list(folder.iterdir())) == 5


class _Killed(BaseException):
    """Stands for the process dying (kill -9) at a given point of a save."""


def test_a_save_killed_before_its_commit_leaves_the_previous_checkpoint(saved, monkeypatch):
    """The JSON is the commit: dying after the new params/states are written but before the
    JSON leaves the previous checkpoint whole (its JSON, files and hashes), and the next save
    clears the orphaned generation."""
    folder, net, trainer = saved
    before = _values(net)
    meta = checkpoint.load(folder, "last")
    _step(net, trainer, 7)

    def die(*args, **kwargs):
        raise _Killed

    monkeypatch.setattr(checkpoint, "write_text", die)
    with pytest.raises(_Killed):
        checkpoint.save(folder, "last", net, trainer, {"epoch": 4})
    monkeypatch.undo()
    assert len(list(folder.glob("last.*.params"))) == 2  # the new generation, written but not committed
    assert checkpoint.load(folder, "last") == meta
    other = _net(2)
    checkpoint.restore_into(folder, "last", other, _trainer(other), mx.cpu())
    for n, v in before.items():
        np.testing.assert_array_equal(_values(other)[n], v, err_msg=n)
    checkpoint.save(folder, "last", net, trainer, {"epoch": 4})
    assert len(list(folder.glob("last.*.params"))) == 1 and checkpoint.load(folder, "last")["epoch"] == 4


def test_a_checkpoint_written_before_generations_still_loads(saved):
    """Runs saved by gluontl before generation files have a JSON without file names: their
    TAG.params/.states are the checkpoint."""
    folder, net, _ = saved
    meta = json.loads((folder / "last.json").read_text())
    for kind in ("params", "states"):
        named = folder / meta.pop(f"{kind}_file")
        (folder / f"last.{kind}").unlink()
        named.rename(folder / f"last.{kind}")
    (folder / "last.json").write_text(json.dumps(meta))
    assert checkpoint.load(folder, "last") == meta
    other = _net(2)
    checkpoint.restore_into(folder, "last", other, _trainer(other), mx.cpu())
    for n, v in _values(net).items():
        np.testing.assert_array_equal(_values(other)[n], v, err_msg=n)


@pytest.mark.parametrize("name", ["", "..", "sub/last.params", "/etc/passwd"])
def test_a_json_naming_no_file_of_its_folder_is_refused(saved, name):
    folder, _, _ = saved
    meta = json.loads((folder / "last.json").read_text())
    meta["params_file"] = name
    (folder / "last.json").write_text(json.dumps(meta))
    with pytest.raises(TrainError, match="as its params file, which is not a file of"):
        checkpoint.load(folder, "last")


@mx.optimizer.register
class _DictState(mx.optimizer.Optimizer):
    """Plain SGD keeping a dict as its state: nothing gluontl's optimizers keep, so not checkpointable."""

    def create_state(self, index, weight):
        return {"steps": mx.nd.zeros(1)}

    def update(self, index, weight, grad, state):
        self._update_count(index)
        state["steps"] += 1
        weight[:] -= self._get_lr(index) * self.rescale_grad * grad


def test_a_failed_save_before_the_commit_is_a_train_error_and_keeps_the_previous(saved):
    folder, net, trainer = saved
    meta = checkpoint.load(folder, "last")
    odd = mx.gluon.Trainer(net.collect_params(), "_dictstate", {"learning_rate": 0.1})
    _step(net, odd, 4)
    with pytest.raises(TrainError, match=r"^The _dictstate optimizer keeps a dict as its state, which gluontl cannot"):
        odd_files = sorted(folder.iterdir())
        checkpoint.save(folder, "last", net, odd, {"epoch": 9})
    assert sorted(folder.iterdir()) == odd_files  # refused before writing anything
    assert checkpoint.load(folder, "last") == meta
    with pytest.raises(TrainError, match=r"Cannot write '.*nowhere.*last\.[0-9a-f]+\.params'"):
        checkpoint.save(folder / "nowhere", "last", net, trainer, {"epoch": 9})


def test_a_json_naming_a_file_outside_its_folder_is_refused(saved):
    folder, _, _ = saved
    meta = json.loads((folder / "last.json").read_text())
    (folder.parent / "elsewhere.states").write_bytes((folder / meta["states_file"]).read_bytes())
    meta["states_file"] = "../elsewhere.states"
    (folder / "last.json").write_text(json.dumps(meta))
    with pytest.raises(TrainError, match=r"names '\.\./elsewhere\.states' as its states file"):
        checkpoint.load(folder, "last")
    (folder / "last.json").write_text("[1, 2]")
    with pytest.raises(TrainError, match="not a checkpoint record"):
        checkpoint.load(folder, "last")


def test_save_removes_temp_files_left_by_a_killed_write(saved):
    folder, net, trainer = saved
    stale = [folder / ".last.params.abc123.tmp", folder / ".best.states.x.tmp"]
    for p in stale:
        p.write_bytes(b"half a file")
    keep = folder / "notes.tmp"  # not one of ours (no leading dot)
    keep.write_text("user file")
    checkpoint.save(folder, "best", net, trainer, {"epoch": 1})
    assert not any(p.exists() for p in stale)
    assert keep.read_text() == "user file"
    assert checkpoint.load(folder, "best")["epoch"] == 1


def test_restore_into_gives_the_same_next_step(saved):
    # the parameters and the momentum buffers both come back: one more step from the restored
    # copy lands exactly where one more step from the original lands
    folder, net, trainer = saved
    other = _net(2)
    assert any(not np.array_equal(a, b) for a, b in zip(_values(other).values(), _values(net).values()))
    other_trainer = _trainer(other)
    checkpoint.load(folder, "last")
    checkpoint.restore_into(folder, "last", other, other_trainer, mx.cpu())
    for n, v in _values(net).items():
        np.testing.assert_array_equal(_values(other)[n], v, err_msg=n)
    _step(net, trainer, 2)
    _step(other, other_trainer, 2)
    for n, v in _values(net).items():
        np.testing.assert_array_equal(_values(other)[n], v, err_msg=n)


def test_a_save_right_after_a_step_holds_that_steps_batchnorm_statistics(tmp_path):
    # oneDNN's BatchNorm updates its running statistics in backward, which a hybridized block's
    # engine ops do not declare as a write: a copy right after the step read them one update
    # behind (a resumed detection run lagged its uninterrupted twin by one BN update)
    mx.random.seed(0)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(32, 3, padding=1, in_channels=8), mx.gluon.nn.BatchNorm(in_channels=32),
            mx.gluon.nn.Activation("relu"))
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = _trainer(net)
    x = mx.nd.array(np.random.RandomState(0).randn(8, 8, 32, 32))
    with mx.autograd.record():
        loss = net(x).mean()
    loss.backward()
    trainer.step(8)
    checkpoint.save(tmp_path, "last", net, trainer, {})
    saved = mx.nd.load(str(tmp_path / "last.params"))
    mx.nd.waitall()
    for name in ("1.running_mean", "1.running_var"):
        now = named_params(net)[name].param.data().asnumpy()
        assert not np.array_equal(now, np.full(32, 1.0 if name.endswith("var") else 0.0)), "the step updated it"
        np.testing.assert_array_equal(saved[name].asnumpy(), now, err_msg=name)


def test_restore_into_without_trainer_sets_only_parameters(saved):
    folder, net, _ = saved
    other = _net(2)
    checkpoint.restore_into(folder, "last", other, None, mx.cpu())
    for n, v in _values(net).items():
        np.testing.assert_array_equal(_values(other)[n], v, err_msg=n)


def test_restore_into_refuses_another_models_checkpoint(saved):
    folder, _, _ = saved
    bigger = mx.gluon.nn.HybridSequential()
    bigger.add(mx.gluon.nn.Dense(4), mx.gluon.nn.Dense(3), mx.gluon.nn.Dense(2), mx.gluon.nn.Dense(2))
    bigger.initialize()
    bigger(mx.nd.zeros((1, 5)))
    before = _values(bigger)
    # four names lack; the message names the first three
    with pytest.raises(TrainError, match=rf"^Checkpoint '{folder / 'last'}.params' lacks "
                                         r"\['2\.bias', '2\.weight', '3\.bias'\]: it belongs to another model\.$"):
        checkpoint.restore_into(folder, "last", bigger, None, mx.cpu())
    for n, v in before.items():  # refused before touching anything
        np.testing.assert_array_equal(_values(bigger)[n], v)


def test_a_failed_commit_is_a_train_error_and_leaves_no_checkpoint(tmp_path):
    # a folder where the JSON should go makes the commit fail
    net = _net(1)
    trainer = _trainer(net)
    _step(net, trainer, 0)
    (tmp_path / "last.json").mkdir()
    with pytest.raises(TrainError, match=rf"Cannot write '{tmp_path / 'last.json'}'"):
        checkpoint.save(tmp_path, "last", net, trainer, {"epoch": 1})
    with pytest.raises(TrainError):
        checkpoint.load(tmp_path, "last")
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("kind", ["params", "states"])
def test_a_failed_link_after_the_commit_is_a_train_error_but_the_checkpoint_holds(tmp_path, kind):
    # TAG.params/.states are conveniences written after the commit: when one cannot be written
    # the save says so, and the committed checkpoint is still whole
    net = _net(1)
    trainer = _trainer(net)
    _step(net, trainer, 0)
    (tmp_path / f"last.{kind}").mkdir()
    with pytest.raises(TrainError, match=rf"Cannot write '{tmp_path / f'last.{kind}'}'"):
        checkpoint.save(tmp_path, "last", net, trainer, {"epoch": 1})
    assert checkpoint.load(tmp_path, "last")["epoch"] == 1
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("kind", ["params", "states"])
@pytest.mark.parametrize("damage", ["modified", "replaced", "deleted"])
def test_load_refuses_files_that_do_not_match_their_hash(saved, kind, damage):
    folder, _, _ = saved
    path = folder / json.loads((folder / "last.json").read_text())[f"{kind}_file"]
    if damage == "modified":  # one byte
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 1
        path.write_bytes(bytes(data))
    elif damage == "replaced":  # a valid file of the same kind from another run
        net = _net(3)
        trainer = _trainer(net)
        _step(net, trainer, 5)
        other = folder / "other"
        other.mkdir()
        checkpoint.save(other, "last", net, trainer, {"epoch": 3, "global_step": 17})
        path.write_bytes((other / f"last.{kind}").read_bytes())
    else:
        path.unlink()
    with pytest.raises(TrainError, match=rf"'{path}' does not match the hash recorded in 'last.json'"):
        checkpoint.load(folder, "last")


def test_load_refuses_a_missing_or_unreadable_json(saved):
    folder, _, _ = saved
    with pytest.raises(TrainError, match=r"No checkpoint 'best' in .*'best.json' is missing"):
        checkpoint.load(folder, "best")
    (folder / "last.json").write_text('{"epoch": 3, "params_sha')
    with pytest.raises(TrainError, match=r"last.json': it is not valid JSON"):
        checkpoint.load(folder, "last")
    (folder / "last.json").write_text("{}")  # no recorded hashes: nothing can match
    with pytest.raises(TrainError, match="does not match the hash"):
        checkpoint.load(folder, "last")


class _Payload:
    """Unpickling this creates ``marker``: proof that a file was unpickled."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_resume_unpickles_no_states_file_whose_hash_does_not_match(tmp_path):
    # docs/classification.md's promise: a resume loads nothing it did not write. An attacker (or a copy
    # from another run) replaces last.states with a pickle that acts when loaded.
    tiny = helpers.tiny_symbol(tmp_path, deep=False)
    r = parse_recipe(helpers.tiny_recipe(tiny, name="ckpt", epochs=1, lr=0.05))
    part = finetune(r, runs_root=tmp_path / "runs", quiet=True, stop_after_steps=2)
    states = part.run_dir / "checkpoints" / "last.states"  # a hard link to the committed file
    marker = tmp_path / "unpickled"
    states.write_bytes(pickle.dumps(_Payload(marker)))
    pickle.loads(pickle.dumps(_Payload(tmp_path / "probe")))  # the payload does act when unpickled
    assert (tmp_path / "probe").exists()
    with pytest.raises(TrainError, match=r"last\.[0-9a-f]+\.states' does not match the hash"):
        finetune(r, runs_root=tmp_path / "runs", quiet=True, resume=part.run_dir)
    assert not marker.exists()


def test_link_copies_where_a_hard_link_cannot_be_made(tmp_path, monkeypatch):
    """On file systems without hard links (or across devices) TAG.params is a copy."""
    other = helpers.other_file_system(tmp_path, monkeypatch)
    src = other / "generation.params"
    try:
        src.write_bytes(b"generation bytes")
        dst = tmp_path / "last.params"
        dst.write_bytes(b"old")
        checkpoint._link(src, dst)
        assert dst.read_bytes() == b"generation bytes" and not os.path.samefile(src, dst)
    finally:
        shutil.rmtree(other)


def _steps(net, trainer, seeds, ctxs):
    """Momentum-style steps over a batch split across ``ctxs`` (as the loop splits it)."""
    for seed in seeds:
        rs = np.random.RandomState(seed)
        xs = mx.gluon.utils.split_and_load(mx.nd.array(rs.randn(6, 5)), ctxs)
        ys = mx.gluon.utils.split_and_load(mx.nd.array(rs.randint(0, 3, 6)), ctxs)
        with mx.autograd.record():
            losses = [mx.gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y) for x, y in zip(xs, ys)]
        mx.autograd.backward(losses)
        trainer.step(6)


OPTIMIZERS = [("sgd", {"momentum": 0.9}), ("sgd", {"momentum": 0.0}), ("nag", {"momentum": 0.9}),
              ("adam", {}), ("adamw", {"wd": 0.01})]


@pytest.mark.parametrize("ctxs, on_kvstore", [([mx.cpu(0)], None), ([mx.cpu(0), mx.cpu(1)], None),
                                              ([mx.cpu(0), mx.cpu(1)], False)],
                         ids=["one-context", "two-contexts", "two-contexts-local-updaters"])
@pytest.mark.parametrize("name, options", OPTIMIZERS, ids=[f"{n}-{o}" for n, o in OPTIMIZERS])
def test_the_optimizer_state_round_trips_exactly(tmp_path, name, options, ctxs, on_kvstore):
    """Arrays (momentum, Adam's moments), update counts and num_update come back as they were
    (two contexts: the local kvstore's updater, or one updater per context as in a distributed
    worker), so the next steps are bit-identical."""
    import gluontl.train.optim  # noqa: F401  (registers adamw)

    def trainer_for(net):
        return mx.gluon.Trainer(net.collect_params(), name, {"learning_rate": 0.05, **options},
                                update_on_kvstore=on_kvstore)

    net = _net(1)
    net.collect_params().reset_ctx(ctxs)
    trainer = trainer_for(net)
    _steps(net, trainer, [0, 1, 2], ctxs)
    checkpoint.save(tmp_path, "last", net, trainer, {"epoch": 1})
    on_disk = mx.nd.load(str(tmp_path / "last.states"))
    record = json.loads((tmp_path / "last.json").read_text())["optimizer"]
    assert record["optimizer"] == name and record["num_update"] == 3
    assert record["update_counts"]["0"] == {str(i): 3 for i in range(4)}
    assert len(on_disk or {}) == {"sgd": 4 if options.get("momentum") else 0, "nag": 4}.get(name, 8)
    other = _net(2)
    other.collect_params().reset_ctx(ctxs)
    other_trainer = trainer_for(other)
    checkpoint.restore_into(tmp_path, "last", other, other_trainer, mx.cpu())
    arrays, restored = checkpoint.optimizer_state(other_trainer)
    assert restored == record
    for key, value in (on_disk or {}).items():
        np.testing.assert_array_equal(arrays[key].asnumpy(), value.asnumpy(), err_msg=key)
    _steps(net, trainer, [3, 4], ctxs)
    _steps(other, other_trainer, [3, 4], ctxs)
    for n, v in _values(net).items():
        np.testing.assert_array_equal(_values(other)[n], v, err_msg=n)
        for copy in named_params(other)[n].param.list_data():
            np.testing.assert_array_equal(copy.asnumpy(), v, err_msg=n)


@pytest.mark.parametrize("edit, reason", [
    (lambda r: r.update(optimizer="adam"), r"is for optimizer 'adam' \(format 1\) where this run uses 'sgd' "
                                           r"\(format 1\)"),
    (lambda r: r["states"].update({"4": "3"}), "names parameter index '4', but the trainer has 4 parameters"),
    (lambda r: r["states"].update({"²": "0"}), "names parameter index '²', but the trainer has 4 parameters"),
    (lambda r: r["update_counts"].update({"cpu": {}}), "names device 'cpu'"),
    (lambda r: r["states"].update({"0": "1"}), r"gives parameter .*_bias \(float32\[4\]\) the state "
                                                r"array '1': float32\[4, 5\]"),
    (lambda r: r["states"].update({"0": "nowhere"}), "gives parameter .* the state array 'nowhere': nothing"),
    (lambda r: r["states"].update({"0": {"0": "0"}}), r"gives parameter .* the state array \{'0': '0'\}: nothing"),
    (lambda r: r["update_counts"]["0"].update({"0": -1}), "holds -1 where an update count belongs"),
    (lambda r: r.update(num_update="3"), "holds '3' where an update count belongs"),
    (lambda r: r.update(states=[]), "lacks its update_counts or states tables"),
], ids=["optimizer", "index", "superscript-index", "device", "shape", "missing-array", "dict-state", "negative-count", "string-count", "states-list"])
def test_an_edited_optimizer_record_is_refused_before_anything_changes(saved, edit, reason):
    folder, _, _ = saved
    meta = json.loads((folder / "last.json").read_text())
    edit(meta["optimizer"])
    (folder / "last.json").write_text(json.dumps(meta))
    other = _net(2)
    before = _values(other)
    with pytest.raises(TrainError, match=rf"^Checkpoint '.*last\.json' has an optimizer record that {reason}; it "
                                         rf"was edited by hand .* --init-from\.$"):
        checkpoint.restore_into(folder, "last", other, _trainer(other), mx.cpu())
    for n, v in before.items():
        np.testing.assert_array_equal(_values(other)[n], v)


def _run_folder(tmp_path):
    """A run stopped after two steps, with its recipe."""
    tiny = helpers.tiny_symbol(tmp_path, deep=False)
    r = parse_recipe(helpers.tiny_recipe(tiny, name="ckpt", epochs=1, lr=0.05, export=[]))
    return r, finetune(r, runs_root=tmp_path / "runs", quiet=True, stop_after_steps=2).run_dir


def _replace_states(folder, data, record=True):
    """``last.states`` replaced by ``data`` with the JSON's hash rewritten to match: what whoever
    hands over a run folder can do. ``record=False`` also drops the optimizer record, as in the
    checkpoints of gluontl before it stopped pickling. The replaced file's path."""
    meta = json.loads((folder / "last.json").read_text())
    (folder / meta["states_file"]).unlink()
    (folder / meta["states_file"]).write_bytes(data)
    meta["states_sha256"] = hashlib.sha256(data).hexdigest()
    if not record:
        meta.pop("optimizer")
    (folder / "last.json").write_text(json.dumps(meta))
    return folder / meta["states_file"]


@pytest.mark.parametrize("record", [False, True], ids=["old-format", "forged-record"])
def test_a_poisoned_run_folder_runs_nothing_on_resume(tmp_path, record):
    """The issue's attack: a pickle that acts when loaded, its hash rewritten into last.json.
    Whether the JSON looks like an old checkpoint (no optimizer record) or a new one, gluontl
    never unpickles it: nothing happens, exit 2, one paragraph."""
    _, run_dir = _run_folder(tmp_path)
    marker = tmp_path / "unpickled"
    _replace_states(run_dir / "checkpoints", pickle.dumps(_Payload(marker)), record)
    pickle.loads(pickle.dumps(_Payload(tmp_path / "probe")))  # the payload does act when unpickled
    assert (tmp_path / "probe").exists()
    done = subprocess.run([sys.executable, "-m", "gluontl", "finetune", "--resume", str(run_dir), "-q"],
                          capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert not marker.exists()
    assert_one_paragraph(done.returncode, done.stdout, done.stderr,
                          ["is not an MXNet array file"] if record else ["as a Python pickle", "--init-from"])


def test_an_old_pickled_checkpoint_is_refused_but_its_weights_start_a_new_run(tmp_path):
    """A genuine checkpoint of gluontl before this format (MXNet's pickled Trainer states) is
    not resumed; the weights-only start its message offers works."""
    from gluontl.train.runs import init_from

    r, run_dir = _run_folder(tmp_path)
    net = _net(1)
    trainer = _trainer(net)
    _step(net, trainer, 0)
    trainer.save_states(str(tmp_path / "pickled.states"))
    _replace_states(run_dir / "checkpoints", (tmp_path / "pickled.states").read_bytes(), record=False)
    with pytest.raises(TrainError, match=rf"as a Python pickle .* `gluontl finetune --recipe {run_dir}/recipe\.yaml "
                                         rf"--init-from {run_dir}/last`\.$"):
        finetune(r, runs_root=tmp_path / "runs", quiet=True, resume=run_dir)
    start = finetune(init_from(r, run_dir / "last"), runs_root=tmp_path / "runs", quiet=True, stop_after_steps=1)
    assert start.run_dir != run_dir and start.stopped_early


def test_a_trainer_saved_before_its_first_step_round_trips(tmp_path):
    """No state and counts of zero (num_update 0) are a valid record, not a damaged one."""
    net = _net(1)
    trainer = _trainer(net)
    checkpoint.save(tmp_path, "last", net, trainer, {})
    record = json.loads((tmp_path / "last.json").read_text())["optimizer"]
    assert (record["num_update"], record["states"]) == (0, {})
    other = _net(2)
    other_trainer = _trainer(other)
    checkpoint.restore_into(tmp_path, "last", other, other_trainer, mx.cpu())
    _step(net, trainer, 0)
    _step(other, other_trainer, 0)
    for n, v in _values(net).items():
        np.testing.assert_array_equal(_values(other)[n], v, err_msg=n)


@pytest.mark.parametrize("content, reason", [
    (b"\x80\x04not arrays", r"is not an MXNet array file \(.*Invalid NDArray file format.*\); it was written by "
                            r"something other than gluontl\. Refusing it\.$"),
    (None, r"holds unnamed arrays; gluontl writes named ones\. Refusing it\.$"),
], ids=["not-arrays", "unnamed-arrays"])
def test_a_states_file_that_is_no_named_array_file_is_refused(saved, tmp_path, content, reason):
    folder, _, _ = saved
    if content is None:
        mx.nd.save(str(tmp_path / "list"), [mx.nd.zeros(3)])
        content = (tmp_path / "list").read_bytes()
    states = _replace_states(folder, content)
    other = _net(2)
    with pytest.raises(TrainError, match=rf"^Checkpoint file '{states}' {reason}"):
        checkpoint.restore_into(folder, "last", other, _trainer(other), mx.cpu())
