import mxnet as mx
import numpy as np
import pytest
from tests.helpers import assert_f32_close
from tests.onnx.opcheck import check, check_grad, make_model, run_mx, run_ort

from gluontl.errors import OnnxImportError
from gluontl.onnx import registry
from gluontl.onnx.registry import Node, Tensor

X = (np.random.RandomState(0).randn(2, 3, 4, 5) * 2).astype("f")


@pytest.mark.parametrize("op,attrs,opset", [
    ("Relu", {}, 6), ("Relu", {}, 14), ("Sigmoid", {}, 13), ("Tanh", {}, 13),
    ("Softplus", {}, 1), ("Softsign", {}, 1),
    ("LeakyRelu", {}, 6), ("LeakyRelu", {"alpha": 0.3}, 16),
    ("Elu", {}, 6), ("Elu", {"alpha": 0.5}, 6),
    ("Selu", {}, 6), ("Selu", {"alpha": 2.0, "gamma": 3.0}, 6),
    ("Celu", {"alpha": 2.0}, 12),
    ("HardSigmoid", {}, 6), ("HardSigmoid", {"alpha": 0.5, "beta": 0.6}, 6),
    ("HardSwish", {}, 14), ("Mish", {}, 18),
    ("Gelu", {}, 20), ("Gelu", {"approximate": "tanh"}, 20),
    ("ThresholdedRelu", {"alpha": 0.5}, 10),
    ("Shrink", {}, 9), ("Shrink", {"lambd": 1.0, "bias": 0.3}, 9),
])
def test_unary(op, attrs, opset):
    check(op, {"x": X}, attrs, opset=opset, grad=True)


@pytest.mark.parametrize("slope_shape", [(3, 1, 1), (1,), (5,), (4, 5), (1, 3, 1, 1)])
def test_prelu_broadcasts_and_slope_trains(slope_shape):
    slope = np.random.uniform(0.1, 0.5, slope_shape).astype("f")
    check("PRelu", {"x": X, "slope": slope}, consts={"slope"}, opset=16, grad=True)
    model, _ = run_ort("PRelu", {"x": X, "slope": slope}, {}, {"slope"}, 16)
    _, grads = run_mx(model, {"x": X, "slope": slope}, {"slope"}, 16, grad=True)
    # d sum(y) / d slope = sum of the negative inputs over the broadcast positions.
    expect = np.minimum(X, 0)
    axes = tuple(range(X.ndim - len(slope_shape)))
    expect = expect.sum(axis=axes)
    for i, d in enumerate(slope_shape):
        if d == 1:
            expect = expect.sum(axis=i, keepdims=True)
    assert_f32_close(grads["slope"], expect, terms=X.size // slope.size)


def test_clip_attrs_and_inputs():
    check("Clip", {"x": X}, {"min": 0.0, "max": 6.0}, opset=6, grad=True)
    check("Clip", {"x": X}, {"max": 1.0}, opset=6, grad=True)
    lo, hi = np.array(-1.0, "f"), np.array(2.5, "f")
    check("Clip", {"x": X, "min": lo, "max": hi}, consts={"min", "max"}, opset=13, grad=True)
    check("Clip", {"x": X, "min": None, "max": hi}, consts={"max"}, opset=11, grad=True)
    # Bounds computed at run time still work (broadcast min/max).
    check("Clip", {"x": X, "min": lo, "max": hi}, opset=13)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis,opset", [(1, 11), (2, 11), (0, 1), (-1, 11), (1, 13), (-2, 13), (0, 13)])
def test_softmax_family(op, axis, opset):
    # before opset 13 the axes from ``axis`` on are flattened into one softmax
    terms = int(np.prod(X.shape[axis:])) if opset < 13 else X.shape[axis]
    check(op, {"x": X}, {"axis": axis}, opset=opset, grad=True, terms=terms)


@pytest.mark.parametrize("axis,opset", [(1, 11), (2, 11), (1, 13), (-1, 13)])
def test_hardmax(axis, opset):
    x = np.random.randint(0, 3, X.shape).astype("f")  # ties: the first maximum wins
    check("Hardmax", {"x": x}, {"axis": axis}, opset=opset)


def test_gelu_bad_approximation_is_clear():
    node = Node("Gelu", "g", {"approximate": "fast"}, 20, ["x"], ["y"])
    x = Tensor("x", mx.sym.var("x"), shape=X.shape)
    with pytest.raises(OnnxImportError, match="'g'.*approximate"):
        registry.get("Gelu", 20)(node, [x])


@pytest.mark.parametrize("x_shape,slope_shape", [((2, 3, 4), (3,)), ((2, 3, 4, 5), (1,))])
def test_prelu_before_opset7_is_per_channel(x_shape, slope_shape):
    # (3,) against (2, 3, 4) would not even broadcast under opset-7 rules; onnxruntime has no
    # PRelu-6 kernel, so the spec by hand is the oracle.
    x, slope = np.random.randn(*x_shape).astype("f"), np.random.uniform(0.1, 0.5, slope_shape).astype("f")
    inputs = {"x": x, "slope": slope}
    got, grads = run_mx(make_model("PRelu", inputs, {}, {"slope"}, 6), inputs, {"slope"}, 6, grad=True)
    per_channel = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    assert_f32_close(got[0], np.where(x > 0, x, per_channel * x))
    expect = np.minimum(x, 0).sum(axis=tuple(i for i in range(x.ndim) if i != 1))
    assert_f32_close(grads["slope"], expect if slope.size > 1 else expect.sum(keepdims=True),
                     terms=x.size // slope.size)


@pytest.mark.parametrize("op,inputs,attrs,opset", [
    ("PRelu", {"x": X[:1, :2, :2], "slope": np.array([[0.2, 0.4, 0.3, 0.1, 0.5]], "f")}, {}, 16),
    ("Gelu", {"x": X[:1, :2, :2]}, {"approximate": "tanh"}, 20),
    ("Celu", {"x": X[:1, :2, :2]}, {"alpha": 2.0}, 12),
    ("Mish", {"x": X[:1, :2, :2]}, {}, 18),
    ("Selu", {"x": X[:1, :2, :2]}, {"alpha": 2.0, "gamma": 3.0}, 6),
    ("Softmax", {"x": X[:1, :2, :2]}, {"axis": 1}, 11),
    ("LogSoftmax", {"x": X[:1, :2, :2]}, {"axis": 0}, 11),
])
def test_composed_activation_gradients_match_central_differences(op, inputs, attrs, opset):
    check_grad(op, {k: np.ascontiguousarray(v) for k, v in inputs.items()}, attrs, opset=opset)


@pytest.mark.parametrize("op,opset", [("Softplus", 1), ("Mish", 18)])
def test_softplus_and_mish_are_exact_in_the_negative_tail(op, opset):
    """oneDNN's fused softrelu is off by ~2e-6 for x < 0 (softrelu(-20) = -1.9e-6 < 0) and
    Mish multiplies that by x. Every output within float32 rounding of its own size, against
    float64 numpy (onnxruntime flushes the far tail: its Mish(-88) is off by 2e-5)."""
    x = np.linspace(-80, 80, 1601, dtype=np.float32)  # outputs stay normal floats
    sp = np.logaddexp(0.0, x.astype(np.float64))
    exact = sp if op == "Softplus" else x * np.tanh(sp)
    model, _ = run_ort(op, {"x": x}, {}, opset=opset)
    got, _ = run_mx(model, {"x": x}, opset=opset)
    assert_f32_close(got[0], exact, scale=np.abs(exact), err_msg=op)


def test_softplus_gradient_is_the_sigmoid_even_at_zero():
    x = np.array([-30, -2, -1e-3, 0, 1e-3, 2, 30], np.float32)
    model, _ = run_ort("Softplus", {"x": x}, {}, opset=1)
    _, grads = run_mx(model, {"x": x}, opset=1, grad=True)
    want = 1 / (1 + np.exp(-x.astype(np.float64)))
    assert_f32_close(grads["x"], want, scale=want)
