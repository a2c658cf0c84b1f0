"""Export a GluonCV detector (SSD, YOLOv3) to MXNet symbol/params and to ONNX with per-class NMS.

``mx.onnx`` translates ``box_nms`` into class-agnostic NMS (it ignores ``id_index`` and
``force_suppress=False``), so two overlapping boxes of different classes lose one in ONNX.
The ONNX file is therefore the network's decoded per-class candidates (``set_nms(-1, -1, -1)``)
followed by ONNX ops that redo MXNet's ``box_nms(id_index=0, force_suppress=False)`` step by
step: drop scores <= ``score_thresh``, keep the global top ``nms_topk`` by score (a stable
sort, ties to the lower index, as MXNet's), greedy IoU > ``nms_thresh`` suppression within each
class (``NonMaxSuppression``, whose scores are per class), then the kept rows in that order,
``post_nms`` of them, padded with -1 rows. Outputs: ``ids`` and ``scores`` (B, P, 1) and
``bboxes`` (B, P, 4), as the MXNet net returns them.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from gluontl.atomic import atomic_write
from gluontl.errors import ExportError, short_reason
from gluontl.export import registry
from gluontl.export.artifacts import Exported
from gluontl.export.exporters import check_target, convert_block, export_block, finish_model, set_metadata
from gluontl.export.trace import sample_batches
from gluontl.export.verify import FIXED_RTOL, ort_session
from gluontl.data.transforms import META_CLASSES, onnx_props

log = logging.getLogger(__name__)

META_NMS = "gluontl.nms"
OUTPUT_NAMES = ("ids", "scores", "bboxes")
# GluonCV's SSD and YOLOv3 forwards call box_nms with valid_thresh=0.01.
GLUONCV_SCORE_THRESH = 0.01
_OPSET = 13
_PREFIX = "gluontl_nms/"


def _nms_nodes(ids: str, scores: str, boxes: str, outputs: Sequence[str], *, num_classes: int,
               num_candidates: int, nms_thresh: float, nms_topk: int, post_nms: int,
               score_thresh: float
               ) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], list[onnx.ValueInfoProto]]:
    """Nodes, constants and output declarations computing MXNet's per-class ``box_nms`` +
    ``post_nms`` slice from candidate tensors ``ids``/``scores`` (B, M, 1) and ``boxes``
    (B, M, 4) into ``outputs``.

    Candidates of id -1 (box_nms's default ``background_id``; SSD's mark for sub-threshold
    scores) are dropped before the top-k whatever their score, as MXNet drops them.
    """
    m = num_candidates
    if post_nms > m:
        raise ExportError(f"post_nms is {post_nms} but the network makes only {m} candidates at this input size "
                          f"(MXNet itself fails slicing them); use post_nms <= {m}, or -1 for all.")
    k = m if nms_topk <= 0 else min(nms_topk, m)
    p = m if post_nms <= 0 else post_nms
    kept = min(p, k)

    def n(name: str) -> str:
        return _PREFIX + name

    inits = [
        numpy_helper.from_array(np.array([2], np.int64), n("axis2")),
        numpy_helper.from_array(np.array([1], np.int64), n("axis1")),
        numpy_helper.from_array(np.array([-1], np.int64), n("axis_last")),
        numpy_helper.from_array(np.array(score_thresh, np.float32), n("score_thresh")),
        numpy_helper.from_array(np.array(-1.0, np.float32), n("minus_one")),
        numpy_helper.from_array(np.array([k], np.int64), n("k")),
        numpy_helper.from_array(np.array([kept], np.int64), n("kept")),
        numpy_helper.from_array(np.array([k], np.int64), n("max_per_class")),
        numpy_helper.from_array(np.array([nms_thresh], np.float32), n("iou")),
        numpy_helper.from_array(np.array([score_thresh], np.float32), n("score_thresh_1d")),
        numpy_helper.from_array(np.arange(num_classes, dtype=np.float32).reshape(1, -1, 1), n("classes")),
        numpy_helper.from_array(np.array([0, 2], np.int64), n("batch_and_box")),
        numpy_helper.from_array(np.array(0.0, np.float32), n("zero")),
        numpy_helper.from_array(np.array(0.5, np.float32), n("half")),
        numpy_helper.from_array(np.array([0], np.int64), n("zero_i")),
    ]
    node = helper.make_node
    nodes = [
        node("Squeeze", [scores, n("axis2")], [n("s")]),  # (B, M)
        node("Squeeze", [ids, n("axis2")], [n("i")]),
        # valid: score > valid_thresh and id != background_id (-1); invalid candidates sort
        # below every valid one (valid scores are > thresh >= 0)
        node("Greater", [n("s"), n("score_thresh")], [n("above")]),
        node("Equal", [n("i"), n("minus_one")], [n("background")]),
        node("Not", [n("background")], [n("not_background")]),
        node("And", [n("above"), n("not_background")], [n("valid")]),
        node("Where", [n("valid"), n("s"), n("minus_one")], [n("key")]),
        # global topk before NMS, stable: ONNX TopK breaks ties to the lower index like MXNet's sort
        node("TopK", [n("key"), n("k")], [n("top_s"), n("top_j")], axis=1, largest=1, sorted=1),
        node("GatherElements", [n("i"), n("top_j")], [n("top_i")], axis=1),  # (B, K)
        node("Unsqueeze", [n("top_j"), n("axis_last")], [n("top_j3")]),
        node("GatherND", [boxes, n("top_j3")], [n("top_b")], batch_dims=1),  # (B, K, 4)
        # per-class scores (B, C, K): a candidate scores only in its own class's row
        node("Unsqueeze", [n("top_i"), n("axis1")], [n("top_i3")]),
        node("Equal", [n("top_i3"), n("classes")], [n("own")]),
        node("Unsqueeze", [n("top_s"), n("axis1")], [n("top_s3")]),
        node("Where", [n("own"), n("top_s3"), n("minus_one")], [n("class_s")]),
        node("NonMaxSuppression", [n("top_b"), n("class_s"), n("max_per_class"), n("iou"), n("score_thresh_1d")],
             [n("selected")], center_point_box=0),  # (S, 3): batch, class, box
        node("Gather", [n("selected"), n("batch_and_box")], [n("sel_bk")], axis=1),
        node("Shape", [n("selected")], [n("sel_shape")]),
        node("Slice", [n("sel_shape"), n("zero_i"), n("axis1")], [n("sel_count1")]),  # [S]
        node("ConstantOfShape", [n("sel_count1")], [n("ones")],
             value=helper.make_tensor("", TensorProto.FLOAT, [1], [1.0])),
        node("Mul", [n("top_s"), n("zero")], [n("zeros")]),
        node("ScatterND", [n("zeros"), n("sel_bk"), n("ones")], [n("keep")]),  # 1 where kept
        # the kept candidates in score order (ties: lower position first), then -1 rows
        node("Greater", [n("keep"), n("half")], [n("kept_mask")]),
        node("Where", [n("kept_mask"), n("top_s"), n("minus_one")], [n("key2")]),
        node("TopK", [n("key2"), n("kept")], [n("out_s"), n("out_j")], axis=1, largest=1, sorted=1),
        node("Greater", [n("out_s"), n("minus_one")], [n("out_valid")]),
        node("GatherElements", [n("top_i"), n("out_j")], [n("out_i_raw")], axis=1),
        node("Where", [n("out_valid"), n("out_i_raw"), n("minus_one")], [n("out_i")]),
        node("Unsqueeze", [n("out_j"), n("axis_last")], [n("out_j3")]),
        node("GatherND", [n("top_b"), n("out_j3")], [n("out_b_raw")], batch_dims=1),
        node("Unsqueeze", [n("out_valid"), n("axis_last")], [n("out_valid3")]),
        node("Where", [n("out_valid3"), n("out_b_raw"), n("minus_one")], [n("out_b")]),
        node("Unsqueeze", [n("out_i"), n("axis_last")], [n("out_i3")]),
        node("Unsqueeze", [n("out_s"), n("axis_last")], [n("out_s3")]),
    ]
    if p > kept:  # fewer candidates survive topk than post_nms rows: MXNet pads with -1
        inits.append(numpy_helper.from_array(np.array([0, 0, 0, 0, p - kept, 0], np.int64), n("pad")))
    for src, dst in zip((n("out_i3"), n("out_s3"), n("out_b")), outputs):
        nodes.append(node("Pad", [src, n("pad"), n("minus_one")], [dst], mode="constant") if p > kept
                     else node("Identity", [src], [dst]))
    declared = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", p, w])
                for name, w in zip(outputs, (1, 1, 4))]
    return nodes, inits, declared


def box_nms_model(num_classes: int, num_candidates: int, *, nms_thresh: float, nms_topk: int = -1,
                  post_nms: int = -1, score_thresh: float = GLUONCV_SCORE_THRESH) -> onnx.ModelProto:
    """The NMS step alone: inputs ``cand_ids``, ``cand_scores`` (B, M, 1) and ``cand_boxes``
    (B, M, 4), outputs as :func:`export_detector`'s. Lets hand-made candidates be checked
    against ``mx.nd.contrib.box_nms`` without a network."""
    _check_thresholds(nms_thresh, score_thresh)
    names = ("cand_ids", "cand_scores", "cand_boxes")
    nodes, inits, outputs = _nms_nodes(*names, OUTPUT_NAMES, num_classes=num_classes, num_candidates=num_candidates,
                                       nms_thresh=nms_thresh, nms_topk=nms_topk, post_nms=post_nms,
                                       score_thresh=score_thresh)
    inputs = [helper.make_tensor_value_info(nm, TensorProto.FLOAT, ["batch", num_candidates, w])
              for nm, w in zip(names, (1, 1, 4))]
    graph = helper.make_graph(nodes, "box_nms", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", _OPSET)]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="gluontl",
                              ir_version=helper.find_min_ir_version_for(opsets))
    return finish_model(model, _OPSET)


def _check_thresholds(nms_thresh: float, score_thresh: float) -> None:
    if not 0 < nms_thresh < 1:
        raise ExportError(f"nms_thresh is {nms_thresh}; give an IoU threshold strictly between 0 and 1 (GluonCV "
                          "skips NMS altogether outside it, and an export without NMS is not a detector).")
    if not 0 <= score_thresh < 1:
        raise ExportError(f"score_thresh is {score_thresh}; give a score threshold in [0, 1).")


def mxnet_box_nms(ids: mx.nd.NDArray, scores: mx.nd.NDArray, boxes: mx.nd.NDArray, settings: Mapping[str, Any]
                  ) -> list[np.ndarray]:
    """MXNet's own NMS on candidates, called exactly as GluonCV's SSD/YOLOv3 forwards call it
    (with ``settings``' thresholds): the reference the ONNX file is verified against."""
    result = mx.nd.contrib.box_nms(
        mx.nd.concat(ids, scores, boxes, dim=-1), overlap_thresh=settings["nms_thresh"], topk=settings["nms_topk"],
        valid_thresh=settings["score_thresh"], id_index=0, score_index=1, coord_start=2, force_suppress=False)
    if settings["post_nms"] > 0:
        result = result.slice_axis(axis=1, begin=0, end=settings["post_nms"])
    out = result.asnumpy()
    return [out[..., :1], out[..., 1:2], out[..., 2:6]]


def _candidates(net: mx.gluon.HybridBlock, x: np.ndarray) -> list[mx.nd.NDArray]:
    ctx = next(iter(net.collect_params().values())).list_ctx()[0]
    with mx.autograd.predict_mode():
        return [a.as_in_context(mx.cpu()) for a in net(mx.nd.array(x, ctx=ctx))]


def _compare(got: list[np.ndarray], want: list[np.ndarray], box_scale: float, rtol: float) -> str | None:
    """Why ``got`` (onnxruntime) is not MXNet's ``want``, or None. Ids exactly; scores live in
    [0, 1], so ``rtol`` is their absolute tolerance; boxes are pixel coordinates, judged
    relative to the larger of the input size and the largest coordinate."""
    ids, scores, boxes = (np.asarray(a) for a in got)
    want_ids, want_scores, want_boxes = (np.asarray(a) for a in want)
    if ids.shape != want_ids.shape or boxes.shape != want_boxes.shape:
        return f"shapes {ids.shape}/{boxes.shape} instead of {want_ids.shape}/{want_boxes.shape}"
    ids, scores, boxes, want_ids, want_scores, want_boxes = _align_ties(
        ids, scores, boxes, want_ids, want_scores, want_boxes, rtol)
    if not np.array_equal(ids, want_ids):
        b, r = np.argwhere(ids != want_ids)[0][:2]
        return (f"image {b}, row {r}: class id {ids[b, r, 0]:g} (score {scores[b, r, 0]:.6f}) where MXNet has "
                f"{want_ids[b, r, 0]:g} (score {want_scores[b, r, 0]:.6f}); a near-tie of two scores, or an "
                "overlap within float rounding of nms_thresh, can order or suppress them differently")
    with np.errstate(invalid="ignore"):  # equal infinities (an exp() overflow in both) are equal
        score_err, box_err = (float(np.max(np.where(g == w, 0.0, np.abs(g - w)), initial=0.0))
                              for g, w in ((scores, want_scores), (boxes, want_boxes)))
    scale = max(box_scale, float(np.max(np.abs(want_boxes[np.isfinite(want_boxes)]), initial=0.0)))
    if not score_err <= rtol or not box_err <= rtol * scale:  # also NaN
        return f"scores differ by up to {score_err:.2e} (tolerance {rtol:.0e}), boxes by {box_err:.2e} " \
               f"(tolerance {rtol * scale:.2e})"
    return None


def _align_ties(ids, scores, boxes, want_ids, want_scores, want_boxes, tol: float):
    """Both outputs with rows whose scores tie within ``tol`` put in the same order.

    Scores that differ by float rounding between MXNet and onnxruntime (seen: 2e-8 on the demo's
    validation images) can swap two detections in the ranking, or swap which of two near-equal
    candidates is the last one ``post_nms`` keeps. Per image, each ``got`` row takes the place of
    the nearest ``want`` row with its class and a score within ``tol``, so such a swap compares
    equal (boxes are still compared after); when ``post_nms`` filled every place, a last row that
    is another box of a tied score is left out on both sides. Anything else stays in place for
    the strict comparison."""
    ids, scores, boxes = ids.copy(), scores.copy(), boxes.copy()
    want_ids, want_scores, want_boxes = want_ids.copy(), want_scores.copy(), want_boxes.copy()
    for b in range(ids.shape[0]):
        free = list(range(ids.shape[1]))
        order = []
        for r in range(ids.shape[1]):
            near = [j for j in free if ids[b, j, 0] == want_ids[b, r, 0]
                    and abs(float(scores[b, j, 0]) - float(want_scores[b, r, 0])) <= tol]
            if not near:
                order.append(None)
                continue
            j = min(near, key=lambda j: abs(j - r))
            free.remove(j)
            order.append(j)
        left = [r for r, j in enumerate(order) if j is None]
        full = bool((want_ids[b, :, 0] >= 0).all())  # post_nms cut the ranking: its last place can tie
        if len(left) == len(free) <= 1 and all(
                r == ids.shape[1] - 1 and full and abs(float(scores[b, j, 0]) - float(want_scores[b, r, 0])) <= tol
                and not np.allclose(boxes[b, j], want_boxes[b, r]) for r, j in zip(left, free)):
            for r in left:  # the last kept place went to either of two tied candidates: compare neither
                want_ids[b, r], want_scores[b, r], want_boxes[b, r] = -1, -1, -1
            order = [j if j is not None else free.pop() for j in order]
            ids[b], scores[b], boxes[b] = ids[b, order], scores[b, order], boxes[b, order]
            for r in left:
                ids[b, r], scores[b, r], boxes[b, r] = -1, -1, -1
    return ids, scores, boxes, want_ids, want_scores, want_boxes


def _detector_onnx(net: mx.gluon.HybridBlock, input_name: str, shape: tuple[int, ...], num_classes: int,
                   settings: Mapping[str, Any]) -> onnx.ModelProto:
    """The net's decoded per-class candidates through mx.onnx (lean), then the NMS nodes.
    The net must be set to ``set_nms(-1, -1, -1)``."""
    cand = ["cand_ids", "cand_scores", "cand_boxes"]
    model, traced = convert_block(net, {input_name: shape}, opset=_OPSET, output_names=cand)
    graph = model.graph
    taken = {t for node in graph.node for t in (*node.input, *node.output)} | {t.name for t in graph.initializer}
    clash = sorted(t for t in taken if t in OUTPUT_NAMES or t.startswith(_PREFIX))
    if clash:
        raise ExportError(f"The network already has tensors named {clash}, the names the NMS step adds; rename "
                          "those layers before exporting.")
    nodes, inits, outputs = _nms_nodes(*cand, OUTPUT_NAMES, num_classes=num_classes,
                                       num_candidates=traced.batched_output_shapes(1)[0][1], **settings)
    graph.node.extend(nodes)
    graph.initializer.extend(inits)
    del graph.output[:]
    graph.output.extend(outputs)
    return finish_model(model, _OPSET)


def export_detector(net: mx.gluon.HybridBlock, out_dir: str | Path, name: str, input_shape: tuple[int, int, int], *,
                    class_names: Sequence[str], card: Mapping[str, Any] | None = None,
                    nms_thresh: float | None = None, nms_topk: int | None = None, post_nms: int | None = None,
                    score_thresh: float = GLUONCV_SCORE_THRESH, sample: np.ndarray | None = None,
                    formats: Sequence[str] = ("symbol", "onnx"), input_name: str = "data", rtol: float | None = None,
                    force: bool = False, judge: Any = None, int8: Any = None, echo: Any = log.info) -> Exported:
    """Write a GluonCV SSD/YOLOv3 as ``NAME-symbol.json``/``NAME-0000.params`` (+
    ``NAME-preprocess.json``) and/or ``NAME.onnx`` with per-class NMS (see the module doc).

    NMS settings default to the net's own (``net.nms_thresh``...); the net gets them back
    afterwards. The ONNX file is written only if onnxruntime reproduces MXNet's ``box_nms`` on
    the net's candidates (GluonCV's forward) on ``sample`` (preprocessed images, N x C x H x W;
    random inputs without it): class ids exactly, scores and boxes within ``rtol``. ``card``
    (a run's ``preprocess.json`` record) plus ``class_names`` and the NMS settings go into the
    metadata. The symbol export is MXNet's own graph, whose score threshold GluonCV fixes at 0.01.
    """
    from gluoncv.model_zoo import SSD, YOLOV3  # (its submodules cannot be imported first)

    if not isinstance(net, (SSD, YOLOV3)):
        raise ExportError(f"export_detector exports GluonCV SSD and YOLOv3 networks (their candidates are what "
                          f"its NMS step reproduces), not a {type(net).__name__}; export other models with "
                          "export_symbol.")
    rtol = FIXED_RTOL if rtol is None else rtol  # scores in [0, 1] and boxes judged by it (None: the default)
    classes = [str(c) for c in class_names]
    net_classes = list(net.classes)
    if len(classes) != len(net_classes):
        raise ExportError(f"class_names has {len(classes)} names but the network predicts {len(net_classes)} "
                          f"classes ({net_classes}); pass one name per class, in the network's order.")
    settings = {"nms_thresh": float(net.nms_thresh if nms_thresh is None else nms_thresh),
                "nms_topk": int(net.nms_topk if nms_topk is None else nms_topk),
                "post_nms": int(net.post_nms if post_nms is None else post_nms),
                "score_thresh": float(score_thresh)}
    registry.check_formats(formats, "formats")
    _check_thresholds(settings["nms_thresh"], settings["score_thresh"])
    traced = [f for f in formats if registry.get(f).source == "block"]
    if traced and settings["score_thresh"] != GLUONCV_SCORE_THRESH:
        raise ExportError(f"score_thresh {score_thresh} cannot go into the {', '.join(traced)} export: GluonCV's graph "
                          f"fixes it at {GLUONCV_SCORE_THRESH}. Export only formats made from ONNX (onnx, openvino) "
                          f"with it, or keep the default.")
    shape = (1, *(int(d) for d in input_shape))
    full_card = {**(card or {}), "classes": classes, "nms": settings}
    saved = (net.nms_thresh, net.nms_topk, net.post_nms)
    try:
        net.set_nms(settings["nms_thresh"], settings["nms_topk"], settings["post_nms"])  # what the symbol holds
        graph = DetectorGraph(net, name, input_name, shape, classes, full_card, settings, sample, rtol)
        return export_block(net, out_dir, name, {input_name: shape}, formats=formats, rtol=rtol, force=force,
                            card=full_card, judge=judge, int8=int8, echo=echo, graph=graph)
    finally:
        net.set_nms(*saved)


class DetectorGraph:
    """The detection finisher: the net's decoded per-class candidates, then MXNet's per-class NMS
    in ONNX ops, verified against ``box_nms`` (class ids exactly)."""

    note = " (per-class NMS: class ids exactly)"

    def __init__(self, net: mx.gluon.HybridBlock, name: str, input_name: str, shape: tuple[int, ...],
                 classes: list[str], card: Mapping[str, Any], settings: Mapping[str, Any],
                 sample: np.ndarray | None, rtol: float) -> None:
        self.net, self.name, self.input_name, self.shape = net, name, input_name, shape
        self.classes, self.card, self.settings, self.sample, self.rtol = classes, card, settings, sample, rtol

    def write_onnx(self, folder: Path, overwrite: bool) -> Path:
        path = Path(folder) / f"{self.name}.onnx"
        check_target(path, overwrite)
        self.net.set_nms(-1, -1, -1)
        model = _detector_onnx(self.net, self.input_name, self.shape, len(self.classes), self.settings)
        meta = onnx_props(self.card) if "preprocess" in self.card else {META_CLASSES: json.dumps(self.classes)}
        set_metadata(model, {**meta, META_NMS: json.dumps(self.settings)})
        data = model.SerializeToString()
        _verify(data, self.net, path, self.batches(), self.settings, max(self.shape[2:]), self.rtol)
        return atomic_write(path, lambda p: p.write_bytes(data), ExportError)

    def batches(self) -> list[tuple[str, np.ndarray]]:
        return sample_batches(self.sample, self.shape)

    def compare(self, got: list[np.ndarray], want: list[np.ndarray]) -> str | None:
        """Another runtime's detections against the ONNX file's as the file is checked against
        MXNet: ids exactly, near-tied scores' rows aligned first (an order swap is no error)."""
        return _compare(got, want, max(self.shape[2:]), self.rtol)


def _verify(data: bytes, net: mx.gluon.HybridBlock, path: Path, batches: list[tuple[str, np.ndarray]],
            settings: Mapping[str, Any], box_scale: float, rtol: float) -> None:
    session = ort_session(data, f"the export for {path} (not written)")
    input_name = session.get_inputs()[0].name
    for label, x in batches:
        try:
            got = session.run(None, {input_name: x})
        except Exception as err:  # onnxruntime's errors share no base class
            raise ExportError(f"Export to {path} was not written: onnxruntime failed on a {label} "
                              f"({short_reason(err)}); please report the model.") from err
        want = mxnet_box_nms(*_candidates(net, x), settings)
        why = _compare(got, want, box_scale, rtol)
        if why is not None:
            raise ExportError(f"Export to {path} was not written: onnxruntime disagrees with MXNet's box_nms on the "
                              f"{label}: {why}. Verify on other images (sample=...), or ship the symbol export.")
        log.info("verified %s on %s", path, label)
