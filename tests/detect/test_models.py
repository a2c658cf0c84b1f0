"""Detector construction, TF-OD-API restore types and class-row reuse (gluontl.detect.models) on
real GluonCV nets (SSD and YOLOv3 with a MobileNet0.25 backbone at 64 px), and the GluonCV/MXNet
pitfalls of issue 12, each pinned upstream and in our handling.

Which parameters are heads, buffers and class-dependent rows is written out here from GluonCV's
layouts (not taken from the module under test): SSD's class predictor has per anchor one
background row then one row per class, YOLOv3's prediction per anchor 4 box rows, 1 objectness
row, then the classes.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
import yaml

from gluontl.detect.models import build_detector, num_classes
from gluontl.errors import GluontlError, RestoreError
from gluontl.naming import named_params
from gluontl.recipe import TransformSpec, parse_recipe
from gluontl.rules import apply_plan, make_plan, trainable_params
from gluontl.sources.restore import snapshot
from gluontl.stages import detector_family
from gluontl.data import checkpoint
from gluontl.data.transforms import model_card
from tests.helpers import ort_run

SSD, YOLO = "ssd_300_mobilenet0.25_custom", "yolo3_mobilenet0.25_custom"
SHAPE = (3, 64, 64)
FAMILIES = pytest.mark.parametrize("src", [SSD, YOLO])
KEPT = {SSD: 1, YOLO: 5}  # class-independent rows per anchor: SSD background; YOLOv3 box + objectness


def is_buffer(src: str, name: str) -> bool:
    return name.startswith("anchor_generators.") if src == SSD else name.endswith((".anchors", ".offsets"))


def is_class_layer(src: str, name: str) -> bool:
    return name.startswith("class_predictors.") if src == SSD else ".prediction." in name


def is_head(src: str, name: str) -> bool:
    return name.startswith(("class_predictors.", "box_predictors.")) if src == SSD else ".prediction." in name


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical (dtype, shape and bytes)."""
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def recipe(src: str, weights: Path | str | None = None, rules: list | None = None, **restore):
    model: dict = {"source": f"zoo:{src}", "input_shape": list(SHAPE)}
    if weights is not None:
        model["weights"] = str(weights)
    if restore:
        model["restore"] = restore
    return parse_recipe({"name": "t", "task": "detection", "model": model, "rules": rules or []}, origin="test")


def build(src: str, classes: list[str], weights=None, **restore):
    """A detector whose fresh initialization is the same in every call (seeded)."""
    mx.random.seed(0)
    return build_detector(recipe(src, weights, **restore), list(classes))


def marked(src: str, classes: list[str], seed: int):
    """A detector with known values everywhere, buffers included: per class-dependent layer
    ``k``, row ``r`` is the constant ``1000 k + r`` (so a row's origin reads off its value);
    every other parameter seeded normals."""
    net, _ = build(src, classes)
    rng = np.random.default_rng(seed)
    k = 0
    for n, e in named_params(net).items():
        shape = e.param.data().shape
        if is_class_layer(src, n):
            k += 1
            rows = (1000.0 * k + np.arange(shape[0])).reshape((-1,) + (1,) * (len(shape) - 1))
            value = np.broadcast_to(rows, shape)
        else:
            value = rng.standard_normal(shape)
        e.param.set_data(mx.nd.array(value.astype(np.float32)))
    return net


def gluon_file(src: str, classes: list[str], path: Path, seed: int) -> dict[str, np.ndarray]:
    """A weights file as GluonCV writes them (``save_parameters``); its values by our names."""
    net = marked(src, classes, seed)
    net.save_parameters(str(path))
    return snapshot(net)


def run_folder(src: str, classes: list[str], root: Path, seed: int) -> tuple[Path, dict[str, np.ndarray]]:
    """A run folder as finetune leaves it (recipe.yaml, preprocess.json with the class names,
    a hash-checked best checkpoint), holding a marked detector."""
    run = root / "runs" / "old"
    (run / "checkpoints").mkdir(parents=True)
    net = marked(src, classes, seed)
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe(src).model_dump(mode="json")), encoding="utf-8")
    (run / "preprocess.json").write_text(json.dumps(model_card(TransformSpec(), classes, "data", SHAPE)),
                                         encoding="utf-8")
    trainer = mx.gluon.Trainer(list(trainable_params(net).values()), "sgd", {"learning_rate": 0.1})
    checkpoint.save(run / "checkpoints", "best", net, trainer, {"epoch": 1})
    return run, snapshot(net)


# --- 1. restore.type detection, same classes ---------------------------------------------------

@FAMILIES
@pytest.mark.parametrize("restore", [{}, {"type": "detection"}], ids=["default", "detection"])
def test_detection_same_classes_restores_every_parameter_bit_identical(src, restore, tmp_path):
    classes = ["cat", "dog", "bird"]
    file = gluon_file(src, classes, tmp_path / "w.params", seed=1)
    fresh = snapshot(build(src, classes)[0])
    net, report = build(src, classes, tmp_path / "w.params", **restore)
    got = snapshot(net)
    assert set(got) == set(file)
    for n in got:
        if is_buffer(src, n):  # anchors/offsets follow the input size, never a file
            assert same(got[n], fresh[n]) and not same(got[n], file[n]), n
        else:
            assert same(got[n], file[n]), n
    assert (report.missing, report.unexpected, report.mismatched) == ([], [], [])
    assert sorted(report.restored) == sorted(n for n in got if not is_buffer(src, n))


# --- 2. restore.type detection, new classes, reuse ---------------------------------------------

OLD = ["zero", "one", "two"]
# (new classes, reuse, old names known from a run folder (RUN or RUN/best), expected {new index: old index})
REUSE_CASES = {
    "names-fewer": (["cat", "dog"], {"cat": "two", "dog": "zero"}, True, {0: 2, 1: 0}),
    "names-more": (["a", "b", "c", "d", "e"], {"e": "one", "b": "two"}, True, {4: 1, 1: 2}),
    "same-names-no-map": (["one", "seven", "zero"], {}, True, {0: 1, 2: 0}),
    "indices": (["p", "q"], {"1": "2"}, False, {1: 2}),
    "names-run-best": (["cat", "dog"], {"dog": "one"}, "best", {1: 1}),  # weights: RUN/best
    "index-and-name": (["p", "q", "r"], {"r": "0"}, True, {2: 0}),
}


@FAMILIES
@pytest.mark.parametrize("case", list(REUSE_CASES))
def test_detection_new_classes_keep_class_independent_rows_and_reuse_listed_ones(src, case, tmp_path):
    classes, reuse, from_run, mapping = REUSE_CASES[case]
    if from_run:
        weights, file = run_folder(src, OLD, tmp_path, seed=2)
        weights = weights / from_run if isinstance(from_run, str) else weights
    else:
        weights = tmp_path / "w.params"
        file = gluon_file(src, OLD, weights, seed=2)
    fresh = snapshot(build(src, classes)[0])
    net, report = build(src, classes, weights, type="detection", reuse=reuse)
    got = snapshot(net)
    kept, nb, ob = KEPT[src], KEPT[src] + len(classes), KEPT[src] + len(OLD)
    class_layers = [n for n in got if is_class_layer(src, n)]
    assert len(class_layers) == (12 if src == SSD else 6)
    for n in class_layers:
        new, old = got[n], file[n]
        anchors = new.shape[0] // nb
        assert new.shape[0] == anchors * nb and old.shape[0] == anchors * ob, n
        for a in range(anchors):
            assert same(new[a * nb:a * nb + kept], old[a * ob:a * ob + kept]), (n, a)
            for i in range(len(classes)):
                row = new[a * nb + kept + i]
                if i in mapping:
                    assert same(row, old[a * ob + kept + mapping[i]]), (n, a, i)
                else:  # fresh init, nothing from the file
                    assert same(row, fresh[n][a * nb + kept + i]), (n, a, i)
                    assert not any(np.array_equal(row, r) for r in old), (n, a, i)
    for n in got:
        if is_buffer(src, n):
            assert same(got[n], fresh[n]), n
        elif not is_class_layer(src, n):  # backbone, neck and SSD's box predictors: all from the file
            assert same(got[n], file[n]), n
    assert sorted(m[0] for m in report.rebuilt) == sorted(class_layers) and not report.mismatched
    assert (report.missing, report.unexpected) == ([], [])


@FAMILIES
def test_reuse_of_unknown_class_names_the_class_and_the_valid_ones(src, tmp_path):
    run, _ = run_folder(src, OLD, tmp_path, seed=3)
    with pytest.raises(RestoreError) as e:
        build(src, ["cat", "dog"], run, type="detection", reuse={"cat": "tow"})
    msg = str(e.value)
    assert "'tow'" in msg and "zero, one, two" in msg and "did you mean 'two'" in msg
    with pytest.raises(RestoreError) as e:
        build(src, ["cat", "dog"], run, type="detection", reuse={"cta": "two"})
    assert "'cta'" in str(e.value) and "cat, dog" in str(e.value)
    with pytest.raises(RestoreError) as e:  # an index past the old classes
        build(src, ["cat", "dog"], run, type="detection", reuse={"cat": "3"})
    assert "'3'" in str(e.value) and "0..2" in str(e.value)


# --- 3. restore.type classification ------------------------------------------------------------

@FAMILIES
@pytest.mark.parametrize("old", [OLD, ["x", "y", "z", "w", "v"]], ids=["same-count", "more-classes"])
def test_classification_restores_backbone_and_neck_and_leaves_every_head_at_init(src, old, tmp_path):
    classes = ["cat", "dog", "bird"]
    file = gluon_file(src, old, tmp_path / "w.params", seed=4)  # heads in the file: not an error
    fresh = snapshot(build(src, classes)[0])
    net, report = build(src, classes, tmp_path / "w.params", type="classification")
    got = snapshot(net)
    heads = [n for n in got if is_head(src, n)]
    assert len(heads) == (24 if src == SSD else 6)
    for n in got:
        if is_head(src, n) or is_buffer(src, n):
            assert same(got[n], fresh[n]), n
        else:
            assert same(got[n], file[n]), n
    assert (report.missing, report.unexpected, report.mismatched) == ([], [], [])
    assert sorted(report.restored) == sorted(n for n in got if not (is_head(src, n) or is_buffer(src, n)))


# --- 4. refused combinations --------------------------------------------------------------------

@FAMILIES
def test_refused_restore_combinations(src, tmp_path):
    file = tmp_path / "w.params"
    gluon_file(src, OLD, file, seed=5)
    with pytest.raises(RestoreError, match="restore.type is none but model.weights"):
        build(src, OLD, file, type="none")
    for kind in ("detection", "classification"):
        with pytest.raises(RestoreError, match=f"restore.type: {kind} needs model.weights"):
            build(src, OLD, None, type=kind)
    assert build(src, OLD, None, type="none")[1] is None
    for kind in ("classification", "none"):  # reuse would be silently ignored
        with pytest.raises(RestoreError, match=f"restores {kind}"):
            build(src, OLD, file if kind == "classification" else None, type=kind, reuse={"zero": "one"})
    assert build(src, OLD)[1] is None


@pytest.mark.parametrize("src, other", [(SSD, YOLO), (YOLO, SSD)])
@pytest.mark.parametrize("kind", ["detection", "classification"])
def test_a_file_of_the_other_family_is_refused(src, other, kind, tmp_path):
    file = tmp_path / "other.params"
    gluon_file(other, OLD, file, seed=6)
    with pytest.raises(RestoreError) as e:
        build(src, OLD, file, type=kind)
    assert str(file) in str(e.value)
    assert isinstance(e.value, GluontlError)


# --- 5. pitfalls ---------------------------------------------------------------------------------

@pytest.mark.parametrize("voc", ["ssd_300_mobilenet0.25_voc", "yolo3_mobilenet0.25_voc"])
def test_reset_class_before_initialize_raises_upstream_and_build_detector_replaces_voc_classes(voc):
    from gluoncv.model_zoo import get_model

    upstream = get_model(voc, pretrained=False, pretrained_base=False)
    with pytest.raises(RuntimeError, match="has not been initialized"):
        upstream.reset_class(["cat", "dog"])
    net, report = build_detector(recipe(voc), ["cat", "dog"])
    assert report is None and list(net.classes) == ["cat", "dog"] and num_classes(net) == 2
    custom = build(SSD if voc.startswith("ssd") else YOLO, ["cat", "dog"])[0]  # the same net, built for 2
    assert {n: a.shape for n, a in snapshot(net).items()} == {n: a.shape for n, a in snapshot(custom).items()}
    with mx.autograd.predict_mode():
        ids, scores, boxes = net(mx.nd.zeros((1, *SHAPE)))
    assert set(np.unique(ids.asnumpy())) <= {-1.0, 0.0, 1.0}


def test_yolov3_num_class_raises_upstream_and_num_classes_works():
    net, _ = build(YOLO, ["a", "b", "c"])
    with pytest.raises(AttributeError):
        net.num_class
    assert num_classes(net) == 3
    ssd, _ = build(SSD, ["a", "b"])
    assert num_classes(ssd) == ssd.num_classes == 2


def _features_in_onnxruntime(net, x: np.ndarray, path: Path) -> list[np.ndarray]:
    """The SSD's feature maps (its FeatureExpander graph) exported by mx.onnx, run in ONNX Runtime."""

    params = {p.name: p.data() for p in net.features.collect_params().values()}
    mx.onnx.export_model(net.features._cached_graph[1], params, [x.shape], [np.float32], str(path))
    return ort_run(path, x, quiet=True)


def test_ssd_expander_batchnorm_gluoncv_init_gives_nan_in_onnxruntime_and_ours_is_identity(tmp_path):
    """GluonCV initializes with ``net.initialize()`` (Uniform(0.07)); the SSD feature expander is
    a SymbolBlock whose BatchNorm parameters have no init of their own (the graph's
    ``__init__`` attrs "one"/"zero" are ignored), so gamma and the running variance come out
    Uniform(-0.07, 0.07): half the variances negative. MXNet's BatchNorm then computes NaN, which
    its ReLU (oneDNN) turns into 0, so MXNet looks fine while ONNX Runtime's maps are NaN."""
    from gluoncv.model_zoo import get_model

    x = np.random.default_rng(7).standard_normal((1, *SHAPE)).astype(np.float32)
    mx.random.seed(7)
    upstream = get_model(SSD, classes=["a", "b"], pretrained=False, pretrained_base=False)
    upstream.initialize()
    upstream(mx.nd.zeros((1, *SHAPE)))
    expand = {n: p.data().asnumpy() for n, p in upstream.collect_params().items() if "_expand_" in n and "bn" in n}
    assert len(expand) == 8 * 4
    for n, v in expand.items():
        assert np.abs(v).max() <= 0.07 and v.min() < 0, n  # gamma, beta, mean and var alike
    var = expand["ssd0_expand_bn0_moving_var"]
    y = mx.nd.BatchNorm(mx.nd.ones((1, var.size, 1, 1)), mx.nd.ones(var.size), mx.nd.zeros(var.size),
                        mx.nd.zeros(var.size), mx.nd.array(var), use_global_stats=True).asnumpy().ravel()
    assert np.isnan(y).any() and not np.isnan(y[var >= 0]).any()
    assert np.array_equal(mx.nd.Activation(mx.nd.array(y), act_type="relu").asnumpy(), np.where(y > 0, y, 0))
    with mx.autograd.predict_mode():
        mxnet_maps = [f.asnumpy() for f in upstream.features(mx.nd.array(x))]
    onnx_maps = _features_in_onnxruntime(upstream, x, tmp_path / "upstream.onnx")
    assert all(np.isfinite(m).all() for m in mxnet_maps)
    assert [bool(np.isnan(m).all()) for m in onnx_maps] == [False, False, True, True, True, True]  # the expander's

    ours, _ = build(SSD, ["a", "b"])
    bn = {n: e.param.data().asnumpy() for n, e in named_params(ours).items()
          if e.layer is not None and e.layer.type == "BatchNorm"}
    assert len(bn) == 27 * 4 + 8 * 4  # MobileNet0.25's 27 and the expander's 8 BatchNorms
    for n, v in bn.items():
        assert (v == (1.0 if n.endswith(("gamma", "var")) else 0.0)).all(), n
    with mx.autograd.predict_mode():
        mxnet_maps = [f.asnumpy() for f in ours.features(mx.nd.array(x))]
    onnx_maps = _features_in_onnxruntime(ours, x, tmp_path / "ours.onnx")
    for a, b in zip(onnx_maps, mxnet_maps):
        # ~30 float32 conv layers of up to 2304-term sums, rounding error ~sqrt(K) eps each
        assert np.isfinite(a).all() and np.abs(a - b).max() <= 1e-4 * np.abs(b).max()


@FAMILIES
def test_parameter_names_do_not_depend_on_how_many_detectors_the_process_built(src, tmp_path):
    from gluoncv.model_zoo import get_model

    upstream = [get_model(src, classes=OLD, pretrained=False, pretrained_base=False) for _ in range(2)]
    assert set(upstream[0].collect_params()).isdisjoint(upstream[1].collect_params())  # a per-process counter
    first = marked(src, OLD, seed=8)
    second, _ = build(src, OLD)
    assert list(named_params(first)) == list(named_params(second))
    assert [e.param.name for e in named_params(first).values()] == [e.param.name for e in named_params(second).values()]
    checkpoint.save_params(first, tmp_path / "first.params")  # what a run's checkpoint holds
    net, report = build(src, OLD, tmp_path / "first.params")
    want, got = snapshot(first), snapshot(net)
    assert all(same(got[n], want[n]) for n in got if not is_buffer(src, n))
    assert (report.missing, report.unexpected, report.mismatched) == ([], [], [])


def test_gluoncv_ssd300_mobilenet_anchors_cover_the_top_left_quarter_only():
    """Upstream fact (gluoncv 0.10.5): ``ssd_300_mobilenet0.25`` takes VGG-SSD's anchor steps
    (8, 16, 32, 64, 100, 300 px) while MobileNet's maps have strides 16, 32, 64, 100, 150, 300 at
    300 px (19x19, 10x10, 5x5, 3x3, 2x2, 1x1), so the centres of the three finest maps stop at
    (n - 0.5) * step = 148, 152, 144 px: the right and bottom halves have no small anchors.
    Anchors are (cx, cy, w, h) in input pixels and do not scale with the input size. gluontl fits
    them to the maps by default (tests/detect/test_anchors.py); `anchors: zoo` keeps these."""
    rec = parse_recipe({"name": "t", "task": "detection",
                        "model": {"source": f"zoo:{SSD}", "input_shape": [3, 300, 300], "anchors": "zoo"}})
    net, _ = build_detector(rec, ["a"])
    x = mx.nd.zeros((1, 3, 300, 300))
    with mx.autograd.train_mode():
        maps = [f.shape[2] for f in net.features(x)]
        anchors = net(x)[2].asnumpy()[0]
    assert maps == [19, 10, 5, 3, 2, 1]
    per_cell = [4, 6, 6, 6, 4, 4]  # sizes + ratios - 1 per map
    edges = np.cumsum([0] + [m * m * k for m, k in zip(maps, per_cell)])
    assert edges[-1] == len(anchors)
    max_centre = [anchors[a:b, 0].max() for a, b in zip(edges[:-1], edges[1:])]
    np.testing.assert_array_equal(max_centre[:3], [148.0, 152.0, 144.0])
    assert (anchors[:edges[3], :2] <= 152.0).all()


# --- 6. stage map, rules and a short training ----------------------------------------------------

def _mobilenet_index(name: str) -> int | None:
    """MobileNet layer number of an SSD backbone parameter (conv N / batchnorm N)."""
    import re

    m = re.match(r"features\.ssd0_mobilenet0_(?:conv|batchnorm)(\d+)_", name)
    return int(m.group(1)) if m else None


def _up_to_stride8(src: str, name: str) -> bool:
    """Backbone layers whose output stride is at most 8: MobileNet's conv0 (stride 2), its
    depthwise/pointwise pairs 1-2 (2), 3-6 (4: conv3 strides) and 7-10 (8: conv7 strides); YOLOv3
    cuts its backbone at strides 8, 16, 32, so its first stage is everything up to stride 8."""
    if src == SSD:
        i = _mobilenet_index(name)
        return i is not None and i <= 10
    return name.startswith("stages.0.")


@FAMILIES
def test_freeze_until_neck_trains_the_heads_only(src):
    net, _ = build(src, OLD)
    plan = make_plan(net, [{"preset": "freeze_until_stage", "until_stage": "neck"}], input_shape=SHAPE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no Constant (anchor) is handed a grad_req
        apply_plan(net, plan)
    heads = {n for n in plan.by_name() if is_head(src, n)}
    assert set(trainable_params(net)) == heads
    assert {r.name for r in plan.rows if r.trainable} == heads  # the plan counts what trains, buffers not
    assert {r.bn for r in plan.rows if r.bn is not None} == {"frozen"}
    assert {r.stage for r in plan.rows if not is_head(src, r.name) and not is_buffer(src, r.name)} == (
        {"stem", 1, 2, 3, 4, "neck"} if src == SSD else {2, 3, 4, "neck"})


@FAMILIES
def test_freeze_until_stage_2_freezes_up_to_stride_8_and_stage_head_selects_heads(src):
    net, _ = build(src, OLD)
    plan = make_plan(net, [{"preset": "freeze_until_stage", "until_stage": 2}], input_shape=SHAPE)
    frozen = {r.name for r in plan.rows if not r.aux and r.grad_req == "null"}
    assert frozen == {n for n in plan.by_name() if _up_to_stride8(src, n) and not n.endswith(("_mean", "_var"))}
    assert {r.name for r in plan.rows if r.bn == "frozen"} == {
        r.name for r in plan.rows if r.layer_type == "BatchNorm" and _up_to_stride8(src, r.name)}
    plan = make_plan(net, [{"stage": "head", "lr_mult": 0.25}], input_shape=SHAPE)
    assert {r.name for r in plan.rows if r.lr_mult == 0.25 and not r.aux} == {
        n for n in plan.by_name() if is_head(src, n)}


def _padded_boxes(rng: np.random.Generator, images: int, most: int, classes: int) -> mx.nd.NDArray:
    """Ground truth (B, M, 6) [x1, y1, x2, y2, class, difficult] in input pixels, rows padded with -1."""
    y = -np.ones((images, most, 6), np.float32)
    for b in range(images):
        for k in range(rng.integers(1, most + 1)):
            w, h = np.exp(rng.uniform(np.log(4), np.log(SHAPE[2]), 2))  # every scale, anywhere
            x1, y1 = rng.uniform(0, SHAPE[2] - w), rng.uniform(0, SHAPE[1] - h)
            y[b, k] = [x1, y1, x1 + w, y1 + h, rng.integers(classes), 0]
    return mx.nd.array(y)


def _ssd_maps_with_positives(net, ys: list[mx.nd.NDArray]) -> set[int]:
    """Feature maps of an (unhybridized) SSD with an anchor GluonCV's SSD matcher assigns a box to."""
    from gluoncv.model_zoo.ssd.target import SSDTargetGenerator

    x = mx.nd.zeros((1, *SHAPE))
    with mx.autograd.train_mode():
        counts = [gen(f).size // 4 for gen, f in zip(net.anchor_generators, net.features(x))]
        anchors = net(x)[2]
    net._clear_cached_op()
    edges = np.cumsum([0, *counts])
    assert edges[-1] == anchors.shape[1]
    matcher = SSDTargetGenerator(iou_thresh=0.5, stds=(0.1, 0.1, 0.2, 0.2), negative_mining_ratio=-1)
    found = set()
    for y in ys:
        positive = matcher(anchors, None, y[:, :, :4], y[:, :, 4:5])[0].asnumpy() > 0
        found |= {i for i in range(len(counts)) if positive[:, edges[i]:edges[i + 1]].any()}
    return found


@FAMILIES
def test_short_training_leaves_frozen_params_and_frozen_bn_statistics_bit_identical(src):
    from gluontl.tasks.detection import Detection, _ssd_targets, _YoloTargets
    from gluontl.train.loop import Stepper

    rec = recipe(src, rules=[{"preset": "freeze_until_stage", "until_stage": 2}])
    net, _ = build_detector(rec, OLD)
    plan = make_plan(net, rec.rules, epoch=0, input_shape=SHAPE)
    apply_plan(net, plan)
    rng = np.random.default_rng(10)
    batches = [(mx.nd.array(rng.standard_normal((4, *SHAPE)).astype(np.float32)),
                _padded_boxes(rng, 4, 6, len(OLD))) for _ in range(3)]
    # an SSD predictor whose anchors no box matches gets no gradient in its box rows (its weights
    # still move by weight decay): GluonCV's matcher says which maps had positives
    matched = _ssd_maps_with_positives(net, [y for _, y in batches]) if src == SSD else set()
    task = Detection()
    task.family = detector_family(net)
    task.targets = _ssd_targets() if task.family == "ssd" else _YoloTargets(net, SHAPE, mx.cpu())
    net.hybridize(static_alloc=True, static_shape=True)  # as the loop trains
    trainer = mx.gluon.Trainer(list(trainable_params(net).values()), "sgd",
                               {"learning_rate": 0.01, "momentum": 0.9, "wd": 1e-4})
    stepper = Stepper(net, trainer, task.forward, [mx.cpu()])
    before = snapshot(net)
    for x, y in batches:
        assert np.isfinite(stepper.step(x, y))
    after = snapshot(net)
    rows = plan.by_name()
    frozen = [n for n in rows if _up_to_stride8(src, n)]
    moving = [n for n, r in rows.items() if r.trainable or (r.aux and r.bn == "train")]
    assert frozen and moving and not set(frozen) & set(moving)
    for n in frozen + [n for n in rows if is_buffer(src, n)]:
        assert same(after[n], before[n]), n
    unmatched = {f"box_predictors.{i}.predictor.bias" for i in range(6) if i not in matched} if src == SSD else set()
    assert src != SSD or matched
    assert {n for n in moving if same(after[n], before[n])} == unmatched
