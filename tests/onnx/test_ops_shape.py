import mxnet as mx
import numpy as np
import pytest
from opcheck import check, check_grad, run_mx, run_ort

from gluontl.errors import OnnxImportError
from gluontl.onnx import registry
from gluontl.onnx.registry import Node, Tensor

X = np.random.RandomState(1).randn(2, 3, 4, 5).astype(np.float32)


def i64(*v):
    return np.array(v, np.int64)


@pytest.mark.parametrize("shape", [(0, -1), (2, 0, 20), (-1,), (6, 20), (0, 0, 4, 5, 1), (-1, 0)])
def test_reshape_codes(shape):
    check("Reshape", {"x": X, "s": i64(*shape)}, consts={"s"}, grad=True)


def test_reshape_allowzero_without_zero_and_error_with_zero():
    check("Reshape", {"x": X, "s": i64(4, -1)}, {"allowzero": 1}, consts={"s"}, opset=14)
    # onnxruntime itself rejects such a model, so call the converter directly
    node = Node("Reshape", "r", {"allowzero": 1}, 14, ["x", "s"], ["y"])
    with pytest.raises(OnnxImportError, match="'r'.*allowzero"):
        registry.get("Reshape", 14)(node, [Tensor("x", mx.sym.var("x"), shape=X.shape),
                                           Tensor("s", None, const=i64(0, 4), shape=(2,))])


def test_reshape_dynamic_shape_is_a_clear_error():
    with pytest.raises(OnnxImportError, match="must be known at import time"):
        check("Reshape", {"x": X, "s": i64(6, 20)})


@pytest.mark.parametrize("axis", [0, 1, 2, 4, -1, -3])
def test_flatten(axis):
    check("Flatten", {"x": X}, {"axis": axis}, grad=True)


@pytest.mark.parametrize("perm", [None, [0, 2, 3, 1], [3, 1, 0, 2]])
def test_transpose(perm):
    check("Transpose", {"x": X}, {"perm": perm} if perm else {}, grad=True)


def test_squeeze_unsqueeze_attr_and_input_forms():
    x = np.random.randn(1, 3, 1, 5).astype(np.float32)
    check("Squeeze", {"x": x}, {"axes": [0, -2]}, opset=11, grad=True)
    check("Squeeze", {"x": x}, opset=11, grad=True)
    check("Squeeze", {"x": x, "a": i64(2)}, consts={"a"}, opset=13, grad=True)
    check("Squeeze", {"x": x}, opset=13, grad=True)
    check("Unsqueeze", {"x": x}, {"axes": [0, -1]}, opset=11, grad=True)
    check("Unsqueeze", {"x": x, "a": i64(6, 1, -3)}, consts={"a"}, opset=13, grad=True)


def test_shape_and_size():
    check("Shape", {"x": X})
    for start, end in [(1, None), (-3, -1), (0, 10), (-10, 2)]:
        attrs = {"start": start} if end is None else {"start": start, "end": end}
        check("Shape", {"x": X}, attrs, opset=15)
    # Size is 0-d in ONNX; MXNet has no 0-d tensors, so the value comes as shape (1,)
    model, ref = run_ort("Size", {"x": X}, {})
    out, _ = run_mx(model, {"x": X})
    assert out[0].shape == (1,) and out[0][0] == ref[0] == X.size


@pytest.mark.parametrize("x_shape,shape", [
    ((3, 1), (2, 1, 6)), ((1, 4), (3, 1)), ((2, 3, 4), (3, 1)), ((3, 1), (3, 4))])
def test_expand(x_shape, shape):
    check("Expand", {"x": np.random.randn(*x_shape).astype(np.float32), "s": i64(*shape)},
          consts={"s"}, grad=True)


@pytest.mark.parametrize("reps", [(1, 2, 1, 3), (2, 2, 2, 2), (1, 1, 1, 1)])
def test_tile(reps):
    check("Tile", {"x": X, "r": i64(*reps)}, consts={"r"}, grad=True)


def test_constant_of_shape_and_range_with_static_inputs():
    from onnx import numpy_helper
    check("ConstantOfShape", {"s": i64(2, 3)}, consts={"s"})
    check("ConstantOfShape", {"s": i64(4)},
          {"value": numpy_helper.from_array(np.array([7], np.int64))}, consts={"s"})
    for args in [(0.0, 5.0, 1.5), (10.0, 2.0, -3.0)]:
        ins = {k: np.array(v, np.float32) for k, v in zip("sld", args)}
        check("Range", ins, consts=set(ins))
    check("Range", {k: np.array(v, np.int64) for k, v in zip("sld", (1, 9, 2))}, consts=set("sld"))


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    x = np.random.randn(2, 8, 3, 4).astype(np.float32)
    check("DepthToSpace", {"x": x}, {"blocksize": 2, "mode": mode}, grad=True)


def test_space_to_depth():
    check("SpaceToDepth", {"x": np.random.randn(2, 3, 4, 6).astype(np.float32)}, {"blocksize": 2},
          grad=True)


def test_rank0_values_carried_as_shape_1():
    """Unsqueeze of a rank-0 run-time value (shape (1,) in MXNet) adds exactly the
    requested axes; Reshape to a scalar yields shape (1,)."""
    node = Node("Unsqueeze", "u", {}, 13, ["x", "a"], ["y"])
    ins = [Tensor("x", mx.sym.var("x"), shape=(), dtype=np.float32),
           Tensor("a", None, const=i64(0, 1), shape=(2,))]
    out = registry.get("Unsqueeze", 13)(node, ins).eval(x=mx.nd.array([3.0]))[0]
    assert out.shape == (1, 1) and out.asnumpy()[0, 0] == 3.0
    node = Node("Reshape", "r", {}, 13, ["x", "s"], ["y"])
    ins = [Tensor("x", mx.sym.var("x"), shape=(1, 1), dtype=np.float32),
           Tensor("s", None, const=np.zeros(0, np.int64), shape=(0,))]
    out = registry.get("Reshape", 13)(node, ins).eval(x=mx.nd.array([[5.0]]))[0]
    assert out.shape == (1,) and out.asnumpy()[0] == 5.0


def test_gradients_match_central_differences():
    x = np.random.randn(1, 8, 2, 2).astype(np.float32)
    check_grad("DepthToSpace", {"x": x}, {"blocksize": 2, "mode": "CRD"})
    check_grad("Expand", {"x": np.random.randn(3, 1).astype(np.float32), "s": i64(2, 1, 4)}, consts={"s"})
    check_grad("Tile", {"x": np.random.randn(2, 1, 3).astype(np.float32), "r": i64(2, 3, 1)},
               consts={"r"})
