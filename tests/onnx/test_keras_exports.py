"""Keras-family ONNX graphs (issue 39 item 5), built with onnx.helper after two exporters' patterns
(files from the real tf2onnx are tests/onnx/test_tf2onnx_fixtures.py's; these replicas keep the
unoptimised per-Conv Transpose pairs and the PRelu node the real Keras path does not write):

- ``tf2onnx``: what tf2onnx / keras2onnx write for a Keras model (NHWC input ``input_1``):
  a Transpose to NCHW before each Conv and back after it, with unoptimised back-to-back pairs
  between two convolutions, ``auto_pad`` SAME_UPPER (stride 2 on an odd size) and VALID,
  a depthwise Conv, BatchNormalization on NCHW, Keras PReLU (shared_axes [1, 2]) as PRelu
  with slopes [1, 1, C] on the NHWC tensor, GlobalAveragePooling2D as ReduceMean over axes
  [1, 2], Dense as MatMul + Add, and a PReLU on the 2-D logits (slopes [C]);
- ``keras2torch``: a Keras model converted to PyTorch (weights transposed, layers kept in NHWC
  by ``permute`` calls) and exported by ``torch.onnx`` at opset 13: ``Transpose`` around every
  Conv, TF "SAME" padding as an explicit asymmetric ``Pad`` then a Conv with zero pads,
  BatchNorm split into Sub(mean) / Mul(gamma / sqrt(var + eps)) / Add(beta) on the channel-last
  tensor, PRelu with slopes [C] on NHWC (4-D), Flatten and Gemm (transB=1).

Each imports, matches onnxruntime at batch 1 and 2, hybridizes, takes an SGD step on every
weight (tests/export/test_export_keras.py re-exports them); back-to-back Transposes that cancel
are folded at import.
"""
from __future__ import annotations

import json

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gluontl.onnx import import_model
from gluontl.rules import trainable_params
from tests.helpers import assert_f32_close, ort_run

NHWC, NCHW = [0, 2, 3, 1], [0, 3, 1, 2]
SIZE = 15  # odd: SAME_UPPER at stride 2 pads one more at the bottom/right


def _init(rs, name, *shape, scale=None, positive=False):
    fan = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    a = rs.randn(*shape) * (scale if scale is not None else np.sqrt(2.0 / max(fan, 1)))
    return numpy_helper.from_array((np.abs(a) + 0.5 if positive else a).astype(np.float32), name)


def _model(nodes, inits, classes, producer):
    graph = helper.make_graph(nodes, producer, [helper.make_tensor_value_info(
        "input_1", TensorProto.FLOAT, ["N", SIZE, SIZE, 3])], [helper.make_tensor_value_info(
            "output", TensorProto.FLOAT, ["N", classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name=producer)
    onnx.checker.check_model(model)
    return model


def tf2onnx_style(classes: int = 4, seed: int = 0) -> onnx.ModelProto:
    rs = np.random.RandomState(seed)
    n = helper.make_node
    inits = [_init(rs, "conv2d/kernel", 8, 3, 3, 3), _init(rs, "conv2d/bias", 8, scale=0.1),
             _init(rs, "p_re_lu/alpha", 1, 1, 8, scale=0.2),
             _init(rs, "conv2d_1/kernel", 8, 8, 3, 3), _init(rs, "conv2d_1/bias", 8, scale=0.1),
             _init(rs, "depthwise/kernel", 8, 1, 3, 3), _init(rs, "depthwise/bias", 8, scale=0.1),
             _init(rs, "bn/gamma", 8, positive=True), _init(rs, "bn/beta", 8, scale=0.1),
             _init(rs, "bn/moving_mean", 8, scale=0.1), _init(rs, "bn/moving_variance", 8, positive=True),
             _init(rs, "dense/kernel", 8, classes, scale=0.4), _init(rs, "dense/bias", classes, scale=0.1),
             _init(rs, "p_re_lu_1/alpha", classes, scale=0.2)]
    nodes = [
        n("Transpose", ["input_1"], ["conv2d__6:0"], perm=NCHW, name="conv2d__6"),
        n("Conv", ["conv2d__6:0", "conv2d/kernel", "conv2d/bias"], ["conv2d:0"], auto_pad="SAME_UPPER",
          strides=[2, 2], kernel_shape=[3, 3], name="conv2d"),
        n("Transpose", ["conv2d:0"], ["conv2d__7:0"], perm=NHWC, name="conv2d__7"),
        n("PRelu", ["conv2d__7:0", "p_re_lu/alpha"], ["p_re_lu:0"], name="p_re_lu"),
        n("Transpose", ["p_re_lu:0"], ["conv2d_1__8:0"], perm=NCHW, name="conv2d_1__8"),
        n("Conv", ["conv2d_1__8:0", "conv2d_1/kernel", "conv2d_1/bias"], ["conv2d_1:0"], auto_pad="VALID",
          kernel_shape=[3, 3], name="conv2d_1"),
        n("Transpose", ["conv2d_1:0"], ["conv2d_1__9:0"], perm=NHWC, name="conv2d_1__9"),
        n("Transpose", ["conv2d_1__9:0"], ["depthwise__10:0"], perm=NCHW, name="depthwise__10"),  # cancels
        n("Conv", ["depthwise__10:0", "depthwise/kernel", "depthwise/bias"], ["depthwise:0"], group=8,
          auto_pad="SAME_UPPER", strides=[2, 2], kernel_shape=[3, 3], name="depthwise"),
        n("BatchNormalization", ["depthwise:0", "bn/gamma", "bn/beta", "bn/moving_mean", "bn/moving_variance"],
          ["bn:0"], epsilon=1e-3, name="bn"),
        n("Relu", ["bn:0"], ["relu:0"], name="relu"),
        n("Transpose", ["relu:0"], ["relu__11:0"], perm=NHWC, name="relu__11"),
        n("ReduceMean", ["relu__11:0"], ["gap:0"], axes=[1, 2], keepdims=0, name="global_average_pooling2d"),
        n("MatMul", ["gap:0", "dense/kernel"], ["dense/MatMul:0"], name="dense/MatMul"),
        n("Add", ["dense/MatMul:0", "dense/bias"], ["dense:0"], name="dense/BiasAdd"),
        n("PRelu", ["dense:0", "p_re_lu_1/alpha"], ["output"], name="p_re_lu_1"),
    ]
    return _model(nodes, inits, classes, "tf2onnx")


def keras2torch_style(classes: int = 4, seed: int = 1) -> onnx.ModelProto:
    rs = np.random.RandomState(seed)
    n = helper.make_node
    inits = [_init(rs, "conv1.weight", 8, 3, 3, 3), _init(rs, "conv1.bias", 8, scale=0.1),
             _init(rs, "conv2.weight", 8, 8, 3, 3), _init(rs, "conv2.bias", 8, scale=0.1),
             _init(rs, "prelu.weight", 8, scale=0.2),
             _init(rs, "fc.weight", classes, 8 * 4 * 4, scale=0.05), _init(rs, "fc.bias", classes, scale=0.1),
             numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "same_pads")]
    for bn in ("bn1", "bn2"):  # Keras BatchNormalization, split by the conversion
        mean, var = rs.randn(8) * 0.1, np.abs(rs.randn(8)) + 0.5
        gamma, beta = np.abs(rs.randn(8)) + 0.5, rs.randn(8) * 0.1
        inits += [numpy_helper.from_array(mean.astype(np.float32), f"{bn}.running_mean"),
                  numpy_helper.from_array((gamma / np.sqrt(var + 1e-3)).astype(np.float32), f"{bn}.scale"),
                  numpy_helper.from_array(beta.astype(np.float32), f"{bn}.bias")]
    nodes = [
        n("Transpose", ["input_1"], ["/Transpose_output_0"], perm=NCHW, name="/Transpose"),
        n("Pad", ["/Transpose_output_0", "same_pads"], ["/Pad_output_0"], mode="constant", name="/Pad"),
        n("Conv", ["/Pad_output_0", "conv1.weight", "conv1.bias"], ["/conv1/Conv_output_0"], strides=[2, 2],
          pads=[0, 0, 0, 0], kernel_shape=[3, 3], name="/conv1/Conv"),
        n("Transpose", ["/conv1/Conv_output_0"], ["/Transpose_1_output_0"], perm=NHWC, name="/Transpose_1"),
        n("Sub", ["/Transpose_1_output_0", "bn1.running_mean"], ["/bn1/Sub_output_0"], name="/bn1/Sub"),
        n("Mul", ["/bn1/Sub_output_0", "bn1.scale"], ["/bn1/Mul_output_0"], name="/bn1/Mul"),
        n("Add", ["/bn1/Mul_output_0", "bn1.bias"], ["/bn1/Add_output_0"], name="/bn1/Add"),
        n("Relu", ["/bn1/Add_output_0"], ["/Relu_output_0"], name="/Relu"),
        n("Transpose", ["/Relu_output_0"], ["/Transpose_2_output_0"], perm=NCHW, name="/Transpose_2"),
        n("Conv", ["/Transpose_2_output_0", "conv2.weight", "conv2.bias"], ["/conv2/Conv_output_0"],
          pads=[1, 1, 1, 1], kernel_shape=[3, 3], strides=[2, 2], name="/conv2/Conv"),
        n("Transpose", ["/conv2/Conv_output_0"], ["/Transpose_3_output_0"], perm=NHWC, name="/Transpose_3"),
        n("Sub", ["/Transpose_3_output_0", "bn2.running_mean"], ["/bn2/Sub_output_0"], name="/bn2/Sub"),
        n("Mul", ["/bn2/Sub_output_0", "bn2.scale"], ["/bn2/Mul_output_0"], name="/bn2/Mul"),
        n("Add", ["/bn2/Mul_output_0", "bn2.bias"], ["/bn2/Add_output_0"], name="/bn2/Add"),
        n("PRelu", ["/bn2/Add_output_0", "prelu.weight"], ["/prelu/PRelu_output_0"], name="/prelu/PRelu"),
        n("Flatten", ["/prelu/PRelu_output_0"], ["/Flatten_output_0"], axis=1, name="/Flatten"),
        n("Gemm", ["/Flatten_output_0", "fc.weight", "fc.bias"], ["output"], transB=1, name="/fc/Gemm"),
    ]
    return _model(nodes, inits, classes, "pytorch")


BUILDERS = {"tf2onnx": tf2onnx_style, "keras2torch": keras2torch_style}
# (terms, depth) of helpers.f32_tol: widest dot product and number of contractions in sequence
BUDGET = {"tf2onnx": (72, 5), "keras2torch": (128, 4)}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def keras(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / f"{request.param}.onnx"
    onnx.save(BUILDERS[request.param](), str(path))
    return request.param, path


def _x(batch, seed=0):
    return np.random.RandomState(seed + batch).randn(batch, SIZE, SIZE, 3).astype(np.float32)


def _ops(block) -> list[str]:
    return [n["op"] for n in json.loads(block._cached_graph[1].tojson())["nodes"] if n["op"] != "null"]


def test_matches_onnxruntime_at_batch_1_and_2_and_hybridized(keras):
    name, path = keras
    block = import_model(str(path))
    terms, depth = BUDGET[name]
    for b in (1, 2):
        x = _x(b)
        want = ort_run(str(path), x)[0]
        got = block(mx.nd.array(x)).asnumpy()
        assert got.shape == (b, 4)
        assert_f32_close(got, want, terms=terms, depth=depth, err_msg=f"{name} batch {b}")
    x = _x(2, seed=5)
    plain = block(mx.nd.array(x)).asnumpy()
    block.hybridize(static_alloc=True, static_shape=True)
    assert_f32_close(block(mx.nd.array(x)).asnumpy(), plain, terms=terms, depth=depth)
    assert np.abs(plain[0] - plain[1]).max() > 1e-2 * np.abs(plain).max()  # the output depends on the input


def test_transposes_that_cancel_are_folded(keras):
    """tf2onnx's back-to-back NHWC -> NCHW pair between two convs computes nothing (one copy
    instead); the others (around the NHWC-only ops) stay, and MatMul's weight is transposed
    for MXNet's FullyConnected (one more)."""
    name, path = keras
    block = import_model(str(path))
    block(mx.nd.array(_x(1)))
    written = sum(n.op_type == "Transpose" for n in onnx.load(str(path)).graph.node)
    kept = _ops(block).count("transpose")
    assert kept == written - (2 - 1 if name == "tf2onnx" else 0), (_ops(block), written)
    assert _ops(block).count("_copy") == (1 if name == "tf2onnx" else 0)


def test_an_sgd_step_moves_every_weight(keras):
    name, path = keras
    block = import_model(str(path))
    params = trainable_params(block)
    weights = {k for k, p in params.items()}
    initializers = {t.name for t in onnx.load(str(path)).graph.initializer if t.data_type == TensorProto.FLOAT}
    stats = {"bn/moving_mean", "bn/moving_variance"}  # BatchNormalization's: auxiliary states
    assert {p.name for p in params.values()} >= initializers - stats - {"same_pads"}, sorted(weights)
    before = {k: p.data().asnumpy().copy() for k, p in params.items()}
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": 0.1})
    x, y = mx.nd.array(_x(2)), mx.nd.array([1, 3])
    with mx.autograd.record():
        loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(block(x), y)
    loss.backward()
    trainer.step(2)
    unchanged = [k for k, p in params.items() if np.array_equal(p.data().asnumpy(), before[k])]
    assert not unchanged, unchanged
