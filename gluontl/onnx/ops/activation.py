"""Activations and the softmax family.

Fused MXNet kernels (Activation, LeakyReLU, clip, softmax) where the ONNX meaning is
exactly theirs, because those are what oneDNN accelerates; short compositions otherwise.
"""
import math

import mxnet as mx
import numpy as np

from ..registry import converter

# MXNet's selu kernel hard-codes these; ONNX makes them attributes with the same defaults.
_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


def _act(act_type):
    def convert(node, inputs):
        return mx.sym.Activation(inputs[0].sym, act_type=act_type, name=node.name)
    return convert


for _op, _act_type in [("Relu", "relu"), ("Sigmoid", "sigmoid"), ("Tanh", "tanh"),
                       ("Softsign", "softsign")]:
    converter(_op, since=1)(_act(_act_type))


def _softplus(node, x, name):
    """max(x, 0) + log1p(exp(-|x|)), as onnxruntime computes it. Not the fused softrelu:
    oneDNN's is off by up to 2e-6 for x < 0 (softrelu(-20) = -1.9e-6), which Mish
    multiplies by x. -|x| is spelled x - 2 max(x, 0) so the gradient at 0 is 1/2."""
    pos = mx.sym.relu(x, name=node.sub("pos"))
    neg_abs = mx.sym.elemwise_sub(mx.sym.elemwise_sub(x, pos, name=node.sub("min")), pos,
                                  name=node.sub("negabs"))
    tail = mx.sym.log1p(mx.sym.exp(neg_abs, name=node.sub("exp")), name=node.sub("log1p"))
    return mx.sym.elemwise_add(pos, tail, name=name)


@converter("Softplus", since=1)
def softplus(node, inputs):
    return _softplus(node, inputs[0].sym, node.name)


@converter("LeakyRelu", since=1)
def leaky_relu(node, inputs):
    return mx.sym.LeakyReLU(inputs[0].sym, act_type="leaky", slope=node.attr("alpha", 0.01),
                            name=node.name)


@converter("Elu", since=1)
def elu(node, inputs):
    return mx.sym.LeakyReLU(inputs[0].sym, act_type="elu", slope=node.attr("alpha", 1.0),
                            name=node.name)


@converter("Selu", since=1)
def selu(node, inputs):
    alpha, gamma = node.attr("alpha", _SELU_ALPHA), node.attr("gamma", _SELU_GAMMA)
    if math.isclose(alpha, _SELU_ALPHA, rel_tol=1e-6) and math.isclose(gamma, _SELU_GAMMA, rel_tol=1e-6):
        return mx.sym.LeakyReLU(inputs[0].sym, act_type="selu", name=node.name)
    e = mx.sym.LeakyReLU(inputs[0].sym, act_type="elu", slope=alpha, name=node.sub("elu"))
    return mx.sym._internal._mul_scalar(e, scalar=gamma, name=node.name)


@converter("Celu", since=12)
def celu(node, inputs):
    # celu(x, a) = a * elu(x / a, 1)
    alpha = node.attr("alpha", 1.0)
    x = mx.sym._internal._div_scalar(inputs[0].sym, scalar=alpha, name=node.sub("scale"))
    e = mx.sym.LeakyReLU(x, act_type="elu", slope=1.0, name=node.sub("elu"))
    return mx.sym._internal._mul_scalar(e, scalar=alpha, name=node.name)


@converter("HardSigmoid", since=1)
def hard_sigmoid(node, inputs):
    return mx.sym.hard_sigmoid(inputs[0].sym, alpha=node.attr("alpha", 0.2),
                               beta=node.attr("beta", 0.5), name=node.name)


@converter("HardSwish", since=14)
def hard_swish(node, inputs):
    x = inputs[0].sym
    gate = mx.sym.hard_sigmoid(x, alpha=1.0 / 6, beta=0.5, name=node.sub("gate"))
    return mx.sym.elemwise_mul(x, gate, name=node.name)


@converter("Mish", since=18)
def mish(node, inputs):
    x = inputs[0].sym
    t = mx.sym.tanh(_softplus(node, x, node.sub("softplus")), name=node.sub("tanh"))
    return mx.sym.elemwise_mul(x, t, name=node.name)


@converter("Gelu", since=20)
def gelu(node, inputs):
    x = inputs[0].sym
    approximate = node.attr("approximate", "none")
    if approximate == "none":
        return mx.sym.LeakyReLU(x, act_type="gelu", name=node.name)
    if approximate != "tanh":
        raise node.unsupported(f"approximate='{approximate}' is not one of 'none', 'tanh'")
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    cube = mx.sym._internal._mul_scalar(mx.sym._internal._power_scalar(x, scalar=3.0, name=node.sub("x3")),
                                        scalar=0.044715, name=node.sub("cube"))
    inner = mx.sym._internal._mul_scalar(mx.sym.elemwise_add(x, cube, name=node.sub("poly")),
                                         scalar=math.sqrt(2 / math.pi), name=node.sub("inner"))
    t = mx.sym._internal._plus_scalar(mx.sym.tanh(inner, name=node.sub("tanh")), scalar=1.0, name=node.sub("t1"))
    half = mx.sym._internal._mul_scalar(x, scalar=0.5, name=node.sub("half"))
    return mx.sym.elemwise_mul(half, t, name=node.name)


@converter("ThresholdedRelu", since=10)
def thresholded_relu(node, inputs):
    x = inputs[0].sym
    mask = mx.sym._internal._greater_scalar(x, scalar=node.attr("alpha", 1.0), name=node.sub("mask"))
    return mx.sym.elemwise_mul(x, mask, name=node.name)


@converter("Shrink", since=9)
def shrink(node, inputs):
    x = inputs[0].sym
    lambd, bias = float(node.attr("lambd", 0.5)), float(node.attr("bias", 0.0))
    low = mx.sym._internal._lesser_scalar(x, scalar=-lambd, name=node.sub("low"))
    high = mx.sym._internal._greater_scalar(x, scalar=lambd, name=node.sub("high"))
    return mx.sym.elemwise_add(
        mx.sym.elemwise_mul(low, mx.sym._internal._plus_scalar(x, scalar=bias, name=node.sub("x+b")),
                            name=node.sub("below")),
        mx.sym.elemwise_mul(high, mx.sym._internal._minus_scalar(x, scalar=bias, name=node.sub("x-b")),
                            name=node.sub("above")),
        name=node.name)


def _prelu_channels(rank, slope_shape):
    """Slope count when it broadcasts along axis 1 only (1 = one shared slope), else None."""
    core = list(slope_shape)
    while core and core[0] == 1:
        core.pop(0)
    if not core:
        return 1
    if len(core) == rank - 1 and all(d == 1 for d in core[1:]):
        return core[0]
    return None


@converter("PRelu", since=1, until=6)
def prelu_per_channel(node, inputs):
    """Before opset 7 the slope is one value per channel (axis 1) or a single shared one."""
    gamma = mx.sym.reshape(inputs[1].sym, shape=(-1,), name=node.sub("slope"))
    return mx.sym.LeakyReLU(inputs[0].sym, gamma=gamma, act_type="prelu", name=node.name)


@converter("PRelu", since=7)
def prelu(node, inputs):
    """Per-channel or shared slopes use the fused prelu kernel; other broadcasts are composed.

    The slope symbol is only reshaped, so it stays the trainable ONNX parameter.
    """
    x, slope = inputs[0], inputs[1]
    sshape = slope.shape if slope.shape is not None else (
        slope.const.shape if slope.const is not None else None)
    if sshape is not None and x.rank is not None and x.rank >= 2 and \
            _prelu_channels(x.rank, sshape) is not None:
        gamma = mx.sym.reshape(slope.sym, shape=(-1,), name=node.sub("slope"))
        return mx.sym.LeakyReLU(x.sym, gamma=gamma, act_type="prelu", name=node.name)
    pos = mx.sym.relu(x.sym, name=node.sub("pos"))
    neg = mx.sym.elemwise_sub(x.sym, pos, name=node.sub("neg"))
    return mx.sym.broadcast_add(pos, mx.sym.broadcast_mul(neg, slope.sym, name=node.sub("scaled")),
                                name=node.name)


def _clip(node, x, lo, hi):
    return mx.sym.clip(x, a_min=lo, a_max=hi, name=node.name)


def _dtype_range(dtype):
    dtype = np.dtype(dtype or np.float32)
    info = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)
    return float(info.min), float(info.max)


@converter("Clip", since=1, until=10)
def clip_attrs(node, inputs):
    lo, hi = _dtype_range(inputs[0].dtype)
    return _clip(node, inputs[0].sym, node.attr("min", lo), node.attr("max", hi))


@converter("Clip", since=11)
def clip_inputs(node, inputs):
    """Constant bounds (the usual ReLU6) become one clip; data-dependent ones broadcast."""
    x = inputs[0]
    bounds = list(_dtype_range(x.dtype))
    dynamic = []
    for i, which in ((1, 0), (2, 1)):
        t = inputs[i] if len(inputs) > i else None
        if t is None:
            continue
        if t.const is not None:
            bounds[which] = float(np.asarray(t.const).reshape(()))
        else:
            dynamic.append((which, t.sym))
    out = x.sym
    if not dynamic:
        return _clip(node, out, *bounds)
    if bounds != list(_dtype_range(x.dtype)):
        out = mx.sym.clip(out, a_min=bounds[0], a_max=bounds[1], name=node.sub("static"))
    for k, (which, sym) in enumerate(dynamic):
        op = mx.sym.broadcast_maximum if which == 0 else mx.sym.broadcast_minimum
        out = op(out, sym, name=node.name if k == len(dynamic) - 1 else node.sub(f"bound{k}"))
    return out


def _flatten_from(node, x, axis):
    """Reshape to (d0, ..., d_axis-1, rest): ONNX<13's coerce-to-2D only needs the tail merged."""
    rank = x.rank
    if rank is None:
        raise node.unsupported("the input rank is unknown; pass input_shapes=... when importing")
    axis = axis + rank if axis < 0 else axis
    if axis == rank - 1:
        return x.sym, False
    return mx.sym.reshape(x.sym, shape=(0,) * axis + (-1,), name=node.sub("flat")), True


def _hardmax(node, x, axis, name):
    """One-hot of the first maximum (argmax picks the first on ties, as ONNX requires)."""
    idx = mx.sym.argmax(x, axis=axis, keepdims=True, name=node.sub("argmax"))
    pos = mx.sym.contrib.arange_like(x, axis=axis, name=node.sub("pos"))
    if axis != -1:
        # arange_like yields a 1-D range; align it with ``axis`` for broadcasting.
        pos = mx.sym.reshape(pos, shape=(-1,) + (1,) * (-axis - 1), name=node.sub("pos_b"))
    return mx.sym.broadcast_equal(idx, pos, name=name)


def _softmax_family(kind, legacy):
    def convert(node, inputs):
        x = inputs[0]
        if legacy:
            data, flat = _flatten_from(node, x, node.attr("axis", 1))
            axis = -1
        else:
            data, flat = x.sym, False
            axis = node.attr("axis", -1)
            if axis >= 0 and x.rank is not None:
                axis -= x.rank
            elif axis >= 0 and kind == "hardmax":
                raise node.unsupported("the input rank is unknown; pass input_shapes=...")
        name = node.sub("core") if flat else node.name
        if kind == "softmax":
            y = mx.sym.softmax(data, axis=axis, name=name)
        elif kind == "log_softmax":
            y = mx.sym.log_softmax(data, axis=axis, name=name)
        else:
            y = _hardmax(node, data, axis, name)
        return mx.sym.reshape_like(y, x.sym, name=node.name) if flat else y
    return convert


for _op, _kind in [("Softmax", "softmax"), ("LogSoftmax", "log_softmax"), ("Hardmax", "hardmax")]:
    converter(_op, since=1, until=12)(_softmax_family(_kind, legacy=True))
    converter(_op, since=13)(_softmax_family(_kind, legacy=False))
