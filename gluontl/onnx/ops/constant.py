"""Structural ops: Constant (folded at import), Identity, Dropout (identity unless its
training_mode input says otherwise)."""
from __future__ import annotations

import mxnet as mx
import numpy as np

from ..registry import Node, converter, evaluator

_I = mx.sym._internal


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
    """Inference semantics, like onnxruntime: output = input, mask = all true (all false
    before opset 12, where it is "not filled"), unless a
    ``training_mode`` input (opset 12+) is true, when elements drop with probability
    ``ratio`` and the kept ones scale by 1 / (1 - ratio), as onnxruntime does (its random
    draws, not its numbers). A run-time ``training_mode`` picks between the two.

    The mask is float32 0/1, the MXNet carrier of ONNX bools (see ops/elementwise.py).
    """
    x = inputs[0].sym
    training = inputs[2] if len(inputs) > 2 else None
    want_mask = len(node.outputs) > 1 and bool(node.outputs[1])
    if training is None or training.const is not None and not training.const.reshape(-1)[0]:
        out = mx.sym.identity(x, name=node.name)
        if not want_mask:
            return out
        # before opset 12 the mask is "not filled" in inference: onnxruntime gives zeros
        fill = mx.sym.ones_like if node.opset >= 12 else mx.sym.zeros_like
        return [out, fill(x, name=node.sub("mask"))]
    ratio = inputs[1] if len(inputs) > 1 else None
    draws = mx.sym.random.uniform_like(x, name=node.sub("draws"))
    if ratio is None or ratio.const is not None:
        p = 0.5 if ratio is None else float(ratio.const.reshape(-1)[0])
        keep = _I._greater_equal_scalar(draws, scalar=p, name=node.sub("keep"))
        dropped = _I._mul_scalar(x * keep, scalar=1.0 / (1.0 - p), name=node.sub("dropped"))
    else:
        r = mx.sym.reshape(ratio.sym, shape=(1,), name=node.sub("ratio"))
        keep = mx.sym.broadcast_greater_equal(draws, r, name=node.sub("keep"))
        dropped = mx.sym.broadcast_div(x * keep, 1.0 - r, name=node.sub("dropped"))
    if training.const is not None:
        out, mask = mx.sym.identity(dropped, name=node.name), keep
    else:
        if inputs[0].rank is None:
            raise node.unsupported("a run-time training_mode needs the input's rank; pass input_shapes=...")
        on = mx.sym.broadcast_like(mx.sym.reshape(training.sym, shape=(1,) * max(inputs[0].rank, 1)),
                                   x, name=node.sub("training"))
        out = mx.sym.where(on, dropped, x, name=node.name)
        mask = mx.sym.where(on, keep, mx.sym.ones_like(x), name=node.sub("mask_on"))
    return [out, mx.sym.identity(mask, name=node.sub("mask"))] if want_mask else out
