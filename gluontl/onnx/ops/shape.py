"""Shape manipulation: Reshape, Flatten, Transpose, (Un)Squeeze, Shape, Size, Expand,
Tile, ConstantOfShape, Range, DepthToSpace, SpaceToDepth.

Shape vectors arrive as import-time constants; the converters emit MXNet's
shape-free forms (``reshape`` codes 0/-1, ``broadcast_to`` with 0 = keep) so an
unknown batch dimension stays free.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np

from ..registry import converter, ints
from .elementwise import expand_to_rank, mx_dtype


def need_rank(node, t) -> int:
    """Rank of ``t``, which negative axes and default permutations depend on."""
    if t.rank is None:
        raise node.unsupported(f"the rank of input '{t.name}' is unknown at import time; "
                               f"pass input_shapes=... when importing")
    return t.rank


def attr_axis(node, t, default: int) -> int:
    """The node's ``axis`` attribute, counted from the front (negative axes need ``t``'s rank)."""
    axis = node.attr("axis", default)
    return axis + need_rank(node, t) if axis < 0 else axis


def norm_axes(node, axes, rank: int) -> list[int]:
    """ONNX axes (negative counts from the end) as order-preserving non-negative ints."""
    out = []
    for a in ints(np.atleast_1d(axes)):
        if not -rank <= a < rank:
            raise node.unsupported(f"axis {a} is out of range for rank {rank}")
        out.append(a % rank)
    return out


def axes_arg(node, inputs, index: int, since: int):
    """The ``axes`` of an op that moved them from an attribute to input ``index`` at
    opset ``since``; None when absent."""
    if node.opset < since:
        return node.attr("axes")
    t = inputs[index] if len(inputs) > index else None
    if t is None:
        return None
    return ints(t.need_const(node, "axes").reshape(-1))


def static_dims(t) -> list[int | None]:
    return list(t.shape) if t.shape is not None else list(t.const.shape)


@converter("Reshape", since=5)
def reshape(node, inputs):
    shape = ints(inputs[1].need_const(node, "target shape").reshape(-1))
    if node.attr("allowzero", 0) and 0 in shape:
        raise node.unsupported("allowzero=1 with a 0 in the shape makes an empty tensor, "
                               "which MXNet cannot hold")
    # ONNX 0 (copy the dim at this position) and -1 (infer) mean the same in MXNet;
    # a rank-0 result is carried as shape (1,)
    return mx.sym.reshape(inputs[0].sym, shape=tuple(shape) or (1,), name=node.name)


@converter("Flatten", since=1)
def flatten(node, inputs):
    x = inputs[0]
    axis = attr_axis(node, x, 1)
    if axis == 1:
        return mx.sym.flatten(x.sym, name=node.name)
    # collapse the tail into one dim, then the head (from the right, so no dim is fixed)
    tail = mx.sym.reshape(x.sym, shape=(0,) * axis + (-1,), name=node.sub("tail"))
    return mx.sym.reshape(tail, shape=(-1, 0), reverse=True, name=node.name)


# Transposes this module made, by output name: (axes attribute as MXNet prints it, input name).
# Keras-family exports (tf2onnx without its optimizer, Keras->PyTorch conversions) put a
# Transpose to NCHW before every Conv and one back after it, so two convolutions in a row read
# through a pair that cancels; such a pair becomes one copy. A name is checked against the
# symbol's own axes and input, so an entry from another import cannot match by accident.
_MADE: dict[str, tuple[str, str]] = {}


def _undone(x, perm: tuple[int, ...]):
    """The input of ``x`` if ``x`` is a transpose this module made that ``perm`` undoes, else None."""
    made = _MADE.get(x.name)
    children = x.get_children() if made is not None else None
    if made is None or children is None or len(children) != 1 or children[0].name != made[1] \
            or x.list_attr().get("axes") != made[0]:
        return None
    inner = tuple(int(a) for a in made[0].strip("()[] ").split(",") if a.strip())
    return children[0] if len(inner) == len(perm) and all(inner[q] == i for i, q in enumerate(perm)) else None


@converter("Transpose", since=1)
def transpose(node, inputs):
    perm = node.attr("perm")
    if perm is None:
        perm = list(range(need_rank(node, inputs[0])))[::-1]
    source = _undone(inputs[0].sym, tuple(perm))
    if source is not None:
        return mx.sym.identity(source, name=node.name)
    out = mx.sym.transpose(inputs[0].sym, axes=tuple(perm), name=node.name)
    if len(_MADE) > 100_000:  # names of long-finished imports
        _MADE.clear()
    _MADE[out.name] = (out.list_attr().get("axes", ""), inputs[0].sym.name)
    return out


@converter("Squeeze", since=1)
def squeeze(node, inputs):
    axes = axes_arg(node, inputs, 1, since=13)
    if axes is None:  # all unit dims, decided at run time like ONNX
        return mx.sym.squeeze(inputs[0].sym, name=node.name)
    axes = norm_axes(node, axes, need_rank(node, inputs[0]))
    return mx.sym.squeeze(inputs[0].sym, axis=tuple(axes), name=node.name)


@converter("Unsqueeze", since=1)
def unsqueeze(node, inputs):
    axes = axes_arg(node, inputs, 1, since=13)
    if axes is None:
        raise node.unsupported("no axes given")
    x = inputs[0]
    out_rank = need_rank(node, x) + len(axes)
    axes = sorted(norm_axes(node, axes, out_rank))
    if x.rank == 0:  # carried as shape (1,)
        return mx.sym.reshape(x.sym, shape=(1,) * out_rank, name=node.name)
    sym = x.sym
    for i, a in enumerate(axes):
        sym = mx.sym.expand_dims(sym, axis=a, name=node.name if i == len(axes) - 1
                                 else node.sub(f"ax{a}"))
    return sym


@converter("Shape", since=1)
def shape(node, inputs):
    x = inputs[0]
    out = mx.sym.shape_array(x.sym, name=node.sub("all") if _shape_sliced(node) else node.name)
    if not _shape_sliced(node):
        return out
    rank = need_rank(node, x)
    start, end = node.attr("start", 0), node.attr("end", rank)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    if end <= start:
        raise node.unsupported("the requested shape slice is empty")
    return mx.sym.slice_axis(out, axis=0, begin=start, end=end, name=node.name)


def _shape_sliced(node) -> bool:
    return node.opset >= 15 and ("start" in node.attrs or "end" in node.attrs)


@converter("Size", since=1)
def size(node, inputs):
    """Returns shape (1,): MXNet has no 0-d tensors."""
    return mx.sym.size_array(inputs[0].sym, name=node.name)


@converter("Expand", since=8)
def expand(node, inputs):
    x = inputs[0]
    target = ints(inputs[1].need_const(node, "target shape").reshape(-1))
    rank = need_rank(node, x)
    n = max(rank, len(target))
    dims = [1] * (n - rank) + static_dims(x)
    target = [1] * (n - len(target)) + target
    sym = expand_to_rank(x.sym, rank, n, node.sub("ax"))
    # 0 keeps the input dim: right when the target is 1 (ONNX broadcasts both ways)
    # or equal to it, and keeps a free batch dim free
    spec = tuple(0 if t == 1 or t == d else t for t, d in zip(target, dims))
    if all(s == 0 for s in spec):
        return mx.sym.identity(sym, name=node.name)
    return mx.sym.broadcast_to(sym, shape=spec, name=node.name)


@converter("Tile", since=6)
def tile(node, inputs):
    """One axis at a time: MXNet's tile broadcasts over 2*rank dims internally and
    fails beyond its 5-dim limit when several axes repeat."""
    reps = ints(inputs[1].need_const(node, "repeats").reshape(-1))
    sym = inputs[0].sym
    axes = [i for i, r in enumerate(reps) if r != 1]
    if not axes:
        return mx.sym.identity(sym, name=node.name)
    for a in axes:
        one = [1] * len(reps)
        one[a] = reps[a]
        sym = mx.sym.tile(sym, reps=tuple(one), name=node.name if a == axes[-1]
                          else node.sub(f"ax{a}"))
    return sym


@converter("ConstantOfShape", since=9)
def constant_of_shape(node, inputs):
    shape = tuple(ints(inputs[0].need_const(node, "output shape").reshape(-1)))
    value = node.attr("value")
    value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    if 0 in shape or not shape:
        raise node.unsupported(f"output shape {shape} is empty or 0-d, which MXNet cannot hold")
    dtype = mx_dtype(value.dtype)
    return mx.sym.full(shape=shape, val=float(value[0]), dtype=dtype.name, name=node.name)


@converter("Range", since=11)
def range_(node, inputs):
    start, limit, delta = (t.need_const(node, what).reshape(()).item()
                           for t, what in zip(inputs, ("start", "limit", "delta")))
    dtype = mx_dtype(inputs[0].dtype or np.float32)
    return mx.sym.arange(start=start, stop=limit, step=delta, dtype=dtype.name, name=node.name)


def range_along(node, inputs, *, start, step, ref, axis: int, dtype):
    """A Range of the length of a free axis of ``ref``, a graph input (BERT's position ids
    ``arange(S)`` with ``S = Shape(input_ids)[1]``): computed at run time by ``arange_like``,
    so the length stays free. The importer calls it in place of the converter. Start and step
    apply in the output's dtype (exact for int64, as ``range_over_batch``)."""
    idx = mx.sym.contrib.arange_like(ref, axis=axis, name=node.sub("idx"))
    out = mx.sym.cast(idx, dtype=mx_dtype(np.dtype(dtype)).name, name=node.sub("cast")) * step
    return mx.sym.identity(out + start, name=node.name)


def range_over_batch(node, inputs, *, values, batches, ref):
    """A Range whose bounds change with the batch size (dynamo's ``as_strided`` and
    advanced-indexing decompositions: ``arange(B) * C + ...``, ``arange(B - 1, -1, -1)``),
    computed at run time from the batch axis of ``ref``, the batched graph input.

    The importer calls it in place of the converter; ``values`` holds each input at the
    two import batch sizes ``batches`` (``inputs`` only says their types). Start and
    length are taken as affine in the batch, as the shape arithmetic of exports is
    (``B``, ``B * C``, ``B - 1``); the step must not depend on it. MXNet shapes cannot come
    from values, so the length is the size of a helper built from ``ref``'s batch axis."""
    (b1, b2), (s, lim, d) = batches, ([np.asarray(x).reshape(()).item() for x in v] for v in values)
    if d[0] != d[1] or d[0] == 0:
        raise node.unsupported("its step depends on the batch size (or is 0)")
    step, span = d[0], b2 - b1
    n = [max(int(np.ceil((lim[i] - s[i]) / step)), 0) for i in (0, 1)]
    if (n[1] - n[0]) % span or n[1] < n[0] or (s[1] - s[0]) % span:
        raise node.unsupported(f"its length ({n[0]} at batch {b1}, {n[1]} at batch {b2}) or start "
                               f"is not a whole multiple of the batch size plus a constant")
    per_batch, extra = (n[1] - n[0]) // span, n[0] - (n[1] - n[0]) // span * b1
    if per_batch == 0 and extra <= 0:
        raise node.unsupported("it is empty, and MXNet cannot hold an empty tensor")
    start_per_batch, start = (s[1] - s[0]) // span, s[0] - (s[1] - s[0]) // span * b1
    dtype = mx_dtype(np.asarray(values[0][0]).dtype).name
    batch = mx.sym.contrib.arange_like(ref, axis=0, name=node.sub("batch"))
    if per_batch == 0:
        idx = mx.sym.arange(0, extra, name=node.sub("idx"))
    else:
        helper = batch
        if per_batch > 1:
            helper = mx.sym.broadcast_to(mx.sym.expand_dims(batch, axis=1, name=node.sub("col")),
                                         shape=(0, per_batch), name=node.sub("rows"))
            helper = mx.sym.reshape(helper, shape=(-1,), name=node.sub("flat"))
        if extra > 0:
            helper = mx.sym.concat(helper, mx.sym.zeros((extra,), name=node.sub("extra")), dim=0,
                                   name=node.sub("longer"))
        elif extra < 0:
            helper = mx.sym.slice_axis(helper, axis=0, begin=0, end=extra, name=node.sub("shorter"))
        idx = mx.sym.contrib.arange_like(helper, axis=0, name=node.sub("idx"))
    out = mx.sym.cast(idx, dtype=dtype, name=node.sub("cast")) * step
    if start_per_batch:  # plus a multiple of the batch size, counted at run time
        count = mx.sym.cast(mx.sym.sum(mx.sym.ones_like(batch), name=node.sub("count")), dtype=dtype)
        out = mx.sym.broadcast_add(out, count * start_per_batch, name=node.sub("moved"))
    return mx.sym.identity(out + start, name=node.name)


@converter("DepthToSpace", since=1)
def depth_to_space(node, inputs):
    b = node.attr("blocksize")
    x = inputs[0].sym
    if node.attr("mode", "DCR") == "DCR":
        return mx.sym.depth_to_space(x, block_size=b, name=node.name)
    # CRD: channels split as (C', b, b) instead of (b, b, C')
    split = mx.sym.reshape(x, shape=(0, -4, -1, b * b, 0, 0), name=node.sub("split_c"))
    split = mx.sym.reshape(split, shape=(0, 0, -4, b, b, 0, 0), name=node.sub("split_b"))
    moved = mx.sym.transpose(split, axes=(0, 1, 4, 2, 5, 3), name=node.sub("move"))
    return mx.sym.reshape(moved, shape=(0, 0, -3, -3), name=node.name)


@converter("SpaceToDepth", since=1)
def space_to_depth(node, inputs):
    return mx.sym.space_to_depth(inputs[0].sym, block_size=node.attr("blocksize"),
                                 name=node.name)

