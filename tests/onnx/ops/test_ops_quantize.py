"""Quantized ops against exact integer arithmetic (numpy, int64, the ONNX spec's formulas in
tests/helpers.py) — never against onnxruntime's integer kernels, whose uint8×int8 products
saturate int16 pair sums on CPUs without VNNI.

QuantizeLinear/DequantizeLinear, MatMulInteger, ConvInteger and DynamicQuantizeLinear must be
bit-exact (their float32 forms hold every integer involved exactly). QLinearConv/QLinearMatMul
accumulate in float32 here, so an output may round the other way only where the exact value
lies within that float error of a rounding tie.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np
import onnx
import pytest
from tests.helpers import (QRANGE, assert_requantized, conv_integer_ref, dequantize_ref, dynamic_quantize_ref,
                     matmul_integer_ref, quantize_ref, requantize_ref, requantize_slack)
from onnx import helper, numpy_helper
from tests.onnx.opcheck import make_model, run_mx

from gluontl.onnx import import_model

T = onnx.TensorProto
ONNX_TYPE = {np.dtype(np.float32): T.FLOAT, np.dtype(np.uint8): T.UINT8, np.dtype(np.int8): T.INT8,
             np.dtype(np.int32): T.INT32}


def model_of(nodes, inputs, output, output_type, inits):
    """``inputs``: name -> array (its dtype and shape, batch left free)."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, ONNX_TYPE[a.dtype], ["N", *a.shape[1:]])
                     for n, a in inputs.items()],
        [helper.make_tensor_value_info(output, output_type, None)],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def run_imported(model, inputs):
    out = import_model(model)(*[mx.nd.array(a, dtype=a.dtype) for a in inputs.values()])
    return [o.asnumpy() for o in (out if isinstance(out, (list, tuple)) else [out])]


def saturating_operands(rs, m, k, n):
    """uint8 activations near 255 against int8 weights of one sign: adjacent products sum
    past 32767, where onnxruntime's non-VNNI kernels saturate (e.g. 255·127·2 = 64770)."""
    a = rs.randint(200, 256, (m, k)).astype(np.uint8)
    b = rs.randint(-128, 128, (k, n)).astype(np.int8)
    b[:, 0] = 127
    b[:, 1] = -128
    return a, b


# ----------------------------------------------------------------- QuantizeLinear / DequantizeLinear

@pytest.mark.parametrize("zero_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_linear_rounds_half_to_even_and_saturates(zero_dtype, per_axis):
    rs = np.random.RandomState(11)
    scale = (rs.rand(3) * 0.1 + 0.02).astype(np.float32) if per_axis else np.float32(0.05)
    zero = (np.array([3, 128, 250]) if zero_dtype == np.uint8 else np.array([-5, 0, 120])).astype(zero_dtype)
    zero = zero if per_axis else zero[:1].reshape(())
    x = (rs.randn(2, 3, 4, 5) * 4).astype(np.float32)
    # exact ties of the step (x / scale = k + 0.5) and values far past the type's range
    s = np.broadcast_to(scale.reshape(-1, 1, 1) if per_axis else scale, (3, 4, 5))
    x[0, :, 0, :] = (np.arange(5) + 0.5) * s[:, 0, :]
    x[1, :, 1, :2] = [1e4, -1e4]
    (got,), _ = run_mx(make_model("QuantizeLinear", {"x": x, "s": scale, "z": zero}, {"axis": 1},
                                  {"s", "z"}), {"x": x, "s": scale, "z": zero}, {"s", "z"})
    want = quantize_ref(x, scale, zero, axis=1)
    np.testing.assert_array_equal(got, want.astype(np.float32))
    assert set(QRANGE[zero.dtype]) <= set(np.unique(want)), "both saturation ends exercised"


def test_quantize_linear_rounds_before_adding_the_zero_point():
    # x / s = -27.499998 in float32; x / s + 128 = 100.5 would be a tie rounding to 100.
    x, s, z = np.array([[-1.3749999]], np.float32), np.float32(0.05), np.uint8(128)
    (got,), _ = run_mx(make_model("QuantizeLinear", {"x": x, "s": s, "z": z}, {}, {"s", "z"}),
                       {"x": x, "s": s, "z": z}, {"s", "z"})
    assert got[0, 0] == quantize_ref(x, s, z)[0, 0] == 101


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_dequantize_linear_per_axis_is_exact(dtype):
    rs = np.random.RandomState(12)
    lo, hi = QRANGE[np.dtype(dtype)]
    q = rs.randint(lo, hi + 1, (2, 4, 3)).astype(dtype)
    scale = (rs.rand(4) * 0.1 + 1e-3).astype(np.float32)
    zero = rs.randint(lo, hi + 1, 4).astype(dtype)
    (got,), _ = run_mx(make_model("DequantizeLinear", {"q": q, "s": scale, "z": zero}, {"axis": 1},
                                  {"s", "z"}), {"q": q, "s": scale, "z": zero}, {"s", "z"})
    np.testing.assert_array_equal(got, dequantize_ref(q, scale, zero, axis=1))


# ----------------------------------------------------------------- integer matmul / conv

def test_matmul_integer_is_exact_where_int16_pair_sums_overflow():
    rs = np.random.RandomState(13)
    a, b = saturating_operands(rs, 4, 64, 5)
    b_zero = np.int8(-3)
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])]
    model = model_of(nodes, {"a": a}, "y", T.INT32, {"b": b, "az": np.uint8(7), "bz": b_zero})
    got = run_imported(model, {"a": a})[0]
    want = matmul_integer_ref(a, b, 7, b_zero)
    assert np.abs(want).max() < 2 ** 24, "float32 holds every partial sum exactly"
    np.testing.assert_array_equal(got, want)


def test_conv_integer_is_exact_with_per_channel_weight_zero_points():
    rs = np.random.RandomState(14)
    x = rs.randint(0, 256, (2, 3, 6, 5)).astype(np.uint8)
    w = rs.randint(-128, 128, (4, 3, 3, 3)).astype(np.int8)
    w_zero = np.array([0, -1, 5, 127], np.int8)
    nodes = [helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1])]
    model = model_of(nodes, {"x": x}, "y", T.INT32, {"w": w, "xz": np.uint8(131), "wz": w_zero})
    got = run_imported(model, {"x": x})[0]
    np.testing.assert_array_equal(got, conv_integer_ref(x, w, 131, w_zero, pads=(1, 1, 1, 1)))


def test_dynamic_quantize_linear_is_exact():
    rs = np.random.RandomState(15)
    x = (rs.randn(3, 7) * 2 + 0.5).astype(np.float32)
    x[0, 0] = 0.0
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    model = model_of(nodes, {"x": x}, "y", T.FLOAT, {})
    q, scale, zero = dynamic_quantize_ref(x)
    np.testing.assert_array_equal(run_imported(model, {"x": x})[0], dequantize_ref(q, scale, zero))


# ----------------------------------------------------------------- QLinear ops (requantized)

def test_qlinear_matmul_matches_exact_requantization():
    rs = np.random.RandomState(16)
    a, b = saturating_operands(rs, 6, 48, 5)
    a_s, a_z, b_s, b_z = np.float32(0.013), np.uint8(120), np.float32(0.004), np.int8(2)
    y_s, y_z = np.float32(0.1), np.uint8(100)
    nodes = [helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])]
    model = model_of(nodes, {"a": a}, "y", T.UINT8,
                     {"as": a_s, "az": a_z, "b": b, "bs": b_s, "bz": b_z, "ys": y_s, "yz": y_z})
    got = run_imported(model, {"a": a})[0]
    acc = matmul_integer_ref(a, b, a_z, b_z)
    multiplier = np.float64(a_s) * np.float64(b_s) / np.float64(y_s)
    want, real = requantize_ref(acc, multiplier, y_z)
    abs_acc = np.abs(a.astype(np.int64) - a_z) @ np.abs(b.astype(np.int64) - b_z)
    assert_requantized(got, want, real, requantize_slack(abs_acc, multiplier, a.shape[1], real))
    assert len(np.unique(want)) > 10, "outputs spread over the range, not saturated"


def test_qlinear_conv_with_bias_matches_exact_requantization():
    rs = np.random.RandomState(17)
    w = rs.randn(4, 2, 3, 3).astype(np.float32)
    w_s = (np.abs(w).reshape(4, -1).max(axis=1) / 127).astype(np.float32)
    wq = np.round(w / w_s[:, None, None, None]).astype(np.int8)
    x_s, x_z, y_s, y_z = np.float32(0.02), np.uint8(128), np.float32(0.05), np.uint8(128)
    bias = np.round(rs.randn(4) / (x_s * w_s)).astype(np.int32)
    xq = rs.randint(0, 256, (2, 2, 5, 5)).astype(np.uint8)
    nodes = [helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"],
                              pads=[1, 1, 1, 1])]
    model = model_of(nodes, {"x": xq}, "y", T.UINT8,
                     {"xs": x_s, "xz": x_z, "w": wq, "ws": w_s, "wz": np.zeros(4, np.int8),
                      "ys": y_s, "yz": y_z, "b": bias})
    got = run_imported(model, {"x": xq})[0]
    acc = conv_integer_ref(xq, wq, x_z, 0, pads=(1, 1, 1, 1)) + bias.reshape(1, 4, 1, 1)
    multiplier = (np.float64(x_s) * w_s.astype(np.float64) / np.float64(y_s)).reshape(1, 4, 1, 1)
    want, real = requantize_ref(acc, multiplier, y_z)
    abs_acc = conv_integer_ref(np.abs(xq.astype(np.int64) - x_z), np.abs(wq.astype(np.int64)),
                               pads=(1, 1, 1, 1)) + np.abs(bias).reshape(1, 4, 1, 1)
    assert_requantized(got, want, real, requantize_slack(abs_acc, multiplier, 2 * 9 + 1, real))
    assert 0 < np.mean((want > 0) & (want < 255)), "not all saturated"
