"""Export a segmenter as MXNet symbol/params and as ONNX with logits and an arg-max mask.

The ONNX file has two outputs: ``logits`` (N, K, H, W) float32, what the network computes, and
``mask`` (N, H, W) int64, the class id of each pixel (``ArgMax`` over the classes, no kept
dimension; ties go to the lower id in both MXNet and onnxruntime). Its batch, height and width
follow the input, since every resize in a :class:`~gluontl.segment.models.Segmenter` reads its
size from a tensor. The file is written only if onnxruntime (float kernels) reproduces the MXNet
block on ``sample`` (or random batches): logits within ``rtol`` of their range, masks equal at
every pixel but those whose two best logits lie within the logits' measured difference of each
other (float rounding may order a near-tie either way).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
import onnx
from onnx import TensorProto, helper

from gluontl.atomic import atomic_write
from gluontl.errors import ExportError, short_reason
from gluontl.export import registry
from gluontl.export.artifacts import Exported
from gluontl.export.exporters import check_target, convert_block, export_block, finish_model, set_metadata
from gluontl.export.trace import dummy_inputs, predict, sample_batches
from gluontl.export.verify import FIXED_RTOL, ort_session, output_error
from gluontl.data.transforms import META_TASK, onnx_props

log = logging.getLogger(__name__)

OUTPUT_NAMES = ("logits", "mask")
TASK = "segmentation"


def export_segmenter(net: mx.gluon.HybridBlock, out_dir: str | Path, name: str, input_shape: Sequence[int], *,
                     formats: Sequence[str] = ("symbol", "onnx"), force: bool = False, sample: np.ndarray | None = None,
                     card: Mapping[str, Any] | None = None, opset: int = 13, rtol: float | None = None,
                     input_name: str = "data") -> Exported:
    """Write ``NAME-symbol.json``/``NAME-0000.params`` (+ ``NAME-preprocess.json`` with ``card``)
    and/or ``NAME.onnx`` (module docstring) for ``net`` at C, H, W ``input_shape``. ``sample``:
    preprocessed images (N, C, H, W) to verify on; ``card``: a run's ``{"classes", "preprocess"}``
    record, written into the ONNX metadata with ``gluontl.task`` = segmentation."""
    registry.check_formats(formats, "formats")
    rtol = FIXED_RTOL if rtol is None else rtol  # logits judged on their range (None: the default)
    shape = (1, *(int(d) for d in input_shape))
    classes = _classes(net, shape, input_name)
    if card is not None and len(card.get("classes", ())) != classes:
        raise ExportError(f"the card names {len(card.get('classes', ()))} classes but the network predicts {classes}; "
                          f"pass the run's card (one class name per output channel).")
    graph = SegmenterGraph(net, name, input_name, shape, card, sample, opset, rtol,
                           build=registry.from_onnx(formats))  # fails before any write
    return export_block(net, out_dir, name, {input_name: shape}, formats=formats, rtol=rtol, force=force, card=card,
                        graph=graph)


class SegmenterGraph:
    """The segmentation finisher: the net's logits, then ``ArgMax`` over the classes as ``mask``,
    verified against MXNet (logits within rtol, masks equal but at near-ties)."""

    note = " (masks)"
    compare = None  # logits within rtol, masks equal on 99.9 % of pixels (openvino_ir.verify_float)

    def __init__(self, net: mx.gluon.HybridBlock, name: str, input_name: str, shape: tuple[int, ...],
                 card: Mapping[str, Any] | None, sample: np.ndarray | None, opset: int, rtol: float,
                 build: bool = True) -> None:
        self.net, self.name, self.card, self.rtol = net, name, card, rtol
        self._batches = sample_batches(sample, shape)
        self.model = segmenter_onnx(net, input_name, shape, opset) if build else None

    def write_onnx(self, folder: Path, overwrite: bool) -> Path:
        path = Path(folder) / f"{self.name}.onnx"
        check_target(path, overwrite)
        set_metadata(self.model, {**(onnx_props(self.card) if self.card is not None else {}), META_TASK: TASK})
        data = self.model.SerializeToString()
        _verify(data, self.net, path, self._batches, self.rtol)
        return atomic_write(path, lambda p: p.write_bytes(data), ExportError)

    def batches(self) -> list[tuple[str, np.ndarray]]:
        return self._batches


def _classes(net: mx.gluon.HybridBlock, shape: tuple[int, ...], input_name: str) -> int:
    out = predict(net, dummy_inputs({input_name: shape}, 1, seed=0))
    if len(out) != 1 or out[0].ndim != 4 or out[0].shape[2:] != shape[2:]:
        raise ExportError(f"export_segmenter exports networks whose predict-mode output is one (N, K, H, W) logits "
                          f"map at the input's size; this one returns {[o.shape for o in out]} for an input of "
                          f"{shape}. Export other models with export_block.")
    return int(out[0].shape[1])


def segmenter_onnx(net: mx.gluon.HybridBlock, input_name: str, shape: tuple[int, ...], opset: int = 13
                   ) -> onnx.ModelProto:
    """The net's logits through mx.onnx (lean), then ``ArgMax`` over the classes as ``mask``."""
    # PSPNet's pyramid pooling (adaptive pooling to 2, 3 and 6 bins) has no mx.onnx converter: convert_block says so
    model, _ = convert_block(net, {input_name: shape}, opset=opset, output_names=["logits"])
    graph = model.graph
    if any(OUTPUT_NAMES[1] in (*n.output, n.name) for n in graph.node):
        raise ExportError(f"The network already has a tensor named '{OUTPUT_NAMES[1]}'; rename that layer first.")
    graph.node.append(helper.make_node("ArgMax", ["logits"], ["mask"], name="mask", axis=1, keepdims=0))
    dims = [d.dim_param or d.dim_value for d in graph.output[0].type.tensor_type.shape.dim]
    graph.output.append(helper.make_tensor_value_info("mask", TensorProto.INT64, [dims[0], *dims[2:]]))
    return finish_model(model, opset)


def mask_disagreement(got_mask: np.ndarray, want_logits: np.ndarray, slack: float) -> np.ndarray:
    """Pixels (boolean, N x H x W) where ``got_mask`` is not MXNet's arg-max and the margin of
    MXNet's best logit over the one ``got_mask`` picked exceeds ``slack``: real disagreements,
    not a near-tie that float rounding may order either way."""
    want_mask = want_logits.argmax(1)
    picked = np.take_along_axis(want_logits, got_mask[:, None].astype(np.int64), 1)[:, 0]
    return (got_mask != want_mask) & (want_logits.max(1) - picked > slack)


def _verify(data: bytes, net: mx.gluon.HybridBlock, path: Path, batches: list[tuple[str, np.ndarray]],
            rtol: float) -> None:
    session = ort_session(data, f"the export for {path} (not written)")
    input_name = session.get_inputs()[0].name
    for label, x in batches:
        try:
            logits, mask = session.run(list(OUTPUT_NAMES), {input_name: x})
        except Exception as err:  # onnxruntime's errors share no base class
            raise ExportError(f"Export to {path} was not written: onnxruntime failed on the {label} "
                              f"({short_reason(err)}); please report the model.") from err
        want = predict(net, {input_name: x})[0]
        max_abs, rel = output_error(logits, want)
        if not rel <= rtol:
            raise ExportError(f"Export to {path} was not written: onnxruntime's logits differ from MXNet's on the "
                              f"{label} by {max_abs:.2e} ({rel:.1e} of their range > rtol {rtol:.0e}). The model "
                              f"likely uses an op mx.onnx converts wrongly; ship the symbol export.")
        bad = mask.shape != want.shape[:1] + want.shape[2:] or mask_disagreement(mask, want, 2 * max_abs).any()
        if bad:
            raise ExportError(f"Export to {path} was not written: onnxruntime's mask {mask.shape} disagrees with "
                              f"MXNet's arg-max of its logits {want.shape} on the {label} beyond a near-tie; "
                              f"please report the model.")
        log.info("verified %s on %s: logits within %.2e of their range", path, label, rel)
