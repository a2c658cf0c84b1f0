"""Detector export: ONNX with per-class NMS == MXNet's box_nms (issue 12).

Tolerances: scores live in [0, 1] and boxes are pixel coordinates decoded through exp(); MXNet
(oneDNN) and onnxruntime (MLAS) sum convolutions in different orders, so float32 candidates
differ by a few ulp of the values they feed, which exp() scales by the box size: measured on
the photos (AVX2), scores 1.2e-7 (SSD) / 7.2e-7 (YOLOv3), boxes 7.6e-6 of 135 px / 2.9e-3 of
473 px (6e-6 relative). 1e-4 absolute on scores and 1e-4 of the coordinate scale on boxes leave
a 16x margin at the least; class ids and the -1 padding must be equal exactly.
"""
from __future__ import annotations

import json
import logging
import warnings

import mxnet as mx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from gluoncv import model_zoo
from sklearn.datasets import load_sample_images

from gluontl.detect.export import (GLUONCV_SCORE_THRESH, META_NMS, _compare, _detector_onnx, _verify,
                                   box_nms_model, export_detector, mxnet_box_nms)
from gluontl.errors import ExportError
from gluontl.export.trace import sample_batches
from gluontl.recipe import TransformSpec
from gluontl.data.transforms import META_CLASSES, load_preprocess, model_card
from tests.helpers import ort_run, ort_session

SIZE = 128
CLASSES = ["cat", "dog", "bird"]
MODELS = {"ssd": "ssd_300_mobilenet0.25_custom", "yolo": "yolo3_mobilenet0.25_custom"}
TOL = 1e-4


def _fix_bn(net: mx.gluon.HybridBlock) -> None:
    """Identity BatchNorm: with pretrained_base=False, SSD's extra layers' BN gets the Uniform
    default init, negative running variances included (NaN in onnxruntime)."""
    for name, p in net.collect_params().items():
        if name.endswith(("running_var", "moving_var", "gamma")):
            p.set_data(mx.nd.ones(p.shape))
        elif name.endswith(("running_mean", "moving_mean", "beta")):
            p.set_data(mx.nd.zeros(p.shape))


def _net(kind: str, seed: int = 0) -> mx.gluon.HybridBlock:
    """A real GluonCV detector with He-initialised convolutions, so scores spread (Gluon's
    default Uniform(0.07) makes MobileNet's features vanish and every score equal)."""
    mx.random.seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = model_zoo.get_model(MODELS[kind], classes=CLASSES, pretrained=False, pretrained_base=False)
    net.initialize()
    net(mx.nd.zeros((1, 3, SIZE, SIZE)))
    _fix_bn(net)
    for p in net.collect_params().values():
        if p.name.endswith("weight") and len(p.shape) == 4:
            p.set_data(mx.nd.random.normal(0, (2.0 / np.prod(p.shape[1:])) ** 0.5, p.shape))
    return net


def _photos() -> np.ndarray:
    """scikit-learn's two sample photos and their mirror images, resized and normalized."""
    images = [mx.image.imresize(mx.nd.array(im), SIZE, SIZE).asnumpy() for im in load_sample_images().images]
    images += [im[:, ::-1] for im in images]
    x = np.stack(images).transpose(0, 3, 1, 2).astype(np.float32) / 255
    return (x - 0.45) / 0.225


def _mxnet(net: mx.gluon.HybridBlock, x: np.ndarray) -> list[np.ndarray]:
    with mx.autograd.predict_mode():
        return [a.asnumpy() for a in net(mx.nd.array(x))]


def _assert_same(got: list[np.ndarray], want: list[np.ndarray], scale: float = SIZE) -> None:
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=TOL)
    np.testing.assert_allclose(got[2], want[2], rtol=0, atol=TOL * max(scale, np.abs(want[2]).max()))


@pytest.mark.parametrize("kind", ["ssd", "yolo"])
def test_onnx_reproduces_mxnet_detections_on_photos(kind, tmp_path):
    net = _net(kind)
    x = _photos()
    want = _mxnet(net, x)  # the net's own forward, with GluonCV's real box_nms
    valid = want[0] >= 0
    assert valid.sum(axis=1).min() >= 10 and len(np.unique(want[0][valid])) == 3  # a non-trivial case
    card = model_card(TransformSpec(resize=SIZE), ["stale", "names"], "data", (3, SIZE, SIZE))
    paths = export_detector(net, tmp_path, "det", (3, SIZE, SIZE), class_names=CLASSES, card=card, sample=x)
    assert [p.name for p in paths] == ["det-symbol.json", "det-0000.params", "det-preprocess.json", "det.onnx"]
    assert (net.nms_thresh, net.nms_topk, net.post_nms) == (0.45, 400, 100)  # restored

    session = ort_session(tmp_path / "det.onnx")
    assert [o.name for o in session.get_outputs()] == ["ids", "scores", "bboxes"]
    for batch in (x[:1], x):  # the batch dimension is free
        got = session.run(None, {"data": batch})
        assert [g.shape for g in got] == [(len(batch), 100, 1), (len(batch), 100, 1), (len(batch), 100, 4)]
        _assert_same(got, _mxnet(net, batch))

    meta = {p.key: p.value for p in onnx.load(str(tmp_path / "det.onnx")).metadata_props}
    nms = {"nms_thresh": 0.45, "nms_topk": 400, "post_nms": 100, "score_thresh": GLUONCV_SCORE_THRESH}
    assert json.loads(meta[META_CLASSES]) == CLASSES and json.loads(meta[META_NMS]) == nms
    prep, names = load_preprocess(tmp_path / "det.onnx")  # what predict reads from an ONNX file
    assert names == CLASSES and prep == load_preprocess(card)[0]
    assert json.loads((tmp_path / "det-preprocess.json").read_text()) == {**card, "classes": CLASSES, "nms": nms}

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reloaded = mx.gluon.SymbolBlock.imports(str(tmp_path / "det-symbol.json"), ["data"],
                                                str(tmp_path / "det-0000.params"))
    for a, b in zip(_mxnet(reloaded, x), want):
        np.testing.assert_array_equal(a, b)


def test_export_after_a_hybridized_training_step(tmp_path):
    """Pitfall: after a hybridized training-mode call, net(x) keeps returning the training graph's
    outputs until re-hybridized or set_nms; the export's set_nms calls rebuild the graph."""
    net = _net("ssd", seed=5)
    net.hybridize(static_alloc=True, static_shape=True)
    x = _photos()[:2]
    with mx.autograd.record(train_mode=True):
        cls_preds, box_preds, anchors = net(mx.nd.array(x))
    export_detector(net, tmp_path, "det", (3, SIZE, SIZE), class_names=CLASSES, sample=x, formats=["onnx"])
    graph = onnx.load(str(tmp_path / "det.onnx")).graph  # one name for the batch, as every export has it
    assert [v.type.tensor_type.shape.dim[0].dim_param for v in (*graph.input, *graph.output)] == ["batch"] * 4
    got = ort_run(tmp_path / "det.onnx", {"data": x})
    want = _mxnet(net, x)
    assert want[0].shape == (2, 100, 1)  # the inference graph again
    _assert_same(got, want)


def test_export_with_other_nms_settings_matches_the_net_set_to_them(tmp_path):
    net = _net("ssd", seed=3)
    x = _photos()
    export_detector(net, tmp_path, "det", (3, SIZE, SIZE), class_names=CLASSES, nms_thresh=0.3, nms_topk=50,
                    post_nms=20, sample=x)
    assert (net.nms_thresh, net.nms_topk, net.post_nms) == (0.45, 400, 100)
    net.set_nms(0.3, 50, 20)
    want = _mxnet(net, x)
    got = ort_run(tmp_path / "det.onnx", {"data": x})
    assert got[0].shape == (4, 20, 1)
    _assert_same(got, want)


def _nms_onnx(cand: list[np.ndarray], num_classes: int, **settings) -> list[np.ndarray]:
    model = box_nms_model(num_classes, cand[0].shape[1], **settings)
    session = ort_session(model)
    return session.run(None, dict(zip(("cand_ids", "cand_scores", "cand_boxes"), cand)))


def _nms_mxnet(cand: list[np.ndarray], nms_thresh: float, nms_topk: int = -1, post_nms: int = -1,
               score_thresh: float = GLUONCV_SCORE_THRESH) -> list[np.ndarray]:
    settings = {"nms_thresh": nms_thresh, "nms_topk": nms_topk, "post_nms": post_nms, "score_thresh": score_thresh}
    return mxnet_box_nms(*(mx.nd.array(c) for c in cand), settings)


def _hand_made() -> list[np.ndarray]:
    """Rows: id, score, box. A (class 0) and B (class 1) overlap with IoU 0.82 > 0.45; C (class 0)
    overlaps A with IoU 0.91; D (class 1) is far away; E has C's box and D's score in class 2;
    F is below the score threshold; G has the top score but id -1, box_nms's background id; H
    ties D in class and score and overlaps it: the earlier row (D) wins in both."""
    rows = [[0, 0.9, 10, 10, 50, 50],    # A
            [1, 0.8, 12, 12, 52, 52],    # B: IoU(A, B) = 38^2 / (2 * 40^2 - 38^2) = 0.8223
            [0, 0.7, 11, 11, 51, 51],    # C: IoU(A, C) = 39^2 / (2 * 40^2 - 39^2) = 0.9059, suppressed by A
            [1, 0.7, 80, 80, 120, 120],  # D
            [2, 0.7, 11, 11, 51, 51],    # E: ties D; the input order decides (a stable sort)
            [2, 0.005, 80, 80, 120, 120],  # F
            [-1, 0.95, 10, 10, 50, 50],  # G: dropped, suppresses nothing
            [1, 0.7, 81, 81, 121, 121]]  # H: IoU(D, H) = 39^2 / (2 * 40^2 - 39^2) = 0.9059
    a = np.array([rows], np.float32)
    return [a[..., :1], a[..., 1:2], a[..., 2:]]


def _assert_equal(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_overlapping_boxes_of_different_classes_are_all_kept():
    cand = _hand_made()
    want = _nms_mxnet(cand, 0.45)
    # MXNet keeps A, B, D, E (D before E: equal scores keep the input order); A suppresses C only
    np.testing.assert_array_equal(want[0][0, :, 0], [0, 1, 1, 2, -1, -1, -1, -1])
    np.testing.assert_array_equal(want[1][0, :, 0], np.float32([0.9, 0.8, 0.7, 0.7, -1, -1, -1, -1]))
    np.testing.assert_array_equal(want[2][0, 2], [80, 80, 120, 120])  # D, not H
    _assert_equal(_nms_onnx(cand, 3, nms_thresh=0.45), want)


def test_same_class_overlap_is_suppressed_and_thresholds_are_strict():
    cand = _hand_made()
    cand[0][0, 1, 0] = 0  # B becomes class 0: A suppresses it
    got = _nms_onnx(cand, 3, nms_thresh=0.45)
    np.testing.assert_array_equal(got[0][0, :4, 0], [0, 1, 2, -1])
    _assert_equal(got, _nms_mxnet(cand, 0.45))
    # IoU(A, B) = 0.8223 is not > 0.83: B stays; IoU(A, C) = 0.9059 > 0.83: C goes
    got = _nms_onnx(cand, 3, nms_thresh=0.83)
    np.testing.assert_array_equal(got[0][0, :5, 0], [0, 0, 1, 2, -1])
    _assert_equal(got, _nms_mxnet(cand, 0.83))
    # a score equal to score_thresh is dropped (valid means score > score_thresh): C, D, E at 0.7
    got = _nms_onnx(cand, 3, nms_thresh=0.45, score_thresh=0.7)
    np.testing.assert_array_equal(got[0][0, :2, 0], [0, -1])
    _assert_equal(got, _nms_mxnet(cand, 0.45, score_thresh=0.7))


def test_plain_mx_onnx_box_nms_suppresses_across_classes():
    """Pins the upstream bug this module works around: mx.onnx ignores id_index and
    force_suppress=False, so B (class 1) is suppressed by A (class 0) in ONNX."""
    cand = [c[:, :6] for c in _hand_made()]  # without G: plain mx.onnx would not drop its -1 id either
    data = mx.sym.var("data")
    sym = mx.sym.contrib.box_nms(data, overlap_thresh=0.45, valid_thresh=GLUONCV_SCORE_THRESH, topk=-1,
                                 id_index=0, score_index=1, coord_start=2, force_suppress=False)
    x = np.concatenate(cand, axis=-1)
    logging.disable(logging.WARNING)  # mx.onnx warns about exactly this
    try:
        from mxnet.onnx.mx2onnx._export_onnx import MXNetGraph
        graph = MXNetGraph().create_onnx_graph_proto(sym, {}, [x.shape], [onnx.TensorProto.FLOAT], opset_version=13)
    finally:
        logging.disable(logging.NOTSET)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    model.ir_version = 8
    session = ort_session(model)
    plain = session.run(None, {"data": x})[0]
    mxnet = mx.nd.contrib.box_nms(mx.nd.array(x), overlap_thresh=0.45, valid_thresh=GLUONCV_SCORE_THRESH,
                                  id_index=0, score_index=1, coord_start=2, force_suppress=False).asnumpy()
    assert 1.0 in mxnet[0, :, 0] and 1.0 in mxnet[0, :2, 0]  # MXNet keeps B right after A
    kept_boxes = {tuple(r[2:]) for r in plain[0] if r[0] >= 0}
    assert (12.0, 12.0, 52.0, 52.0) not in kept_boxes and (10.0, 10.0, 50.0, 50.0) in kept_boxes


def _random_candidates(seed: int, batch: int = 2, num: int = 60, classes: int = 4) -> list[np.ndarray]:
    """Clustered boxes (many overlaps within and across classes), distinct scores, some below
    the threshold with SSD's -1 id, and some -1 ids above it (box_nms drops them before topk)."""
    rng = np.random.RandomState(seed)
    centers = rng.uniform(20, 100, (batch, 6, 2))[:, rng.randint(0, 6, num)]
    wh = rng.uniform(10, 40, (batch, num, 2))
    xy = centers + rng.normal(0, 4, (batch, num, 2))
    boxes = np.concatenate([xy - wh / 2, xy + wh / 2], axis=-1)
    scores = rng.permutation(batch * num).reshape(batch, num) / (batch * num) * 0.9 + 0.001
    ids = rng.randint(0, classes, (batch, num)).astype(np.float64)
    ids[(scores <= GLUONCV_SCORE_THRESH) | (rng.uniform(size=(batch, num)) < 0.15)] = -1
    return [ids[..., None].astype(np.float32), scores[..., None].astype(np.float32), boxes.astype(np.float32)]


@pytest.mark.parametrize("nms_topk,post_nms", [(-1, -1), (15, -1), (-1, 7), (15, 40), (1000, 60), (1, 3)])
def test_topk_and_post_nms_truncation_match_mxnet(nms_topk, post_nms):
    """topk selects before NMS over all classes; post_nms after; rows past what survives are -1
    (the (15, 40) case pads 25+ rows)."""
    for seed in range(3):
        cand = _random_candidates(seed)
        want = _nms_mxnet(cand, 0.45, nms_topk, post_nms)
        got = _nms_onnx(cand, 4, nms_thresh=0.45, nms_topk=nms_topk, post_nms=post_nms)
        _assert_equal(got, want)
        assert (want[0] >= 0).sum() >= 2  # something survived, so order and content were checked


def test_nothing_above_the_threshold_gives_only_padding():
    cand = _random_candidates(7)
    cand[1][:] = 0.005
    got = _nms_onnx(cand, 4, nms_thresh=0.45, post_nms=10)
    assert all((g == -1).all() for g in got) and got[2].shape == (2, 10, 4)
    _assert_equal(got, _nms_mxnet(cand, 0.45, post_nms=10))


def test_an_image_without_detections_beside_one_with():
    cand = _random_candidates(8)
    cand[1][0] = 0.005  # image 0: nothing above the threshold
    want = _nms_mxnet(cand, 0.45, 30, 20)
    assert (want[0][0] == -1).all() and (want[0][1] >= 0).sum() >= 2
    _assert_equal(_nms_onnx(cand, 4, nms_thresh=0.45, nms_topk=30, post_nms=20), want)


def test_yolo_export_loads_with_constant_folding(tmp_path):
    """A plain static mx.onnx export of YOLOv3 fails in onnxruntime's ConstantFolding ("Attempt
    to replace the existing tensor") and loads only with it disabled; ours (free batch, lean)
    loads with every default optimizer."""
    net = _net("yolo", seed=1)
    net.hybridize()
    x = _photos()[:1]
    net(mx.nd.array(x))
    net.export(str(tmp_path / "plain"))
    logging.disable(logging.WARNING)
    try:
        mx.onnx.export_model(str(tmp_path / "plain-symbol.json"), str(tmp_path / "plain-0000.params"),
                             [x.shape], np.float32, str(tmp_path / "plain.onnx"))
    finally:
        logging.disable(logging.NOTSET)
    quiet = ort.SessionOptions()
    quiet.log_severity_level = 4
    with pytest.raises(Exception, match="replace the existing tensor"):
        ort.InferenceSession(str(tmp_path / "plain.onnx"), quiet, providers=["CPUExecutionProvider"])
    ort.InferenceSession(str(tmp_path / "plain.onnx"), quiet, providers=["CPUExecutionProvider"],
                         disabled_optimizers=["ConstantFolding"])

    net = _net("yolo", seed=1)
    export_detector(net, tmp_path, "det", (3, SIZE, SIZE), class_names=CLASSES, sample=x, formats=["onnx"])
    session = ort_session(tmp_path / "det.onnx")
    _assert_same(session.run(None, {"data": x}), _mxnet(net, x))


def test_verification_refuses_a_graph_that_disagrees(tmp_path):
    """The check that guards export_detector: an NMS graph built with other settings than the
    reference's is refused (and, built with the same, accepted)."""
    net = _net("ssd", seed=2)
    x = _photos()
    shape = (1, 3, SIZE, SIZE)
    loose = {"nms_thresh": 0.9, "nms_topk": 400, "post_nms": 100, "score_thresh": GLUONCV_SCORE_THRESH}
    net.set_nms(-1, -1, -1)
    data = _detector_onnx(net, "data", shape, 3, loose).SerializeToString()
    _verify(data, net, tmp_path / "x.onnx", sample_batches(x, shape), loose, SIZE, TOL)
    with pytest.raises(ExportError, match=r"disagrees with MXNet's box_nms on the sample image 0: image 0, row \d+"):
        _verify(data, net, tmp_path / "x.onnx", sample_batches(x, shape), {**loose, "nms_thresh": 0.45}, SIZE, TOL)


def test_comparison_tolerances():
    """Boxes that overflowed exp() to inf in both runtimes agree; finite boxes are judged against
    the largest finite coordinate (or the input size); NaN never agrees."""
    ids, scores = np.float32([[[0], [1]]]), np.float32([[[0.5], [0.25]]])
    boxes = np.float32([[[0, 0, 1000, np.inf], [1, 2, 3, 4]]])
    assert _compare([ids, scores, boxes], [ids, scores, boxes], 128, TOL) is None
    assert _compare([ids, scores, boxes + 0.09], [ids, scores, boxes], 128, TOL) is None  # 1e-4 of 1000 px
    assert "boxes by 1.10e-01" in _compare([ids, scores, boxes + 0.11], [ids, scores, boxes], 128, TOL)
    assert "scores differ by up to 2.00e-04" in _compare([ids, scores + 2e-4, boxes], [ids, scores, boxes], 128, TOL)
    assert "boxes by nan" in _compare([ids, scores, boxes * np.nan], [ids, scores, boxes], 128, TOL)
    assert "row 1: class id 2" in _compare([ids * 2, scores, boxes], [ids, scores, boxes], 128, TOL)


def test_detections_whose_scores_tie_within_tolerance_may_come_in_either_order():
    """MXNet and onnxruntime round scores differently (2e-8 apart on the demo's validation
    images), which can swap two neighbours in the ranking or pick the other of two tied
    candidates for the last place post_nms keeps; neither is a disagreement. A swap of scores
    further apart, or a different class at a place, still is."""
    ids = np.float32([[[0], [1], [2]]])  # post_nms 3 filled every place
    scores = np.float32([[[0.9], [0.3], [0.3 - 2e-8]]])
    boxes = np.float32([[[0, 0, 10, 10], [5, 5, 20, 20], [30, 30, 40, 40]]])
    swap = [0, 2, 1]
    assert _compare([ids[:, swap], scores[:, swap], boxes[:, swap]], [ids, scores, boxes], 128, TOL) is None
    last = ids.copy(), scores.copy(), boxes.copy()  # the last kept place: another candidate of a tied score
    last[0][0, 2], last[2][0, 2] = 4, [60, 60, 70, 70]
    assert _compare(list(last), [ids, scores, boxes], 128, TOL) is None
    apart = scores.copy()
    apart[0, 2] = 0.3 - 3e-4
    assert "class id" in _compare([ids[:, swap], apart[:, swap], boxes[:, swap]], [ids, scores, boxes], 128, TOL)
    other = ids.copy()
    other[0, 0] = 3  # the top detection's class differs
    assert "class id 3" in _compare([other, scores, boxes], [ids, scores, boxes], 128, TOL)
    relabelled = ids.copy()
    relabelled[0, 2] = 4  # the last place: the same box with another class is no tie
    assert "class id 4" in _compare([relabelled, scores, boxes], [ids, scores, boxes], 128, TOL)


def test_refusals_name_the_setting_and_restore_the_net(tmp_path):
    net = _net("ssd", seed=4)
    shape = (3, SIZE, SIZE)
    with pytest.raises(ExportError, match="exports GluonCV SSD and YOLOv3 networks .*, not a Dense"):
        export_detector(mx.gluon.nn.Dense(2), tmp_path, "d", shape, class_names=CLASSES)
    with pytest.raises(ExportError, match="class_names has 2 names but the network predicts 3"):
        export_detector(net, tmp_path, "d", shape, class_names=CLASSES[:2])
    with pytest.raises(ExportError, match="nms_thresh is 1.0"):
        export_detector(net, tmp_path, "d", shape, class_names=CLASSES, nms_thresh=1.0)
    with pytest.raises(ExportError, match="post_nms is 5000 but the network makes only 1170 candidates"):
        export_detector(net, tmp_path, "d", shape, class_names=CLASSES, post_nms=5000, formats=["onnx"])
    with pytest.raises(ExportError, match="score_thresh 0.2 cannot go into the symbol export"):
        export_detector(net, tmp_path, "d", shape, class_names=CLASSES, score_thresh=0.2)
    with pytest.raises(ExportError, match="sample has shape"):
        export_detector(net, tmp_path, "d", shape, class_names=CLASSES, sample=np.zeros((2, 3, 64, 64)),
                        formats=["onnx"])
    assert (net.nms_thresh, net.nms_topk, net.post_nms) == (0.45, 400, 100)
    assert not list(tmp_path.iterdir())
