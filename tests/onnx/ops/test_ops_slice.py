import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import ort_run, ort_session
from tests.onnx.opcheck import check, check_grad, i64

from gluontl.errors import OnnxImportError

X = np.random.RandomState(2).randn(3, 4, 5).astype(np.float32)
BIG = np.iinfo(np.int64).max


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    b = np.random.randn(3, 4, 5).astype(np.float32)
    check("Concat", {"a": X, "b": b, "c": X * 2}, {"axis": axis}, grad=True)


def test_split_forms():
    x = np.random.randn(2, 7).astype(np.float32)
    check("Split", {"x": x}, {"axis": 1, "split": [3, 4]}, opset=11, n_outputs=2, grad=True)
    check("Split", {"x": x, "s": i64(2, 2, 3)}, {"axis": -1}, consts={"s"}, opset=13,
          n_outputs=3, grad=True)
    check("Split", {"x": x.T.copy()}, opset=13, n_outputs=7, grad=True)  # equal parts
    # opset 18 num_outputs with an uneven last part: 7 -> 3, 3, 1
    check("Split", {"x": x}, {"axis": 1, "num_outputs": 3}, opset=18, n_outputs=3, grad=True)
    check("Split", {"x": x}, {"axis": 0, "num_outputs": 2}, opset=18, n_outputs=2, grad=True)


def test_split_with_a_zero_size_part_is_refused_by_name():
    """The empty part (as torch.split can write) is a tensor MXNet cannot hold."""
    x = np.random.randn(2, 7).astype(np.float32)
    with pytest.raises(OnnxImportError, match=r"split_node.*\[3, 0, 4\] make an empty output"):
        check("Split", {"x": x, "s": i64(3, 0, 4)}, {"axis": 1}, consts={"s"}, opset=13,
              n_outputs=3)


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ((1,), (3,), (1,), None),
    ((0, -3), (BIG, -1), (0, 2), None),
    ((-1,), (-BIG,), (1,), (-1,)),           # reverse the whole axis
    ((4, 0), (0, BIG), (2, 0), (-2, 2)),
    ((-100,), (2,), (-1,), None),            # clamped start
    ((1, 1, 1), (3, 3, 4), None, (1, 1, 2)),
])
def test_slice_input_form(starts, ends, axes, steps):
    ins = {"x": X, "s": i64(*starts), "e": i64(*ends)}
    if axes is not None or steps is not None:
        ins["a"] = i64(*(axes if axes is not None else range(len(starts))))
    if steps is not None:
        ins["t"] = i64(*steps)
    check("Slice", ins, consts=set(ins) - {"x"}, opset=13, grad=True)


def test_slice_attr_form_and_empty_error():
    check("Slice", {"x": X}, {"starts": [0, 1], "ends": [2, 1000], "axes": [0, 2]}, opset=9,
          grad=True)
    with pytest.raises(OnnxImportError, match="empty"):
        check("Slice", {"x": X}, {"starts": [3], "ends": [1], "axes": [1]}, opset=9)
    # a start past the end clamps to the end: empty too (onnx's slice_start_out_of_bounds)
    with pytest.raises(OnnxImportError, match="slice_node.*axis 1 is empty"):
        check("Slice", {"x": X, "s": i64(1000), "e": i64(BIG), "a": i64(1)},
              consts={"s", "e", "a"}, opset=13)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(axis):
    idx = np.array([[0, -1], [2, 1]], np.int64)
    check("Gather", {"x": X, "i": idx}, {"axis": axis}, grad=True)           # runtime indices
    check("Gather", {"x": X, "i": idx}, {"axis": axis}, consts={"i"}, grad=True)
    check("Gather", {"x": X, "i": np.array(-2, np.int64)}, {"axis": axis}, consts={"i"},
          grad=True)                                                         # scalar: a slice
    check("Gather", {"x": X, "i": i64(1, 2)}, {"axis": axis}, consts={"i"}, grad=True)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_gather_elements(axis):
    idx_shape = list(X.shape)
    idx_shape[axis] = 2
    idx = np.random.randint(-X.shape[axis], X.shape[axis], size=idx_shape).astype(np.int64)
    check("GatherElements", {"x": X, "i": idx}, {"axis": axis}, grad=True)


def test_gather_nd():
    idx = np.array([[[0, -1], [2, 3]], [[1, 0], [-3, 2]]], np.int64)
    check("GatherND", {"x": X, "i": idx}, grad=True)
    check("GatherND", {"x": X, "i": np.array([[1], [-1]], np.int64)}, grad=True)
    check("GatherND", {"x": X, "i": np.array([[1, -1], [0, 4], [-1, 0]], np.int64)},
          {"batch_dims": 1}, grad=True)
    check("GatherND", {"x": X, "i": np.array([[-2], [0], [3]], np.int64)},
          {"batch_dims": 1}, consts={"i"}, grad=True)


def test_gather_nd_negative_index_into_the_free_batch_axis():
    """Negative run-time indices along an axis whose size is only known at run time (the
    batch) are fixed with the run-time size; known axes use their static size."""
    from onnx import helper
    from gluontl.onnx import import_model
    model = helper.make_model(helper.make_graph(
        [helper.make_node("GatherND", ["x", "i"], ["y"])], "g",
        [helper.make_tensor_value_info("x", 1, ["N", 4]), helper.make_tensor_value_info("i", 7, [3, 2])],
        [helper.make_tensor_value_info("y", 1, None)]), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    block = import_model(model)
    i = i64([-1, -1], [0, 2], [-2, 1])
    for b in (2, 5):
        feeds = {"x": np.random.RandomState(b).randn(b, 4).astype("f"), "i": i}
        ref = ort_run(model, feeds)[0]
        assert np.array_equal(block(mx.nd.array(feeds["x"]), mx.nd.array(i, dtype="int64")).asnumpy(), ref)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_generic(mode):
    pads = i64(1, 0, 2, 0, 2, 1)
    ins = {"x": X, "p": pads}
    if mode == "constant":
        ins["v"] = np.array(1.5, np.float32)
    check("Pad", ins, {"mode": mode}, consts={"p", "v"}, opset=19 if mode == "wrap" else 13,
          grad=True)


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_nchw_fast_path_and_attr_form(mode):
    x = np.random.randn(2, 3, 4, 5).astype(np.float32)
    check("Pad", {"x": x, "p": i64(0, 0, 1, 2, 0, 0, 2, 1)}, {"mode": mode}, consts={"p"},
          opset=13, grad=True)
    check("Pad", {"x": x}, {"mode": mode, "pads": [0, 0, 1, 2, 0, 0, 2, 1], "value": 0.5},
          opset=2, grad=True)
    x5 = np.random.randn(1, 2, 3, 4, 5).astype(np.float32)
    check("Pad", {"x": x5, "p": i64(0, 0, 1, 2, 1, 0, 0, 2, 1, 3)}, {"mode": mode},
          consts={"p"}, opset=13, grad=True)


def test_pad_negative_and_axes():
    check("Pad", {"x": X, "p": i64(-1, 2, 0, 0, -2, 1)}, consts={"p"}, opset=13, grad=True)
    for mode in ("reflect", "edge"):  # crop one end, pad the other
        check("Pad", {"x": X, "p": i64(0, 1, 2, 1, -1, 1)}, {"mode": mode}, consts={"p"},
              opset=13, grad=True)
    check("Pad", {"x": X, "p": i64(1, 2), "v": np.array(0.0, np.float32), "a": i64(-1)},
          {"mode": "edge"}, consts={"p", "v", "a"}, opset=18, grad=True)
    check("Pad", {"x": np.arange(12, dtype=np.int64).reshape(3, 4), "p": i64(1, 2, 1, 0)},
          {"mode": "reflect"}, consts={"p"}, opset=13)


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_slice_matches_onnxruntime_on_random_bounds(data):
    """Non-empty slices written every ONNX way: negative, clamped or sentinel bounds."""
    n_axes = data.draw(st.integers(1, 3))
    axes = data.draw(st.permutations(range(3)))[:n_axes]
    starts, ends, steps = [], [], []
    for a in axes:
        dim, step = X.shape[a], data.draw(st.sampled_from([-3, -2, -1, 1, 2, 3]))
        p = data.draw(st.integers(0, dim - 1))
        q = data.draw(st.integers(p + 1, dim) if step > 0 else st.integers(-1, p - 1)) \
            if (step > 0 and p < dim - 1) or (step < 0 and p > 0) else (dim if step > 0 else -1)
        first = [p, p - dim] + ([-BIG] if step > 0 and p == 0 else
                                [BIG] if step < 0 and p == dim - 1 else [])
        # "before index 0" (q == -1) can only be written as a clamped negative bound
        last = [q, q - dim] if 0 <= q < dim else [q, BIG] if q == dim else [-dim - 1, -BIG]
        starts.append(data.draw(st.sampled_from(first)))
        ends.append(data.draw(st.sampled_from(last)))
        steps.append(step)
    ins = {"x": X, "s": i64(*starts), "e": i64(*ends), "a": i64(*axes), "t": i64(*steps)}
    check("Slice", ins, consts={"s", "e", "a", "t"}, opset=13)


def test_gradients_match_central_differences():
    x = np.random.randn(2, 3, 4).astype(np.float32)
    for mode in ("constant", "reflect", "edge", "wrap"):
        check_grad("Pad", {"x": x, "p": i64(0, 1, 2, 1, -1, 1)}, {"mode": mode}, consts={"p"},
                   opset=19)
    check_grad("Slice", {"x": x, "s": i64(-1, 3), "e": i64(-BIG, 0), "a": i64(1, 2),
                         "t": i64(-1, -2)}, consts={"s", "e", "a", "t"}, opset=13)
    check_grad("GatherElements", {"x": x, "i": np.array([[[0, -1, 2, 1]] * 3] * 2, np.int64)},
               {"axis": 2})
    check_grad("GatherND", {"x": x, "i": np.array([[1, -1], [0, 0]], np.int64)})
    check_grad("Gather", {"x": x, "i": np.array([[2, 0], [2, -1]], np.int64)}, {"axis": 1})


def test_pytorch_embedding_export_matches_and_trains_only_the_rows_it_reads():
    """nn.Embedding as torch.onnx writes it: Gather(weight, ids) with symbolic batch and
    sequence; ids may be negative (counted from the end, as ONNX allows)."""
    from onnx import TensorProto, helper, numpy_helper

    from gluontl.onnx import import_model
    rs = np.random.RandomState(5)
    weight = rs.randn(10, 4).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["emb.weight", "ids"], ["y"], name="/emb/Gather")], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "emb.weight")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    block = import_model(model)
    sess = ort_session(model)
    for shape in [(1, 5), (3, 7)]:
        ids = rs.randint(-10, 10, shape).astype(np.int64)
        np.testing.assert_array_equal(block(mx.nd.array(ids, dtype="int64")).asnumpy(),
                                      sess.run(None, {"ids": ids})[0])  # a copy: bit-exact
    param = block.collect_params()["emb.weight"]
    assert param.grad_req == "write"
    ids = i64(0, 0, -1, 3).reshape(1, 4)  # rows 0 (twice), 9 and 3
    with mx.autograd.record():
        loss = block(mx.nd.array(ids, dtype="int64")).sum()
    loss.backward()
    counts = np.zeros(10, np.float32)
    np.add.at(counts, [0, 0, 9, 3], 1)
    np.testing.assert_array_equal(param.grad().asnumpy(), np.repeat(counts[:, None], 4, axis=1))
