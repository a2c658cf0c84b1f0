import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opcheck import check, check_grad, run_ort

from gluontl.errors import OnnxImportError
from gluontl.onnx import registry
from gluontl.onnx.registry import Tensor



def f(*shape):
    return np.random.randn(*shape).astype("f")


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
    check("Conv", inputs, attrs, consts={"w", "b"}, opset=11, grad=True, rtol=1e-4, atol=1e-4)


def test_conv_opset1_and_runtime_weights():
    check("Conv", {"x": f(1, 2, 6, 6), "w": f(3, 2, 3, 3)}, {"kernel_shape": [3, 3]}, opset=1, grad=True,
          atol=1e-4)


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
    check("ConvTranspose", inputs, attrs, consts={"w", "b"}, opset=11, grad=True, rtol=1e-4, atol=1e-4)


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
          rtol=1e-4, atol=1e-4)


def test_conv_transpose_crop_and_late_bias_gradients():
    inputs = {"x": f(1, 2, 3, 3), "w": f(2, 2, 2, 2), "b": f(2)}
    check_grad("ConvTranspose", inputs, {"strides": [2, 2], "output_shape": [8, 5]}, opset=11)
    check_grad("Conv", {"x": f(1, 2, 5, 4), "w": f(2, 1, 2, 2)}, {"group": 2, "pads": [0, 1, 1, 0]}, opset=11)
