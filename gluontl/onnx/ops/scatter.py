"""ScatterElements (opset 9-10: Scatter) and ScatterND: what PyTorch's exporters write for
in-place writes (``y[:, 0] = v``, ``index_put``, ``select_scatter``).

MXNet's scatter ops take the output shape as a number, which a free batch does not
have, and do not differentiate the data they write into. So a write is a match: every
index is compared with ``arange_like`` of the data axis it addresses (sizes come from the
data at run time), the matches pick the updates by a sum (or product, max, min), and
``where`` keeps the data elsewhere; gradients reach data and updates. An index given
twice behaves as in onnxruntime, which applies updates in order: the last one is kept
(``reduction='none'``) or all combine. The matches cost indices × positions memory.
"""
from __future__ import annotations

import math

import mxnet as mx
import numpy as np

from ..registry import converter
from .shape import attr_axis, need_rank
from .slice import _fix_negative, _maybe_negative

_BIG = 3.4028234e38  # float32 max: the identity of max/min over no match
_NEUTRAL = {"mul": 1.0, "max": -_BIG, "min": _BIG}


def _reduction(node, data) -> str:
    if data.dtype is not None and np.dtype(data.dtype).kind != "f":
        raise node.unsupported(f"{np.dtype(data.dtype)} data: only float data can be written into")
    reduction = node.attr("reduction", "none")
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise node.unsupported(f"reduction '{reduction}' is not an ONNX reduction")
    return reduction


def _index(node, idx, data, first: int, count: int):
    """Indices as float32 (exact below 2**24), negative ones counted from the end."""
    index = mx.sym.Cast(idx.sym, dtype="int64", name=node.sub("index"))
    if _maybe_negative(idx):
        index = _fix_negative(node, index, data, first, count, "index")
    return mx.sym.Cast(index, dtype="float32", name=node.sub("index_f"))


def _along(node, vec, axis: int, rank: int, tag: str):
    """1-D ``vec`` as a rank-``rank`` tensor lying along ``axis``."""
    return mx.sym.reshape(vec, shape=tuple(-1 if i == axis else 1 for i in range(rank)),
                          name=node.sub(tag))


def _last(node, match, axis: int, rank: int):
    """``match`` (0/1) keeping only the last 1 along ``axis``: onnxruntime's last write."""
    order = _along(node, mx.sym.contrib.arange_like(match, axis=axis, start=1, name=node.sub("order")),
                   axis, rank, "order_along")
    scored = mx.sym.broadcast_mul(match, order, name=node.sub("scored"))
    latest = mx.sym.max(scored, axis=axis, keepdims=True, name=node.sub("latest"))
    return match * mx.sym.broadcast_equal(scored, latest, name=node.sub("is_latest"))


def _combine(node, data, hits, picked, reduction: str):
    """The output from the data, how often each position was written (``hits``) and the
    updates reduced per position (``picked``), all shaped like the data."""
    written = hits > 0
    if reduction == "add":
        return mx.sym.elemwise_add(data, picked, name=node.name)
    if reduction == "mul":
        return mx.sym.elemwise_mul(data, picked, name=node.name)
    if reduction in ("max", "min"):
        fn = mx.sym.broadcast_maximum if reduction == "max" else mx.sym.broadcast_minimum
        picked = fn(data, picked, name=node.sub("with_data"))
    return mx.sym.where(written, picked, data, name=node.name)


def _reduce(node, values, match, axis: int, reduction: str):
    """Updates ``values`` at the matching entries, reduced over ``axis``."""
    if reduction in ("none", "add"):
        return mx.sym.sum(values * match, axis=axis, name=node.sub("picked"))
    chosen = mx.sym.where(match, values, mx.sym.ones_like(values) * _NEUTRAL[reduction],
                          name=node.sub("chosen"))
    fn = {"mul": mx.sym.prod, "max": mx.sym.max, "min": mx.sym.min}[reduction]
    return fn(chosen, axis=axis, name=node.sub("picked"))


@converter("Scatter", since=9, until=10)
@converter("ScatterElements", since=11)
def scatter_elements(node, inputs):
    """``out[.., idx[u], ..] = upd[u]`` along ``axis``: matches of shape indices × axis size."""
    data, idx, upd = inputs
    rank = need_rank(node, data)
    axis = attr_axis(node, data, 0)
    reduction = _reduction(node, data)
    if idx.shape is None or data.shape is None or len(idx.shape) != rank or any(
            i != d for a, (i, d) in enumerate(zip(idx.shape, data.shape)) if a != axis):
        raise node.unsupported(f"indices {idx.shape} must have the data's shape {data.shape} off "
                               f"axis {axis} (writes into a corner of the data are not supported)")
    index = mx.sym.expand_dims(_index(node, idx, data, axis, 1), axis=rank, name=node.sub("index_col"))
    positions = _along(node, mx.sym.contrib.arange_like(data.sym, axis=axis, name=node.sub("positions")),
                       rank, rank + 1, "positions_along")
    match = mx.sym.broadcast_equal(index, positions, name=node.sub("match"))  # idx.shape + (D,)
    if reduction == "none":
        match = _last(node, match, axis, rank + 1)
    values = mx.sym.broadcast_like(mx.sym.expand_dims(upd.sym, axis=rank, name=node.sub("upd_col")),
                                   match, name=node.sub("values"))
    perm = list(range(rank - 1))
    perm.insert(axis, rank - 1)  # the position axis (last after the reduction) back to ``axis``
    hits = mx.sym.transpose(mx.sym.sum(match, axis=axis, name=node.sub("hits_last")), axes=perm,
                            name=node.sub("hits"))
    picked = mx.sym.transpose(_reduce(node, values, match, axis, reduction), axes=perm,
                              name=node.sub("picked_t"))
    return _combine(node, data.sym, hits, picked, reduction)


@converter("ScatterND", since=11)
def scatter_nd(node, inputs):
    """``out[idx[q]] = upd[q]`` for k-tuples ``idx[q]``: matches of shape indices × the
    data's first k axes."""
    data, idx, upd = inputs
    rank = need_rank(node, data)
    reduction = _reduction(node, data)
    k = idx.shape[-1] if idx.shape is not None else None
    rest = list(data.shape[k:]) if data.shape is not None and k is not None else [None]
    if k is None or None in rest:
        raise node.unsupported("the length of the last indices axis and the data axes after the "
                               "indexed ones must be known; pass input_shapes=...")
    index = mx.sym.reshape(_index(node, idx, data, 0, k), shape=(-1, k), name=node.sub("rows"))
    match = None  # (Q, D0, .., Dk-1): row q addresses that position
    for m in range(k):
        col = mx.sym.slice_axis(index, axis=1, begin=m, end=m + 1, name=node.sub(f"col{m}"))
        positions = mx.sym.reshape(mx.sym.contrib.arange_like(data.sym, axis=m, name=node.sub(f"pos{m}")),
                                   shape=(1, -1), name=node.sub(f"pos{m}_row"))
        hit = mx.sym.broadcast_equal(col, positions, name=node.sub(f"hit{m}"))
        hit = mx.sym.reshape(hit, shape=(0,) + (1,) * m + (-1,) + (1,) * (k - 1 - m),
                             name=node.sub(f"hit{m}_along"))
        match = hit if match is None else mx.sym.broadcast_mul(match, hit, name=node.sub(f"match{m}"))
    match = mx.sym.reshape(match, shape=(0, -1), name=node.sub("match"))  # (Q, P)
    if reduction == "none":
        match = _last(node, match, 0, 2)
    size = math.prod(rest)
    values = mx.sym.reshape(upd.sym, shape=(-1, size), name=node.sub("values"))  # (Q, R)
    hits = mx.sym.sum(match, axis=0, name=node.sub("hits_flat"))  # (P,)
    if reduction in ("none", "add"):
        picked = mx.sym.dot(match, values, transpose_a=True, name=node.sub("picked_flat"))  # (P, R)
    else:
        wide = mx.sym.broadcast_like(mx.sym.expand_dims(values, axis=1), match, lhs_axes=(1,),
                                     rhs_axes=(1,), name=node.sub("wide"))  # (Q, P, R)
        picked = _reduce(node, wide, mx.sym.broadcast_like(
            mx.sym.expand_dims(match, axis=2), wide, name=node.sub("match_wide")), 0, reduction)
    hits = mx.sym.broadcast_like(mx.sym.expand_dims(hits, axis=1), picked, name=node.sub("hits_wide"))
    return _combine(node, data.sym, mx.sym.reshape_like(hits, data.sym, name=node.sub("hits")),
                    mx.sym.reshape_like(picked, data.sym, name=node.sub("picked")), reduction)
