"""train.ema: the average against numpy, resume bit for bit, ema_* metrics, the best checkpoint and
export holding the average, the feature cache, BatchNorm statistics, several contexts."""
import contextlib
import json

import mxnet as mx
import numpy as np
import pytest
from tests import helpers

from gluontl.errors import RecipeError
from gluontl.naming import named_params
from gluontl.recipe import EmaSpec, parse_recipe
from gluontl.rules import make_plan, apply_plan, trainable_params
from gluontl.train.ema import Ema
from gluontl.train.loop import finetune
from gluontl.train.runs import export_run

DATA = helpers.DIGITS_5_9


def recipe(prefix, ema=None, **train):
    return parse_recipe(helpers.tiny_recipe(prefix, **{"epochs": 2, "lr": 0.05, "log_every": 1,
                                                        "ema": {"decay": 0.9, **(ema or {})}, **train}))


def resnet_recipe(weights, **train):
    """ResNet-18, its last stage training (BatchNorm in batch statistics) after a cached frozen prefix."""
    return parse_recipe({"name": "r", "model": {"source": "zoo:resnet18_v1", "weights": weights,
                                                "input_shape": [3, 16, 16], "restore": {"only": ["features.*"]}},
                         "surgery": {"head": {"classes": 2}},
                         "rules": [{"preset": "freeze_until_stage", "until_stage": 3}],
                         "data": {"source": "demo:digits", "classes": ["5", "6"], "batch_size": 16,
                                  "train_transform": {"resize": 16}, "val_transform": {"resize": 16}},
                         "train": {"epochs": 2, "lr": 0.01, "log_every": 1, "prefix_engine": "mxnet", **train}})


def arrays(run_dir, name):
    return {k.split(":", 1)[-1]: v.asnumpy() for k, v in mx.nd.load(str(run_dir / "checkpoints" / name)).items()}


def test_the_average_equals_numpy_over_sgd_steps_with_warmup():
    rs = np.random.RandomState(0)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(6, in_units=4), mx.gluon.nn.Dense(3, in_units=6))
    net.initialize(mx.init.Xavier())
    apply_plan(net, make_plan(net, [{"match": "0.*", "grad_req": "null"}]))  # the first layer frozen
    ema = Ema(EmaSpec(decay=0.95, warmup=True))
    ema.track(net)
    assert sorted(ema.avg) == ["1.bias", "1.weight"]
    trainer = helpers.sgd_step(net, mx.nd.array(rs.randn(8, 4)), mx.nd.array(rs.randint(0, 3, 8)), steps=0)
    frozen = net[0].weight.data().asnumpy().copy()
    want = {n: ema.avg[n].asnumpy().astype(np.float64) for n in ema.avg}
    decays = []
    for t in range(6):
        x, y = mx.nd.array(rs.randn(8, 4)), mx.nd.array(rs.randint(0, 3, 8))
        with mx.autograd.record():
            loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
        loss.backward()
        trainer.step(8)
        ema.update(net)
        d = min(0.95, (1 + t) / (10 + t))  # by hand: 0.1, 2/11, 3/12, ...
        decays.append(d)
        for n in want:
            w = {"1.weight": net[1].weight, "1.bias": net[1].bias}[n].data().asnumpy()
            want[n] = d * want[n] + (1 - d) * w
    assert decays[0] == pytest.approx(0.1) and ema.updates == 6
    for n in want:  # each update rounds once at the size of the weights
        helpers.assert_f32_close(ema.avg[n].asnumpy(), want[n], terms=4 * 6)
    np.testing.assert_array_equal(net[0].weight.data().asnumpy(), frozen)
    no_warmup = Ema(EmaSpec(decay=0.95, warmup=False))
    assert no_warmup.decay() == 0.95


def two_layers(ctx=None, frozen_first=True):
    mx.random.seed(3)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(5, in_units=4), mx.gluon.nn.Dense(3, in_units=5))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    if frozen_first:
        apply_plan(net, make_plan(net, [{"match": "0.*", "grad_req": "null"}]))
    return net


def test_warmup_decay_by_hand_and_capped_by_the_recipes_decay():
    ema = Ema(EmaSpec(decay=0.5, warmup=True))
    got = []
    for t in range(11):
        ema.updates = t
        got.append(ema.decay())
    # (1 + t) / (10 + t): 1/10, 2/11, ..., 9/18 = 0.5 at t = 8, then 10/19 > 0.5 is capped
    assert got == [(1 + t) / (10 + t) for t in range(9)] + [0.5, 0.5]
    ema.updates = 0
    assert Ema(EmaSpec(decay=0.05, warmup=True)).decay() == 0.05  # below 1/10 from the start
    assert Ema(EmaSpec(decay=0.95, warmup=False)).decay() == 0.95


def test_one_update_without_warmup_moves_the_average_by_one_minus_decay():
    net = two_layers()
    ema = Ema(EmaSpec(decay=0.75, warmup=False))
    ema.track(net)
    start = {n: a.asnumpy().astype(np.float64) for n, a in ema.avg.items()}
    rs = np.random.RandomState(1)
    for p in (net[1].weight, net[1].bias):  # the weights move by hand, as a step would
        p.set_data(p.data() + mx.nd.array(rs.randn(*p.shape)))
    ema.update(net)
    assert ema.updates == 1
    for n, p in (("1.weight", net[1].weight), ("1.bias", net[1].bias)):
        want = 0.75 * start[n] + 0.25 * p.data().asnumpy()
        helpers.assert_f32_close(ema.avg[n].asnumpy(), want, terms=2, err_msg=n)


def test_track_copies_each_parameter_when_it_starts_training_and_keeps_older_averages():
    net = two_layers()
    ema = Ema(EmaSpec(decay=0.9))
    ema.track(net)
    assert sorted(ema.avg) == ["1.bias", "1.weight"]
    w1 = net[1].weight.data().asnumpy().copy()
    np.testing.assert_array_equal(ema.avg["1.weight"].asnumpy(), w1)
    net[1].weight.set_data(net[1].weight.data() * 2)  # the average is a copy, not the weight's array
    np.testing.assert_array_equal(ema.avg["1.weight"].asnumpy(), w1)
    ema.avg["1.bias"][:] = 7.0
    apply_plan(net, make_plan(net, []))  # the first layer starts training (a later from_epoch rule)
    ema.track(net)
    assert sorted(ema.avg) == ["0.bias", "0.weight", "1.bias", "1.weight"]
    np.testing.assert_array_equal(ema.avg["0.weight"].asnumpy(), net[0].weight.data().asnumpy())
    np.testing.assert_array_equal(ema.avg["1.bias"].asnumpy(), np.full(3, 7.0, np.float32))  # not restarted
    np.testing.assert_array_equal(ema.avg["1.weight"].asnumpy(), w1)


def test_the_plan_line_says_how_the_average_is_made():
    net = two_layers()
    ema = Ema(EmaSpec(decay=0.99))
    ema.track(net)
    assert ema.line() == ("ema: 2 trained parameters averaged, decay min(0.99, (1+t)/(10+t)) at step t; "
                          "BatchNorm statistics copied from the model")
    ema = Ema(EmaSpec(decay=0.9, warmup=False, batch_norm="recompute", recompute_batches=7))
    assert ema.line() == ("ema: 0 trained parameters averaged, decay 0.9; BatchNorm statistics recomputed with "
                          "the averaged weights on 7 training batches each epoch")


def test_record_and_arrays_load_onto_the_weights_context_as_copies():
    net = two_layers(ctx=[mx.cpu(1), mx.cpu(2)])
    ema = Ema(EmaSpec(decay=0.9))
    ema.track(net)
    ema.updates = 4
    assert ema.record() == {"format": 1, "updates": 4, "names": ["1.bias", "1.weight"]}
    arrays = ema.arrays()
    assert all(a.context == mx.cpu() for a in arrays.values())
    arrays["1.bias"][:] = 3.0  # a copy: the average is not touched
    assert not (ema.avg["1.bias"].asnumpy() == 3.0).any()
    other = Ema(EmaSpec(decay=0.9))
    other.load({"format": 1, "updates": 0, "names": ["1.bias", "1.weight"]}, arrays, net, "x")
    assert other.updates == 0  # 0 updates is a valid record (saved before the first step)
    assert all(a.context == mx.cpu(1) for a in other.avg.values())  # the weight's first context
    np.testing.assert_array_equal(other.avg["1.bias"].asnumpy(), np.full(3, 3.0, np.float32))
    same = {n: a.as_in_context(mx.cpu(1)) for n, a in arrays.items()}  # already there: still copied
    other.load(ema.record(), same, net, "x")
    assert other.updates == 4
    same["1.weight"][:] = 0.0
    np.testing.assert_array_equal(other.avg["1.weight"].asnumpy(), ema.avg["1.weight"].asnumpy())


@pytest.mark.parametrize("record, edit, bad", [
    (["not", "a", "dict"], None, None), ({"format": 2}, None, None), ({"updates": True}, None, None),
    ({"updates": 1.0}, None, None), ({"updates": -1}, None, None), ({"names": ["1.weight"]}, None, None),
    (None, "2.weight", "2.weight"), (None, "shape", "1.bias")])
def test_load_refuses_a_record_or_arrays_that_do_not_fit_naming_the_array(record, edit, bad):
    from gluontl.errors import TrainError

    net = two_layers()
    ema = Ema(EmaSpec(decay=0.9))
    ema.track(net)
    arrays = ema.arrays()
    if edit == "shape":
        arrays["1.bias"] = mx.nd.zeros(4)
    elif edit:
        arrays[edit] = mx.nd.zeros(net[0].weight.shape)  # a parameter the model does not have
    full = {"format": 1, "updates": 2, "names": sorted(arrays)}
    record = record if isinstance(record, list) else {**full, **(record or {})}
    fresh = Ema(EmaSpec(decay=0.9))
    with pytest.raises(TrainError) as e:
        fresh.load(record, arrays, net, "'here.json'")
    msg = str(e.value)
    assert msg.startswith("Checkpoint 'here.json' has an ema record that does not fit this model")
    assert msg.endswith("it was edited by hand or written by something other than gluontl. Refusing it; start a "
                        "new run from its weights with --init-from.")
    assert (f"model ({bad});" in msg) if bad else ("model;" in msg)
    assert fresh.updates == 0 and fresh.avg == {}


def test_applied_puts_the_average_in_every_copy_and_the_weights_and_statistics_back_bit_for_bit():
    mx.random.seed(4)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(5, in_units=4), mx.gluon.nn.BatchNorm(in_channels=5))
    net.initialize(mx.init.Xavier(), ctx=[mx.cpu(1), mx.cpu(2)])
    ema = Ema(EmaSpec(decay=0.9))
    ema.track(net)
    assert sorted(ema.avg) == ["0.bias", "0.weight", "1.beta", "1.gamma"]
    for a in ema.avg.values():
        a[:] = a + 0.5
    before = {n: [c.asnumpy().copy() for c in e.param.list_data()] for n, e in named_params(net).items()}
    for fail in (False, True):  # the second time a failure inside the block: put back all the same
        with pytest.raises(KeyError) if fail else contextlib.nullcontext():
            with ema.applied(net, ["1.running_mean"]):
                for n, e in named_params(net).items():
                    for c in e.param.list_data():
                        want = ema.avg[n].asnumpy() if n in ema.avg else before[n][0]
                        np.testing.assert_array_equal(c.asnumpy(), want, err_msg=n)
                for c in net[1].running_mean.list_data():  # what a recompute does to the statistics
                    c[:] = 9.0
                if fail:
                    raise KeyError("inside")
        for n, e in named_params(net).items():
            for got, want in zip(e.param.list_data(), before[n]):
                np.testing.assert_array_equal(got.asnumpy(), want, err_msg=n)


def bn_net():
    """A frozen Dense, dropout, a BatchNorm with frozen gamma and beta, a trained Dense: only the
    input's gradient carries the backward pass to the BatchNorm."""
    mx.random.seed(5)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(5, in_units=4), mx.gluon.nn.Dropout(0.5), mx.gluon.nn.BatchNorm(in_channels=5),
            mx.gluon.nn.Dense(3, in_units=5))
    net.initialize(mx.init.Xavier())
    apply_plan(net, make_plan(net, [{"match": ["0.*", "2.gamma", "2.beta"], "grad_req": "null"}]))
    return net


def forward(net, xs, ys):
    return [mx.gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y) for x, y in zip(xs, ys)], None


def split(x, ctxs):
    return mx.gluon.utils.split_and_load(x, ctxs)


def bn_batches(n=3):
    rs = np.random.RandomState(2)
    return [(mx.nd.array(rs.randn(8, 4)), mx.nd.array(rs.randint(0, 3, 8))) for _ in range(n)]


def test_recompute_runs_the_first_batches_through_the_model_and_leaves_no_gradient():
    """Without dropout (p = 0) the statistics are numpy's: MXNet's momentum 0.9, biased variance."""
    net = bn_net()
    net[1]._rate = 0.0
    ema = Ema(EmaSpec(decay=0.9, batch_norm="recompute", recompute_batches=2))
    params = list(trainable_params(net).values())
    ema.recompute_bn(net, params, forward, iter(bn_batches()), [mx.cpu()], split, seed=1)
    w, b = net[0].weight.data().asnumpy().astype(np.float64), net[0].bias.data().asnumpy().astype(np.float64)
    mean, var = np.zeros(5), np.ones(5)
    for x, _ in bn_batches()[:2]:  # two of the three
        h = x.asnumpy() @ w.T + b
        mean, var = 0.9 * mean + 0.1 * h.mean(0), 0.9 * var + 0.1 * h.var(0)
    helpers.assert_f32_close(net[2].running_mean.data().asnumpy(), mean, scale=4.0, terms=8)
    helpers.assert_f32_close(net[2].running_var.data().asnumpy(), var, scale=16.0, terms=8)
    for p in params:
        assert not p.grad().asnumpy().any(), p.name


def test_recompute_draws_batch_i_with_seed_plus_i_and_does_nothing_under_copy():
    """Batch i runs under mx.random.seed((seed + i) mod 2**31), so a resumed run's dropout draws the
    same: replayed by hand from the largest seed, where the second batch's wraps to 0."""
    net, ref = bn_net(), bn_net()
    copy = Ema(EmaSpec(decay=0.9, batch_norm="copy"))
    copy.recompute_bn(net, [], forward, iter(bn_batches()), [mx.cpu()], split, seed=0)
    np.testing.assert_array_equal(net[2].running_mean.data().asnumpy(), np.zeros(5, np.float32))
    ema = Ema(EmaSpec(decay=0.9, batch_norm="recompute", recompute_batches=2))
    mx.random.seed(123)  # whatever the global generator was doing before
    ema.recompute_bn(net, [], forward, iter(bn_batches()), [mx.cpu()], split, seed=2**31 - 1)
    for seed, (x, y) in zip((2**31 - 1, 0), bn_batches()):
        mx.random.seed(seed)
        x.attach_grad()
        with mx.autograd.record():
            losses, _ = forward(ref, [x], [y])
        mx.autograd.backward(losses)
    for name in ("running_mean", "running_var"):
        got, want = getattr(net[2], name).data().asnumpy(), getattr(ref[2], name).data().asnumpy()
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_a_stopped_and_resumed_ema_run_is_the_uninterrupted_one_bit_for_bit(tiny_symbol, tmp_path):
    r = recipe(tiny_symbol, select="ema_val_top1")
    full = finetune(r, runs_root=tmp_path / "a", quiet=True)
    part = finetune(r, runs_root=tmp_path / "b", quiet=True, stop_after_steps=13)
    part = finetune(r, runs_root=tmp_path / "b", quiet=True, resume=part.run_dir, stop_after_steps=40)
    done = finetune(r, runs_root=tmp_path / "b", quiet=True, resume=part.run_dir)
    assert helpers.without_timings(done.metrics) == helpers.without_timings(full.metrics)
    for name in ("last.params", "last.ema", "best.params"):
        a, b = arrays(full.run_dir, name), arrays(done.run_dir, name)
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{name} {k}")


def test_ema_metrics_are_logged_and_select_the_best_checkpoint_which_export_holds(tiny_symbol, tmp_path):
    res = finetune(recipe(tiny_symbol, epochs=3, select="ema_val_loss"), runs_root=tmp_path, quiet=True)
    rows = [r for r in res.metrics if "epoch" in r]
    assert all({"ema_val_top1", "ema_val_loss", "ema_val_balanced_acc", "val_top1"} <= set(r) for r in rows)
    want = int(np.argmin([r["ema_val_loss"] for r in rows])) + 1
    assert res.best["epoch"] == want and res.best["ema_val_loss"] == rows[want - 1]["ema_val_loss"]
    best, ema = arrays(res.run_dir, "best.params"), arrays(res.run_dir, "best.ema")
    meta = json.loads((res.run_dir / "checkpoints" / "best.json").read_text())
    assert meta["ema"]["updates"] == meta["global_step"] and sorted(ema) == meta["ema"]["names"]
    assert len(ema) == 6  # every parameter of the tiny net trains
    for k in ema:
        np.testing.assert_array_equal(best[k], ema[k])
    exported = [p for p in export_run(res.run_dir, tmp_path / "out", formats=["symbol"]) if p.suffix == ".params"]
    values = [v.asnumpy() for v in mx.nd.load(str(exported[0])).values()]
    for k, v in ema.items():  # each averaged array is in the export as it is
        assert any(e.shape == v.shape and np.array_equal(e, v) for e in values), k
    last = arrays(res.run_dir, "last.params")
    assert any(not np.array_equal(last[k], ema[k]) for k in ema)  # the model's weights are others


def test_select_by_ema_needs_train_ema(tiny_symbol):
    assert recipe(tiny_symbol, select="ema_val_top1").train.select == "ema_val_top1"
    with pytest.raises(RecipeError, match="averages none; add train.ema"):
        parse_recipe({"name": "t", "model": {"source": f"symbol:{tiny_symbol}"}, "data": DATA,
                      "train": {"select": "ema_val_top1"}})
    with pytest.raises(RecipeError, match="ema_val_map50 is not a classification metric"):
        recipe(tiny_symbol, select="ema_val_map50")


def test_with_the_feature_cache_and_recomputed_batchnorm_the_model_trains_as_without_ema(resnet_weights, tmp_path):
    """The average is swapped in and out of the model bit for bit: the weights' run is the run
    without EMA; the best checkpoint holds the average, with BatchNorm statistics of its own."""
    plain = finetune(resnet_recipe(resnet_weights), runs_root=tmp_path / "a", quiet=True)
    r = resnet_recipe(resnet_weights, ema={"decay": 0.9, "batch_norm": "recompute", "recompute_batches": 3},
                      select="ema_val_top1")
    ema = finetune(r, runs_root=tmp_path / "b", quiet=True)
    assert json.loads((ema.run_dir / "summary.json").read_text())["feature_cache"]["cache"]
    assert "recomputed with the averaged weights on 3 training batches" in (ema.run_dir / "plan.txt").read_text()
    strip = [{k: v for k, v in r.items() if not k.startswith("ema_")} for r in helpers.without_timings(ema.metrics)]
    assert strip == helpers.without_timings(plain.metrics)
    a, b = arrays(plain.run_dir, "last.params"), arrays(ema.run_dir, "last.params")
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    best, avg = arrays(ema.run_dir, "best.params"), arrays(ema.run_dir, "best.ema")
    assert sorted(avg) == sorted(k for k in best if k.startswith(("features.7.", "output.")) and
                                 not k.endswith(("running_mean", "running_var")))
    for k in avg:
        np.testing.assert_array_equal(best[k], avg[k])
    for k in best:  # the frozen prefix is the model's, untouched
        if k.startswith("features.") and not k.startswith("features.7."):
            np.testing.assert_array_equal(best[k], b[k], err_msg=k)
    stats = [k for k in best if k.startswith("features.7.") and k.endswith("running_mean")]
    assert stats and all(not np.array_equal(best[k], b[k]) for k in stats)  # recomputed, not the model's
    # stopped in epoch 1 and resumed: the same average, statistics and weights
    part = finetune(r, runs_root=tmp_path / "c", quiet=True, stop_after_steps=5)
    done = finetune(r, runs_root=tmp_path / "c", quiet=True, resume=part.run_dir)
    assert helpers.without_timings(done.metrics) == helpers.without_timings(ema.metrics)
    for name in ("last.params", "last.ema", "best.params"):
        x, y = arrays(ema.run_dir, name), arrays(done.run_dir, name)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=f"{name} {k}")


def test_copied_batchnorm_statistics_are_the_models(resnet_weights, tmp_path):
    res = finetune(resnet_recipe(resnet_weights, epochs=1, ema={"decay": 0.9}, select="ema_val_top1"),
                   runs_root=tmp_path, quiet=True)
    best, last = arrays(res.run_dir, "best.params"), arrays(res.run_dir, "last.params")
    stats = [k for k in best if k.endswith(("running_mean", "running_var"))]
    for k in stats:
        np.testing.assert_array_equal(best[k], last[k], err_msg=k)


def test_two_cpu_contexts_average_as_one(tiny_symbol, tmp_path):
    one = finetune(recipe(tiny_symbol, epochs=1), runs_root=tmp_path / "a", quiet=True, stop_after_steps=3)
    two = finetune(recipe(tiny_symbol, epochs=1, ctx="cpu:1,2"), runs_root=tmp_path / "b", quiet=True,
                   stop_after_steps=3)
    start = {k.split(":", 1)[1]: v.asnumpy() for k, v in mx.nd.load(f"{tiny_symbol}-0000.params").items()}
    a, b = arrays(one.run_dir, "last.ema"), arrays(two.run_dir, "last.ema")
    # the tiny net's largest sum: a conv weight's gradient over 16 images x 16 x 16 positions
    helpers.assert_same_training(a, b, start, steps=3, grad_err=helpers.f32_tol(1.0, 16 * 16 * 16))
    assert json.loads((two.run_dir / "checkpoints" / "last.json").read_text())["ema"]["updates"] == 3


@pytest.mark.parametrize("edit", [{"updates": -1}, {"updates": "3"}, {"names": ["conv0_weight"]}, {"format": 2}])
def test_an_edited_ema_record_is_refused_on_resume(tiny_symbol, tmp_path, edit):
    from gluontl.errors import TrainError

    r = recipe(tiny_symbol)
    part = finetune(r, runs_root=tmp_path, quiet=True, stop_after_steps=2)
    path = part.run_dir / "checkpoints" / "last.json"
    meta = json.loads(path.read_text())
    meta["ema"] = {**meta["ema"], **edit}
    path.write_text(json.dumps(meta))
    with pytest.raises(TrainError, match="ema record that does not fit this model"):
        finetune(r, runs_root=tmp_path, quiet=True, resume=part.run_dir)
