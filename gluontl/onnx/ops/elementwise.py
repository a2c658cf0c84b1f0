"""Elementwise math, comparison, logic, Where and Cast.

ONNX booleans are carried as float32 0/1 in MXNet: legacy MXNet ops have no usable
bool type, and float32 masks feed straight into Mul/Where/Cast without extra casts.
Binary ops use MXNet's ``broadcast_*`` ops (numpy-style, rank-prepending); a constant
operand of size 1 uses the ``*_scalar`` op instead, so it costs no parameter.
"""
from __future__ import annotations

import dataclasses

import mxnet as mx
import numpy as np
import onnx

from ..registry import canonical_dtype, converter

BOOL = np.dtype(np.float32)  # MXNet dtype of ONNX bool values

ONNX2NP = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.BOOL: np.bool_,
    # widened: MXNet has no int16/uint16/uint32; values fit in int32/int64
    onnx.TensorProto.INT16: np.int32, onnx.TensorProto.UINT16: np.int32,
    onnx.TensorProto.UINT32: np.int64,
}


def mx_dtype(dtype) -> np.dtype | None:
    """MXNet dtype that carries values of ONNX/numpy ``dtype`` (bool -> float32)."""
    if dtype is None:
        return None
    dtype = canonical_dtype(dtype)
    return BOOL if dtype == np.bool_ else dtype


def scalar_of(t) -> float | int | None:
    """The value of a size-1 constant, for the fast ``*_scalar`` ops."""
    if t is None or t.const is None or t.const.size != 1:
        return None
    v = t.const.reshape(()).item()
    return float(v) if isinstance(v, (bool, float)) else v


def renamed(node, suffix: str):
    """``node`` under a helper name, to build one of its sub-ops with a shared helper."""
    return dataclasses.replace(node, name=node.sub(suffix))


def expand_to_rank(sym, rank: int, target: int, name: str):
    """Prepend unit axes (numpy broadcasting) so ``sym`` has rank ``target``. A rank-0
    value travels as shape (1,) and is reshaped instead."""
    if rank == 0 and target > 0:
        return mx.sym.reshape(sym, shape=(1,) * target, name=f"{name}0")
    for i in range(target - rank):
        sym = mx.sym.expand_dims(sym, axis=0, name=f"{name}{i}")
    return sym


def binary(node, a, b, bcast, scalar=None, rscalar=None):
    """Broadcasting binary op; size-1 constants go through ``scalar``/``rscalar`` ops."""
    for t, other, op in ((b, a, scalar), (a, b, rscalar)):
        v = scalar_of(t)
        if op is None or v is None or (t.const.ndim and other.rank is None):
            continue
        out = op(other.sym, scalar=v, name=node.name if t.const.ndim <= (other.rank or 0)
                 else node.sub("op"))
        if t.const.ndim > other.rank:
            out = expand_to_rank(out, other.rank, t.const.ndim, node.name)
        return out
    return bcast(a.sym, b.sym, name=node.name)


def broadcast_all(node, tensors):
    """Symbols of ``tensors`` broadcast to their common shape (for ops that do not
    broadcast, e.g. ``where``), using ``broadcast_like`` so unknown dims stay free."""
    ranks = [t.rank for t in tensors]
    if any(r is None for r in ranks):
        if len(set(ranks)) == 1:  # all unknown: the ONNX model must use equal shapes
            return [t.sym for t in tensors]
        raise node.unsupported("the ranks of its inputs are unknown; pass input_shapes=...")
    rank = max(ranks)
    shapes = [(1,) * (rank - len(t.shape if t.shape is not None else t.const.shape))
              + tuple(t.shape if t.shape is not None else t.const.shape) for t in tensors]
    syms = [expand_to_rank(t.sym, r, rank, node.sub(f"in{i}_ax"))
            for i, (t, r) in enumerate(zip(tensors, ranks))]
    out = []
    for i, (s, shp) in enumerate(zip(syms, shapes)):
        by_src: dict[int, list[int]] = {}
        for ax in range(rank):
            if shp[ax] != 1:
                continue
            src = next((j for j, o in enumerate(shapes) if o[ax] != 1), None)
            if src is not None:
                by_src.setdefault(src, []).append(ax)
        for src, axes in by_src.items():
            s = mx.sym.broadcast_like(s, syms[src], lhs_axes=tuple(axes), rhs_axes=tuple(axes),
                                      name=node.sub(f"in{i}_bc{src}"))
        out.append(s)
    return out


def to_bool(node, sym, src_dtype):
    """Cast a 0/1 result of a comparison to the bool carrier dtype when needed."""
    if src_dtype is not None and mx_dtype(src_dtype) == BOOL:
        return sym
    return mx.sym.Cast(sym, dtype=BOOL.name, name=node.name)


_I = mx.sym._internal

_ARITH = {
    "Add": (mx.sym.broadcast_add, _I._plus_scalar, _I._plus_scalar),
    "Sub": (mx.sym.broadcast_sub, _I._minus_scalar, _I._rminus_scalar),
    "Mul": (mx.sym.broadcast_mul, _I._mul_scalar, _I._mul_scalar),
    "Div": (mx.sym.broadcast_div, _I._div_scalar, _I._rdiv_scalar),
}


@converter(list(_ARITH), since=1)
def arith(node, inputs):
    if node.opset < 7 and node.attr("broadcast", 0) and node.attr("axis") is not None:
        raise node.unsupported("legacy broadcast with an explicit 'axis' is not supported; "
                               "upgrade the model to opset >= 7 with onnx.version_converter")
    return binary(node, inputs[0], inputs[1], *_ARITH[node.op_type])


@converter("Pow", since=1)
def power(node, inputs):
    base, exp = inputs
    v = scalar_of(exp)
    if v is not None and exp.const.ndim <= (base.rank or 0):
        if v == 2:  # common in norms: exact and cheap
            return mx.sym.square(base.sym, name=node.name)
        return _I._power_scalar(base.sym, scalar=float(v), name=node.name)
    if base.dtype is not None and exp.dtype is not None \
            and np.dtype(base.dtype) != np.dtype(exp.dtype):
        # opset 12+ allows e.g. an int exponent for a float base; MXNet wants one dtype
        exp = type(exp)(exp.name, mx.sym.Cast(exp.sym, dtype=np.dtype(base.dtype).name,
                                              name=node.sub("exp_cast")), None, exp.shape,
                        base.dtype)
    return binary(node, base, exp, mx.sym.broadcast_power, None, _I._rpower_scalar)


@converter("Mod", since=10)
def mod(node, inputs):
    a, b = inputs
    if not node.attr("fmod", 0):  # sign of the divisor, like Python: MXNet's mod
        return binary(node, a, b, mx.sym.broadcast_mod, _I._mod_scalar, _I._rmod_scalar)
    # C fmod (sign of the dividend): a - b * trunc(a / b)
    q = binary(renamed(node, "div"), a, b, mx.sym.broadcast_div, _I._div_scalar,
               _I._rdiv_scalar)
    if a.dtype is None or np.dtype(a.dtype).kind == "f":
        q = mx.sym.fix(q, name=node.sub("trunc"))
    prod = mx.sym.broadcast_mul(q, b.sym, name=node.sub("mul"))
    return mx.sym.broadcast_sub(a.sym, prod, name=node.name)


_UNARY = {
    "Sqrt": mx.sym.sqrt, "Exp": mx.sym.exp, "Log": mx.sym.log, "Abs": mx.sym.abs,
    "Neg": mx.sym.negative, "Reciprocal": mx.sym.reciprocal, "Floor": mx.sym.floor,
    "Ceil": mx.sym.ceil, "Sign": mx.sym.sign, "Sin": mx.sym.sin, "Cos": mx.sym.cos,
    "Tan": mx.sym.tan, "Asin": mx.sym.arcsin, "Acos": mx.sym.arccos, "Atan": mx.sym.arctan,
    "Sinh": mx.sym.sinh, "Cosh": mx.sym.cosh, "Asinh": mx.sym.arcsinh,
    "Acosh": mx.sym.arccosh, "Atanh": mx.sym.arctanh, "Erf": mx.sym.erf,
}


@converter(list(_UNARY), since=1)
def unary(node, inputs):
    return _UNARY[node.op_type](inputs[0].sym, name=node.name)


@converter("Round", since=11)
def round_half_even(node, inputs):
    """ONNX rounds half to even; MXNet ``round`` goes away from zero, so ties whose
    result is odd step back one towards zero."""
    x = inputs[0].sym
    r = mx.sym.round(x, name=node.sub("round"))
    frac = mx.sym.abs(mx.sym.elemwise_sub(x, mx.sym.fix(x, name=node.sub("fix")),
                                          name=node.sub("sub")), name=node.sub("frac"))
    tie = _I._equal_scalar(frac, scalar=0.5, name=node.sub("tie"))
    odd = mx.sym.abs(_I._mod_scalar(r, scalar=2.0, name=node.sub("mod")), name=node.sub("odd"))
    step = mx.sym.elemwise_mul(mx.sym.elemwise_mul(tie, odd, name=node.sub("odd_tie")),
                               mx.sym.sign(x, name=node.sub("sign")), name=node.sub("step"))
    return mx.sym.elemwise_sub(r, step, name=node.name)


@converter(["Min", "Max", "Sum", "Mean"], since=1)
def variadic(node, inputs):
    if node.opset < 8 and len({t.shape for t in inputs}) > 1:
        raise node.unsupported("inputs of different shapes need opset >= 8 broadcasting")
    op, sop = {"Min": (mx.sym.broadcast_minimum, _I._minimum_scalar),
               "Max": (mx.sym.broadcast_maximum, _I._maximum_scalar),
               "Sum": (mx.sym.broadcast_add, _I._plus_scalar),
               "Mean": (mx.sym.broadcast_add, _I._plus_scalar)}[node.op_type]
    if len(inputs) == 1:
        return mx.sym.identity(inputs[0].sym, name=node.name)
    acc = inputs[0]
    last = len(inputs) - 1 if node.op_type != "Mean" else len(inputs)
    for i, t in enumerate(inputs[1:], 1):
        sub = node if i == last else renamed(node, f"acc{i}")
        acc = type(t)(sub.name, binary(sub, acc, t, op, sop, sop), None,
                      _broadcast_shape(acc.shape, t.shape), t.dtype)
    if node.op_type == "Mean":
        return _I._div_scalar(acc.sym, scalar=float(len(inputs)), name=node.name)
    return acc.sym


def _broadcast_shape(a, b):
    """Static numpy broadcast of two shapes with ``None`` for unknown dims."""
    if a is None or b is None:
        return None
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    return tuple(y if x == 1 else x if y == 1 else (x if x is not None else y)
                 for x, y in zip(a, b))


_COMPARE = {
    "Equal": (mx.sym.broadcast_equal, _I._equal_scalar, _I._equal_scalar),
    "Less": (mx.sym.broadcast_lesser, _I._lesser_scalar, _I._greater_scalar),
    "Greater": (mx.sym.broadcast_greater, _I._greater_scalar, _I._lesser_scalar),
    "LessOrEqual": (mx.sym.broadcast_lesser_equal, _I._lesser_equal_scalar,
                    _I._greater_equal_scalar),
    "GreaterOrEqual": (mx.sym.broadcast_greater_equal, _I._greater_equal_scalar,
                       _I._lesser_equal_scalar),
    "And": (mx.sym.broadcast_logical_and, _I._logical_and_scalar, _I._logical_and_scalar),
    "Or": (mx.sym.broadcast_logical_or, _I._logical_or_scalar, _I._logical_or_scalar),
    "Xor": (mx.sym.broadcast_logical_xor, _I._logical_xor_scalar, _I._logical_xor_scalar),
}


@converter(list(_COMPARE), since=7)
def compare(node, inputs):
    a, b = inputs
    dtype = a.dtype if a.const is None else b.dtype
    if mx_dtype(dtype) == BOOL:
        return binary(node, a, b, *_COMPARE[node.op_type])
    raw = binary(renamed(node, "cmp"), a, b, *_COMPARE[node.op_type])
    return to_bool(node, raw, None)


@converter("Not", since=1)
def logical_not(node, inputs):
    return mx.sym.logical_not(inputs[0].sym, name=node.name)


@converter("IsNaN", since=9)
def isnan(node, inputs):
    x = inputs[0]
    raw = mx.sym.broadcast_not_equal(x.sym, x.sym, name=node.sub("ne"))
    return to_bool(node, raw, x.dtype)


@converter("IsInf", since=10)
def isinf(node, inputs):
    x = inputs[0]
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    if pos and neg:
        raw = _I._equal_scalar(mx.sym.abs(x.sym, name=node.sub("abs")), scalar=float("inf"),
                               name=node.sub("eq"))
    elif pos or neg:
        raw = _I._equal_scalar(x.sym, scalar=float("inf") if pos else float("-inf"),
                               name=node.sub("eq"))
    else:
        raw = mx.sym.zeros_like(x.sym, name=node.sub("none"))
    return to_bool(node, raw, x.dtype)


@converter("Where", since=9)
def where(node, inputs):
    """MXNet ``where`` does not broadcast: inputs are broadcast first, and a size-1
    constant branch becomes a filled copy of the broadcast shape (no parameter)."""
    cond, x, y = inputs
    rank = max((t.rank or 0) for t in inputs)
    dyn = [t for t in inputs if t is cond or scalar_of(t) is None or t.const.ndim > rank]
    syms = dict(zip(map(id, dyn), broadcast_all(node, dyn)))
    ref = syms[id(dyn[-1])]
    dtype = mx_dtype(x.dtype if x.dtype is not None else y.dtype) or np.dtype(np.float32)
    if dyn[-1] is cond and dtype != BOOL:
        ref = mx.sym.Cast(ref, dtype=dtype.name, name=node.sub("like"))
    for i, t in ((1, x), (2, y)):
        if id(t) not in syms:
            zero = mx.sym.zeros_like(ref, name=node.sub(f"in{i}_zero"))
            syms[id(t)] = _I._plus_scalar(zero, scalar=scalar_of(t), name=node.sub(f"in{i}_fill"))
    return mx.sym.where(syms[id(cond)], syms[id(x)], syms[id(y)], name=node.name)


def cast_to(node, sym, dtype):
    """Cast to the MXNet carrier of ONNX/numpy ``dtype``; to bool means ``x != 0``."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        raw = _I._not_equal_scalar(sym, scalar=0.0, name=node.sub("ne0"))
        return mx.sym.Cast(raw, dtype=BOOL.name, name=node.name)
    return mx.sym.Cast(sym, dtype=dtype.name, name=node.name)


@converter("Cast", since=6)
def cast(node, inputs):
    to = node.attr("to")
    if to not in ONNX2NP:
        raise node.unsupported(f"target type {onnx.TensorProto.DataType.Name(to)} has no MXNet "
                               f"equivalent; only float/int/bool casts are supported")
    return cast_to(node, inputs[0].sym, ONNX2NP[to])


@converter("CastLike", since=15)
def cast_like(node, inputs):
    if inputs[1].dtype is None:
        raise node.unsupported(f"the type of the 'target_type' input '{inputs[1].name}' is "
                               f"unknown at import time")
    return cast_to(node, inputs[0].sym, inputs[1].dtype)

