"""Normalization layers.

BatchNormalization maps to MXNet's BatchNorm with the ONNX running mean/var as its
moving_mean/moving_var inputs, so they become auxiliary states that training updates
(ONNX and MXNet define momentum the same way) instead of trainable parameters.
``use_global_stats`` stays False so the layer trains; the rule engine toggles it.
"""
import mxnet as mx
import numpy as np

from ..registry import converter


def _is_variable(sym):
    return sym.get_children() is None


def _channel_view(node, sym, rank, suffix):
    """(C,) -> (1, C, 1, ...) for broadcasting against an NC... tensor."""
    return mx.sym.reshape(sym, shape=(1, -1) + (1,) * (rank - 2), name=node.sub(suffix))


def _wants(node, i):
    return len(node.outputs) > i and bool(node.outputs[i])


@converter("BatchNormalization", since=1)
def batch_norm(node, inputs):
    x, scale, bias, mean, var = inputs[:5]
    eps = float(node.attr("epsilon", 1e-5))
    momentum = float(node.attr("momentum", 0.9))
    if node.attr("training_mode", 0):
        return _batch_norm_training(node, x, scale, bias, mean, var, eps, momentum)
    if any(_wants(node, i) for i in range(1, 5)):
        raise node.unsupported("the running/saved mean and variance outputs (training-mode export) are not "
                               "supported; re-export the model in inference mode")
    if node.attr("spatial", 1) == 0 and scale.rank not in (None, 1):
        raise node.unsupported("spatial=0 (per-activation statistics) is not supported")
    if _is_variable(mean.sym) and _is_variable(var.sym):
        return mx.sym.BatchNorm(x.sym, gamma=scale.sym, beta=bias.sym, moving_mean=mean.sym,
                                moving_var=var.sym, eps=eps, momentum=momentum, fix_gamma=False,
                                use_global_stats=False, axis=1, name=node.name)
    # Statistics computed inside the graph cannot be auxiliary states: plain arithmetic.
    if x.rank is None:
        raise node.unsupported("the input rank is unknown; pass input_shapes=...")
    std = mx.sym.sqrt(mx.sym._internal._plus_scalar(var.sym, scalar=eps, name=node.sub("var_eps")),
                      name=node.sub("std"))
    gain = mx.sym.elemwise_div(scale.sym, std, name=node.sub("gain"))
    shift = mx.sym.elemwise_sub(bias.sym, mx.sym.elemwise_mul(mean.sym, gain, name=node.sub("mean_gain")),
                                name=node.sub("shift"))
    y = mx.sym.broadcast_mul(x.sym, _channel_view(node, gain, x.rank, "gain_c"), name=node.sub("scaled"))
    return mx.sym.broadcast_add(y, _channel_view(node, shift, x.rank, "shift_c"), name=node.name)


def _batch_norm_training(node, x, scale, bias, mean, var, eps, momentum):
    """training_mode=1 (opset 14+): batch statistics always, plus the updated running stats.

    Spelled out because that is what the graph computes in every mode; such a layer has no
    running statistics of its own for MXNet to keep.
    """
    if x.rank is None:
        raise node.unsupported("the input rank is unknown; pass input_shapes=...")
    axes = (0,) + tuple(range(2, x.rank))
    view = lambda sym, tag: _channel_view(node, sym, x.rank, tag)
    batch_mean = mx.sym.mean(x.sym, axis=axes, name=node.sub("batch_mean"))
    centered = mx.sym.broadcast_sub(x.sym, view(batch_mean, "mean_c"), name=node.sub("centered"))
    batch_var = mx.sym.mean(mx.sym.square(centered, name=node.sub("sq")), axis=axes, name=node.sub("batch_var"))
    inv = mx.sym.rsqrt(mx.sym._internal._plus_scalar(batch_var, scalar=eps, name=node.sub("var_eps")),
                       name=node.sub("inv_std"))
    gain = mx.sym.elemwise_mul(inv, scale.sym, name=node.sub("gain"))
    scaled = mx.sym.broadcast_mul(centered, view(gain, "gain_c"), name=node.sub("scaled"))
    y = mx.sym.broadcast_add(scaled, view(bias.sym, "bias_c"), name=node.name)

    def running(old, new, tag):
        kept = mx.sym._internal._mul_scalar(old, scalar=momentum, name=node.sub(f"{tag}_kept"))
        added = mx.sym._internal._mul_scalar(new, scalar=1.0 - momentum, name=node.sub(f"{tag}_added"))
        return mx.sym.elemwise_add(kept, added, name=node.sub(tag))

    return [y, running(mean.sym, batch_mean, "running_mean") if _wants(node, 1) else None,
            running(var.sym, batch_var, "running_var") if _wants(node, 2) else None]


@converter("InstanceNormalization", since=1)
def instance_norm(node, inputs):
    x, scale, bias = inputs
    return mx.sym.InstanceNorm(x.sym, gamma=scale.sym, beta=bias.sym, eps=float(node.attr("epsilon", 1e-5)),
                               name=node.name)


def _shape(t):
    return t.shape if t.shape is not None else (None if t.const is None else t.const.shape)


@converter("LayerNormalization", since=17)
def layer_norm(node, inputs):
    """One fused LayerNorm over the trailing axes (merged into one when there are several)."""
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    rank = x.rank
    if rank is None:
        raise node.unsupported("the input rank is unknown; pass input_shapes=...")
    axis = node.attr("axis", -1)
    axis = axis + rank if axis < 0 else axis
    norm_shape = x.shape[axis:] if x.shape is not None else None
    s_shape = _shape(scale)
    if s_shape is not None and norm_shape is not None and None not in norm_shape and \
            int(np.prod(s_shape)) != int(np.prod(norm_shape)):
        raise node.unsupported(f"Scale of shape {tuple(s_shape)} does not cover the normalized shape "
                               f"{tuple(norm_shape)}; broadcast Scale/B are not supported")
    flat = axis != rank - 1
    data = mx.sym.reshape(x.sym, shape=(0,) * axis + (-1,), name=node.sub("flat")) if flat else x.sym
    gamma = mx.sym.reshape(scale.sym, shape=(-1,), name=node.sub("gamma")) if s_shape is None or \
        len(s_shape) != 1 else scale.sym
    if bias is None:
        beta = mx.sym.zeros_like(gamma, name=node.sub("beta"))
    else:
        beta = mx.sym.reshape(bias.sym, shape=(-1,), name=node.sub("beta")) if bias.rank != 1 else bias.sym
    stats = _wants(node, 1) or _wants(node, 2)
    name = node.sub("ln") if flat or stats else node.name
    out = mx.sym.LayerNorm(data, gamma=gamma, beta=beta, axis=-1, eps=float(node.attr("epsilon", 1e-5)),
                           output_mean_var=stats, name=name)
    y = out[0] if stats else out
    if flat:
        y = mx.sym.reshape_like(y, x.sym, name=node.name if not stats else node.sub("y"))
    if not stats:
        return y
    keep = (0,) * axis + (1,) * (rank - axis)  # ONNX keeps the normalized axes as size 1
    mean = mx.sym.reshape(out[1], shape=keep, name=node.sub("mean"))
    inv_std = mx.sym.reshape(mx.sym.reciprocal(out[2], name=node.sub("inv")), shape=keep,
                             name=node.sub("inv_std"))
    return [y, mean, inv_std]


def _group_norm(per_channel):
    def convert(node, inputs):
        x, scale, bias = inputs
        groups = int(node.attr("num_groups"))
        eps = float(node.attr("epsilon", 1e-5))
        if not per_channel:
            return mx.sym.GroupNorm(x.sym, gamma=scale.sym, beta=bias.sym, num_groups=groups, eps=eps,
                                    name=node.name)
        if x.rank is None:
            raise node.unsupported("the input rank is unknown; pass input_shapes=...")
        # Opset 21 scales per channel: normalize per group, then apply the channel affine.
        ones = mx.sym.ones(shape=(groups,), name=node.sub("ones"))
        zeros = mx.sym.zeros(shape=(groups,), name=node.sub("zeros"))
        y = mx.sym.GroupNorm(x.sym, gamma=ones, beta=zeros, num_groups=groups, eps=eps, name=node.sub("gn"))
        y = mx.sym.broadcast_mul(y, _channel_view(node, scale.sym, x.rank, "scale_c"), name=node.sub("scaled"))
        return mx.sym.broadcast_add(y, _channel_view(node, bias.sym, x.rank, "bias_c"), name=node.name)
    return convert


converter("GroupNormalization", since=18, until=20)(_group_norm(per_channel=False))
converter("GroupNormalization", since=21)(_group_norm(per_channel=True))


@converter("LpNormalization", since=1)
def lp_normalization(node, inputs):
    p = int(node.attr("p", 2))
    if p not in (1, 2):
        raise node.unsupported(f"p={p}; ONNX defines only p=1 and p=2")
    x = inputs[0].sym
    norm = mx.sym.norm(x, ord=p, axis=node.attr("axis", -1), keepdims=True, name=node.sub("norm"))
    return mx.sym.broadcast_div(x, norm, name=node.name)


@converter("LRN", since=1)
def lrn(node, inputs):
    """MXNet's LRN for odd windows on 4-D input; otherwise a channel-window sum pooling."""
    x = inputs[0]
    size = int(node.attr("size"))
    alpha, beta, bias = float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75)), float(node.attr("bias", 1.0))
    if size % 2 == 1 and x.rank == 4:
        return mx.sym.LRN(x.sym, alpha=alpha, beta=beta, knorm=bias, nsize=size, name=node.name)
    if x.rank is None or x.rank < 3:
        raise node.unsupported("LRN needs an input of known rank >= 3; pass input_shapes=...")
    # (N, C, ...) -> (N, 1, C, rest): sum squares over a channel window [c - lo, c + hi].
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = mx.sym.square(x.sym, name=node.sub("sq"))
    img = mx.sym.expand_dims(sq, axis=1, name=node.sub("img"))
    if x.rank > 3:
        img = mx.sym.reshape(img, shape=(0, 0, 0, -1), name=node.sub("img_flat"))
    img = mx.sym.pad(img, mode="constant", pad_width=(0, 0, 0, 0, lo, hi, 0, 0), name=node.sub("pad"))
    total = mx.sym.Pooling(img, kernel=(size, 1), pool_type="sum", pooling_convention="valid",
                           name=node.sub("sum"))
    total = mx.sym.reshape_like(total, x.sym, name=node.sub("sum_nd"))
    scaled = mx.sym._internal._mul_scalar(total, scalar=alpha / size, name=node.sub("scaled"))
    base = mx.sym._internal._plus_scalar(scaled, scalar=bias, name=node.sub("base"))
    denom = mx.sym._internal._power_scalar(base, scalar=beta, name=node.sub("denom"))
    return mx.sym.elemwise_div(x.sym, denom, name=node.name)


@converter("MeanVarianceNormalization", since=9)
def mean_variance_normalization(node, inputs):
    """ONNX's own formula: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9)."""
    x = inputs[0].sym
    axes = tuple(node.attr("axes", [0, 2, 3]))
    mean = mx.sym.mean(x, axis=axes, keepdims=True, name=node.sub("mean"))
    mean_sq = mx.sym.mean(mx.sym.square(x, name=node.sub("sq")), axis=axes, keepdims=True, name=node.sub("mean_sq"))
    var = mx.sym.elemwise_sub(mean_sq, mx.sym.square(mean, name=node.sub("mean2")), name=node.sub("var"))
    std = mx.sym._internal._plus_scalar(mx.sym.sqrt(var, name=node.sub("sqrt")), scalar=1e-9, name=node.sub("std"))
    return mx.sym.broadcast_div(mx.sym.broadcast_sub(x, mean, name=node.sub("centered")), std, name=node.name)
