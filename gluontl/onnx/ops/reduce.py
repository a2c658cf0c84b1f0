"""Reductions: Reduce*, ArgMax/ArgMin, CumSum, TopK.

A reduction to a scalar with keepdims=0 yields shape (1,) (MXNet has no 0-d tensors).
MXNet returns indices as float32; they are cast to int64 like ONNX.
"""
from __future__ import annotations

import math

import mxnet as mx
import numpy as np

from ..registry import converter
from .shape import attr_axis, axes_arg, need_rank, norm_axes

_I = mx.sym._internal

# opset at which ``axes`` moved from an attribute to an input
_AXES_INPUT = {"ReduceSum": 13}


def _reduce_axes(node, inputs):
    """Normalised axes, None for all axes, or "noop" for the identity."""
    axes = axes_arg(node, inputs, 1, since=_AXES_INPUT.get(node.op_type, 18))
    if not axes:
        if node.attr("noop_with_empty_axes", 0) and node.opset >= _AXES_INPUT.get(node.op_type, 18):
            return "noop"
        return None
    rank = inputs[0].rank
    if rank is None:
        if min(axes) < 0:
            raise node.unsupported("negative axes on an input of unknown rank")
        return tuple(axes)
    return tuple(norm_axes(node, axes, rank))


def _sum(x, axis, keep, name):
    return mx.sym.sum(x, axis=axis, keepdims=keep, name=name)


def _log_sum_exp(node, x, axis, keep):
    """Stable: max + log(sum(exp(x - max)))."""
    peak = mx.sym.max(x, axis=axis, keepdims=True, name=node.sub("max"))
    shifted = mx.sym.exp(mx.sym.broadcast_sub(x, mx.sym.BlockGrad(peak, name=node.sub("stop")),
                                              name=node.sub("shift")), name=node.sub("exp"))
    total = mx.sym.log(_sum(shifted, axis, keep, node.sub("sum")), name=node.sub("log"))
    peak = peak if keep else mx.sym.max(x, axis=axis, keepdims=False, name=node.sub("max_flat"))
    return mx.sym.broadcast_add(total, mx.sym.BlockGrad(peak, name=node.sub("peak")),
                                name=node.name)


_REDUCE = {
    "ReduceSum": lambda n, x, a, k: _sum(x, a, k, n.name),
    "ReduceMean": lambda n, x, a, k: mx.sym.mean(x, axis=a, keepdims=k, name=n.name),
    "ReduceMax": lambda n, x, a, k: mx.sym.max(x, axis=a, keepdims=k, name=n.name),
    "ReduceMin": lambda n, x, a, k: mx.sym.min(x, axis=a, keepdims=k, name=n.name),
    "ReduceProd": lambda n, x, a, k: mx.sym.prod(x, axis=a, keepdims=k, name=n.name),
    "ReduceL1": lambda n, x, a, k: _sum(mx.sym.abs(x, name=n.sub("abs")), a, k, n.name),
    "ReduceL2": lambda n, x, a, k: mx.sym.sqrt(
        _sum(mx.sym.square(x, name=n.sub("sq")), a, k, n.sub("sum")), name=n.name),
    "ReduceSumSquare": lambda n, x, a, k: _sum(mx.sym.square(x, name=n.sub("sq")), a, k,
                                               n.name),
    "ReduceLogSum": lambda n, x, a, k: mx.sym.log(_sum(x, a, k, n.sub("sum")), name=n.name),
    "ReduceLogSumExp": _log_sum_exp,
}


# ONNX's value of a reduction over no elements (onnx.reference, onnxruntime)
_EMPTY = {"ReduceSum": 0.0, "ReduceL1": 0.0, "ReduceL2": 0.0, "ReduceSumSquare": 0.0,
          "ReduceProd": 1.0, "ReduceMax": -math.inf, "ReduceMin": math.inf,
          "ReduceLogSum": -math.inf, "ReduceLogSumExp": -math.inf}


def _empty_reduction(node, x, axes, keep):
    """A float input with a zero-size axis: every output is the op's value for no elements.
    MXNet's sum is the one reduction whose shape inference passes an empty axis (its
    shapes read 0 as unknown), and it yields the zeros to add that value to."""
    reduced = range(len(x.shape)) if axes is None else axes
    if any(d == 0 for i, d in enumerate(x.shape) if i not in reduced):
        raise node.unsupported(f"input '{x.name}' has shape {tuple(x.shape)} and the reduction "
                               f"keeps a zero-size axis, so the output is empty, which MXNet "
                               f"cannot hold")
    if node.op_type not in _EMPTY or x.dtype is None or np.dtype(x.dtype).kind != "f":
        raise node.unsupported(f"input '{x.name}' ({x.dtype}) has shape {tuple(x.shape)}: "
                               f"the reduction is over no elements, which gluontl converts only "
                               f"for float {', '.join(_EMPTY)}")
    value = _EMPTY[node.op_type]
    zeros = _sum(x.sym, axes, keep, node.name if value == 0 else node.sub("zeros"))
    return zeros if value == 0 else _I._plus_scalar(zeros, scalar=value, name=node.name)


@converter(list(_REDUCE), since=1)
def reduce(node, inputs):
    axes = _reduce_axes(node, inputs)
    keep = bool(node.attr("keepdims", 1))
    if axes != "noop" and inputs[0].shape is not None and 0 in inputs[0].shape:
        return _empty_reduction(node, inputs[0], axes, keep)
    x = inputs[0].sym
    if axes == "noop":  # onnxruntime still applies the elementwise part of these two
        fn = {"ReduceLogSum": mx.sym.log, "ReduceSumSquare": mx.sym.square}.get(node.op_type,
                                                                               mx.sym.identity)
        return fn(x, name=node.name)
    return _REDUCE[node.op_type](node, x, axes, keep)


reduce.empty_inputs = True  # the importer refuses empty inputs for every other converter


@converter(["ArgMax", "ArgMin"], since=1)
def arg_extreme(node, inputs):
    x = inputs[0]
    axis, keep = attr_axis(node, x, 0), bool(node.attr("keepdims", 1))
    op = mx.sym.argmax if node.op_type == "ArgMax" else mx.sym.argmin
    if node.opset >= 12 and node.attr("select_last_index", 0):
        # last extreme = first extreme of the reversed axis, counted from the end
        rev = mx.sym.reverse(x.sym, axis=axis, name=node.sub("rev"))
        idx = op(rev, axis=axis, keepdims=keep, name=node.sub("arg"))
        dim = mx.sym.slice_axis(mx.sym.shape_array(x.sym, name=node.sub("shape")), axis=0,
                                begin=axis, end=axis + 1,
                                name=node.sub("dim"))
        last = _I._minus_scalar(mx.sym.Cast(dim, dtype="float32", name=node.sub("dimf")),
                                scalar=1.0, name=node.sub("last"))
        idx = mx.sym.broadcast_sub(last, idx, name=node.sub("flip"))
    else:
        idx = op(x.sym, axis=axis, keepdims=keep, name=node.sub("arg"))
    return mx.sym.Cast(idx, dtype="int64", name=node.name)


@converter("CumSum", since=11)
def cumsum(node, inputs):
    x = inputs[0]
    axis = norm_axes(node, inputs[1].need_const(node, "axis"), need_rank(node, x))[0]
    sym = x.sym
    reverse = node.attr("reverse", 0)
    if reverse:
        sym = mx.sym.reverse(sym, axis=axis, name=node.sub("rev_in"))
    total = mx.sym.cumsum(sym, axis=axis, name=node.sub("cumsum") if reverse or
                          node.attr("exclusive", 0) else node.name)
    if node.attr("exclusive", 0):  # shift by one: drop each element's own term
        total = mx.sym.elemwise_sub(total, sym, name=node.sub("excl") if reverse else node.name)
    if reverse:
        total = mx.sym.reverse(total, axis=axis, name=node.name)
    return total


@converter("TopK", since=1)
def topk(node, inputs):
    x = inputs[0]
    if node.opset < 10:
        k = node.attr("k")
    else:
        k = int(inputs[1].need_const(node, "k").reshape(-1)[0])
    largest = node.attr("largest", 1) if node.opset >= 11 else 1
    values, idx = mx.sym.topk(x.sym, axis=node.attr("axis", -1), k=k, ret_typ="both",
                              is_ascend=not largest, name=node.sub("topk"))
    return [mx.sym.identity(values, name=node.name),
            mx.sym.Cast(idx, dtype="int64", name=node.sub("indices"))]
