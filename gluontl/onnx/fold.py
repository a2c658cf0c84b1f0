"""Constant folding: evaluate nodes whose inputs are known at import time.

Nodes are evaluated one at a time with onnxruntime (a single-node session costs
~0.2 ms), so folded values are exactly what onnxruntime would compute. To keep the
batch dimension free, the importer evaluates batch-dependent chains at two batch sizes;
the helpers here turn a shape vector that differs between them into a batch-free form.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import OnnxImportError
from .registry import Node, canonical, get_evaluator

# Ops whose output is not a function of their inputs: never folded.
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike",
                              "RandomUniformLike", "Multinomial", "Bernoulli"})

_INT64_MAX = np.iinfo(np.int64).max


def evaluate(proto: onnx.NodeProto, node: Node, values: Sequence[np.ndarray | None],
             opsets: dict[str, int], outer: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
    """Outputs of one node on known inputs (numpy evaluator, else onnxruntime); ``outer``:
    the values an If/Loop/Scan body reads from the enclosing graph."""
    fn = get_evaluator(node.op_type, node.domain)
    if fn is not None:
        return [None if v is None else canonical(v) for v in fn(node, list(values))]
    return Session(proto, values, opsets, outer).run(values)


class Session:
    """An onnxruntime session over a single node, reusable for a second batch size."""

    def __init__(self, proto: onnx.NodeProto, values: Sequence[np.ndarray | None],
                 opsets: dict[str, int], outer: dict[str, np.ndarray] | None = None) -> None:
        import onnxruntime as ort

        names = [f"in{i}" if v is not None else "" for i, v in enumerate(values)]
        node = onnx.NodeProto()
        node.CopyFrom(proto)
        del node.input[:]
        node.input.extend(names)
        del node.output[:]
        self.outputs = [f"out{i}" if o else "" for i, o in enumerate(proto.output)]
        node.output.extend(self.outputs)
        inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), None)
                  for n, v in zip(names, values) if v is not None]
        graph = helper.make_graph([node], "fold", inputs,
                                  [onnx.ValueInfoProto(name=o) for o in self.outputs if o],
                                  [numpy_helper.from_array(v, n) for n, v in (outer or {}).items()])
        ids = [helper.make_opsetid(d if d != "ai.onnx" else "", v) for d, v in opsets.items()]
        model = helper.make_model(graph, opset_imports=ids)
        model.ir_version = helper.find_min_ir_version_for(ids, ignore_unknown=True)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.log_severity_level = 3
        self.names = names
        self.sess = ort.InferenceSession(model.SerializeToString(), options,
                                         providers=["CPUExecutionProvider"])

    def run(self, values: Sequence[np.ndarray | None]) -> list[np.ndarray]:
        feed = {n: v for n, v in zip(self.names, values) if v is not None}
        got = iter(self.sess.run([o for o in self.outputs if o], feed))
        return [canonical(next(got)) if o else None for o in self.outputs]  # longlong -> int64


def batch_free(op_type: str, index: int, v1: np.ndarray, v2: np.ndarray,
               dims1: tuple[int, ...] | None, dims2: tuple[int, ...] | None,
               allowzero: bool = False) -> np.ndarray | None:
    """A single value equivalent to ``v1`` at batch 1 and ``v2`` at batch 2, or None.

    ``v1``/``v2`` feed input ``index`` of an ``op_type`` node whose data input has
    shape ``dims1``/``dims2`` at the two batch sizes.
    """
    if v1.shape != v2.shape or v1.ndim != 1:
        return None
    diff = np.flatnonzero(v1 != v2)
    out = v1.copy()
    if op_type == "Reshape" and index == 1:
        return _reshape_free(v1, v2, diff, dims1, dims2, allowzero)
    if op_type == "Resize" and index == 3 and dims1 is not None and len(dims1) == len(v1):
        for i in diff:  # 0 = keep this axis (the Resize converter's convention)
            if (dims1[i], dims2[i]) != (v1[i], v2[i]):
                return None
            out[i] = 0
        return out
    if op_type == "Expand" and index == 1 and dims1 is not None:
        shift = len(v1) - len(dims1)
        for i in diff:
            j = i - shift
            if not (0 <= j < len(dims1) and (dims1[j], dims2[j]) == (v1[i], v2[i])):
                return None
            out[i] = 1
        return out
    return None


def _reshape_free(v1: np.ndarray, v2: np.ndarray, diff: np.ndarray, dims1: tuple[int, ...] | None,
                  dims2: tuple[int, ...] | None, allowzero: bool) -> np.ndarray | None:
    """Batch-dependent Reshape targets: entries copying the data's dim become 0 (not under
    allowzero, where 0 is a literal zero); one remaining varying entry becomes the -1, after
    resolving an existing -1 to its value when that value does not depend on the batch
    (Swin's window_reverse: ``[B, h, w, ws, ws, -1]`` over data of ``B·n`` windows)."""
    out = v1.copy()
    allowzero = allowzero and (0 in v1 or 0 in v2)  # without a literal 0 it changes nothing
    copies = [i for i in diff if not allowzero and dims1 is not None and i < len(dims1)
              and (dims1[i], dims2[i]) == (v1[i], v2[i])]
    rest = [i for i in diff if i not in copies]
    out[copies] = 0
    if not rest:
        return out
    if len(rest) > 1:
        return None
    existing = np.flatnonzero(v1 == -1)
    if len(existing):
        if dims1 is None or dims2 is None:
            return None
        k = int(existing[0])
        known = [_minus_one(v, dims, k, allowzero) for v, dims in ((v1, dims1), (v2, dims2))]
        if known[0] is None or known[0] != known[1]:
            return None
        out[k] = known[0]
    out[rest[0]] = -1
    return out


def _minus_one(v: np.ndarray, dims: tuple[int, ...], k: int, allowzero: bool) -> int | None:
    """The value ONNX Reshape gives the -1 at index ``k`` of target ``v`` for data of shape ``dims``."""
    others = 1
    for i, d in enumerate(v):
        if i != k:
            others *= dims[i] if (d == 0 and not allowzero and i < len(dims)) else int(d)
    total = int(np.prod(dims, dtype=np.int64))
    return total // others if others > 0 and total % others == 0 else None


def batch_sized(v1: np.ndarray, v2: np.ndarray, sizes: set[tuple[int, int]],
                dims1: tuple[int, ...] | None = None, dims2: tuple[int, ...] | None = None
                ) -> tuple[np.ndarray, tuple[tuple[int, tuple[int, int]], ...]] | None:
    """A shape vector whose differing entries are each exactly a free size (the batch, a
    sequence length: ``sizes`` holds each as its pair of import sizes), with those entries
    set to 1, and the positions to broadcast at run time with the size each takes (those
    where the data input, aligned right with shape ``dims1``/``dims2``, lacks it)."""
    if v1.shape != v2.shape or v1.ndim != 1:
        return None
    diff = np.flatnonzero(v1 != v2)
    if not all((int(v1[i]), int(v2[i])) in sizes for i in diff):
        return None
    out = v1.copy()
    out[diff] = 1
    shift = len(v1) - len(dims1) if dims1 is not None else 0
    carried = {i for i in diff if dims1 is not None and 0 <= i - shift < len(dims1)
               and (dims1[i - shift], dims2[i - shift]) == (v1[i], v2[i])}
    return out, tuple((int(i), (int(v1[i]), int(v2[i]))) for i in diff if i not in carried)


def tile_free(v1: np.ndarray, v2: np.ndarray, b1: int, b2: int, dims1: tuple[int, ...] | None,
              dims2: tuple[int, ...] | None) -> tuple[np.ndarray, tuple[int, ...]] | None:
    """Tile ``repeats`` whose differing entries are the batch size on axes of length 1
    (``x[:1].repeat(B, 1, 1)``): those repeats become 1, and the axes to broadcast to the
    batch at run time. Tiling a longer axis by the batch has no batch-free form."""
    if dims1 is None or dims2 is None or v1.shape != v2.shape or v1.ndim != 1 or len(v1) != len(dims1):
        return None
    diff = np.flatnonzero(v1 != v2)
    if not all((v1[i], v2[i]) == (b1, b2) and dims1[i] == dims2[i] == 1 for i in diff):
        return None
    out = v1.copy()
    out[diff] = 1
    return out, tuple(int(i) for i in diff)


def slice_free(ends1: np.ndarray, ends2: np.ndarray, axes: np.ndarray,
               dims1: tuple[int, ...] | None, dims2: tuple[int, ...] | None) -> np.ndarray | None:
    """Slice ``ends`` that reach the end of a batch-sized axis become INT64_MAX."""
    if dims1 is None or ends1.shape != ends2.shape:
        return None
    out = ends1.copy()
    for i in np.flatnonzero(ends1 != ends2):
        ax = int(axes[i]) % len(dims1)
        if not (ends1[i] >= dims1[ax] and ends2[i] >= dims2[ax]):
            return None
        out[i] = _INT64_MAX
    return out


def fold_error(node: Node, err: Exception) -> OnnxImportError:
    return OnnxImportError(
        f"{node.op_type} node '{node.name}' has only constant inputs but evaluating it at import "
        f"time failed ({type(err).__name__}: {str(err).strip()[:300]}). The model is probably "
        f"invalid; check it with onnx.checker.check_model and onnxruntime.")
