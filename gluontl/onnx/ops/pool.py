"""MaxPool, AveragePool, LpPool and their global forms.

One oneDNN Pooling when MXNet's symmetric-pad, floor/ceil conventions give exactly the
ONNX window set; otherwise explicit padding plus a valid-mode pooling (or, for dilated
windows, a max/sum over strided slices), with averages divided by an explicit count.
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


def _window_reduce(node, data, kernel, strides, dilations, out_sizes, kind, name, tag):
    """Max or sum over windows of already padded ``data``, exactly ``out_sizes`` long."""
    n = len(kernel)
    if all(d == 1 for d in dilations):
        y = mx.sym.Pooling(data, kernel=kernel, stride=strides, pool_type=kind, pooling_convention="valid",
                           name=node.sub(f"{tag}_pool"))
        return mx.sym.slice(y, begin=(None,) * (n + 2), end=(None, None) + tuple(out_sizes), name=name)
    # Dilated windows: combine one strided slice per kernel offset.
    terms = []
    for idx, offs in enumerate(itertools.product(*(range(k) for k in kernel))):
        begin = tuple(o * d for o, d in zip(offs, dilations))
        end = tuple(b + (o - 1) * s + 1 for b, o, s in zip(begin, out_sizes, strides))
        terms.append(mx.sym.slice(data, begin=(None, None) + begin, end=(None, None) + end,
                                  step=(None, None) + tuple(strides), name=node.sub(f"{tag}_win{idx}")))
    if kind == "sum":
        return mx.sym.add_n(*terms, name=name)
    out = terms[0]
    for i, t in enumerate(terms[1:]):
        out = mx.sym.broadcast_maximum(out, t, name=name if i == len(terms) - 2 else node.sub(f"{tag}_max{i}"))
    return out


def _pool(node, inputs, kind, data=None, name=None):
    """``data``/``name`` let LpPool reuse the sum path on |x|^p under its own names."""
    x = inputs[0]
    data = x.sym if data is None else data
    name = name or node.name
    if kind == "max" and len(node.outputs) > 1 and node.outputs[1]:
        raise node.unsupported("its Indices output (argmax positions) is not supported: MXNet's "
                               "pooling returns no positions (nor has MaxUnpool, their usual "
                               "reader, a converter); export the model without return_indices")
    kernel = ints(node.attr("kernel_shape", []))
    n = len(kernel)
    if n not in (1, 2, 3):
        raise node.unsupported(f"{n}-D pooling is not supported (1-D, 2-D and 3-D are)")
    strides = ints(node.attr("strides", [1] * n))
    dilations = ints(node.attr("dilations", [1] * n))
    ceil = bool(node.attr("ceil_mode", 0))
    include_pad = bool(node.attr("count_include_pad", 0))
    begin, end = onnx_pads(node, x, kernel, strides, dilations)
    sizes = spatial_shape(x, n)
    convention = _fast_convention(sizes, begin, end, kernel, strides, ceil) \
        if all(d == 1 for d in dilations) else None
    if convention is not None:
        extra = {"count_include_pad": include_pad} if kind == "avg" else {}
        return mx.sym.Pooling(data, kernel=kernel, stride=strides, pad=begin, pool_type=kind,
                              pooling_convention=convention, name=name, **extra)
    if any(s is None for s in sizes):
        raise node.unsupported("asymmetric pads, dilations or this ceil_mode need static spatial input "
                               "sizes; pass input_shapes=... when importing")
    outs = [_out_size(*a, ceil) for a in zip(sizes, begin, end, kernel, strides, dilations)]
    # Ceil mode may need more end padding; it never counts toward averages.
    tail = [max(0, (o - 1) * s + (k - 1) * d + 1 - (z + b + e))
            for o, s, k, d, z, b, e in zip(outs, strides, kernel, dilations, sizes, begin, end)]
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
    if dtype.kind == "f":
        return _pool(node, inputs, "max")
    if dtype.itemsize > 2:
        raise node.unsupported(f"{dtype} input: only float, int8 and uint8 MaxPool is defined")
    as_float = mx.sym.Cast(x.sym, dtype="float32", name=node.sub("float_in"))
    pooled = _pool(node, inputs, "max", data=as_float, name=node.sub("float_out"))
    return mx.sym.Cast(pooled, dtype=dtype.name, name=node.name)


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
