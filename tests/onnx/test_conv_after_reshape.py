"""Convolutions fed by reshaped attention output train (issue 23).

MobileViT, EfficientFormerV2 and XCiT fold attention output back into an image and convolve
it; MXNet 1.9.1's oneDNN backward failed there ("could not create a primitive descriptor for a
reorder primitive", see gluontl/mxinternals/plain_grad.py). The fixtures are the three patterns in small
form, from both PyTorch exporters: XCiT's depthwise conv after LayerNorm → Transpose → Reshape,
MobileViT's 1x1 projection after the fold, EfficientFormerV2's 1x1 conv after MatMul →
Transpose → Reshape → Add → GELU. Every weight's gradient is checked against central
differences of the ONNX graph itself, evaluated in float64 by onnx's reference evaluator.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from gluontl.onnx import import_model
from gluontl.mxinternals.plain_grad import plain_conv_gradients
from tests.helpers import EPS32, f32_tol

FIXTURES = Path(__file__).parent / "fixtures"
PATTERNS = ("xcit_lpi", "mobilevit_fold", "efficientformer_attn")
ENTRIES = [pytest.param(e, id=e["file"][:-len(".onnx")])
           for e in json.loads((FIXTURES / "MANIFEST.json").read_text())["fixtures"] if e["model"] in PATTERNS]
EPS64 = float(np.finfo(np.float64).eps)
LAYERS = {"Conv", "MatMul", "Gemm", "LayerNormalization", "BatchNormalization", "Softmax", "ReduceMean"}


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[x.dtype])(x)


class Erf(OpRun):
    """Erf in its input's precision. onnx 1.20's reference evaluator rounds Erf to float32
    whatever the input (``np.vectorize(erf, otypes="f")``; 1.17 kept float64): a relative error
    of 6e-8 that a central difference over a step of 1e-6 turns into a 0.3 % error of the
    gradient (XCiT's and EfficientFormerV2's GELU)."""

    op_domain = ""

    def _run(self, x):
        return (_erf(x),)


class Gelu(OpRun):
    """Gelu (opset 20) by its formula in the input's precision: the evaluator expands it into its
    function body, whose Erf is onnx's own (``new_ops`` do not reach function bodies)."""

    op_domain = ""

    def _run(self, x, approximate="none"):
        if approximate == "tanh":
            return (0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),)
        return (0.5 * x * (1 + _erf(x / math.sqrt(2))),)


def _float64_trainable(model: onnx.ModelProto, weights: set[str]) -> onnx.ModelProto:
    """The graph in float64 with ``weights`` as inputs and BatchNorm on batch statistics, as
    MXNet trains it."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    kept = []
    for t in m.graph.initializer:
        value = numpy_helper.to_array(t)
        value = value.astype(np.float64) if value.dtype == np.float32 else value
        if t.name in weights:
            m.graph.input.append(helper.make_tensor_value_info(t.name, TensorProto.DOUBLE, value.shape))
        else:
            kept.append(numpy_helper.from_array(value, t.name))
    del m.graph.initializer[:]
    m.graph.initializer.extend(kept)
    for n in m.graph.node:
        for a in n.attribute:
            if a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64)))
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
        if n.op_type == "BatchNormalization":
            n.attribute.append(helper.make_attribute("training_mode", 1))
    for v in [*m.graph.input, *m.graph.output, *m.graph.value_info]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.DOUBLE
    return m


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_weight_gradient_matches_float64_central_differences(entry):
    """Along the gradient itself and along a random direction, for every trainable weight.

    The float64 differences are exact to ~1e-9 relative (step 1e-6 of the weight's size), so
    the bound is MXNet's float32 error: f32_tol per gradient element at the size of that
    weight's gradient, summed over |direction|, with the contractions and normalisations of
    the forward and backward pass as its depth."""
    path = str(FIXTURES / entry["file"])
    source = onnx.load(path)
    block = import_model(path)
    block.hybridize()
    params = {n: p for n, p in block.collect_params().items() if p.grad_req != "null"}
    rng = np.random.RandomState(0)
    x = rng.standard_normal((2, *entry["test_shapes"][-1][1:])).astype(np.float32)
    with mx.autograd.record():
        out = block(mx.nd.array(x))
    r = rng.standard_normal(out.shape)
    out.backward(mx.nd.array(r))
    grads = {n: p.grad().asnumpy().astype(np.float64) for n, p in params.items()}
    assert all(np.isfinite(g).all() for g in grads.values())

    weights = {n: p.data().asnumpy().astype(np.float64) for n, p in params.items()}
    reference = ReferenceEvaluator(_float64_trainable(source, set(weights)), new_ops=[Erf, Gelu])

    def loss(**changed) -> float:
        y = reference.run(None, {entry["input"]: x.astype(np.float64), **weights, **changed})[0]
        return float(np.sum(y * r))

    depth = 2 * sum(n.op_type in LAYERS for n in source.graph.node)
    size = float(np.sum(np.abs(r * out.asnumpy())))
    for name, g in grads.items():
        w = weights[name]
        for d in (g, rng.standard_normal(w.shape)):
            step = 1e-6 * (np.sqrt(np.mean(w ** 2)) + 1e-3) / (np.sqrt(np.mean(d ** 2)) + 1e-30)
            central = (loss(**{name: w + step * d}) - loss(**{name: w - step * d})) / (2 * step)
            bound = np.sum(np.abs(d)) * f32_tol(np.abs(g).max(), terms=256, depth=depth) \
                + 64 * depth * EPS64 * size / step
            assert abs(central - np.sum(g * d)) <= bound, (name, central, np.sum(g * d), bound)


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_copy_sits_before_the_convolution_that_needs_it(entry):
    """XCiT: conv1 (fed by the token reshape), not conv2 (fed by conv1 through GELU and BN);
    MobileViT: the projection after the fold and the fuse conv after the channel Concat (a
    reshape in MXNet); EfficientFormerV2: the projection after the GELU; no other."""
    block = import_model(str(FIXTURES / entry["file"]))
    nodes = json.loads(block._cached_graph[1].tojson())["nodes"]
    copies = [n for n in nodes if n["name"].endswith("/plain_grad")]
    convs = {n["name"] for n in nodes if n["op"] == "Convolution"}
    readers = [n["name"] for n in nodes if n["op"] == "Convolution"
               and nodes[n["inputs"][0][0]]["name"].endswith("/plain_grad")]
    assert {n["name"][:-len("/plain_grad")] for n in copies} == set(readers) <= convs
    assert len(copies) == {"xcit_lpi": 1, "mobilevit_fold": 2, "efficientformer_attn": 1}[entry["model"]]


def _tokens_to_image(F, x, w, middle):
    """(B, 16, 8) tokens → transpose → reshape to (B, 8, 4, 4) → ``middle`` → 1x1 conv."""
    image = F.reshape(F.transpose(x, axes=(0, 2, 1)), shape=(0, 8, 4, 4))
    image = {"none": lambda t: t, "relu": F.relu, "transpose": lambda t: F.transpose(t, axes=(0, 1, 3, 2)),
             "bias": lambda t: F.broadcast_add(t, F.ones((1, 8, 1, 1)))}[middle](image)
    return F.Convolution(image, w, kernel=(1, 1), num_filter=8, no_bias=True)


@pytest.mark.parametrize("middle,copied", [("none", True), ("relu", True), ("bias", True), ("transpose", False)])
def test_plain_conv_gradients_is_exact_where_it_copies_and_absent_elsewhere(middle, copied):
    """Forward bits unchanged; gradients equal the float64 chain rule within float32 error."""
    xs, ws = mx.sym.var("x"), mx.sym.var("w")
    plain = plain_conv_gradients(_tokens_to_image(mx.sym, xs, ws, middle))
    assert any(o.endswith("/plain_grad_output") for o in plain.get_internals().list_outputs()) == copied
    rng = np.random.RandomState(4)
    x, w, r = rng.standard_normal((2, 16, 8)), rng.standard_normal((8, 8, 1, 1)), rng.standard_normal((2, 8, 4, 4))
    block = mx.gluon.SymbolBlock(plain, [xs, ws])
    block.hybridize()
    xn, wn = mx.nd.array(x), mx.nd.array(w)
    xn.attach_grad()
    wn.attach_grad()
    with mx.autograd.record():
        y = block(xn, wn)
    y.backward(mx.nd.array(r))
    np.testing.assert_array_equal(y.asnumpy(), _tokens_to_image(mx.nd, xn, wn, middle).asnumpy())

    image = x.transpose(0, 2, 1).reshape(2, 8, 4, 4)
    image, back = {"none": (image, lambda g: g), "relu": (np.maximum(image, 0), lambda g: g * (image > 0)),
                   "transpose": (image.transpose(0, 1, 3, 2), lambda g: g.transpose(0, 1, 3, 2)),
                   "bias": (image + 1, lambda g: g)}[middle]
    gw = np.einsum("bohw,bihw->oi", r, image)[:, :, None, None]
    gx = back(np.einsum("oi,bohw->bihw", w[:, :, 0, 0], r)).reshape(2, 8, 16).transpose(0, 2, 1)
    np.testing.assert_allclose(wn.grad.asnumpy(), gw, rtol=0, atol=f32_tol(np.abs(gw).max(), terms=32))
    np.testing.assert_allclose(xn.grad.asnumpy(), gx, rtol=0, atol=f32_tol(np.abs(gx).max(), terms=8))
