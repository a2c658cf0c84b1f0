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

from gluontl.detect.models import build_detector, num_classes, stage_map
from gluontl.errors import GluontlError, RestoreError
from gluontl.naming import named_params
from gluontl.recipe import TransformSpec, parse_recipe
from gluontl.rules import apply_plan, make_plan, trainable_params
from gluontl.sources.restore import snapshot
from gluontl.train import checkpoint
from gluontl.train.transforms import model_card

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
# (new classes, reuse, old names known from a run folder, expected {new index: old index})
REUSE_CASES = {
    "names-fewer": (["cat", "dog"], {"cat": "two", "dog": "zero"}, True, {0: 2, 1: 0}),
    "names-more": (["a", "b", "c", "d", "e"], {"e": "one", "b": "two"}, True, {4: 1, 1: 2}),
    "same-names-no-map": (["one", "seven", "zero"], {}, True, {0: 1, 2: 0}),
    "indices": (["p", "q"], {"1": "2"}, False, {1: 2}),
    "index-and-name": (["p", "q", "r"], {"r": "0"}, True, {2: 0}),
}


@FAMILIES
@pytest.mark.parametrize("case", list(REUSE_CASES))
def test_detection_new_classes_keep_class_independent_rows_and_reuse_listed_ones(src, case, tmp_path):
    classes, reuse, from_run, mapping = REUSE_CASES[case]
    if from_run:
        weights, file = run_folder(src, OLD, tmp_path, seed=2)
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
    assert sorted(m[0] for m in report.mismatched) == sorted(class_layers)
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


def test_ssd_expander_batchnorm_gluoncv_init_is_uniform_and_ours_is_identity():
    """GluonCV initializes with ``net.initialize()`` (Uniform(0.07)); the SSD feature expander is
    a SymbolBlock whose BatchNorm parameters have no init of their own (the graph's
    ``__init__`` attrs "one"/"zero" are ignored), so gamma and the running variance come out
    Uniform(-0.07, 0.07): half the variances negative."""
    import onnxruntime as ort
    from gluoncv.model_zoo import get_model
    from onnx import TensorProto, helper

    mx.random.seed(7)
    upstream = get_model(SSD, classes=["a", "b"], pretrained=False, pretrained_base=False)
    upstream.initialize()
    upstream(mx.nd.zeros((1, *SHAPE)))
    expand = {n: p.data().asnumpy() for n, p in upstream.collect_params().items() if "_expand_" in n and "bn" in n}
    assert len(expand) == 8 * 4
    for n, v in expand.items():
        assert np.abs(v).max() <= 0.07 and v.min() < 0, n  # gamma, beta, mean and var alike
    # MXNet's BatchNorm then gives NaN; MXNet's ReLU (oneDNN) maps NaN to 0 and hides it, ONNX's keeps it
    var = expand["ssd0_expand_bn0_moving_var"]
    y = mx.nd.BatchNorm(mx.nd.ones((1, var.size, 1, 1)), mx.nd.ones(var.size), mx.nd.zeros(var.size),
                        mx.nd.zeros(var.size), mx.nd.array(var), use_global_stats=True).asnumpy().ravel()
    assert np.isnan(y).any() and not np.isnan(y[var >= 0]).any()
    relu = mx.nd.Activation(mx.nd.array(y), act_type="relu").asnumpy()
    assert np.isfinite(relu).all()
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [y.size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [y.size])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert np.array_equal(np.isnan(sess.run(None, {"x": y})[0]), np.isnan(y))

    ours, _ = build(SSD, ["a", "b"])
    bn = {n: v for n, v in snapshot(ours).items() if "batchnorm" in n or "_bn" in n}
    assert len(bn) == 27 * 4 + 8 * 4  # MobileNet0.25's 27 and the expander's 8 BatchNorms
    for n, v in bn.items():
        want = 1.0 if n.endswith(("gamma", "var")) else 0.0
        assert (v == want).all(), n
