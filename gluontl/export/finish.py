"""Finishing a verified classifier ONNX file: probabilities as its output, optionally a flip TTA
baked into the graph, and more metadata — then verified again against MXNet, as every export is.

The graph of a classifier export ends in logits ``(N, C)``. ``finish_onnx`` appends the activation
(``Sigmoid`` for multi-label; for ``Softmax`` the output is the log of the averaged probabilities,
so the file still answers logit-like scores whose softmax is the average) and, with ``flip``, runs
the network once on the batch and its mirror image concatenated (``Slice`` with step -1 on W,
``Concat`` on N) and averages the two halves' probabilities (``Split`` on N, ``Add``, ``Mul`` by
0.5). Nothing else in the graph changes; its output keeps its name.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..atomic import atomic_write
from ..errors import ExportError
from .exporters import set_metadata
from .verify import FIXED_RTOL, ort_session


def finish_graph(model: onnx.ModelProto, act: str, flip: bool) -> onnx.ModelProto:
    """``model`` (one input N x C x H x W, one output N x K of logits) with ``act`` and the flip
    average appended; a copy."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    inits = {i.name for i in g.initializer}
    inputs = [i for i in g.input if i.name not in inits]
    if len(inputs) != 1 or len(g.output) != 1:
        raise ExportError(f"finishing a classifier export needs one image input and one output; the graph has "
                          f"inputs {[i.name for i in inputs]} and outputs {[o.name for o in g.output]}.")
    x, y = inputs[0].name, g.output[0].name
    raw = y + "__logits"
    for node in g.node:
        node.output[:] = [raw if o == y else o for o in node.output]
        node.input[:] = [raw if i == y else i for i in node.input]
    head: list[onnx.NodeProto] = []
    if flip:
        both = x + "__and_mirror"
        for node in g.node:
            node.input[:] = [both if i == x else i for i in node.input]
        g.initializer.extend([numpy_helper.from_array(np.array([-1], np.int64), "tta__starts"),
                              numpy_helper.from_array(np.array([np.iinfo(np.int64).min], np.int64), "tta__ends"),
                              numpy_helper.from_array(np.array([3], np.int64), "tta__axes"),
                              numpy_helper.from_array(np.array([-1], np.int64), "tta__steps")])
        head = [helper.make_node("Slice", [x, "tta__starts", "tta__ends", "tta__axes", "tta__steps"], [x + "__mirror"],
                                 name="tta__mirror"),
                helper.make_node("Concat", [x, x + "__mirror"], [both], axis=0, name="tta__concat")]
    probs = raw + "__probs"
    tail = [helper.make_node("Sigmoid" if act == "sigmoid" else "Softmax", [raw], [probs], name="finish__act",
                             **({} if act == "sigmoid" else {"axis": 1}))]
    if flip:
        opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 13)
        halves = [probs + "__plain", probs + "__mirror"]
        tail.append(helper.make_node("Split", [probs], halves, axis=0, name="tta__split",
                                     **({"num_outputs": 2} if opset >= 18 else {})))
        g.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "tta__half"))
        tail += [helper.make_node("Add", halves, [probs + "__sum"], name="tta__add"),
                 helper.make_node("Mul", [probs + "__sum", "tta__half"], [probs + "__mean"], name="tta__mean")]
        probs = probs + "__mean"
    tail.append(helper.make_node("Identity" if act == "sigmoid" else "Log", [probs], [y], name="finish__out"))
    nodes = head + list(g.node) + tail
    del g.node[:]
    g.node.extend(nodes)
    g.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    return m


def finish_onnx(path: Path, act: str, flip: bool, metadata: dict[str, str],
                reference: Callable[[np.ndarray], np.ndarray], sample: np.ndarray, atol: float | None) -> float:
    """Rewrite the export at ``path`` finished (:func:`finish_graph`) with ``metadata`` added, only if
    onnxruntime reproduces ``reference(x)`` (MXNet: the block's averaged probabilities, or their log
    for softmax, then compared as probabilities) within ``atol`` on ``sample``, one image and all of
    it (``atol`` None, export.rtol unset: 1e-4, as probabilities in [0, 1]); the largest error."""
    atol = FIXED_RTOL if atol is None else atol
    model = finish_graph(onnx.load(str(path)), act, flip)
    for p in model.metadata_props:
        metadata.setdefault(p.key, p.value)
    set_metadata(model, metadata)
    data = model.SerializeToString()
    session = ort_session(data, f"the finished export {path} (not written)")
    name, out = session.get_inputs()[0].name, session.get_outputs()[0].name
    worst = 0.0
    for batch in (sample[:1], sample):
        got = np.asarray(session.run([out], {name: batch.astype(np.float32)})[0], np.float64)
        want = np.asarray(reference(batch), np.float64)
        if act == "softmax":  # compared as probabilities: a log-probability near 0 probability is all noise
            got, want = np.exp(got), np.exp(want)
        err = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
        if not err <= atol:
            raise ExportError(f"{path} was not finished: onnxruntime's {'flip-averaged ' if flip else ''}{act} "
                              f"output differs from MXNet's by {err:.2e} (> {atol:g}) on a batch of {len(batch)}; "
                              f"the logits file stays as verified. Please report the model.")
        worst = max(worst, err)
    atomic_write(path, lambda p: p.write_bytes(data), ExportError)
    return worst
