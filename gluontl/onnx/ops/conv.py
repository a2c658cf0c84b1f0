"""Conv and ConvTranspose, plus the padding arithmetic shared with pooling.

MXNet kernels take one symmetric pad per axis; ONNX allows begin != end and auto_pad.
The symmetric part stays in the kernel (oneDNN handles it for free) and only the
remainder becomes an explicit Pad (or a crop, for transposed convolution).
"""
import mxnet as mx

from ..registry import converter, ints


def spatial_shape(x, n):
    """Static spatial sizes of ``x`` (None where unknown)."""
    if x.shape is not None:
        return tuple(x.shape[-n:])
    if x.const is not None:
        return tuple(x.const.shape[-n:])
    return (None,) * n


def same_pads(node, in_sizes, kernel, strides, dilations, mode):
    """Begin/end pads for auto_pad SAME_UPPER / SAME_LOWER (needs static spatial sizes)."""
    if any(s is None for s in in_sizes):
        raise node.unsupported(f"auto_pad={mode} needs static spatial input sizes; pass input_shapes=... "
                               f"when importing or re-export with explicit pads")
    begin, end = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(small if mode == "SAME_UPPER" else big)
        end.append(big if mode == "SAME_UPPER" else small)
    return begin, end


def onnx_pads(node, x, kernel, strides, dilations):
    """(begin, end) pads per spatial axis from ``pads`` or ``auto_pad``."""
    n = len(kernel)
    mode = node.attr("auto_pad", "NOTSET")
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        return same_pads(node, spatial_shape(x, n), kernel, strides, dilations, mode)
    if mode not in ("NOTSET", "VALID"):
        raise node.unsupported(f"unknown auto_pad '{mode}'")
    pads = ints(node.attr("pads", [0] * 2 * n)) if mode == "NOTSET" else [0] * 2 * n
    return pads[:n], pads[n:]


def pad_spatial(node, sym, rank, begin, end, value=0.0, suffix="pad", name=None):
    """Explicit constant padding of the spatial axes (MXNet's Pad wants 4-D/5-D input)."""
    if not any(begin) and not any(end):
        return sym
    name = name or node.sub(suffix)
    width = [0, 0, 0, 0]
    for b, e in zip(begin, end):
        width += [b, e]
    if rank == 3:  # 1-D: pad as a 1 x L image
        img = mx.sym.expand_dims(sym, axis=2, name=node.sub(suffix + "_2d"))
        padded = mx.sym.pad(img, mode="constant", constant_value=value, pad_width=(0,) * 6 + tuple(width[4:]),
                            name=node.sub(suffix + "_pad2d"))
        return mx.sym.squeeze(padded, axis=2, name=name)
    if rank not in (4, 5):
        raise node.unsupported(f"asymmetric padding of a rank-{rank} input is not supported")
    return mx.sym.pad(sym, mode="constant", constant_value=value, pad_width=tuple(width), name=name)


def split_pads(begin, end):
    """Symmetric part for the kernel, and the remaining explicit begin/end pads."""
    sym_pad = [min(b, e) for b, e in zip(begin, end)]
    return sym_pad, [b - p for b, p in zip(begin, sym_pad)], [e - p for e, p in zip(end, sym_pad)]


def _kernel(node, w):
    shape = w.shape if w.shape is not None else (None if w.const is None else w.const.shape)
    if shape is None or any(d is None for d in shape):
        raise node.unsupported("the weight shape is unknown; weights must be initializers or have static shapes")
    kernel = ints(node.attr("kernel_shape", shape[2:]))
    return tuple(shape), kernel


def _geometry(node, n):
    return ints(node.attr("strides", [1] * n)), ints(node.attr("dilations", [1] * n))


def _operands(node, inputs, what: str):
    """Data, weight, optional bias, weight shape, kernel, strides and dilations of a (transposed) conv."""
    x, w = inputs[0], inputs[1]
    b = inputs[2] if len(inputs) > 2 and inputs[2] is not None else None
    w_shape, kernel = _kernel(node, w)
    n = len(kernel)
    if n not in (1, 2, 3):
        raise node.unsupported(f"{n}-D {what} is not supported (1-D, 2-D and 3-D are)")
    strides, dilations = _geometry(node, n)
    return x, w, b, w_shape, kernel, strides, dilations


@converter("Conv", since=1)
def conv(node, inputs):
    x, w, b, w_shape, kernel, strides, dilations = _operands(node, inputs, "convolution")
    n = len(kernel)
    begin, end = onnx_pads(node, x, kernel, strides, dilations)
    pad, extra_begin, extra_end = split_pads(begin, end)
    data = pad_spatial(node, x.sym, n + 2, extra_begin, extra_end)
    kwargs = {"bias": b.sym} if b is not None else {"no_bias": True}
    return mx.sym.Convolution(data, weight=w.sym, kernel=kernel, stride=strides, dilate=dilations, pad=pad,
                              num_filter=w_shape[0], num_group=node.attr("group", 1), name=node.name,
                              **kwargs)


@converter("ConvTranspose", since=1)
def conv_transpose(node, inputs):
    """Deconvolution with the symmetric pad; asymmetric/output_shape padding is a crop."""
    x, w, b, w_shape, kernel, strides, dilations = _operands(node, inputs, "transposed convolution")
    n = len(kernel)
    group = node.attr("group", 1)
    out_pad = ints(node.attr("output_padding", [0] * n))
    mode = node.attr("auto_pad", "NOTSET")
    out_shape = node.attr("output_shape")
    if out_shape is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
        sizes = spatial_shape(x, n)
        if any(s is None for s in sizes):
            raise node.unsupported("output_shape/auto_pad need static spatial input sizes; pass "
                                   "input_shapes=... when importing")
        target = ints(out_shape)[-n:] if out_shape is not None else [s * st for s, st in zip(sizes, strides)]
        begin, end = [], []
        for i in range(n):
            full = strides[i] * (sizes[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1
            total = full - target[i]
            if total < 0 and out_shape is not None:  # more output than the kernel covers: zeros at the end
                out_pad[i] -= total
            total = max(total, 0)  # auto_pad SAME never crops below the full output (onnxruntime)
            small, big = total // 2, total - total // 2
            upper = mode == "SAME_UPPER"  # onnxruntime: output_shape alone pads like SAME_LOWER
            begin.append(small if upper else big)
            end.append(big if upper else small)
    else:
        begin, end = onnx_pads(node, x, kernel, strides, dilations) if mode != "VALID" else ([0] * n, [0] * n)
    pad, crop_begin, crop_end = split_pads(begin, end)
    # MXNet's adj must stay below the stride; the rest of output_padding is explicit zeros.
    adj = [p if p < s else 0 for p, s in zip(out_pad, strides)]
    extra = [p - a for p, a in zip(out_pad, adj)]
    crop = any(crop_begin) or any(crop_end)
    # oneDNN fails in the backward of a 1-output-channel Deconvolution fed by a blocked-layout
    # tensor (any conv before it): "could not create a primitive descriptor for a reorder
    # primitive"; computed weights fail too. A depthwise Deconvolution (same weight array: its
    # layout (C_in, 1, k, k) is exactly the grouped one) summed over channels is the same map.
    single = w_shape[1] * group == 1 and w_shape[0] > 1
    late_bias = b is not None and (any(extra) or single)
    names = _chain_names(node, [True, single, any(extra), crop, late_bias])
    kwargs = {"bias": b.sym, "no_bias": False} if b is not None and not late_bias else {"no_bias": True}
    channels = (w_shape[0], w_shape[0]) if single else (w_shape[1] * group, group)
    y = mx.sym.Deconvolution(x.sym, weight=w.sym, kernel=kernel, stride=strides, dilate=dilations, pad=pad,
                             adj=adj, num_filter=channels[0], num_group=channels[1], name=names[0], **kwargs)
    if single:
        y = mx.sym.sum(y, axis=1, keepdims=True, name=names[1])
    if any(extra):
        y = pad_spatial(node, y, n + 2, [0] * n, extra, suffix="outpad", name=names[2])
    if crop:
        y = mx.sym.slice(y, begin=(None, None) + tuple(crop_begin),
                         end=(None, None) + tuple(-c if c else None for c in crop_end), name=names[3])
    if late_bias:
        bias = mx.sym.reshape(b.sym, shape=(1, -1) + (1,) * n, name=node.sub("bias"))
        y = mx.sym.broadcast_add(y, bias, name=names[4])
    return y


def _chain_names(node, steps):
    """Helper names for a chain of optional steps; the last one present carries node.name."""
    last = max(i for i, present in enumerate(steps) if present)
    return [node.name if i == last else node.sub(f"step{i}") for i in range(len(steps))]
