import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import conv3x3_np, ort_run
from tests.onnx.opcheck import check, check_grad, run_ort

from gluontl.errors import OnnxImportError
from gluontl.onnx import registry
from gluontl.onnx.registry import Tensor



def f(*shape):
    return np.random.randn(*shape).astype("f")


def terms(w, transpose=False, group=1):
    """Products summed into one output (+1 for the bias): C_in/group · kernel size."""
    per_group_in = w.shape[0] // group if transpose else w.shape[1]
    return per_group_in * int(np.prod(w.shape[2:])) + 1


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((2, 3, 9, 8), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
    ((2, 3, 9, 8), (4, 3, 3, 3), {"strides": [2, 2], "pads": [0, 1, 2, 1]}),          # asymmetric
    ((2, 4, 9, 8), (4, 1, 3, 3), {"group": 4, "dilations": [2, 1], "pads": [2, 1, 2, 1]}),  # depthwise
    ((2, 4, 9, 8), (6, 2, 3, 2), {"group": 2, "strides": [1, 2]}),
    ((2, 3, 9, 8), (4, 3, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((2, 3, 9, 8), (4, 3, 4, 4), {"auto_pad": "SAME_LOWER", "strides": [2, 3]}),
    ((2, 3, 9, 8), (4, 3, 3, 3), {"auto_pad": "VALID", "strides": [2, 2]}),
    ((2, 3, 11), (5, 3, 3), {"pads": [2, 0], "strides": [2]}),                       # 1-D asymmetric
    ((1, 2, 5, 6, 7), (3, 2, 3, 3, 3), {"pads": [1, 0, 1, 1, 1, 0], "dilations": [1, 2, 1]}),  # 3-D
])
@pytest.mark.parametrize("bias", [True, False])
def test_conv(x_shape, w_shape, attrs, bias):
    inputs = {"x": f(*x_shape), "w": f(*w_shape), "b": f(w_shape[0]) if bias else None}
    check("Conv", inputs, attrs, consts={"w", "b"}, opset=11, grad=True, terms=terms(inputs["w"]))


def test_conv_opset1_and_runtime_weights():
    check("Conv", {"x": f(1, 2, 6, 6), "w": f(3, 2, 3, 3)}, {"kernel_shape": [3, 3]}, opset=1, grad=True,
          terms=2 * 9)


@pytest.mark.parametrize("x_shape,w_shape,attrs", [
    ((2, 3, 4, 5), (3, 4, 3, 3), {"strides": [2, 2]}),
    ((2, 3, 4, 5), (3, 4, 3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2], "output_padding": [1, 1]}),
    ((2, 4, 4, 5), (4, 3, 3, 3), {"group": 2, "dilations": [2, 1]}),
    ((2, 3, 4, 5), (3, 4, 3, 3), {"strides": [3, 2], "output_shape": [12, 10]}),
    ((2, 3, 4, 5), (3, 4, 3, 3), {"strides": [2, 2], "output_shape": [8, 8]}),
    ((2, 3, 4, 5), (3, 4, 3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}),
    ((2, 3, 4, 5), (3, 4, 4, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}),
    ((2, 3, 7), (3, 2, 3), {"strides": [2], "pads": [1, 1]}),
    ((1, 2, 3, 4, 3), (2, 2, 3, 3, 2), {"strides": [2, 1, 2]}),
    ((2, 6, 4, 4), (6, 1, 2, 2), {"strides": [2, 2]}),  # one output channel (PP-OCR det's last layer)
    ((2, 6, 4, 4), (6, 1, 3, 3), {"strides": [2, 2], "output_shape": [10, 9]}),
])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose(x_shape, w_shape, attrs, bias):
    group = attrs.get("group", 1)
    inputs = {"x": f(*x_shape), "w": f(*w_shape), "b": f(w_shape[1] * group) if bias else None}
    check("ConvTranspose", inputs, attrs, consts={"w", "b"}, opset=11, grad=True,
          terms=terms(inputs["w"], True, group))


def test_conv_same_padding_needs_static_shape():
    model, _ = run_ort("Conv", {"x": f(1, 2, 6, 6), "w": f(3, 2, 3, 3)}, {"auto_pad": "SAME_UPPER"}, {"w"}, 11)
    node = registry.node_from_proto(model.graph.node[0], 11)
    x = Tensor("x", mx.sym.var("x"), shape=(None, 2, None, None))
    w = Tensor("w", mx.sym.var("w"), shape=(3, 2, 3, 3))
    with pytest.raises(OnnxImportError, match="conv_node.*input_shapes"):
        registry.get("Conv", 11)(node, [x, w, None])


@settings(max_examples=25, deadline=None, derandomize=True)
@given(st.data())
def test_conv_geometry_matches_onnxruntime(data):
    """Random kernel/stride/pad/dilation/group/output_padding combinations."""
    transpose = data.draw(st.booleans())
    n = data.draw(st.integers(1, 2))
    group = data.draw(st.sampled_from([1, 2]))
    kernel = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    strides = data.draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    dilations = data.draw(st.lists(st.integers(1, 2), min_size=n, max_size=n))
    pads = [data.draw(st.integers(0, k - 1)) for k in kernel * 2]
    sizes = [data.draw(st.integers((k - 1) * d + 1, 6)) for k, d in zip(kernel, dilations)]
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dilations, "group": group}
    if data.draw(st.booleans()) and (transpose or dilations == [1] * n):  # onnxruntime: no dilated SAME Conv
        attrs["auto_pad"] = data.draw(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    else:
        attrs["pads"] = pads
    c_in, c_out = 2 * group, 3 * group
    if transpose:
        attrs["output_padding"] = [data.draw(st.integers(0, s - 1)) for s in strides]
        w = f(c_in, c_out // group, *kernel)
    else:
        w = f(c_out, c_in // group, *kernel)
    inputs = {"x": f(2, c_in, *sizes), "w": w, "b": f(c_out)}
    check("ConvTranspose" if transpose else "Conv", inputs, attrs, consts={"w", "b"}, opset=11, grad=True,
          terms=terms(w, transpose, group))


def test_conv_transpose_crop_and_late_bias_gradients():
    inputs = {"x": f(1, 2, 3, 3), "w": f(2, 2, 2, 2), "b": f(2)}
    check_grad("ConvTranspose", inputs, {"strides": [2, 2], "output_shape": [8, 5]}, opset=11)
    check_grad("Conv", {"x": f(1, 2, 5, 4), "w": f(2, 1, 2, 2)}, {"group": 2, "pads": [0, 1, 1, 0]}, opset=11)


@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 2)])
def test_one_channel_conv_transpose_after_conv_trains(kernel, stride):
    """A conv feeding a 1-output-channel ConvTranspose (segmentation/detection map heads): oneDNN
    fails in that Deconvolution's backward, so the converter must avoid it. Forward against
    onnxruntime, the weight gradient against the sum written out in numpy."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from gluontl.onnx import import_model

    rng = np.random.RandomState(7)
    c = 16
    cw = rng.randn(c, 3, 3, 3).astype("f") * 0.2
    tw = rng.randn(c, 1, kernel, kernel).astype("f")
    tb = rng.randn(1).astype("f")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "cw"], ["h"], name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
         helper.make_node("ConvTranspose", ["h", "tw", "tb"], ["y"], name="up", strides=[stride, stride],
                          kernel_shape=[kernel, kernel])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1, "H", "W"])],
        [numpy_helper.from_array(cw, "cw"), numpy_helper.from_array(tw, "tw"), numpy_helper.from_array(tb, "tb")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    block = import_model(model)
    block.hybridize()
    x = rng.randn(2, 3, 8, 8).astype("f")
    ref = ort_run(model, {"x": x})[0]
    with mx.autograd.record():
        y = block(mx.nd.array(x))
        weights = mx.nd.array(rng.randn(*ref.shape).astype("f"))
        (y * weights).sum().backward()
    np.testing.assert_allclose(y.asnumpy(), ref, rtol=1e-4, atol=1e-4)
    params = block.collect_params()
    h = conv3x3_np(x, cw)
    want = np.zeros_like(tw, dtype=np.float64)
    r = weights.asnumpy().astype(np.float64)
    for i in range(h.shape[2]):
        for j in range(h.shape[3]):
            patch = r[:, 0, i * stride:i * stride + kernel, j * stride:j * stride + kernel]
            want[:, 0] += np.einsum("nc,nab->cab", h[:, :, i, j], patch)
    got = params["tw"].grad().asnumpy()
    bound = 1e-5 * np.abs(h).sum() * np.abs(r).max()  # float32 accumulation over every product
    assert np.abs(got - want).max() <= bound
    assert abs(params["tb"].grad().asnumpy()[0] - r.sum()) <= 1e-5 * np.abs(r).sum()


