import mxnet as mx
import numpy as np
import pytest
from tests.helpers import ort_run
from tests.onnx.opcheck import check, check_grad, i64, run_mx, run_ort

from gluontl.errors import OnnxImportError
from gluontl.onnx import registry
from gluontl.onnx.registry import Node, Tensor

X = np.random.RandomState(1).randn(2, 3, 4, 5).astype(np.float32)


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


# ------------------------------------------------------------------ batch-dependent Range / Tile
# The importer folds shape arithmetic at two batch sizes; a Range or Tile whose inputs change
# with the batch is computed at run time from the batch axis (dynamo's as_strided and
# advanced-indexing decompositions). Checked against onnxruntime at batch sizes other than
# the two the importer folds at.

def _assert_matches_ort(model, block, x):
    """Exact match with onnxruntime's kernels (basic rewrites: its extended ones turn the
    reversed Range below into an empty tensor, see ort_session)."""
    ref = ort_run(model, {"x": x})[0]
    got = block(mx.nd.array(x)).asnumpy()
    assert got.shape == ref.shape and np.array_equal(got, ref), (got, ref)


def _batch_model(nodes, inits, x_dims, opset=17):
    from onnx import helper, numpy_helper
    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"], start=0, end=1),
         helper.make_node("Squeeze", ["shape"], ["n"])] + nodes, "g",
        [helper.make_tensor_value_info("x", 1, ["N", *x_dims])], [helper.make_tensor_value_info("y", 1, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _bound(name, const, per_batch, dtype):
    """Nodes computing ``const + per_batch * N`` as a scalar named ``name``."""
    from onnx import helper
    return ([helper.make_node("Cast", ["n"], [f"{name}_n"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype))),
             helper.make_node("Mul", [f"{name}_n", f"{name}_per"], [f"{name}_scaled"]),
             helper.make_node("Add", [f"{name}_scaled", f"{name}_const"], [name])],
            {f"{name}_per": np.array(per_batch, dtype), f"{name}_const": np.array(const, dtype)})


def _range_model(start, limit, delta, dtype=np.int64):
    """y = flatten(x)[Range(start, limit, delta)], each bound ``(c, k)`` meaning ``c + k * N``;
    a float Range is the output itself."""
    from onnx import helper
    nodes, inits = [], {"flat": np.array([-1], np.int64)}
    for name, (c, k) in zip(("start", "limit", "delta"), (start, limit, delta)):
        more, vals = _bound(name, c, k, dtype)
        nodes += more
        inits.update(vals)
    nodes.append(helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range_b"))
    if np.dtype(dtype).kind == "f":
        nodes.append(helper.make_node("Identity", ["r"], ["y"]))
    else:
        nodes += [helper.make_node("Reshape", ["x", "flat"], ["xf"]),
                  helper.make_node("Gather", ["xf", "r"], ["y"], axis=0)]
    return _batch_model(nodes, inits, [6])


@pytest.mark.parametrize("start,limit,delta", [
    ((0, 0), (0, 1), (1, 0)),     # arange(N): the as_strided row index
    ((0, 0), (0, 6), (1, 0)),     # arange(N * 6): every element
    ((-1, 1), (-1, 0), (-1, 0)),  # arange(N - 1, -1, -1): reversed batch (index_select)
    ((1, 0), (0, 6), (2, 0)),     # odd positions: length 3N
    ((0, 0), (-1, 6), (1, 0)),    # length 6N - 1
    ((0, 0), (2, 1), (1, 0)),     # length N + 2
    ((0, 1), (0, 6), (1, 0)),     # arange(N, 6N): the start moves with the batch too
], ids=["n", "6n", "reversed", "step2", "6n-1", "n+2", "moving-start"])
def test_range_over_the_batch_matches_onnxruntime_at_any_batch(start, limit, delta):
    from gluontl.onnx import import_model
    from tests.onnx.test_importer import graph_ops
    model = _range_model(start, limit, delta)
    block = import_model(model)
    for b in (1, 2, 3, 7):
        _assert_matches_ort(model, block, np.random.RandomState(b).randn(b, 6).astype("f"))
    block.hybridize()
    _assert_matches_ort(model, block, np.random.RandomState(0).randn(4, 6).astype("f"))
    assert "shape_array" not in graph_ops(block), "the batch comes from arange_like, not shape ops"


def test_float_range_over_the_batch():
    from gluontl.onnx import import_model
    model = _range_model((0.5, 0), (0.5, 2), (0.5, 0), dtype=np.float32)
    block = import_model(model)
    for b in (1, 2, 5):
        _assert_matches_ort(model, block, np.zeros((b, 6), np.float32))


@pytest.mark.parametrize("start,limit,delta,match", [
    ((0, 0), (10, -1), (1, 0), "length .* is not a whole multiple"),  # 10 - N: shrinks with the batch
    ((0, 0), (0, 6), (0, 1), "step depends on the batch size"),
])
def test_range_over_the_batch_refuses_what_it_cannot_express(start, limit, delta, match):
    from gluontl.onnx import import_model
    with pytest.raises(OnnxImportError, match=f"range_b.*{match}"):
        import_model(_range_model(start, limit, delta))


def test_tile_by_the_batch_size_broadcasts_at_run_time():
    """``x[:1].repeat(N, 1)``: the repeat of a length-1 axis by the batch is a broadcast."""
    from onnx import helper
    from gluontl.onnx import import_model
    nodes = [helper.make_node("Slice", ["x", "zero", "one"], ["first"]),
             helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
             helper.make_node("Concat", ["n1", "one"], ["reps"], axis=0),
             helper.make_node("Tile", ["first", "reps"], ["tiled"]),
             helper.make_node("Add", ["tiled", "x"], ["y"])]
    model = _batch_model(nodes, {"zero": i64(0), "one": i64(1)}, [6])
    block = import_model(model)
    for b in (1, 2, 5):
        _assert_matches_ort(model, block, np.random.RandomState(b).randn(b, 6).astype("f"))


def test_tile_of_the_batch_axis_by_the_batch_size_is_refused():
    """Tiling N rows N times gives N² rows: no batch-free form, so a clear error."""
    from onnx import helper
    from gluontl.onnx import import_model
    nodes = [helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
             helper.make_node("Concat", ["n1", "one"], ["reps"], axis=0),
             helper.make_node("Tile", ["x", "reps"], ["y"], name="tile_nn")]
    with pytest.raises(OnnxImportError, match="tile_nn.*changes with the batch size"):
        import_model(_batch_model(nodes, {"zero": i64(0), "one": i64(1)}, [6]))


@pytest.mark.parametrize("op,attrs,opset", [
    ("Shape", {}, 13), ("Shape", {"start": 1, "end": -1}, 15), ("Size", {}, 13)])
@pytest.mark.parametrize("batch", [None, "N"])
def test_graph_output_that_is_the_inputs_shape(op, attrs, opset, batch):
    """A static shape folds to a constant; the output keeps int64 (not the float32 MXNet's
    SymbolBlock assumes when no input reaches the output). With a free batch it runs."""
    from onnx import helper

    from gluontl.onnx import import_model
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", 1, [batch or 2, 3, 4])],
        [helper.make_tensor_value_info("y", 7, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    block = import_model(model)
    for b in ((2, 5) if batch else (2,)):
        x = np.zeros((b, 3, 4), np.float32)
        ref = ort_run(model, {"x": x})[0]
        got = block(mx.nd.array(x)).asnumpy()
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got.reshape(ref.shape), ref)


