"""Selecting and joining: Concat, Split, Slice, Gather, GatherElements, GatherND, Pad.

Indices that may be negative are fixed up with the data's static sizes, or with
``shape_array`` of the data where a size is free (the batch), so gathers along a free
batch dimension keep working.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np

from ..registry import converter, ints
from .elementwise import scalar_of
from .shape import attr_axis, axes_arg, need_rank, norm_axes

INT_BIG = 2**31 - 1  # exporters write INT_MAX / INT64_MAX for "to the end"

_I = mx.sym._internal


@converter("Concat", since=1)
def concat(node, inputs):
    syms = [t.sym for t in inputs if t is not None]
    axis = attr_axis(node, next(t for t in inputs if t is not None), 1)
    if len(syms) == 1:
        return mx.sym.identity(syms[0], name=node.name)
    if axis == 1 and all(t.rank == 4 for t in inputs if t is not None):
        return _channel_concat(node, syms)
    return mx.sym.concat(*syms, dim=axis, name=node.name)


def _channel_concat(node, syms):
    """NCHW channel concat done on (N, C, H·W) views.

    MXNet 1.9.1's oneDNN backward of a 4-D channel Concat feeding a Convolution fails
    ("could not construct a sub-memory", or SIGFPE for some channel counts — the
    apache/mxnet#19586 family; YOLOv8's SPPF/CSP blocks hit it). The 3-D concat takes the
    plain path and computes the same values and gradients.
    """
    flat = [mx.sym.reshape(s, shape=(0, 0, -1), name=node.sub(f"flat{i}")) for i, s in enumerate(syms)]
    joined = mx.sym.concat(*flat, dim=1, name=node.sub("cat"))
    return mx.sym.reshape_like(joined, syms[0], lhs_begin=2, lhs_end=3, rhs_begin=2, rhs_end=4, name=node.name)


def _split_sizes(node, inputs, dim):
    """Explicit split sizes, or None for equal parts."""
    if node.opset < 13:
        split = node.attr("split")
    else:
        t = inputs[1] if len(inputs) > 1 else None
        split = None if t is None else ints(t.need_const(node, "split sizes").reshape(-1))
    if split is not None:
        return list(split)
    if node.opset >= 18 and node.attr("num_outputs") is not None:
        n = node.attr("num_outputs")
        if dim is not None and dim % n:  # uneven: ceil-sized parts, the last smaller
            size = -(-dim // n)
            return [size] * (dim // size) + ([dim % size] if dim % size else [])
    return None


@converter("Split", since=2)
def split(node, inputs):
    x = inputs[0]
    axis = attr_axis(node, x, 0)
    dim = x.shape[axis] if x.shape is not None else None
    sizes = _split_sizes(node, inputs, dim)
    n = len(node.outputs) if sizes is None else len(sizes)
    if sizes is not None and 0 in sizes:
        raise node.unsupported(f"split sizes {sizes} make an empty output, which MXNet cannot hold")
    if sizes is None or len(set(sizes)) == 1 and (dim is None or sum(sizes) == dim):
        if n == 1:
            return [mx.sym.identity(x.sym, name=node.name)]
        parts = mx.sym.split(x.sym, num_outputs=n, axis=axis, name=node.name)
        return [parts[i] for i in range(n)]
    begins = np.cumsum([0] + sizes[:-1])
    return [mx.sym.slice_axis(x.sym, axis=axis, begin=int(b), end=int(b + s),
                              name=node.name if i == 0 else node.sub(str(i)))
            for i, (b, s) in enumerate(zip(begins, sizes))]


def _slice_bounds(start, end, step, dim):
    """ONNX start/end as MXNet slice bounds (Python semantics; None = to the edge)."""
    if dim is None:  # keep Python-style negatives, drop "to the end" sentinels
        if step > 0:
            return start, (None if end >= INT_BIG else end)
        return (None if start >= INT_BIG else start), (None if end <= -INT_BIG else end)
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    start, end = min(max(start, -1), dim - 1), min(max(end, -1), dim - 1)
    return max(start, 0), (None if end < 0 else end)


@converter("Slice", since=1)
def slice_(node, inputs):
    x = inputs[0]
    if node.opset < 10:
        starts, ends, axes = node.attr("starts"), node.attr("ends"), node.attr("axes")
        steps = None
    else:
        starts, ends = (ints(t.need_const(node, what).reshape(-1))
                        for t, what in zip(inputs[1:3], ("starts", "ends")))
        axes = axes_arg(node, inputs, 3, since=10)
        steps = _opt_ints(node, inputs, 4, "steps")
    steps = steps or [1] * len(starts)
    if axes is None:
        axes = list(range(len(starts)))
    elif min(axes) < 0:
        axes = norm_axes(node, axes, need_rank(node, x))
    if 0 in steps:
        raise node.unsupported("a step of 0 is invalid")
    n = max(axes) + 1
    begin, end, step = [None] * n, [None] * n, [None] * n
    for a, s, e, st in zip(axes, starts, ends, steps):
        dim = x.shape[a] if x.shape is not None else None
        begin[a], end[a] = _slice_bounds(s, e, st, dim)
        step[a] = st
        if dim is not None and not len(range(dim)[slice(begin[a], end[a], st)]):
            raise node.unsupported(f"the slice along axis {a} is empty, which MXNet cannot hold")
    return mx.sym.slice(x.sym, begin=tuple(begin), end=tuple(end), step=tuple(step),
                        name=node.name)


def _opt_ints(node, inputs, index, what):
    t = inputs[index] if len(inputs) > index else None
    return None if t is None else ints(t.need_const(node, what).reshape(-1))


def _fix_negative(node, idx, data, first: int, count: int, tag: str):
    """``idx + dim`` where ``idx < 0``; the last index axis (or the whole index, when
    ``count`` is 1) addresses data axes ``first .. first + count - 1``."""
    neg = _I._lesser_scalar(idx, scalar=0.0, name=node.sub(f"{tag}_neg"))
    static = list(data.shape[first:first + count]) if data.shape is not None else [None]
    if None not in static:  # known sizes: no run-time shape read
        if count == 1:
            shift = _I._mul_scalar(neg, scalar=float(static[0]), name=node.sub(f"{tag}_shift"))
            return mx.sym.elemwise_add(idx, shift, name=node.sub(f"{tag}_fixed"))
        dims = mx.sym.concat(*[mx.sym.full((1,), d, dtype="int64", name=node.sub(f"{tag}_dim{i}"))
                               for i, d in enumerate(static)], dim=0, name=node.sub(f"{tag}_dim"))
    else:
        dims = mx.sym.slice_axis(mx.sym.shape_array(data.sym, name=node.sub(f"{tag}_shape")),
                                 axis=0, begin=first, end=first + count, name=node.sub(f"{tag}_dim"))
    shift = mx.sym.broadcast_mul(neg, dims, name=node.sub(f"{tag}_shift"))
    return mx.sym.broadcast_add(idx, shift, name=node.sub(f"{tag}_fixed"))


def _maybe_negative(t) -> bool:
    return t.const is None or bool((t.const < 0).any())


@converter("Gather", since=1)
def gather(node, inputs):
    data, idx = inputs
    axis = attr_axis(node, data, 0)
    v = scalar_of(idx)
    if v is not None and idx.const.ndim == 0:  # one index: a slice, no index parameter
        dim = data.shape[axis] if data.shape is not None else None
        v = int(v)
        if v < 0 and dim is None:
            raise node.unsupported(f"negative index {v} along axis {axis} of unknown size")
        v = v % dim if v < 0 else v
        part = mx.sym.slice_axis(data.sym, axis=axis, begin=v, end=v + 1, name=node.sub("slice"))
        return mx.sym.squeeze(part, axis=axis, name=node.name) if (data.rank or 0) > 1 \
            else mx.sym.reshape(part, shape=(1,), name=node.name)
    if idx.const is not None and idx.const.ndim == 1 and idx.const.size > 1 \
            and (np.diff(idx.const) == 1).all() and idx.const[0] >= 0:
        first = int(idx.const[0])  # a contiguous range: a slice as well
        return mx.sym.slice_axis(data.sym, axis=axis, begin=first, end=first + idx.const.size,
                                 name=node.name)
    # 'wrap' maps -1 to the last entry like ONNX; indices in range are untouched
    return mx.sym.take(data.sym, idx.sym, axis=axis, mode="wrap", name=node.name)


def _coords(node, ref, rank, axes, tag):
    """For each of ``axes``, an int64 tensor shaped like ``ref`` holding the position
    along that axis (the implicit coordinates of gathers)."""
    out = []
    for a in axes:
        r = mx.sym.contrib.arange_like(ref, axis=a, name=node.sub(f"{tag}{a}_range"))
        r = mx.sym.reshape(r, shape=tuple(-1 if i == a else 1 for i in range(rank)),
                           name=node.sub(f"{tag}{a}_col"))
        out.append(mx.sym.broadcast_like(r, ref, name=node.sub(f"{tag}{a}")))
    return out


@converter("GatherElements", since=11)
def gather_elements(node, inputs):
    data, idx = inputs
    rank = need_rank(node, data)
    axis = node.attr("axis", 0) % rank
    index = mx.sym.Cast(idx.sym, dtype="int64", name=node.sub("index"))
    if _maybe_negative(idx):
        index = _fix_negative(node, index, data, axis, 1, "index")
    coords = _coords(node, index, rank, range(rank), "pos")
    coords[axis] = index
    stacked = mx.sym.stack(*coords, axis=0, name=node.sub("coords"))
    return mx.sym.gather_nd(data.sym, stacked, name=node.name)


@converter("GatherND", since=11)
def gather_nd(node, inputs):
    data, idx = inputs
    b = node.attr("batch_dims", 0)
    irank = need_rank(node, idx)
    k = idx.shape[-1] if idx.shape is not None else None
    if k is None:
        raise node.unsupported("the length of the last indices axis is unknown")
    index = mx.sym.Cast(idx.sym, dtype="int64", name=node.sub("index"))
    if _maybe_negative(idx):
        index = _fix_negative(node, index, data, b, k, "index")
    if b:
        head = mx.sym.slice_axis(index, axis=-1, begin=0, end=1, name=node.sub("head"))
        batch = _coords(node, head, irank, range(b), "batch")
        index = mx.sym.concat(*batch, index, dim=irank - 1, name=node.sub("full_index"))
    perm = (irank - 1,) + tuple(range(irank - 1))
    coords = mx.sym.transpose(index, axes=perm, name=node.sub("coords"))
    return mx.sym.gather_nd(data.sym, coords, name=node.name)


def _pad_args(node, inputs, rank):
    """(pads as [(begin, end)] per axis, constant value) across the opset forms."""
    if node.opset < 11:
        pads = node.attr("pads", node.attr("paddings"))
        value = node.attr("value", 0.0)
        axes = list(range(rank))
    else:
        pads = ints(inputs[1].need_const(node, "pads").reshape(-1))
        cv = inputs[2] if len(inputs) > 2 else None
        if cv is not None and scalar_of(cv) is None:
            raise node.unsupported("the constant_value input must be an import-time scalar")
        value = scalar_of(cv) if cv is not None else 0.0
        axes = axes_arg(node, inputs, 3, since=18)
        axes = list(range(rank)) if axes is None else norm_axes(node, axes, rank)
    n = len(axes)
    if len(pads) != 2 * n:
        raise node.unsupported(f"{len(pads)} pad values for {n} axes (expected {2 * n})")
    per_axis = [(0, 0)] * rank
    for i, a in enumerate(axes):
        per_axis[a] = (pads[i], pads[i + n])
    return per_axis, float(value)


@converter("Pad", since=1)
def pad(node, inputs):
    x = inputs[0]
    rank = need_rank(node, x)
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise node.unsupported(f"mode '{mode}' is unknown")
    pads, value = _pad_args(node, inputs, rank)
    floating = x.dtype is None or np.dtype(x.dtype).kind == "f"
    if rank in (4, 5) and pads[0] == pads[1] == (0, 0) and mode != "wrap" and floating \
            and min(min(p) for p in pads) >= 0:  # MXNet's own Pad: one fast op
        width = tuple(v for p in pads for v in p)
        return mx.sym.pad(x.sym, mode=mode, pad_width=width, constant_value=value,
                          name=node.name)
    sym = x.sym
    todo = [a for a in range(rank) if pads[a] != (0, 0)]
    if not todo:
        return mx.sym.identity(sym, name=node.name)
    for a in todo:
        last = a == todo[-1]
        sym = _pad_axis(node, sym, a, *pads[a], mode, value, node.name if last
                        else node.sub(f"ax{a}"))
    return sym


def _pad_axis(node, sym, axis, before, after, mode, value, name):
    """Pad (or crop, for negative pads) one axis by concatenating border blocks."""
    tag = node.sub(f"ax{axis}")
    if before < 0 or after < 0:
        sym = mx.sym.slice_axis(sym, axis=axis, begin=max(-before, 0),
                                end=after if after < 0 else None, name=f"{tag}_crop")
        before, after = max(before, 0), max(after, 0)
    parts = []
    for side, p in (("begin", before), ("end", after)):
        if p == 0:
            parts.append(None)
            continue
        first = side == "begin"
        if mode == "reflect":
            block = mx.sym.slice_axis(sym, axis=axis, begin=1 if first else -p - 1,
                                      end=p + 1 if first else -1, name=f"{tag}_{side}_src")
            block = mx.sym.reverse(block, axis=axis, name=f"{tag}_{side}")
        elif mode == "wrap":
            block = mx.sym.slice_axis(sym, axis=axis, begin=-p if first else 0,
                                      end=None if first else p, name=f"{tag}_{side}")
        else:
            edge = mx.sym.slice_axis(sym, axis=axis, begin=0 if first else -1,
                                     end=1 if first else None, name=f"{tag}_{side}_edge")
            if mode == "constant":
                edge = _I._plus_scalar(mx.sym.zeros_like(edge, name=f"{tag}_{side}_zero"),
                                       scalar=value, name=f"{tag}_{side}_fill")
            block = mx.sym.broadcast_axis(edge, axis=axis, size=p, name=f"{tag}_{side}")
        parts.append(block)
    syms = [s for s in (parts[0], sym, parts[1]) if s is not None]
    if len(syms) == 1:
        return mx.sym.identity(sym, name=name)
    return mx.sym.concat(*syms, dim=axis, name=name)
