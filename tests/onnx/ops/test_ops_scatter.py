"""ScatterElements / Scatter / ScatterND against onnxruntime: every reduction, negative and
repeated indices (onnxruntime applies updates in order), indices known at import or only at
run time, gradients to data and updates; and the free batch of an imported model."""
import mxnet as mx
import numpy as np
import pytest
from onnx import helper
from tests.helpers import ort_session
from tests.onnx.opcheck import check, check_grad, i64

from gluontl.errors import OnnxImportError
from gluontl.onnx import import_model


def _data(*shape, seed=0):
    return np.random.RandomState(seed).randn(*shape).astype(np.float32)


@pytest.mark.parametrize("const", [False, True], ids=["runtime-indices", "const-indices"])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_scatter_elements_axes(axis, const):
    x = _data(3, 4, 5)
    shape = list(x.shape)
    shape[axis] = 2
    rs = np.random.RandomState(1)
    idx = rs.randint(-x.shape[axis], x.shape[axis], size=shape).astype(np.int64)
    check("ScatterElements", {"x": x, "i": idx, "u": _data(*shape, seed=2)}, {"axis": axis},
          consts={"i"} if const else (), grad=True)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_repeated_indices_and_reductions(reduction):
    x = _data(2, 5)
    idx = i64([1, 1, 4, -1], [0, 3, 3, 0])  # each row writes one position twice
    check("ScatterElements", {"x": x, "i": idx, "u": _data(2, 4, seed=3)},
          {"axis": 1, "reduction": reduction}, opset=18, grad=True)


def test_scatter_opset10_is_scatter_elements():
    x = _data(4, 3)
    check("Scatter", {"x": x, "i": i64([3, 0, 1], [1, 2, 0]), "u": _data(2, 3, seed=1)}, {"axis": 0},
          opset=10, grad=True)


@pytest.mark.parametrize("const", [False, True], ids=["runtime-indices", "const-indices"])
@pytest.mark.parametrize("idx", [
    i64([1], [-1]),                                   # whole rows
    i64([[0, 2], [1, -4]]),                           # (row, col) pairs, batched index axes
    i64([0, 1, 2], [1, 3, 4], [-1, 0, 0]),            # single elements
], ids=["k1", "k2", "k3"])
def test_scatter_nd(idx, const):
    x = _data(2, 4, 5)
    k = idx.shape[-1]
    upd = _data(*idx.shape[:-1], *x.shape[k:], seed=4)
    check("ScatterND", {"x": x, "i": idx, "u": upd}, consts={"i"} if const else (), grad=True)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_repeated_indices_and_reductions(reduction):
    x = _data(3, 4)
    idx = i64([2], [0], [2], [-1])  # row 2 three times
    check("ScatterND", {"x": x, "i": idx, "u": _data(4, 4, seed=5)}, {"reduction": reduction},
          opset=18, grad=True)


def test_scatter_gradients_match_central_differences():
    check_grad("ScatterElements", {"x": _data(2, 3), "i": i64([2, 0], [1, 1]), "u": _data(2, 2, seed=1)},
               {"axis": 1, "reduction": "mul"}, consts={"i"}, opset=18)
    check_grad("ScatterND", {"x": _data(3, 2), "i": i64([1], [2]), "u": _data(2, 2, seed=2)},
               {"reduction": "max"}, consts={"i"}, opset=18)


def test_scatter_into_a_corner_is_refused():
    """Indices smaller than the data off the scatter axis write into a corner, which the
    match formulation does not pad to: a clear error rather than a wrong shape."""
    with pytest.raises(OnnxImportError, match="scatterelements_node.*off axis"):
        check("ScatterElements", {"x": _data(3, 4), "i": i64([0, 1]), "u": _data(1, 2)}, {"axis": 1})


def test_scatter_nd_over_the_free_batch_axis():
    """``y[arange(N), 0] = v`` on an imported model: the match sizes come from the data at
    run time, so any batch size works."""
    graph = helper.make_graph(
        [helper.make_node("ScatterND", ["x", "i", "u"], ["y"])], "g",
        [helper.make_tensor_value_info("x", 1, ["N", 4]), helper.make_tensor_value_info("i", 7, ["N", 2]),
         helper.make_tensor_value_info("u", 1, ["N"])], [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    block = import_model(model)
    sess = ort_session(model)
    for b in (1, 3):
        rows = np.stack([np.arange(b), np.full(b, -1)], 1).astype(np.int64)
        feeds = {"x": _data(b, 4), "i": rows, "u": _data(b, seed=b)}
        got = block(mx.nd.array(feeds["x"]), mx.nd.array(rows, dtype="int64"), mx.nd.array(feeds["u"]))
        assert np.array_equal(got.asnumpy(), sess.run(None, feeds)[0])
