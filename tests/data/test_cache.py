"""Frozen-prefix feature cache and prefix engines: same numbers as training through the whole net."""
import json
import shutil
from functools import partial

import mxnet as mx
from tests import helpers
import numpy as np
import pytest
from gluoncv.model_zoo import get_model

from gluontl.errors import TrainError
from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune

DATA = {"source": "demo:digits", "classes": ["5", "6"], "batch_size": 16,
        "train_transform": {"resize": 16}, "val_transform": {"resize": 16}}
HEAD_ONLY = [{"preset": "freeze_all_but_head"}]
LAST_STAGE = [{"preset": "freeze_until_stage", "until_stage": 3}]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return helpers.resnet18_weights(tmp_path_factory.mktemp("w") / "w.params")


def recipe(weights, rules=HEAD_ONLY, data=None, **train):
    return parse_recipe({"name": "c", "model": {"source": "zoo:resnet18_v1", "weights": weights,
                                                "input_shape": [3, 16, 16], "restore": {"only": ["features.*"]}},
                         "surgery": {"head": {"classes": 2}}, "rules": rules, "data": {**DATA, **(data or {})},
                         "train": {"epochs": 2, "lr": 0.05, "log_every": 1, "prefix_engine": "mxnet", **train}})


def curve(result):
    rows = [r for r in result.metrics]
    return np.array([[r.get(k, 0.0) for k in ("step", "loss", "lr", "train_loss", "val_loss", "val_top1")]
                     for r in rows])


def kept_files(result):
    return sorted(p.name for p in (result.run_dir / "feature_cache").iterdir())


def summary(result):
    return json.loads((result.run_dir / "summary.json").read_text())["feature_cache"]


# Relative error of frozen features computed another way (another graph, engine or kernel):
# resnet18's prefix chains 17 convs of at most 512·3·3 products (helpers.f32_tol); stored in
# float16, each feature is rounded once at half precision (unit roundoff 2**-11).
RESNET_FEATURES = helpers.f32_tol(1.0, 512 * 9, depth=17)
FLOAT16_FEATURES = 8 * 2.0 ** -11


def _params(path):
    """Arrays by parameter name (exported files prefix them with arg:/aux:)."""
    return {k.split(":", 1)[-1]: v.asnumpy() for k, v in mx.nd.load(str(path)).items()}


def assert_same_run(a, b, start=None, feature_err=RESNET_FEATURES):
    """Two runs that differ only in how the frozen features were computed or stored: the same
    steps, learning rates and validation accuracy (a prediction flips only where a logit margin
    is below float rounding), and losses and weights (trained from the ``start`` file's) within
    what features off by the relative ``feature_err`` explain (helpers.assert_same_training)."""
    ca, cb = curve(a), curve(b)
    assert ca.shape == cb.shape
    step, loss, lr, train_loss, val_loss, top1 = range(6)
    np.testing.assert_array_equal(ca[:, [step, lr, top1]], cb[:, [step, lr, top1]])
    losses = [loss, train_loss, val_loss]
    diff, bound = np.abs(ca[:, losses] - cb[:, losses]).max(), 8 * feature_err * np.abs(ca[:, losses]).max()
    assert diff <= bound, f"losses differ by {diff:.3g}, more than the features' error explains ({bound:.3g})"
    pa, pb = (_params(r.run_dir / "checkpoints" / "last.params") for r in (a, b))
    initial = _params(start) if start else {}
    helpers.assert_same_training(pa, pb, {k: v for k, v in initial.items() if k in pa and v.shape == pa[k].shape},
                                 steps=int(ca[-1, step]), grad_err=feature_err)


@pytest.fixture(scope="module")
def uncached(weights, tmp_path_factory):
    """The reference: head-only training through the whole network."""
    return finetune(recipe(weights, cache_features="off"), runs_root=tmp_path_factory.mktemp("ref"), quiet=True)


@pytest.mark.parametrize("rules, boundary, lr", [(HEAD_ONLY, "output", 0.05), (LAST_STAGE, "features.7", 0.01)])
def test_cached_training_equals_uncached(weights, uncached, tmp_path, rules, boundary, lr):
    # training amplifies float-order differences; a gentler lr keeps stage-4 runs comparable at 1e-4
    off = uncached if rules is HEAD_ONLY else finetune(recipe(weights, rules, cache_features="off", lr=lr),
                                                       runs_root=tmp_path, quiet=True)
    on = finetune(recipe(weights, rules, cache_features="on", lr=lr), runs_root=tmp_path, quiet=True)
    assert summary(off)["cache"] is False and "cache_features: off" in summary(off)["log"]
    s = summary(on)
    assert s["cache"] is True and s["boundary"] == boundary and "in memory" in s["cache_size"]
    # the fill is part of the run's time: more than 0, less than the first epoch that includes it
    first = next(r for r in on.metrics if "epoch" in r)
    assert summary(off)["cache_fill_seconds"] is None and 0 < s["cache_fill_seconds"] < first["seconds"]
    assert f"training from {boundary}" in (on.run_dir / "plan.txt").read_text()
    assert_same_run(off, on, weights)


def test_resume_with_the_cache_continues_exactly(weights, uncached, tmp_path):
    part = finetune(recipe(weights), runs_root=tmp_path, quiet=True, stop_after_steps=7)
    assert part.stopped_early
    done = finetune(recipe(weights), runs_root=tmp_path, quiet=True, resume=part.run_dir)
    assert summary(done)["cache"]
    assert_same_run(uncached, done, weights)


def test_a_resume_reads_the_features_the_stopped_run_left(weights, tmp_path):
    """A stopped run leaves its features in the run folder; its resumes read them instead of
    running the frozen prefix again (a short slot trains at once) and reach the uninterrupted
    run bit for bit. Proof that they are read: features zeroed under the same record change
    the next step's loss."""
    full = finetune(recipe(weights), runs_root=tmp_path / "full", quiet=True)
    part = finetune(recipe(weights), runs_root=tmp_path, quiet=True, stop_after_steps=7)
    kept = part.run_dir / "feature_cache" / "train_view_0.npy"
    record = json.loads(kept.with_suffix(".json").read_text())
    assert (record["what"], record["boundary"], record["rows"]) == ("train view 0", "output", np.load(kept).shape[0])
    zeroed = tmp_path / "zeroed"
    shutil.copytree(part.run_dir, zeroed)
    np.save(zeroed / "feature_cache" / "train_view_0.npy", np.zeros_like(np.load(kept)))
    stamp = (kept.stat().st_mtime_ns, kept.read_bytes())
    # on past the end of epoch 1 (18 steps), whose validation fills the val features
    more = finetune(recipe(weights), runs_root=tmp_path, quiet=True, resume=part.run_dir, stop_after_steps=14)
    assert (kept.stat().st_mtime_ns, kept.read_bytes()) == stamp  # read, not computed or written again
    assert (part.run_dir / "feature_cache" / "val.json").is_file()
    wrong = finetune(recipe(weights), runs_root=tmp_path, quiet=True, resume=zeroed, stop_after_steps=1)
    step8 = [next(r["loss"] for r in res.metrics if r.get("step") == 8) for res in (more, wrong)]
    assert step8[0] != step8[1]
    done = finetune(recipe(weights), runs_root=tmp_path, quiet=True, resume=part.run_dir)
    assert summary(done)["cache_reused"] == ["train view 0", "val"]
    assert f"prefix engine: none run (every feature is in {part.run_dir / 'feature_cache'})" in summary(done)["log"]
    np.testing.assert_array_equal(curve(done), curve(full))
    for k, v in _params(full.run_dir / "checkpoints" / "last.params").items():
        np.testing.assert_array_equal(_params(done.run_dir / "checkpoints" / "last.params")[k], v, err_msg=k)
    assert kept_files(part) == ["val.json", "val.npy"]  # a finished run keeps only val's, for evaluate


def test_cached_features_are_reused_only_under_their_own_record(weights, tmp_path):
    """Another cut, other prefix weights or a damaged file: the record or the file no longer
    matches, so the features are computed again (and the file replaced)."""
    from gluontl.pipeline import prepare
    from gluontl.data.cache import FeatureCache, cache_key
    from gluontl.data.prefix import MxEngine, split_frozen_prefix
    from gluontl.tasks import get_task

    r = recipe(weights)
    prep, loaders = get_task(r).setup(r, mx.cpu(), seed=0)
    split = split_frozen_prefix(prep.block, prep.plan, r.model.input_shape, mx.cpu())
    folder = tmp_path / "feature_cache"

    def fill(key):
        cache = FeatureCache(MxEngine(split.prefix, r.model.input_shape, mx.cpu()), loaders, 1, r.train, folder, 16, 0, True, key)
        cache.prepare(0)
        features = np.array(cache.train[0])
        cache.close(keep=True)
        return features, cache.reused

    sets = loaders.train._dataset, loaders.val._dataset
    key = cache_key(r, split, (512, 1, 1), *sets)
    first, reused = fill(key)
    assert reused == [] and first.shape == (len(loaders.train._dataset), 512, 1, 1)
    again, reused = fill(key)
    assert reused == ["train view 0"]
    np.testing.assert_array_equal(again, first)
    labels = loaders.train._dataset.labels
    labels[0] = (labels[0] + 1) % 5  # one image relabelled between the stop and the resume
    relabelled = cache_key(r, split, (512, 1, 1), *sets)
    labels[0] = (labels[0] - 1) % 5
    assert relabelled["items_sha256"] != key["items_sha256"] and cache_key(r, split, (512, 1, 1), *sets) == key
    for other in ({**key, "boundary": "features.7"}, {**key, "prefix_sha256": "0" * 64}, relabelled):
        assert fill(other)[1] == []
        assert fill(key)[1] == []  # the recompute replaced the file and its record
    np.save(folder / "train_view_0.npy", first[:-1])  # one row short, the record unchanged
    assert fill(key)[1] == []
    (folder / "train_view_0.npy").write_bytes(b"not an array")
    assert fill(key)[1] == []
    features, _ = fill(key)
    np.testing.assert_array_equal(features, first)


def test_the_key_names_the_engine_that_ran_and_its_reduce_range(weights):
    """Float engines agree within 1e-4 and keep the key they always had (caches left by earlier
    versions stay valid); an int8 prefix's features depend on reduce_range (VNNI or not), so a
    resume on another CPU, or after the int8 prefix was refused, recomputes instead of mixing."""
    from gluontl.data.cache import cache_key
    from gluontl.data.prefix import Int8Engine, MxEngine, split_frozen_prefix
    from gluontl.tasks import get_task

    r = recipe(weights)
    prep, loaders = get_task(r).setup(r, mx.cpu(), seed=0)
    split = split_frozen_prefix(prep.block, prep.plan, r.model.input_shape, mx.cpu())
    sets = loaders.train._dataset, loaders.val._dataset
    key = cache_key(r, split, (512, 1, 1), *sets)
    assert sorted(key) == ["boundary", "dtype", "format", "items_sha256", "prefix_sha256", "recipe", "row_shape",
                           "seed"]
    assert cache_key(r, split, (512, 1, 1), *sets, MxEngine(split.prefix, r.model.input_shape, mx.cpu())) == key
    int8 = r.model_copy(update={"train": r.train.model_copy(update={"prefix_engine": "onnxruntime-int8"})})
    assert cache_key(int8, split, (512, 1, 1), *sets) == key  # asked for, not run: the float key
    keys = [cache_key(r, split, (512, 1, 1), *sets, type("Ran", (), {"key": Int8Engine.key_for(reduce)})())
            for reduce in (False, True)]
    assert keys[0] != keys[1] and key not in keys
    assert [(k["engine"], k["reduce_range"]) for k in keys] == [("onnxruntime-int8", False), ("onnxruntime-int8", True)]


def test_evaluate_reads_the_val_features_finetune_left_and_only_under_their_key(weights, tmp_path):
    """A finished run keeps its val features; evaluate then runs only the trained rest on them and
    reports finetune's own validation of that checkpoint to the last bit. Without them, or with a
    record that is not the key of this model and data, it runs the whole network on the decoded
    images, whose numbers the cached ones equal within float rounding."""
    from gluontl.train.runs import evaluate

    run = finetune(recipe(weights, cache_dtype="float16"), runs_root=tmp_path, quiet=True).run_dir
    best = json.loads((run / "checkpoints" / "best.json").read_text())["best"]
    cached = evaluate(run)
    assert cached["from_feature_cache"] is True
    assert (cached["val_top1"], cached["val_balanced_acc"], cached["val_loss"]) == \
        (best["val_top1"], best["val_balanced_acc"], best["val_loss"])
    record = run / "feature_cache" / "val.json"
    good = record.read_text()
    for field, value in (("prefix_sha256", "0" * 64), ("seed", 1), ("dtype", "float32"), ("boundary", "features.7")):
        record.write_text(json.dumps({**json.loads(good), field: value}))
        assert evaluate(run)["from_feature_cache"] is False, field
    record.write_text(good)
    assert evaluate(run)["from_feature_cache"] is True
    shutil.rmtree(run / "feature_cache")
    whole = evaluate(run)
    assert whole["from_feature_cache"] is False
    np.testing.assert_array_equal(whole["confusion"], cached["confusion"])
    assert abs(whole["val_loss"] - cached["val_loss"]) <= 8 * FLOAT16_FEATURES * whole["val_loss"]
    assert json.loads((run / "summary.json").read_text())["feature_cache"]["cache"] is True


def test_random_augmentation_turns_the_cache_off_unless_views_are_asked_for(weights, tmp_path):
    flip = {"train_transform": {"resize": 16, "flip": True}}
    off = finetune(recipe(weights, data=flip), runs_root=tmp_path, quiet=True, stop_after_steps=3)
    assert "flip in train_transform" in (off.run_dir / "plan.txt").read_text()
    with pytest.raises(TrainError, match="flip in train_transform"):
        finetune(recipe(weights, data=flip, cache_features="on"), runs_root=tmp_path, quiet=True)
    # views drawn as epochs 0 and 1 draw them: with K >= epochs the run is the uncached one
    plain = finetune(recipe(weights, data=flip, cache_features="off"), runs_root=tmp_path, quiet=True)
    views = finetune(recipe(weights, data=flip, cache_views=2), runs_root=tmp_path, quiet=True)
    assert summary(views)["cache"] and "2 augmented views" in summary(views)["log"]
    assert_same_run(plain, views, weights)


def test_why_the_cache_is_off_when_everything_trains(weights, tmp_path):
    r = finetune(recipe(weights, rules=[], epochs=1), runs_root=tmp_path, quiet=True, stop_after_steps=1)
    log = (r.run_dir / "plan.txt").read_text().splitlines()[-1]
    assert log.startswith("feature cache: off (stage stem trains (features.0.weight")


def test_memory_mapped_float16_cache(weights, uncached, tmp_path):
    on = finetune(recipe(weights, cache_dtype="float16", cache_max_bytes=1), runs_root=tmp_path, quiet=True)
    assert "memory-mapped" in summary(on)["cache_size"] and "float16" in summary(on)["cache_size"]
    assert kept_files(on) == ["val.json", "val.npy"]  # the train views removed when the run ends
    assert_same_run(uncached, on, weights, FLOAT16_FEATURES)


def test_onnxruntime_prefix_engine_matches_mxnet(weights, uncached, tmp_path):
    flip = {"train_transform": {"resize": 16, "flip": True}}
    base = finetune(recipe(weights, data=flip, cache_features="off"), runs_root=tmp_path, quiet=True)
    ort = finetune(recipe(weights, data=flip, prefix_engine="onnxruntime"), runs_root=tmp_path, quiet=True)
    s = summary(ort)
    assert s["cache"] is False and s["prefix_engine"] == "onnxruntime" and "run every step" in s["log"]
    assert_same_run(base, ort, weights)
    cached = finetune(recipe(weights, prefix_engine="onnxruntime"), runs_root=tmp_path, quiet=True)
    assert summary(cached)["cache"] and summary(cached)["prefix_engine"] == "onnxruntime"
    assert_same_run(uncached, cached, weights)


@pytest.fixture(scope="module")
def bn_symbol(tmp_path_factory):
    """A small conv net with BatchNorm, exported as an MXNet symbol checkpoint (an imported graph)."""
    d = tmp_path_factory.mktemp("sym")
    mx.random.seed(1)
    nn = mx.gluon.nn
    net = nn.HybridSequential(prefix="bn_")  # a name scope: node names independent of earlier tests
    with net.name_scope():
        net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"), nn.MaxPool2D(2),
                nn.Conv2D(16, 3, padding=1, activation="relu"), nn.GlobalAvgPool2D(), nn.Dense(2))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    with mx.autograd.record():
        net(mx.nd.random.uniform(shape=(8, 3, 16, 16)))
    net.export(str(d / "bn"))
    return str(d / "bn")


FROZEN_BN = {"type": "BatchNorm", "bn": "frozen"}


@pytest.mark.parametrize("rules, boundary", [
    ([{"match": "*", "grad_req": "null"}, FROZEN_BN, {"type": "Dense", "grad_req": "write"}], "bn_pool1_fwd"),
    ([{"match": ["*conv0*", "*batchnorm*"], "grad_req": "null"}, FROZEN_BN], "bn_pool0_fwd")])
def test_imported_graph_is_cut_after_its_last_frozen_dominator(bn_symbol, tmp_path, rules, boundary):
    def run(mode):
        model = {"source": f"symbol:{bn_symbol}", "input_shape": [3, 16, 16]}
        train = {"epochs": 2, "lr": 0.05, "log_every": 1, "cache_features": mode, "prefix_engine": "mxnet"}
        return finetune(parse_recipe({"name": "g", "model": model, "rules": rules, "data": DATA, "train": train}),
                        runs_root=tmp_path, quiet=True)
    off, on = run("off"), run("on")
    assert summary(on)["cache"] and summary(on)["boundary"] == boundary
    # features through at most two convs (the wider one sums 8·3·3 products)
    assert_same_run(off, on, f"{bn_symbol}-0000.params", helpers.f32_tol(1.0, 8 * 9, depth=2))


def test_preview_tells_gluontl_plan_what_finetune_will_decide(weights):
    from gluontl.pipeline import prepare
    from gluontl.data.cache import preview

    r = recipe(weights)
    prep = prepare(r)
    assert preview(r, prep.block, prep.plan) == ("feature cache: on (frozen prefix features.0..features.8, "
                                                 "training from output)")
    flip = recipe(weights, data={"train_transform": {"resize": 16, "flip": True}})
    assert preview(flip, prep.block, prep.plan).startswith("feature cache: off (flip in train_transform")


def test_gradual_unfreezing_moves_the_cut_and_matches_uncached(weights, tmp_path):
    rules = HEAD_ONLY + [{"stage": 4, "grad_req": "write", "bn": "train", "from_epoch": 1}]
    # all of epoch 1 (18 steps) and 3 steps of epoch 2: training stage 4 on 16px digits is chaotic
    # enough to amplify float-order differences past any tolerance after a few more steps
    off = finetune(recipe(weights, rules, cache_features="off", lr=0.01), runs_root=tmp_path, quiet=True,
                   stop_after_steps=21)
    on = finetune(recipe(weights, rules, lr=0.01), runs_root=tmp_path, quiet=True, stop_after_steps=21)
    plan = json.loads((on.run_dir / "plan.json").read_text())
    assert plan["epoch"] == 1 and plan["feature_cache"]["boundary"] == "features.7"
    assert plan["feature_cache"]["cache"] and "training from features.7" in plan["feature_cache"]["log"]
    assert_same_run(off, on, weights)


def test_the_benchmarked_step_is_the_handwritten_step(weights):
    from mxnet import autograd, gluon

    from gluontl.rules import trainable_params
    from gluontl.tasks.classification import classify
    from gluontl.train.loop import Stepper

    def net_and_trainer():
        net = get_model("resnet18_v1", classes=2)
        net.load_parameters(weights)
        net.hybridize(static_alloc=True, static_shape=True)
        return net, gluon.Trainer(list(trainable_params(net).values()), "sgd", {"learning_rate": 0.1})

    rng = np.random.default_rng(0)
    batches = [(mx.nd.array(rng.standard_normal((4, 3, 16, 16))), mx.nd.array(rng.integers(0, 2, 4)))
               for _ in range(3)]
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    a, ta = net_and_trainer()
    for x, y in batches:
        with autograd.record():
            loss = loss_fn(a(x), y)
        loss.backward()
        ta.step(4)
    b, tb = net_and_trainer()
    stepper = Stepper(b, tb, partial(classify, loss=loss_fn), [mx.cpu()])
    for x, y in batches:
        stepper.step(x, y)
    for (k, pa), pb in zip(a.collect_params().items(), b.collect_params().values()):
        np.testing.assert_array_equal(pa.data().asnumpy(), pb.data().asnumpy(), err_msg=k)


def test_a_cache_the_disk_cannot_hold_is_declined_or_refused(tmp_path):
    from gluontl.recipe import TrainSpec
    from gluontl.data.cache import Decision, _check_room

    on = Decision(True, 1, "frozen prefix")
    small = TrainSpec(cache_max_bytes=1)
    assert _check_room(on, small, 512, 1000, tmp_path / "feature_cache") is on  # 2 MB fits on disk
    huge = 10**15  # rows: more features than any disk here holds
    off = _check_room(on, small, 512, huge, tmp_path / "feature_cache")
    assert not off.train and "GiB free beside the run folder" in off.reason
    with pytest.raises(TrainError, match="cache_features: on, but the features need"):
        _check_room(on, TrainSpec(cache_max_bytes=1, cache_features="on"), 512, huge, tmp_path / "feature_cache")
