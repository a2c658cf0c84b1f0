import numpy as np
import pytest
from tests.helpers import assert_f32_close, ort_run
from tests.onnx.opcheck import check, check_grad, i64, run_mx, run_ort

X = np.random.RandomState(3).uniform(0.5, 2.0, (2, 3, 4)).astype(np.float32)
OPS = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
       "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", OPS)
def test_reduce_attr_form(op):
    for axes, keep in [([1], 1), ([0, -1], 0), (None, 1)]:
        attrs = {"keepdims": keep} if axes is None else {"axes": axes, "keepdims": keep}
        check(op, {"x": X}, attrs, opset=11, grad=True, terms=X.size)
    # all axes without keepdims is 0-d in ONNX and shape (1,) in MXNet
    model, ref = run_ort(op, {"x": X}, {"keepdims": 0}, opset=11)
    got, _ = run_mx(model, {"x": X}, opset=11)
    assert ref[0].shape == () and got[0].shape == (1,)
    assert_f32_close(got[0][0], ref[0], terms=X.size)


@pytest.mark.parametrize("op", OPS)
def test_reduce_input_form(op):
    opset = 13 if op == "ReduceSum" else 18
    check(op, {"x": X, "a": i64(-2)}, {"keepdims": 0}, consts={"a"}, opset=opset, grad=True,
          terms=X.shape[-2])
    check(op, {"x": X}, {"keepdims": 1}, opset=opset, grad=True, terms=X.size)
    # noop_with_empty_axes: no axes means identity rather than "all axes"
    check(op, {"x": X}, {"noop_with_empty_axes": 1}, opset=opset, grad=True)


def test_log_sum_exp_is_stable():
    x = np.array([[1000.0, 1000.0], [-1000.0, 0.0]], np.float32)
    check("ReduceLogSumExp", {"x": x}, {"axes": [1]}, opset=13, grad=True)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_extreme(op):
    x = np.array([[1, 3, 3, 0], [2, 0, 0, 2], [5, 5, 5, 5]], np.float32)
    for axis in (0, 1, -1):
        for keep in (0, 1):
            for last in (0, 1):
                check(op, {"x": x}, {"axis": axis, "keepdims": keep, "select_last_index": last},
                      opset=13)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumsum(exclusive, reverse):
    x = np.random.randn(3, 5).astype(np.float32)
    for axis in (1, -2):
        check("CumSum", {"x": x, "a": np.array(axis, np.int64)},
              {"exclusive": exclusive, "reverse": reverse}, consts={"a"}, grad=True, terms=x.shape[axis])


@pytest.mark.parametrize("largest", [1, 0])
def test_topk(largest):
    x = np.random.permutation(24).reshape(2, 3, 4).astype(np.float32)
    check("TopK", {"x": x, "k": i64(2)}, {"axis": 1, "largest": largest}, consts={"k"},
          n_outputs=2, opset=11, grad=True)
    check("TopK", {"x": x}, {"k": 3}, n_outputs=2, opset=9)


def test_gradients_match_central_differences():
    # distinct values 0.1 apart: no max within the 1e-2 step of another (central differences
    # across the kink of ReduceMax would average two one-sided slopes)
    x = (0.5 + 0.1 * np.random.permutation(12)).reshape(2, 3, 2).astype(np.float32)
    for op in ("ReduceLogSumExp", "ReduceL2", "ReduceProd", "ReduceLogSum", "ReduceMax"):
        check_grad(op, {"x": x}, {"axes": [1], "keepdims": 0}, opset=13)
    for exclusive, reverse in [(1, 0), (0, 1), (1, 1)]:
        check_grad("CumSum", {"x": x, "a": np.array(1, np.int64)},
                   {"exclusive": exclusive, "reverse": reverse}, consts={"a"})
    check_grad("TopK", {"x": np.random.permutation(12).reshape(3, 4).astype(np.float32),
                        "k": i64(2)}, consts={"k"}, opset=11)


def _import_empty(op, keep_axis=1, dtype=np.float32):
    from tests.onnx.opcheck import make_model

    from gluontl.onnx import import_model
    x = np.zeros((2, 0, 4), dtype)
    model = make_model(op, {"x": x, "a": i64(keep_axis)}, {"keepdims": 1}, consts={"a"},
                       opset=13 if op == "ReduceSum" else 18)
    return model, x, import_model(model)


@pytest.mark.parametrize("op", [o for o in OPS if o != "ReduceMean"])
def test_reduction_over_no_elements_is_the_ops_identity(op):
    """ReduceMax of nothing is -inf, ReduceProd 1, ReduceL2 0, ... as in onnxruntime."""
    import mxnet as mx
    model, x, block = _import_empty(op)
    ref = ort_run(model, {"x": x})[0]
    got = block(mx.nd.array(x)).asnumpy()
    assert got.shape == ref.shape == (2, 1, 4)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("op,axis,match", [
    ("ReduceMean", 1, "no elements"),                  # 0 / 0
    ("ReduceSum", 2, "keeps a zero-size axis"),         # the output (2, 0, 1) is empty too
])
def test_reductions_of_empty_inputs_without_an_exact_result_are_refused(op, axis, match):
    from gluontl.errors import OnnxImportError
    with pytest.raises(OnnxImportError, match=f"{op} node .*'x'.*\\(2, 0, 4\\).*{match}"):
        _import_empty(op, axis)


def test_other_ops_on_an_empty_input_are_refused_by_name():
    """The function expansion of ReduceL1 starts with Abs, which MXNet cannot run on an empty
    tensor: refused at import, naming the node, not an MXNetError at the first call."""
    from tests.onnx.opcheck import make_model

    from gluontl.errors import OnnxImportError
    from gluontl.onnx import import_model
    model = make_model("Abs", {"x": np.zeros((2, 0, 4), np.float32)}, {}, opset=13)
    with pytest.raises(OnnxImportError, match="Abs node 'abs_node'.*'x'.*empty"):
        import_model(model)


