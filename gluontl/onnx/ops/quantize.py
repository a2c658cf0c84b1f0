"""QDQ quantization: QuantizeLinear / DequantizeLinear as float fake-quantization.

Weights behind DequantizeLinear fold at import into float parameters (the importer
evaluates the node on its known inputs), so a QDQ model fine-tunes like a float one.
Activation QuantizeLinear→DequantizeLinear pairs run as fake quantization: quantized
values travel as float32 integers, and rounding passes gradients straight through
(a zero-gradient round would stop training of every layer before it). Scales and zero
points are held as non-trainable constants by the importer. Integer-arithmetic ops
(QLinearConv, ConvInteger, ...) are refused by the importer's unsupported-op report.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np

from ..registry import Node, Tensor, converter

_RANGES = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127),
           np.dtype(np.uint16): (0, 65535), np.dtype(np.int16): (-32768, 32767)}


def _operand(node: Node, x: Tensor, t: Tensor | None, what: str, default: float):
    """A scale/zero point as a float (per tensor) or a symbol broadcasting along ``axis``."""
    if t is None:
        return default
    v = t.need_const(node, what)
    if v.size == 1:
        return float(v.reshape(-1)[0])
    if node.attr("block_size", 0):
        raise node.unsupported("blocked quantization (block_size) is not supported")
    if x.rank is None:
        raise node.unsupported(f"per-axis {what} needs the rank of input '{x.name}', which shape "
                               f"inference could not determine; pass input_shapes=...")
    shape = [1] * x.rank
    shape[node.attr("axis", 1) % x.rank] = v.size
    return mx.sym.reshape(mx.sym.Cast(t.sym, dtype="float32"), shape=tuple(shape),
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
