import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import assert_f32_close
from tests.onnx.opcheck import check, check_grad, run_ort

from gluontl.onnx import import_model



def f32(*shape, lo=-2.0, hi=2.0):
    return np.random.uniform(lo, hi, shape).astype(np.float32)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_arith_broadcast_and_scalar(op):
    a, b = f32(2, 3, 4), f32(3, 1, lo=0.5)
    check(op, {"a": a, "b": b}, grad=True)
    check(op, {"a": b, "b": a}, grad=True)  # lower rank on the left
    # size-1 constants take the *_scalar path, on either side, including rank growth
    check(op, {"a": a, "c": np.array([1.5], np.float32)}, consts={"c"}, grad=True)
    check(op, {"c": np.array(2.5, np.float32), "a": a + 3}, consts={"c"}, grad=True)
    check(op, {"a": f32(3), "c": np.full((1, 1), 0.5, np.float32)}, consts={"c"}, grad=True)


def test_integer_div_truncates_and_mod():
    a = np.array([-7, 7, -8, 9, 0], np.int64)
    b = np.array([2, -2, 3, 4, 5], np.int64)
    check("Div", {"a": a, "b": b})
    check("Div", {"a": a, "c": np.array(3, np.int64)}, consts={"c"})
    check("Mod", {"a": a, "b": b})
    check("Mod", {"a": a, "b": b}, {"fmod": 1})
    check("Mod", {"a": f32(2, 5) * 5, "b": np.array([1.5, -2, 2.5, -0.7, 3], np.float32)},
          {"fmod": 1})


def test_pow():
    x = f32(2, 3, lo=0.5)
    check("Pow", {"x": x, "y": f32(3, lo=-1)}, grad=True)
    check("Pow", {"x": x, "y": np.array(2.0, np.float32)}, consts={"y"}, grad=True)
    check("Pow", {"x": x, "y": np.array([3], np.int64)}, consts={"y"}, grad=True)
    check("Pow", {"y": np.array(2.0, np.float32), "x": x}, consts={"y"}, grad=True)
    # float base, int exponent tensor (opset 12+)
    check("Pow", {"x": x, "y": np.array([1, 2, 3], np.int64)}, grad=True)


@pytest.mark.parametrize("op,lo,hi", [
    ("Sqrt", 0.1, 3), ("Exp", -2, 2), ("Log", 0.1, 3), ("Abs", -2, 2), ("Neg", -2, 2),
    ("Reciprocal", 0.5, 3), ("Sin", -3, 3), ("Cos", -3, 3), ("Tan", -1, 1),
    ("Asin", -0.9, 0.9), ("Acos", -0.9, 0.9), ("Atan", -3, 3), ("Sinh", -2, 2),
    ("Cosh", -2, 2), ("Erf", -2, 2)])
def test_unary_with_grad(op, lo, hi):
    check(op, {"x": f32(3, 4, lo=lo, hi=hi)}, grad=True)


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Sign", "Round"])
def test_unary_piecewise(op):
    x = np.array([-2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.7, -3.2, 0.49], np.float32)
    check(op, {"x": x})


@pytest.mark.parametrize("op", ["Min", "Max", "Sum", "Mean"])
def test_variadic(op):
    check(op, {"a": f32(2, 3), "b": f32(3), "c": f32(2, 1)}, grad=True)
    check(op, {"a": f32(4)}, grad=True)
    check(op, {"a": f32(2, 3), "c": np.array([0.25], np.float32)}, consts={"c"}, grad=True)


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
def test_compare(op):
    a = np.array([[1, 2, 3], [3, 2, 1]], np.float32)
    check(op, {"a": a, "b": np.array([2, 2, 2], np.float32)})
    check(op, {"a": a, "c": np.array(2, np.float32)}, consts={"c"})
    check(op, {"c": np.array([2], np.float32), "a": a}, consts={"c"})
    check(op, {"a": a.astype(np.int64), "b": np.array([[2], [1]], np.int64)})


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    a = np.array([[True, False, True, False]])
    b = np.array([[True], [False]])
    check(op, {"a": a, "b": b})


def test_not_isnan_isinf():
    check("Not", {"a": np.array([True, False, True])})
    x = np.array([1.0, np.nan, np.inf, -np.inf, -2.0], np.float32)
    check("IsNaN", {"x": x})
    for pos, neg in [(1, 1), (1, 0), (0, 1)]:
        check("IsInf", {"x": x}, {"detect_positive": pos, "detect_negative": neg})


def test_compare_feeds_where_and_cast():
    """Bool outputs are float32 0/1, which Where and Cast consume directly."""
    c = np.array([[True, False, True]])
    check("Where", {"c": c, "x": f32(2, 1), "y": f32(3)}, grad=True)
    check("Where", {"c": np.array([True, False]), "x": np.array([[1], [2]], np.int64),
                    "y": np.array(7, np.int64)}, consts={"y"})
    check("Where", {"c": c, "x": np.array(1.5, np.float32), "y": np.array([-1], np.float32)},
          consts={"x", "y"})
    check("Where", {"c": c, "x": f32(2, 3), "y": np.array(0.0, np.float32)}, consts={"y"},
          grad=True)


@pytest.mark.parametrize("to,src", [
    (1, np.array([True, False])), (7, np.array([-1.7, 1.7, 2.5, -0.2], np.float32)),
    (6, np.array([3, -4], np.int64)), (9, np.array([0.0, 0.3, -2.0], np.float32)),
    (9, np.array([0, 5], np.int64)), (1, np.array([3, -4], np.int64)),
    (11, np.array([1.25, -3.5], np.float32)), (2, np.array([3.9, 200.0], np.float32))])
def test_cast(to, src):
    check("Cast", {"x": src}, {"to": to})


def test_cast_like_and_grad():
    check("Cast", {"x": f32(2, 3)}, {"to": 1}, grad=True)
    check("CastLike", {"x": np.array([1.9, -2.9], np.float32), "t": np.array([0], np.int64)})
    check("CastLike", {"x": np.array([1, 0], np.int64), "t": np.array([0.0], np.float32)})


def test_cast_to_string_is_unsupported():
    from gluontl.errors import OnnxImportError
    with pytest.raises(OnnxImportError, match="STRING"):
        check("Cast", {"x": f32(2)}, {"to": 8})


def test_rank0_runtime_value_broadcasts_like_a_scalar():
    """A rank-0 run-time value travels as shape (1,); Where must align it as a scalar,
    not as the last axis."""
    import mxnet as mx

    from gluontl.onnx import registry
    from gluontl.onnx.registry import Node, Tensor

    c = np.array([[True], [False]])
    x, y = f32(2, 1, 3), np.float32(-4.0)
    node = Node("Where", "w", {}, 17, ["c", "x", "y"], ["o"])
    ins = [Tensor("c", mx.sym.var("c"), shape=c.shape, dtype=np.bool_),
           Tensor("x", mx.sym.var("x"), shape=x.shape, dtype=np.float32),
           Tensor("y", mx.sym.var("y"), shape=(), dtype=np.float32)]
    out = registry.get("Where", 17)(node, ins).eval(
        c=mx.nd.array(c.astype(np.float32)), x=mx.nd.array(x), y=mx.nd.array([y]))[0]
    np.testing.assert_array_equal(out.asnumpy(), np.where(c, x, y))


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.data())
def test_broadcasting_matches_onnxruntime_on_random_shapes(data):
    """Numpy broadcasting of any compatible shapes, for a broadcasting op and for Where
    (which MXNet does not broadcast itself)."""
    out = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=4))

    def operand():
        rank = data.draw(st.integers(1, len(out)))
        return tuple(d if data.draw(st.booleans()) else 1 for d in out[len(out) - rank:])

    rs = np.random.RandomState(data.draw(st.integers(0, 2**16)))  # keep R's stream fixed
    a, b, c = (rs.randn(*operand()).astype(np.float32) for _ in range(3))
    check("Sub", {"a": a, "b": b})
    check("Where", {"c": c > 0, "a": a, "b": b})


def test_gradients_match_central_differences():
    a, b = f32(2, 3, lo=0.5), f32(3, lo=0.5)
    check_grad("Where", {"c": np.array([True, False, True]), "a": a, "b": f32(2, 1)})
    check_grad("Pow", {"a": a, "b": b})
    check_grad("Div", {"a": a, "b": b})
    check_grad("Mean", {"a": a, "b": b, "c": f32(2, 1)})
    # Max's kink: operands at least 0.1 apart, beyond the 1e-2 central-difference step
    gap = np.random.uniform(0.1, 1.0, (2, 3)) * np.random.choice([-1, 1], (2, 3))
    check_grad("Max", {"a": (b + gap).astype(np.float32), "b": b})


@pytest.mark.parametrize("scalar", ["exponent", "base"])
def test_pow_broadcasts_a_rank0_runtime_scalar(scalar):
    """A rank-0 graph input fed as a shape () NDArray (as onnx's own data has it)."""
    s = np.array(3.0 if scalar == "exponent" else 1.5, np.float32)
    inputs = {"x": f32(2, 3, lo=0.5), "y": s} if scalar == "exponent" else {"x": s, "y": f32(2, 3)}
    model, ref = run_ort("Pow", inputs, {}, opset=15)
    got = import_model(model)(*[mx.nd.array(v) for v in inputs.values()]).asnumpy()
    assert_f32_close(got, ref[0])
