import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import ort_session
from tests.onnx.opcheck import check, check_grad, run_ort

from gluontl.errors import OnnxImportError

X2 = np.random.RandomState(0).randn(2, 3, 9, 8).astype("f")

CASES = [
    ({"kernel_shape": [3, 3], "strides": [2, 2]}, 12),
    ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, 7),
    ({"kernel_shape": [3, 2], "strides": [2, 2], "pads": [0, 1, 2, 0]}, 12),      # asymmetric
    ({"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, 12),
    ({"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1}, 12),  # last window dropped
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 0, 1], "ceil_mode": 1}, 12),
    ({"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}, 12),
    ({"kernel_shape": [2, 4], "auto_pad": "SAME_LOWER", "strides": [2, 3]}, 12),
]


@pytest.mark.parametrize("attrs,opset", CASES + [
    ({"kernel_shape": [2, 2], "dilations": [2, 3], "pads": [1, 1, 0, 1]}, 12),
    ({"kernel_shape": [3, 3], "storage_order": 1}, 8),
])
def test_max_pool(attrs, opset):
    check("MaxPool", {"x": X2}, attrs, opset=opset, grad=True)


@pytest.mark.parametrize("attrs,opset", CASES + [
    ({"kernel_shape": [2, 2], "dilations": [2, 3], "pads": [1, 1, 0, 1]}, 19),
])
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool(attrs, opset, include_pad):
    attrs = dict(attrs, count_include_pad=include_pad)
    check("AveragePool", {"x": X2}, attrs, opset=max(opset, 7), grad=True,
          terms=int(np.prod(attrs["kernel_shape"])))


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("x_shape,attrs", [
    ((2, 3, 11), {"kernel_shape": [3], "strides": [2], "pads": [2, 0]}),
    ((1, 2, 6, 7, 5), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [1, 1, 0, 1, 1, 0]}),
])
def test_pool_1d_3d(op, x_shape, attrs):
    check(op, {"x": np.random.randn(*x_shape).astype("f")}, attrs, opset=12, grad=True,
          terms=int(np.prod(attrs["kernel_shape"])))


@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "p": 2},
    {"kernel_shape": [2, 3], "p": 1, "strides": [2, 1], "pads": [1, 0, 0, 1]},
    {"kernel_shape": [2, 2], "p": 3, "dilations": [2, 2]},
])
def test_lp_pool(attrs):
    check("LpPool", {"x": X2}, attrs, opset=18, grad=True, terms=int(np.prod(attrs["kernel_shape"])))


@pytest.mark.parametrize("op,attrs", [("GlobalAveragePool", {}), ("GlobalMaxPool", {}),
                                      ("GlobalLpPool", {"p": 2}), ("GlobalLpPool", {"p": 3})])
@pytest.mark.parametrize("shape", [(2, 3, 9, 8), (2, 3, 7)])
def test_global_pool(op, attrs, shape):
    check(op, {"x": np.random.randn(*shape).astype("f")}, attrs, opset=2, grad=True,
          terms=int(np.prod(shape[2:])))


def _ties(*shape, seed=0):
    """Small integers: many windows hold their maximum twice, so the tie rule is tested."""
    return np.random.RandomState(seed).randint(-3, 4, shape).astype("f")


def _assert_indices_match(x, attrs, opset=12):
    from tests.onnx.opcheck import run_mx
    model, ref = run_ort("MaxPool", {"x": x}, attrs, opset=opset, n_outputs=2)
    got, _ = run_mx(model, {"x": x}, opset=opset)
    assert got[1].dtype == np.int64
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_array_equal(got[1], ref[1])


@pytest.mark.parametrize("attrs", [a for a, _ in CASES] + [
    {"kernel_shape": [2, 2], "dilations": [2, 1], "pads": [1, 0, 0, 1]},
    {"kernel_shape": [3, 2], "strides": [2, 1], "storage_order": 1},
    {"kernel_shape": [2, 3], "pads": [1, 1, 0, 2], "ceil_mode": 1, "storage_order": 1},
])
def test_max_pool_indices_match_onnxruntime(attrs):
    """The flat argmax positions (N and C counted, row- or column-major) as onnxruntime
    writes them, ties included: its first maximum in row-major window order."""
    _assert_indices_match(_ties(2, 3, 9, 8), attrs)


@pytest.mark.parametrize("attrs", [{"kernel_shape": [2, 2], "pads": [1, 1, 0, 0]},
                                   {"kernel_shape": [2, 3], "pads": [1, 1, 1, 1], "ceil_mode": 1, "strides": [2, 2]},
                                   {"kernel_shape": [2, 2], "dilations": [2, 1], "pads": [1, 0, 0, 1]}])
def test_max_pool_indices_of_windows_holding_only_minus_inf(attrs):
    """onnxruntime names the first input position of such a window (never a pad) and returns
    -inf; float32 lowest as padding (and MXNet's Pooling, which starts there) beat -inf."""
    x = _ties(1, 2, 5, 4, seed=2)
    x[0, 0] = -np.inf  # a channel of -inf only
    x[0, 1, ::2] = -np.inf  # rows of -inf among finite values
    _assert_indices_match(x, attrs)


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 10), {"kernel_shape": [3], "strides": [2], "pads": [1, 0]}),
    ((1, 2, 5, 6, 4), {"kernel_shape": [2, 3, 2], "strides": [2, 1, 2], "pads": [0, 1, 1, 1, 0, 0]}),
    ((1, 2, 5, 6, 4), {"kernel_shape": [2, 2, 2], "storage_order": 1}),
])
def test_max_pool_indices_in_1d_and_3d(shape, attrs):
    _assert_indices_match(_ties(*shape, seed=1), attrs)


def _indices_model(dims):
    from onnx import TensorProto, helper
    graph = helper.make_graph(
        [helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    model.ir_version = 8
    return model


def test_max_pool_indices_with_a_free_batch_count_the_batch():
    import mxnet as mx

    from gluontl.onnx import import_model
    model = _indices_model(["N", 2, 6, 4])
    block = import_model(model)
    sess = ort_session(model)
    for b in (1, 3):
        x = _ties(b, 2, 6, 4, seed=b)
        got = block(mx.nd.array(x))
        for g, r in zip(got, sess.run(None, {"x": x})):
            np.testing.assert_array_equal(g.asnumpy(), r)


def test_max_pool_indices_of_unknown_spatial_sizes_are_refused():
    from gluontl.onnx import import_model
    with pytest.raises(OnnxImportError, match="MaxPool node .*Indices output needs static"):
        import_model(_indices_model(["N", 2, "H", "W"]))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.data())
def test_pool_geometry_matches_onnxruntime(data):
    """Random kernel/stride/pad/dilation/ceil combinations, all paths (fused, padded, sliced)."""
    op = data.draw(st.sampled_from(["MaxPool", "AveragePool"]))
    n = data.draw(st.integers(1, 2))
    kernel = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    strides = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    dilations = data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    pads = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]
    sizes = [data.draw(st.integers(max((k - 1) * d + 1, 2), 7)) for k, d in zip(kernel, dilations)]
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads, "ceil_mode": data.draw(st.integers(0, 1))}
    if any(d > 1 for d in dilations):
        attrs["dilations"] = dilations
    if op == "AveragePool":
        attrs["count_include_pad"] = data.draw(st.integers(0, 1))
    x = np.random.randn(2, 2, *sizes).astype("f")
    check(op, {"x": x}, attrs, opset=19 if op == "AveragePool" else 12, grad=True, terms=int(np.prod(kernel)))
    if op == "MaxPool":
        _assert_indices_match(np.round(x * 2), {**attrs, "storage_order": data.draw(st.integers(0, 1))})


@pytest.mark.parametrize("op,attrs", [
    ("AveragePool", {"kernel_shape": [2, 3], "strides": [2, 2], "pads": [1, 0, 0, 2], "ceil_mode": 1}),
    ("AveragePool", {"kernel_shape": [2, 2], "dilations": [2, 1], "count_include_pad": 1, "pads": [1, 1, 1, 0]}),
    ("MaxPool", {"kernel_shape": [2, 2], "dilations": [1, 2], "pads": [0, 1, 1, 0], "ceil_mode": 1}),
    ("LpPool", {"kernel_shape": [2, 2], "p": 3, "pads": [1, 0, 0, 1]}),
])
def test_pool_fallback_gradients_match_central_differences(op, attrs):
    x = (np.random.permutation(2 * 5 * 6).reshape(1, 2, 5, 6) / 10.0 - 3).astype("f")  # distinct values: no max ties
    check_grad(op, {"x": x}, attrs, opset=19 if op != "MaxPool" else 12)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("attrs", [{"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                                   {"kernel_shape": [2, 2], "dilations": [2, 2]}])
def test_max_pool_of_8_bit_integers_is_exact(dtype, attrs):
    """MXNet pools floats only; float32 holds every 8-bit value, so the result is exact."""
    info = np.iinfo(dtype)
    x = np.random.RandomState(0).randint(info.min, info.max + 1, (2, 3, 7, 8)).astype(dtype)
    got = check("MaxPool", {"x": x}, attrs, opset=12)
    assert got[0].dtype == dtype


def test_max_pool_of_wide_integers_is_refused():
    """ONNX defines no int32 MaxPool (onnxruntime rejects the model): the converter alone."""
    from tests.onnx.opcheck import build_mx, make_model
    x = {"x": np.zeros((1, 1, 4, 4), np.int32)}
    with pytest.raises(OnnxImportError, match="int32 input"):
        build_mx(make_model("MaxPool", x, {"kernel_shape": [2, 2]}, opset=12), x, opset=12)
