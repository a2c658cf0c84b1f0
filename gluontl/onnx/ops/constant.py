"""Structural ops: Constant (folded at import), Identity, Dropout (inference = identity)."""
from __future__ import annotations

import mxnet as mx
import numpy as np

from ..registry import Node, converter, evaluator


def _dense(sparse) -> np.ndarray:
    """A SparseTensorProto as a dense array (COO indices, flat or per-dimension)."""
    from onnx import numpy_helper

    values = numpy_helper.to_array(sparse.values)
    indices = numpy_helper.to_array(sparse.indices)
    dims = tuple(sparse.dims)
    out = np.zeros(dims, dtype=values.dtype)
    if indices.ndim == 1:
        out.reshape(-1)[indices] = values
    else:
        out[tuple(indices.T)] = values
    return out


@evaluator("Constant")
def constant_value(node: Node, inputs: list) -> list[np.ndarray]:
    a = node.attrs
    if "value" in a:
        return [np.asarray(a["value"])]
    if "value_float" in a:
        return [np.array(a["value_float"], dtype=np.float32)]
    if "value_floats" in a:
        return [np.array(a["value_floats"], dtype=np.float32)]
    if "value_int" in a:
        return [np.array(a["value_int"], dtype=np.int64)]
    if "value_ints" in a:
        return [np.array(a["value_ints"], dtype=np.int64)]
    if "sparse_value" in a:
        return [_dense(a["sparse_value"])]
    raise node.unsupported(f"no numeric value attribute (has {sorted(a) or 'none'}); "
                           f"string constants have no MXNet equivalent")


@evaluator("Identity")
def identity_value(node: Node, inputs: list) -> list[np.ndarray]:
    return [inputs[0]]


@converter("Identity", since=1)
def identity(node, inputs):
    return mx.sym.identity(inputs[0].sym, name=node.name)


@converter("Dropout", since=1)
def dropout(node, inputs):
    """Inference semantics, like onnxruntime: output = input, mask = all true.

    The mask is float32 ones, the MXNet carrier of ONNX bools (see ops/elementwise.py).
    """
    x = inputs[0].sym
    out = mx.sym.identity(x, name=node.name)
    if len(node.outputs) > 1 and node.outputs[1]:
        return [out, mx.sym.ones_like(x, name=node.sub("mask"))]
    return out
