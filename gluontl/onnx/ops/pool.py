"""MaxPool, AveragePool, LpPool and their global forms.

One oneDNN Pooling when MXNet's symmetric-pad, floor/ceil conventions give exactly the
ONNX window set; otherwise explicit padding plus a valid-mode pooling (or, for dilated
windows, a max/sum over strided slices), with averages divided by an explicit count.
MaxPool's Indices output is an argmax over the same strided slices.
"""
import itertools

import mxnet as mx
import numpy as np

from ..registry import converter, ints
from .conv import onnx_pads, pad_spatial, spatial_shape

_NEG = -3.4028234e38  # float32 lowest: padding that never wins a max


def _out_size(size, begin, end, k, s, d, ceil):
    """ONNX output length; a ceil-mode window may not start in the end padding."""
    span = size + begin + end - ((k - 1) * d + 1)
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + begin:
        out -= 1
    return out


def _mxnet_size(size, pad, k, s, full):
    span = size + 2 * pad - k
    return (-(-span // s) if full else span // s) + 1


def _fast_convention(sizes, begin, end, kernel, strides, ceil):
    """MXNet pooling convention reproducing ONNX exactly, or None."""
    if begin != end:
        return None
    if not ceil:
        return "valid"
    if any(s is None for s in sizes):
        return "full"  # best effort: equal unless a window would start in the end padding
    for full in (True, False):
        if all(_mxnet_size(n, p, k, s, full) == _out_size(n, p, p, k, s, 1, True)
               for n, p, k, s in zip(sizes, begin, kernel, strides)):
            return "full" if full else "valid"
    return None


def _window_slices(node, data, kernel, strides, dilations, out_sizes, tag):
    """One strided slice of padded ``data`` per kernel offset, offsets in row-major order."""
    terms = []
    for idx, offs in enumerate(itertools.product(*(range(k) for k in kernel))):
        begin = tuple(o * d for o, d in zip(offs, dilations))
        end = tuple(b + (o - 1) * s + 1 for b, o, s in zip(begin, out_sizes, strides))
        terms.append(mx.sym.slice(data, begin=(None, None) + begin, end=(None, None) + end,
                                  step=(None, None) + tuple(strides), name=node.sub(f"{tag}_win{idx}")))
    return terms


def _window_reduce(node, data, kernel, strides, dilations, out_sizes, kind, name, tag):
    """Max or sum over windows of already padded ``data``, exactly ``out_sizes`` long."""
    n = len(kernel)
    if all(d == 1 for d in dilations):
        y = mx.sym.Pooling(data, kernel=kernel, stride=strides, pool_type=kind, pooling_convention="valid",
                           name=node.sub(f"{tag}_pool"))
        return mx.sym.slice(y, begin=(None,) * (n + 2), end=(None, None) + tuple(out_sizes), name=name)
    # Dilated windows: combine one strided slice per kernel offset.
    terms = _window_slices(node, data, kernel, strides, dilations, out_sizes, tag)
    if kind == "sum":
        return mx.sym.add_n(*terms, name=name)
    out = terms[0]
    for i, t in enumerate(terms[1:]):
        out = mx.sym.broadcast_maximum(out, t, name=name if i == len(terms) - 2 else node.sub(f"{tag}_max{i}"))
    return out


def _windows(node, x):
    """kernel, strides, dilations, ceil mode, begin and end pads, spatial input sizes."""
    kernel = ints(node.attr("kernel_shape", []))
    n = len(kernel)
    if n not in (1, 2, 3):
        raise node.unsupported(f"{n}-D pooling is not supported (1-D, 2-D and 3-D are)")
    strides = ints(node.attr("strides", [1] * n))
    dilations = ints(node.attr("dilations", [1] * n))
    begin, end = onnx_pads(node, x, kernel, strides, dilations)
    return kernel, strides, dilations, bool(node.attr("ceil_mode", 0)), begin, end, spatial_shape(x, n)


def _out_sizes(kernel, strides, dilations, ceil, begin, end, sizes):
    """Output sizes, and the end padding ceil mode needs beyond ``end`` (never counted in
    averages)."""
    outs = [_out_size(*a, ceil) for a in zip(sizes, begin, end, kernel, strides, dilations)]
    tail = [max(0, (o - 1) * s + (k - 1) * d + 1 - (z + b + e))
            for o, s, k, d, z, b, e in zip(outs, strides, kernel, dilations, sizes, begin, end)]
    return outs, tail


def _argmax_indices(node, x, data, name):
    """ONNX MaxPool's output and Indices: the flat position of each window's maximum in the
    input, counting N and C (row-major; column-major over the spatial axes with storage_order=1).
    onnxruntime keeps a window's first maximum among its input positions in row-major scan
    order, also when that maximum is -inf: the maximum is taken over the stacked offset slices
    (padded with -inf, which no finite value ties; MXNet's Pooling starts from float32 lowest
    and returns that for a window of -inf), then argmax picks the first slice that holds it and
    is not padding. Comparisons only: the values and positions are exact."""
    kernel, strides, dilations, ceil, begin, end, sizes = _windows(node, x)
    channels = x.shape[1] if x.shape is not None and len(x.shape) > 1 else None
    if any(v is None for v in [*sizes, channels]):
        raise node.unsupported("its Indices output needs static channel and spatial input "
                               "sizes; pass input_shapes=... when importing")
    n = len(kernel)
    outs, tail = _out_sizes(kernel, strides, dilations, ceil, begin, end, sizes)
    ends = [e + t for e, t in zip(end, tail)]

    def stacked(sym, pad, tag):
        padded = pad_spatial(node, sym, n + 2, begin, ends, pad, suffix=f"{tag}_pad")
        slices = _window_slices(node, padded, kernel, strides, dilations, outs, tag)
        return mx.sym.stack(*slices, axis=2, name=node.sub(f"{tag}_stack"))

    windows = stacked(data, -np.inf, "idx")
    inside = stacked(mx.sym.ones_like(data, name=node.sub("idx_ones")), 0.0, "idx_in")
    pooled = mx.sym.max(windows, axis=2, name=name)
    first = mx.sym.broadcast_equal(windows, mx.sym.expand_dims(pooled, axis=2, name=node.sub("idx_max_e")),
                                   name=node.sub("idx_is_max")) * inside
    which = mx.sym.Cast(mx.sym.argmax(first, axis=2, name=node.sub("idx_argmax")),
                        dtype="int64", name=node.sub("idx_which"))
    # element strides of the spatial axes in the flat index
    order = range(n) if node.attr("storage_order", 0) else range(n - 1, -1, -1)
    step, elem = 1, [0] * n
    for i in order:
        elem[i], step = step, step * sizes[i]
    terms = []
    for i in range(n):  # window offset of axis i: (which // prod(kernel[i+1:])) % kernel[i]
        inner = int(np.prod(kernel[i + 1:]))
        off = mx.sym._internal._div_scalar(which, scalar=inner, name=node.sub(f"idx_div{i}")) \
            if inner > 1 else which
        off = mx.sym._internal._mod_scalar(off, scalar=kernel[i], name=node.sub(f"idx_mod{i}"))
        terms.append(mx.sym._internal._mul_scalar(off, scalar=dilations[i] * elem[i],
                                                  name=node.sub(f"idx_off{i}")))
    # window start of each output position: (n*C + c)*size + sum (o*stride - begin)*elem
    scale = [channels * step, step] + [s * e for s, e in zip(strides, elem)]
    shift = -sum(b * e for b, e in zip(begin, elem))
    for axis in range(n + 2):
        pos = mx.sym.Cast(mx.sym.contrib.arange_like(which, axis=axis, name=node.sub(f"idx_pos{axis}")),
                          dtype="int64", name=node.sub(f"idx_pos{axis}_i"))
        pos = mx.sym.reshape(pos, shape=tuple(-1 if a == axis else 1 for a in range(n + 2)),
                             name=node.sub(f"idx_pos{axis}_r"))
        terms.append(mx.sym._internal._mul_scalar(pos, scalar=scale[axis], name=node.sub(f"idx_at{axis}")))
    index = terms[0]
    for i, t in enumerate(terms[1:]):
        index = mx.sym.broadcast_add(index, t, name=node.sub(f"idx_sum{i}"))
    return pooled, mx.sym._internal._plus_scalar(index, scalar=shift, name=node.sub("indices"))


def _pool(node, inputs, kind, data=None, name=None):
    """``data``/``name`` let LpPool reuse the sum path on |x|^p under its own names."""
    x = inputs[0]
    data = x.sym if data is None else data
    name = name or node.name
    kernel, strides, dilations, ceil, begin, end, sizes = _windows(node, x)
    n = len(kernel)
    include_pad = bool(node.attr("count_include_pad", 0))
    convention = _fast_convention(sizes, begin, end, kernel, strides, ceil) \
        if all(d == 1 for d in dilations) else None
    if convention is not None:
        extra = {"count_include_pad": include_pad} if kind == "avg" else {}
        return mx.sym.Pooling(data, kernel=kernel, stride=strides, pad=begin, pool_type=kind,
                              pooling_convention=convention, name=name, **extra)
    if any(s is None for s in sizes):
        raise node.unsupported("asymmetric pads, dilations or this ceil_mode need static spatial input "
                               "sizes; pass input_shapes=... when importing")
    outs, tail = _out_sizes(kernel, strides, dilations, ceil, begin, end, sizes)
    ends = [e + t for e, t in zip(end, tail)]

    def reduce(padded, how, out_name, tag):
        return _window_reduce(node, padded, kernel, strides, dilations, outs, how, out_name, tag)

    if kind in ("max", "sum"):
        padded = pad_spatial(node, data, n + 2, begin, ends, _NEG if kind == "max" else 0.0)
        return reduce(padded, kind, name, kind)
    total = reduce(pad_spatial(node, data, n + 2, begin, ends), "sum", node.sub("sum"), "sum")
    ones = mx.sym.ones_like(mx.sym.slice_axis(x.sym, axis=1, begin=0, end=1, name=node.sub("one_ch")),
                            name=node.sub("ones"))
    if include_pad:
        mask = pad_spatial(node, pad_spatial(node, ones, n + 2, begin, end, 1.0, suffix="mask_in"),
                           n + 2, [0] * n, tail, suffix="mask_tail")
    else:
        mask = pad_spatial(node, ones, n + 2, begin, ends, suffix="mask")
    count = mx.sym.BlockGrad(reduce(mask, "sum", node.sub("count"), "count"), name=node.sub("count_const"))
    return mx.sym.broadcast_div(total, count, name=node.name)


@converter("MaxPool", since=1)
def max_pool(node, inputs):
    """int8/uint8 inputs (opset 12+) pool in float32, which holds them exactly: MXNet's
    pooling takes floats only."""
    x = inputs[0]
    dtype = np.dtype(x.dtype) if x.dtype is not None else np.dtype(np.float32)
    want_indices = len(node.outputs) > 1 and bool(node.outputs[1])
    if dtype.kind == "f":
        data = x.sym
    elif dtype.itemsize > 2:
        raise node.unsupported(f"{dtype} input: only float, int8 and uint8 MaxPool is defined")
    else:
        data = mx.sym.Cast(x.sym, dtype="float32", name=node.sub("float_in"))
    out = node.name if dtype.kind == "f" else node.sub("float_out")
    if want_indices:
        pooled, indices = _argmax_indices(node, x, data, out)
    else:
        pooled = _pool(node, inputs, "max", data=data, name=out)
    if dtype.kind != "f":
        pooled = mx.sym.Cast(pooled, dtype=dtype.name, name=node.name)
    return [pooled, indices] if want_indices else pooled


@converter("AveragePool", since=1)
def average_pool(node, inputs):
    return _pool(node, inputs, "avg")


def _lp_power(node, x):
    p = float(node.attr("p", 2))
    powered = mx.sym._internal._power_scalar(mx.sym.abs(x.sym, name=node.sub("abs")), scalar=p,
                                             name=node.sub("pow"))
    return p, powered


def _root(node, total, p):
    return mx.sym._internal._power_scalar(total, scalar=1.0 / p, name=node.name)


@converter("LpPool", since=1)
def lp_pool(node, inputs):
    """(sum |x|^p)^(1/p) over each window; MXNet's own lp pooling does not match ONNX."""
    p, powered = _lp_power(node, inputs[0])
    return _root(node, _pool(node, inputs, "sum", data=powered, name=node.sub("sum")), p)


def _global_pool(node, x, data, kind, name):
    if x.rank is None or x.rank < 3:
        raise node.unsupported("the input rank is unknown or below 3; pass input_shapes=...")
    return mx.sym.Pooling(data, kernel=(1,) * (x.rank - 2), global_pool=True, pool_type=kind, name=name)


@converter("GlobalAveragePool", since=1)
def global_average_pool(node, inputs):
    return _global_pool(node, inputs[0], inputs[0].sym, "avg", node.name)


@converter("GlobalMaxPool", since=1)
def global_max_pool(node, inputs):
    return _global_pool(node, inputs[0], inputs[0].sym, "max", node.name)


@converter("GlobalLpPool", since=1)
def global_lp_pool(node, inputs):
    p, powered = _lp_power(node, inputs[0])
    return _root(node, _global_pool(node, inputs[0], powered, "sum", node.sub("sum")), p)
