"""QDQ quantization: QuantizeLinear / DequantizeLinear as float fake-quantization.

Weights behind DequantizeLinear fold at import into float parameters (the importer
evaluates the node on its known inputs), so a QDQ model fine-tunes like a float one.
Activation QuantizeLinear→DequantizeLinear pairs run as fake quantization: quantized
values travel as float32 integers, and rounding passes gradients straight through
(a zero-gradient round would stop training of every layer before it). Scales and zero
points are held as non-trainable constants by the importer. Integer-arithmetic ops
(QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger) are rewritten by the importer
into the same dequantize → float op → quantize form (``integer_as_float``).
"""
from __future__ import annotations

import mxnet as mx
import numpy as np

from ..registry import Node, Tensor, converter

_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127),
           np.dtype(np.uint16): (0, 65535), np.dtype(np.int16): (-32768, 32767)}


def _operand(node: Node, x: Tensor, t: Tensor | None, what: str, default: float):
    """A scale/zero point as a float (known, per tensor) or a symbol broadcasting against
    ``x`` (per axis along ``axis``, or given at run time)."""
    if t is None:
        return default
    if t.const is not None and t.const.size == 1:
        return float(t.const.reshape(-1)[0])
    if node.attr("block_size", 0):
        raise node.unsupported("blocked quantization (block_size) is not supported")
    shape = t.shape if t.shape is not None else (None if t.const is None else t.const.shape)
    if x.rank is None or shape is None:
        raise node.unsupported(f"the ranks of input '{x.name}' and {what} '{t.name}' are needed; "
                               f"shape inference could not determine them, pass input_shapes=...")
    target = [1] * x.rank
    if int(np.prod(shape)) != 1:  # per axis
        target[node.attr("axis", 1) % x.rank] = -1
    return mx.sym.reshape(mx.sym.Cast(t.sym, dtype="float32"), shape=tuple(target),
                          name=node.sub(what.replace(" ", "_")))


def _mul(a, b, name=None):
    return a * b if isinstance(b, float) else mx.sym.broadcast_mul(a, b, name=name)


def _add(a, b, sign: float = 1.0):
    if isinstance(b, float):
        return a + sign * b
    return mx.sym.broadcast_add(a, b) if sign > 0 else mx.sym.broadcast_sub(a, b)


def _round_half_even(x, node: Node):
    """ONNX rounds halves to even; MXNet's round/rint do not."""
    f = mx.sym.floor(x, name=node.sub("floor"))
    frac = x - f
    odd = f - 2 * mx.sym.floor(f * 0.5)
    return f + (frac > 0.5) + (frac == 0.5) * odd


@converter("QuantizeLinear", since=10)
def quantize_linear(node, inputs):
    x, scale = inputs[0], inputs[1]
    zt = inputs[2] if len(inputs) > 2 else None
    dtype = np.dtype(zt.dtype) if zt is not None and zt.dtype is not None else np.dtype(np.uint8)
    if dtype not in _RANGES:
        raise node.unsupported(f"quantization to {dtype} (only 8/16-bit integers are supported)")
    lo, hi = _RANGES[dtype]
    s = _operand(node, x, scale, "scale", 1.0)
    scaled = x.sym / s if isinstance(s, float) else mx.sym.broadcast_div(x.sym, s)
    zero = _operand(node, x, zt, "zero point", 0.0)
    shifted = _add(scaled, zero)
    # Round before shifting, as onnxruntime does (x/s + z can land on a tie x/s is not on).
    q = mx.sym.clip(_add(_round_half_even(scaled, node), zero), lo, hi)
    # Forward value q, gradient of ``shifted`` (straight-through estimator).
    return mx.sym.elemwise_add(shifted, mx.sym.BlockGrad(q - shifted), name=node.name)


@converter("DequantizeLinear", since=10)
def dequantize_linear(node, inputs):
    x = inputs[0]
    zt = inputs[2] if len(inputs) > 2 else None
    centered = _add(mx.sym.Cast(x.sym, dtype="float32"), _operand(node, x, zt, "zero point", 0.0), -1.0)
    return _mul(centered, _operand(node, x, inputs[1], "scale", 1.0), name=node.name)


def integer_as_float(proto) -> list | None:
    """Integer-arithmetic ops rewritten as DequantizeLinear → float op (→ QuantizeLinear).

    The integer weights then fold into float parameters like QDQ weights, and the
    graph computes in float32 what exact integer arithmetic gives: bit for bit while
    partial sums stay below 2**24 (uint8×int8 dot products of up to 513 terms), the
    requantized QLinear outputs up to float rounding next to a tie. None for other ops.
    """
    from onnx import helper

    op, name, ins = proto.op_type, proto.name or proto.output[0], list(proto.input)
    attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}
    one = f"{name}/one"
    nodes = [helper.make_node("Constant", [], [one], name=one, value_float=1.0)]

    def dq(x, scale, zero, axis, tag):
        out = f"{x}/{tag}"
        nodes.append(helper.make_node("DequantizeLinear", [x, scale] + ([zero] if zero else []),
                                      [out], name=f"{name}/{tag}_{len(nodes)}", axis=axis))
        return out

    def arg(i):
        return ins[i] if len(ins) > i else ""

    if op == "MatMulInteger":
        a, b = dq(ins[0], one, arg(2), -2, "float"), dq(ins[1], one, arg(3), -1, "float")
        nodes.append(helper.make_node("MatMul", [a, b], [proto.output[0]], name=name))
    elif op == "ConvInteger":
        x, w = dq(ins[0], one, arg(2), 1, "float"), dq(ins[1], one, arg(3), 0, "float")
        nodes.append(helper.make_node("Conv", [x, w], [proto.output[0]], name=name, **attrs))
    elif op in ("QLinearMatMul", "QLinearConv"):
        conv = op == "QLinearConv"
        x = dq(ins[0], ins[1], ins[2], 1 if conv else -2, "dequantized")
        w = dq(ins[3], ins[4], ins[5], 0 if conv else -1, "dequantized")
        y, float_ins = f"{proto.output[0]}/float", [x, w]
        if conv and arg(8):  # int32 bias in units of x_scale * w_scale
            bias_scale = f"{name}/bias_scale"
            nodes.append(helper.make_node("Mul", [ins[1], ins[4]], [bias_scale], name=bias_scale))
            float_ins.append(dq(ins[8], bias_scale, "", 0, "dequantized"))
        nodes.append(helper.make_node("Conv" if conv else "MatMul", float_ins, [y], name=name,
                                      **(attrs if conv else {})))
        nodes.append(helper.make_node("QuantizeLinear", [y, ins[6], ins[7]], [proto.output[0]],
                                      name=f"{name}/requantize", axis=1))
    else:
        return None
    return nodes
