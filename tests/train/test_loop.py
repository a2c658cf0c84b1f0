"""The fine-tuning loop: determinism, resume, accumulation, frozen backbones, multi-context."""
import json

import mxnet as mx
import numpy as np
import pytest
from tests import helpers
from gluoncv.model_zoo import get_model

from gluontl.naming import named_params
from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune

DATA = helpers.DIGITS_5_9


def recipe(prefix, **train):
    return parse_recipe(helpers.tiny_recipe(prefix, **{"epochs": 2, "lr": 0.05, "log_every": 1, **train}))


def initial_params(prefix):
    return {k.split(":", 1)[1]: v.asnumpy() for k, v in mx.nd.load(f"{prefix}-0000.params").items()}


# The tiny net's largest sum: a conv weight's gradient over 16 images x 16 x 16 positions.
GRAD_ERR = helpers.f32_tol(1.0, 16 * 16 * 16)


def test_same_seed_gives_identical_metrics(tiny_symbol, tmp_path):
    a = finetune(recipe(tiny_symbol), runs_root=tmp_path, quiet=True)
    b = finetune(recipe(tiny_symbol), runs_root=tmp_path, quiet=True)
    assert a.run_dir != b.run_dir
    assert helpers.without_timings(a.metrics) == helpers.without_timings(b.metrics)
    on_disk = [json.loads(l) for l in (a.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in on_disk if "epoch" in r] == [1, 2]
    assert {"loss", "lr", "img_per_s"} <= set(on_disk[0]) and {"val_top1", "val_loss", "train_loss"} <= set(on_disk[-1])
    c = finetune(recipe(tiny_symbol, seed=1), runs_root=tmp_path, quiet=True)
    assert helpers.without_timings(c.metrics) != helpers.without_timings(a.metrics)


def test_resume_mid_epoch_reaches_the_same_result(tiny_symbol, tmp_path):
    full = finetune(recipe(tiny_symbol), runs_root=tmp_path / "a", quiet=True)
    part = finetune(recipe(tiny_symbol), runs_root=tmp_path / "b", quiet=True, stop_after_steps=13)
    assert part.stopped_early
    meta = json.loads((part.run_dir / "checkpoints" / "last.json").read_text())
    assert meta["batch_in_epoch"] == 13 and meta["epoch"] == 0
    part = finetune(recipe(tiny_symbol), runs_root=tmp_path / "b", quiet=True, resume=part.run_dir,
                    stop_after_steps=40)  # stops again in epoch 2
    done = finetune(recipe(tiny_symbol), runs_root=tmp_path / "b", quiet=True, resume=part.run_dir)
    assert helpers.without_timings(done.metrics) == helpers.without_timings(full.metrics)
    a, b = helpers.checkpoint_params(full.run_dir), helpers.checkpoint_params(done.run_dir)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_resume_refuses_a_changed_recipe_and_tampered_files(tiny_symbol, tmp_path):
    from gluontl.errors import TrainError
    part = finetune(recipe(tiny_symbol), runs_root=tmp_path, quiet=True, stop_after_steps=3)
    with pytest.raises(TrainError, match=r"recipe differs .*train\.lr: 0\.05 -> 0\.1"):
        finetune(recipe(tiny_symbol, lr=0.1), runs_root=tmp_path, quiet=True, resume=part.run_dir)
    meta_path = part.run_dir / "checkpoints" / "last.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "recipe_digest": "0" * 16}))  # as an older gluontl's digest
    with pytest.raises(TrainError, match=r"settings agree: the run was written by an older gluontl.*--init-from"):
        finetune(recipe(tiny_symbol), runs_root=tmp_path, quiet=True, resume=part.run_dir)
    meta_path.write_text(json.dumps(meta))
    p = part.run_dir / "checkpoints" / "last.params"
    p.write_bytes(p.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(TrainError, match="does not match the hash"):
        finetune(recipe(tiny_symbol), runs_root=tmp_path, quiet=True, resume=part.run_dir)


def test_accumulation_matches_the_double_batch(tiny_symbol, tmp_path):
    # 30 optimizer steps each: the same 480 images, as 30 batches of 16 or 60 batches of 8
    big = finetune(recipe(tiny_symbol, epochs=1, momentum=0.0), runs_root=tmp_path / "a", quiet=True,
                   stop_after_steps=30)
    small = parse_recipe({**recipe(tiny_symbol).model_dump(mode="json"),
                          "data": {**DATA, "batch_size": 8},
                          "train": {"epochs": 1, "lr": 0.05, "momentum": 0.0, "accumulate": 2, "log_every": 1}})
    acc = finetune(small, runs_root=tmp_path / "b", quiet=True, stop_after_steps=30)
    a, b, start = helpers.checkpoint_params(big.run_dir), helpers.checkpoint_params(acc.run_dir), initial_params(tiny_symbol)
    assert all(not np.array_equal(a[k], start[k]) for k in a)
    helpers.assert_same_training(a, b, start, steps=30, grad_err=GRAD_ERR)


def test_two_cpu_contexts_match_one(tiny_symbol, tmp_path):
    # a few steps: float summation order differs between one and two contexts, and training amplifies it
    one = finetune(recipe(tiny_symbol, epochs=1), runs_root=tmp_path / "a", quiet=True, stop_after_steps=3)
    # cpu:1,2 leaves out the default context, as gpu:0,1 does: nothing may read a parameter there
    two = finetune(recipe(tiny_symbol, epochs=1, ctx="cpu:1,2"), runs_root=tmp_path / "b", quiet=True,
                   stop_after_steps=3)
    a, b = helpers.checkpoint_params(one.run_dir), helpers.checkpoint_params(two.run_dir)
    helpers.assert_same_training(a, b, initial_params(tiny_symbol), steps=3, grad_err=GRAD_ERR)


def test_frozen_backbone_run_keeps_every_frozen_array(tmp_path):
    net = get_model("resnet18_v1", classes=5)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 16, 16)))
    with mx.autograd.record():  # give BN non-trivial statistics
        net(mx.nd.random.uniform(shape=(8, 3, 16, 16)))
    weights = tmp_path / "w.params"
    net.save_parameters(str(weights))
    r = parse_recipe({"name": "f", "model": {"source": "zoo:resnet18_v1", "weights": str(weights),
                                             "input_shape": [3, 16, 16], "restore": {"only": ["features.*"]}},
                      "surgery": {"head": {"classes": 5}}, "rules": [{"preset": "freeze_all_but_head"}],
                      "data": DATA, "train": {"epochs": 1, "lr": 0.1}})
    res = finetune(r, runs_root=tmp_path, quiet=True)
    before = {k: v.asnumpy() for k, v in mx.nd.load(str(weights)).items()}
    after = helpers.checkpoint_params(res.run_dir)
    frozen = [k for k in before if k.startswith("features.")]
    assert len(frozen) == 100 and any(k.endswith("running_var") for k in frozen)
    for k in frozen:
        np.testing.assert_array_equal(before[k], after[k], err_msg=k)
    plan = json.loads((res.run_dir / "plan.json").read_text())
    assert {p["name"] for p in plan["params"] if p["grad_req"] == "write"} == {"output.weight", "output.bias"}
    assert res.best["val_top1"] > 0.2


def test_gradual_unfreezing_changes_what_trains_at_the_epoch(tiny_symbol, tmp_path):
    # Gluon's global names depend on what the process built before: find the convs by graph order
    convs = [n for n in mx.sym.load(f"{tiny_symbol}-symbol.json").list_arguments() if "conv" in n]
    conv0, conv1 = convs[0], convs[2]
    assert conv0.endswith("_weight") and conv1.endswith("_weight")
    r = parse_recipe({"name": "u", "model": {"source": f"symbol:{tiny_symbol}", "input_shape": [3, 16, 16]},
                      "rules": [{"match": convs, "grad_req": "null"},
                                {"match": convs[2:], "grad_req": "write", "from_epoch": 1}],
                      "data": DATA, "train": {"epochs": 2, "lr": 0.05}})
    part = finetune(r, runs_root=tmp_path, quiet=True, stop_after_steps=1000)  # whole epoch 1 + 1 step
    init = {k.split(":", 1)[1]: v.asnumpy() for k, v in mx.nd.load(f"{tiny_symbol}-0000.params").items()}
    after = helpers.checkpoint_params(part.run_dir)
    np.testing.assert_array_equal(after[conv0], init[conv0])
    assert not np.array_equal(after[conv1], init[conv1])


def test_a_resume_at_the_epoch_a_rule_starts_is_the_uninterrupted_run(tiny_symbol, tmp_path):
    """At an epoch whose plan differs from the one before, the uninterrupted run builds a new
    trainer (fresh momentum); a resume stopped at that epoch's start must do the same, not load the
    previous trainer's state into it (its parameters and their order differ)."""
    convs = [n for n in mx.sym.load(f"{tiny_symbol}-symbol.json").list_arguments() if "conv" in n]

    def r(epochs):
        return parse_recipe({"name": "u", "model": {"source": f"symbol:{tiny_symbol}", "input_shape": [3, 16, 16]},
                             "rules": [{"match": convs, "grad_req": "null"},
                                       {"match": convs[2:], "grad_req": "write", "from_epoch": 1}],
                             "data": DATA, "train": {"epochs": epochs, "lr": 0.05, "momentum": 0.9}})

    whole = finetune(r(2), runs_root=tmp_path / "a", quiet=True)
    first = finetune(r(1), runs_root=tmp_path / "b", quiet=True)
    resumed = finetune(r(2), runs_root=tmp_path / "b", resume=first.run_dir, quiet=True)
    a, b = helpers.checkpoint_params(whole.run_dir), helpers.checkpoint_params(resumed.run_dir)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_unwritable_runs_folder_is_a_clear_error(tiny_symbol, tmp_path):
    from gluontl.errors import TrainError
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(TrainError, match="Cannot create a run folder"):
        finetune(recipe(tiny_symbol), runs_root=blocker / "runs", quiet=True)
    assert blocker.read_text() == "not a folder"


def test_evaluate_predict_plot_use_the_run(tiny_symbol, tmp_path):
    from gluontl.data.datasets import load_split
    from gluontl.train.runs import evaluate, plot, predict

    res = finetune(recipe(tiny_symbol), runs_root=tmp_path, quiet=True)
    ev = evaluate(res.run_dir, "val", "best")
    assert ev["val_top1"] == pytest.approx(res.best["val_top1"])
    assert ev["confusion"].sum() == ev["images"] and ev["confusion"].shape == (5, 5)
    ds = load_split(recipe(tiny_symbol).data, "val")
    top = predict(res.run_dir, [ds.name(0)], topk=3)[0]["top"]
    assert len(top) == 3 and top[0][1] >= top[1][1] >= top[2][1] and top[0][0] in ds.class_names
    png = plot(res.run_dir)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_export_run_writes_verified_files_and_refuses_to_overwrite(tiny_symbol, tmp_path):

    from gluontl.errors import ExportError
    from gluontl.train.runs import export_run, load_run

    res = finetune(recipe(tiny_symbol, epochs=1), runs_root=tmp_path, quiet=True)
    paths = export_run(res.run_dir, tmp_path / "out", formats=["onnx", "symbol"])
    onnx_path = next(p for p in paths if p.suffix == ".onnx")
    assert oct(onnx_path.stat().st_mode & 0o777) != oct(0o600)
    _, net = load_run(res.run_dir)
    x = np.random.RandomState(0).rand(3, 3, 16, 16).astype("f")
    with mx.autograd.predict_mode():
        ref = net(mx.nd.array(x)).asnumpy()
    got = helpers.ort_run(onnx_path, {"data": x})[0]
    helpers.assert_f32_close(got, ref, terms=8 * 9, depth=4)  # conv, conv, pool, dense; 8·3·3 the widest
    before = onnx_path.read_bytes()
    with pytest.raises(ExportError, match="already exists"):
        export_run(res.run_dir, tmp_path / "out", formats=["onnx"])
    assert onnx_path.read_bytes() == before


@pytest.mark.parametrize("select", ["val_top1", "val_balanced_acc", "val_loss"])
def test_the_best_checkpoint_is_the_epoch_train_select_ranks_first(tiny_symbol, tmp_path, select):
    res = finetune(recipe(tiny_symbol, epochs=4, lr=0.2, select=select), runs_root=tmp_path, quiet=True)
    rows = [r for r in res.metrics if "epoch" in r]
    values = np.array([r[select] for r in rows])
    want = int(np.argmin(values) if select == "val_loss" else np.argmax(values)) + 1  # first of ties
    assert res.best["epoch"] == want and res.best[select] == rows[want - 1][select]
    meta = json.loads((res.run_dir / "checkpoints" / "best.json").read_text())
    assert meta["epoch"] == want and meta["best"]["select"] == select


def test_val_every_validates_every_nth_and_the_last_epoch_with_the_same_training(tiny_symbol, tmp_path):
    """``train.val_every: 2`` over 5 epochs validates after epochs 2, 4 and 5; the others log their
    training numbers only. Training is the same as validating every epoch (validation reads the
    weights, never writes them), the best is picked among the validated epochs, every epoch
    checkpoints as last, and plot draws the gaps."""
    from gluontl.train.runs import plot

    every = finetune(recipe(tiny_symbol, epochs=5, lr=0.2), runs_root=tmp_path / "a", quiet=True)
    some = finetune(recipe(tiny_symbol, epochs=5, lr=0.2, val_every=2), runs_root=tmp_path / "b", quiet=True)
    rows, all_rows = [r for r in some.metrics if "epoch" in r], [r for r in every.metrics if "epoch" in r]
    assert [r["epoch"] for r in rows if "val_top1" in r] == [2, 4, 5]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5]
    for r, full in zip(rows, all_rows):
        assert r["train_loss"] == full["train_loss"] and r["lr"] == full["lr"]
        if "val_top1" in r:
            assert r["val_top1"] == full["val_top1"] and r["val_loss"] == full["val_loss"]
        else:
            assert not any(k.startswith("val_") for k in r)
    for k, v in helpers.checkpoint_params(some.run_dir).items():
        np.testing.assert_array_equal(v, helpers.checkpoint_params(every.run_dir)[k], err_msg=k)
    validated = [r for r in rows if "val_top1" in r]
    best = max(validated, key=lambda r: r["val_top1"])  # max keeps the first of ties, as the loop does
    assert some.best["epoch"] == best["epoch"] and some.best["val_top1"] == best["val_top1"]
    assert json.loads((some.run_dir / "checkpoints" / "best.json").read_text())["epoch"] == best["epoch"]
    assert json.loads((some.run_dir / "checkpoints" / "last.json").read_text())["epoch"] == 5
    assert plot(some.run_dir).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_val_every_changes_no_resume_digest(tiny_symbol, tmp_path):
    """Validation only reads the weights: a resume may validate more or less often."""
    from gluontl.train.loop import _resume_digest

    assert _resume_digest(recipe(tiny_symbol, val_every=3)) == _resume_digest(recipe(tiny_symbol))
    part = finetune(recipe(tiny_symbol, epochs=3), runs_root=tmp_path, quiet=True, stop_after_steps=13)
    done = finetune(recipe(tiny_symbol, epochs=3, val_every=3), runs_root=tmp_path, resume=part.run_dir, quiet=True)
    assert [r["epoch"] for r in done.metrics if "val_top1" in r] == [3]


def test_better_ranks_by_the_selected_metric_alone():
    from gluontl.metrics import better as _better  # what the best checkpoint (train/engine.py KeepBest) asks

    best = {"val_top1": 0.80, "val_balanced_acc": 0.60, "val_loss": 0.50}
    row = {"val_top1": 0.78, "val_balanced_acc": 0.70, "val_loss": 0.55}  # worse top-1 and loss, better balance
    assert [_better(row, best, m) for m in ("val_top1", "val_balanced_acc", "val_loss")] == [False, True, False]
    lower_loss = {**best, "val_loss": 0.40}
    assert _better(lower_loss, best, "val_loss") and not _better(best, best, "val_top1")  # a tie keeps the earlier
    assert _better(row, None, "val_loss")
