import json

import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import assert_f32_close
from tests.onnx.opcheck import check, check_grad, make_model, run_mx, run_ort

from gluontl.errors import OnnxImportError
from gluontl.onnx import registry
from gluontl.onnx.registry import Tensor

T, N, I, H = 5, 3, 4, 6
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _inputs(op, dirs=1, bias=True, init=True, layout=0, lens=None, peep=False):
    g = GATES[op]
    x_shape = (N, T, I) if layout else (T, N, I)
    s_shape = (N, dirs, H) if layout else (dirs, N, H)
    inputs = {
        "X": np.random.randn(*x_shape).astype("f"),
        "W": (np.random.randn(dirs, g * H, I) * 0.5).astype("f"),
        "R": (np.random.randn(dirs, g * H, H) * 0.5).astype("f"),
        "B": (np.random.randn(dirs, 2 * g * H) * 0.5).astype("f") if bias else None,
        "sequence_lens": None if lens is None else np.array(lens, "int32"),
        "initial_h": np.random.randn(*s_shape).astype("f") if init else None,
    }
    if op == "LSTM":
        inputs["initial_c"] = np.random.randn(*s_shape).astype("f") if init else None
        inputs["P"] = (np.random.randn(dirs, 3 * H) * 0.5).astype("f") if peep else None
    while inputs[list(inputs)[-1]] is None:  # trailing optional inputs are simply omitted
        inputs.pop(list(inputs)[-1])
    return inputs


def _check(op, inputs, attrs, opset=14, consts=("W", "R", "B", "P")):
    attrs = dict(attrs, hidden_size=H)
    n_out = 3 if op == "LSTM" else 2
    tol = {"terms": I + H + 2, "depth": T}  # per step, a gate sums W·x, R·h and two biases
    consts = set(consts) & set(inputs)
    if attrs.get("layout"):
        # onnxruntime has no batch-major kernels: compare with its time-major run, transposed.
        tm = {k: (v.transpose(1, 0, 2) if k in ("X", "initial_h", "initial_c") else v) for k, v in inputs.items()}
        _, ref = run_ort(op, tm, dict(attrs, layout=0), consts, opset, n_out)
        ref = [ref[0].transpose(2, 0, 1, 3)] + [r.transpose(1, 0, 2) for r in ref[1:]]
        model = make_model(op, inputs, attrs, consts, opset, n_out)
        got, _ = run_mx(model, inputs, consts, opset)
        for g, r in zip(got, ref):
            assert_f32_close(g, r, **tol)
    else:
        check(op, inputs, attrs, consts=consts, opset=opset, n_outputs=n_out, **tol)
        model, _ = run_ort(op, inputs, attrs, consts, opset, n_out)
    _, grads = run_mx(model, inputs, consts, opset, grad=True)
    for name in ("X", "W", "R", "B", "P"):  # the ONNX parameters themselves are what trains
        if name in grads:
            assert np.isfinite(grads[name]).all() and np.abs(grads[name]).sum() > 0, name
    return model


@pytest.mark.parametrize("direction,layout,bias,init,opset", [
    ("forward", 0, True, True, 7),
    ("bidirectional", 0, False, False, 14),
    ("reverse", 1, True, True, 14),
    ("bidirectional", 1, True, True, 14),
])
def test_lstm_fused(direction, layout, bias, init, opset):
    dirs = 2 if direction == "bidirectional" else 1
    inputs = _inputs("LSTM", dirs, bias, init, layout, lens=[T] * N)
    model = _check("LSTM", inputs, {"direction": direction, "layout": layout} if opset >= 14 else
                   {"direction": direction}, opset)
    node = registry.node_from_proto(model.graph.node[0], opset)
    tensors = [None if a is None else Tensor(n, mx.sym.var(n), const=a if n != "X" else None, shape=a.shape)
               for n, a in inputs.items()]
    group = mx.sym.Group([s for s in registry.get("LSTM", opset)(node, tensors) if s is not None])
    ops = [n["op"] for n in json.loads(group.tojson())["nodes"]]
    assert ops.count("RNN") == 1 and "FullyConnected" not in ops


@pytest.mark.parametrize("attrs,kw", [
    ({}, {"peep": True}),                                             # peepholes
    ({"direction": "bidirectional"}, {"dirs": 2, "lens": [5, 2, 4]}),  # shorter sequences
    ({"clip": 0.5}, {}),
    ({"input_forget": 1}, {}),
    ({"activations": ["HardSigmoid", "Tanh", "Relu"]}, {"bias": False}),
])
def test_lstm_unrolled(attrs, kw):
    _check("LSTM", _inputs("LSTM", **kw), attrs)


@pytest.mark.parametrize("attrs,kw", [
    ({"linear_before_reset": 1}, {}),                                   # fused (PyTorch export)
    ({"linear_before_reset": 1, "direction": "bidirectional", "layout": 1}, {"dirs": 2, "layout": 1}),
    ({}, {}),                                                           # ONNX default: unrolled
    ({"direction": "reverse"}, {"bias": False, "init": False}),
    ({"linear_before_reset": 1, "direction": "bidirectional"}, {"dirs": 2, "lens": [1, 5, 3]}),
])
def test_gru(attrs, kw):
    _check("GRU", _inputs("GRU", **kw), attrs)


@pytest.mark.parametrize("attrs,kw", [
    ({}, {}),
    ({"activations": ["Relu", "Relu"], "direction": "bidirectional"}, {"dirs": 2, "init": False}),
    ({"direction": "reverse", "layout": 1}, {"layout": 1, "lens": [5, 3, 1]}),
    ({"activations": ["Sigmoid"]}, {"bias": False}),
])
def test_rnn(attrs, kw):
    _check("RNN", _inputs("RNN", **kw), attrs)


def test_unsupported_activation_is_clear_error():
    inputs = _inputs("RNN")
    model, _ = run_ort("RNN", inputs, {"hidden_size": H, "activations": ["Affine"]}, {"W", "R", "B"}, 14, 2)
    with pytest.raises(OnnxImportError, match="rnn_node.*Affine|rnn_node.*affine"):
        run_mx(model, inputs, {"W", "R", "B"}, 14)


@settings(max_examples=20, deadline=None, derandomize=True)
@given(st.data())
def test_recurrent_variants_match_onnxruntime(data):
    """Random mixes of direction, optional inputs, sequence lengths and cell options."""
    op = data.draw(st.sampled_from(["LSTM", "GRU", "RNN"]))
    direction = data.draw(st.sampled_from(["forward", "reverse", "bidirectional"]))
    dirs = 2 if direction == "bidirectional" else 1
    lens = data.draw(st.one_of(st.none(), st.lists(st.integers(2, T), min_size=N, max_size=N)))  # R needs 2 steps
    kw = {"dirs": dirs, "bias": data.draw(st.booleans()), "init": data.draw(st.booleans()), "lens": lens}
    attrs = {"direction": direction}
    if op == "LSTM":
        kw["peep"] = data.draw(st.booleans())
    if op == "GRU":
        attrs["linear_before_reset"] = data.draw(st.integers(0, 1))
    if data.draw(st.booleans()):
        attrs["clip"] = 1.5
    _check(op, _inputs(op, **kw), attrs)


@pytest.mark.parametrize("op,attrs,kw", [
    ("GRU", {}, {"dirs": 1, "lens": [3, 1]}),                        # unrolled, masked
    ("GRU", {"linear_before_reset": 1, "direction": "bidirectional"}, {"dirs": 2}),  # fused
    ("LSTM", {}, {"peep": True}),
    ("LSTM", {"direction": "reverse"}, {}),
    ("RNN", {"activations": ["Sigmoid"]}, {}),  # smooth: central differences cannot straddle a kink
    ("RNN", {"direction": "bidirectional"}, {"dirs": 2}),
])
def test_recurrent_gradients_match_central_differences(op, attrs, kw):
    global T, N, H
    saved = T, N, H
    T, N, H = 3, 2, 2  # one forward per element: keep the problem tiny
    try:
        inputs = _inputs(op, **kw)
        check_grad(op, inputs, dict(attrs, hidden_size=H), opset=14, rtol=3e-2, atol=3e-3)
    finally:
        T, N, H = saved
