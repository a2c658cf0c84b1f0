"""mx.onnx export of graphs our importer builds: a model imported from ONNX, saved with
export_symbol and loaded as ``symbol:PREFIX`` is exported through mx.onnx, not patched.

Each converter gluontl adds to or replaces in mx.onnx (gluontl/export/mx_ops.py), and the
renaming that keeps mx.onnx's helper tensors apart, runs on a small graph: export_onnx's own
verification must pass, and onnxruntime (float kernels) must match an independent numpy
computation. Then one fixture of each family that used to fail makes the whole round trip.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest
from tests.helpers import ONNX_FIXTURES, assert_f32_close, ort_run
from mxnet.gluon import rnn

from gluontl.errors import ExportError
from gluontl.export import export_onnx, export_symbol
from gluontl.onnx import import_model
from gluontl.sources import load_model

FIXTURES = ONNX_FIXTURES


def _symbol_block(sym: mx.sym.Symbol, inputs: list[str], params: dict[str, np.ndarray]) -> mx.gluon.SymbolBlock:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # input dtypes: float32, as SymbolBlock assumes
        block = mx.gluon.SymbolBlock(sym, [mx.sym.var(n) for n in inputs])
    for name, param in block.collect_params().items():
        param._load_init(mx.nd.array(params[name]), mx.cpu())
    return block


def _export_run(tmp_path: Path, block, shapes: dict[str, tuple[int, ...]],
                feeds: dict[str, np.ndarray]) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    """export_onnx (which refuses unless onnxruntime reproduces the block), then the file run on
    ``feeds``."""
    path = export_onnx(block, tmp_path / "m.onnx", shapes)
    return onnx.load(str(path)), ort_run(path, feeds)


# ------------------------------------------------------------------ converters, one by one

@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_full_is_a_constant(tmp_path, dtype):
    """``_full`` (ONNX ConstantOfShape of a static shape), broadcast to the batch as the
    importer does; mx.onnx types a scalar op's constant by its input, so an integer ``_full``
    must be known as one (an int32 + float Add is an invalid graph)."""
    x = mx.sym.var("x")
    const = mx.sym.Cast(mx.sym.full((1, 4), 3, dtype=dtype) + 1, dtype="float32")
    sym = x * mx.sym.broadcast_like(const, x, lhs_axes=(0,), rhs_axes=(0,))
    data = np.random.RandomState(0).standard_normal((3, 4)).astype(np.float32)
    model, (got,) = _export_run(tmp_path, _symbol_block(sym, ["x"], {}), {"x": (1, 4)}, {"x": data})
    assert any(n.op_type == "Constant" for n in model.graph.node)
    np.testing.assert_array_equal(got, data * 4)  # one exactly rounded product


@pytest.mark.parametrize("divisor", [2.5, -2.5, 0.0])
def test_mod_scalar_float_takes_the_divisors_sign(tmp_path, divisor):
    """Python's sign rule (numpy's ``mod``); MXNet's ``x % 0`` is 0. fmod is exact and the one
    correcting addition is correctly rounded in float32 everywhere, so results are equal."""
    rng = np.random.RandomState(1)
    data = np.concatenate([rng.uniform(-10, 10, (4, 6)), [[-5, -2.5, 0, 2.5, 5, -1e-7]]]).astype(np.float32)
    block = _symbol_block(mx.sym.var("x") % divisor, ["x"], {})
    _, (got,) = _export_run(tmp_path, block, {"x": (1, 6)}, {"x": data})
    want = np.zeros_like(data) if divisor == 0 else np.mod(data, np.float32(divisor))
    np.testing.assert_array_equal(got, want)
    assert (got[:4] < 0).any() == (divisor < 0) and (got[:4] > 0).any() == (divisor > 0)


def test_mod_scalar_integer(tmp_path):
    """On int32 tensors (the importer's index arithmetic) ONNX ``Mod`` itself has Python's rule."""
    x = mx.sym.var("x")
    sym = mx.sym.Cast(mx.sym.Cast(x, dtype="int32") % 3, dtype="float32")
    data = np.random.RandomState(2).uniform(-20, 20, (5, 7)).astype(np.float32)
    _, (got,) = _export_run(tmp_path, _symbol_block(sym, ["x"], {}), {"x": (1, 7)}, {"x": data})
    np.testing.assert_array_equal(got, np.mod(np.trunc(data).astype(np.int64), 3).astype(np.float32))


def test_broadcast_to_zero_keeps_the_axis(tmp_path):
    """A 0 in ``broadcast_to``'s shape keeps the input's size (here the batch, which mx.onnx
    turned into an empty axis)."""
    sym = mx.sym.broadcast_to(mx.sym.var("x"), shape=(0, 4, 0))
    data = np.random.RandomState(3).standard_normal((2, 1, 3)).astype(np.float32)
    _, (got,) = _export_run(tmp_path, _symbol_block(sym, ["x"], {}), {"x": (1, 1, 3)}, {"x": data})
    np.testing.assert_array_equal(got, np.broadcast_to(data, (2, 4, 3)))


def test_broadcast_maximum(tmp_path):
    """Elementwise Max with broadcasting (the importer's Max, tensor-bounded Clip)."""
    sym = mx.sym.broadcast_maximum(mx.sym.var("x"), mx.sym.var("y"))
    rng = np.random.RandomState(8)
    feeds = {"x": rng.standard_normal((2, 3, 4)).astype(np.float32), "y": rng.standard_normal((2, 1, 4)).astype(np.float32)}
    _, (got,) = _export_run(tmp_path, _symbol_block(sym, ["x", "y"], {}), {"x": (1, 3, 4), "y": (1, 1, 4)}, feeds)
    np.testing.assert_array_equal(got, np.maximum(feeds["x"], feeds["y"]))


@pytest.mark.parametrize("sym", [
    mx.sym.RNN(mx.sym.var("x"), mx.sym.var("p"), mx.sym.var("h"), mx.sym.var("c"), state_size=4, num_layers=1,
               mode="lstm", lstm_state_clip_min=-1.0, lstm_state_clip_max=1.0, state_outputs=True)],
    ids=["lstm_state_clip"])
def test_ops_without_an_exact_onnx_form_are_refused(tmp_path, sym):
    """Options the converters do not write (ONNX's LSTM cannot clip cell states) stop the export
    with an ExportError naming them, and nothing is written."""
    args = sym.list_arguments()
    shapes = {"x": (1, 3, 5), "h": (1, 3, 4), "c": (1, 3, 4)}
    block = _symbol_block(sym, [a for a in args if a != "p"], {"p": np.zeros(176, np.float32)})
    with pytest.raises(ExportError, match="lstm_state_clip"):
        export_onnx(block, tmp_path / "m.onnx", shapes)
    assert not (tmp_path / "m.onnx").exists()


def _bilinear_ref(x: np.ndarray, size: tuple[int, int], corners: bool) -> np.ndarray:
    """Separable linear interpolation in float64: align_corners maps the end pixels onto each
    other, otherwise pixel centres scale by in/out (source index clamped at 0, as in PyTorch)."""
    for axis, m in zip((2, 3), size):
        n = x.shape[axis]
        o = np.arange(m, dtype=np.float64)
        if corners:
            src = o * (n - 1) / (m - 1) if m > 1 else 0 * o
        else:
            src = np.maximum((o + 0.5) * n / m - 0.5, 0)
        lo = np.minimum(np.floor(src).astype(int), n - 1)
        w = (src - lo).reshape([-1 if a == axis else 1 for a in range(4)])
        x = np.take(x, lo, axis) * (1 - w) + np.take(x, np.minimum(lo + 1, n - 1), axis) * w
    return x


@pytest.mark.parametrize("corners", [False, True])
@pytest.mark.parametrize("how", [{"height": 9, "width": 16}, {"height": 3, "width": 5},
                                 {"scale_height": 1.5, "scale_width": 0.75}, {"mode": "like"}])
def test_bilinear_resize_coordinates(tmp_path, corners, how):
    """mx.onnx wrote align_corners coordinates for either setting; torchvision's segmentation
    heads import as ``align_corners=False``. Mode ``like`` (the size of a second tensor, as
    gluontl's segmenters bring logits to the input's size) was not converted at all."""
    names = ["x", "y"] if how.get("mode") == "like" else ["x"]
    sym = mx.sym.contrib.BilinearResize2D(*map(mx.sym.var, names), align_corners=corners, **how)
    data = np.random.RandomState(4).standard_normal((2, 3, 6, 8)).astype(np.float32)
    shapes, feeds = {"x": (1, 3, 6, 8)}, {"x": data}
    if "y" in names:
        size = (9, 13)
        shapes["y"], feeds["y"] = (1, 1, *size), np.zeros((2, 1, *size), np.float32)
    else:
        size = (how.get("height") or int(6 * how["scale_height"]), how.get("width") or int(8 * how["scale_width"]))
    _, (got,) = _export_run(tmp_path, _symbol_block(sym, names, {}), shapes, feeds)
    # float32 source coordinates (below 8 here) and so the weights are off by a few ulps of 8
    # (2**-21 = 4 eps32 each); a weight error e moves an output by e·|x1 - x0| <= 2e·max|x|:
    # about 16 eps32·max per axis, 32 over both, which is f32_tol at terms=4, depth=2
    assert_f32_close(got, _bilinear_ref(data.astype(np.float64), size, corners), terms=4, depth=2)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


def _cell(mode: str, x, h, c, wx, wh, bx, bh):
    """One step of MXNet's (cuDNN's) cells: LSTM gates i f g o, GRU gates r z n with the reset
    applied after the recurrent product."""
    gx, gh = x @ wx.T + bx, h @ wh.T + bh
    if mode == "lstm":
        i, f, g, o = np.split(gx + gh, 4, axis=-1)
        c = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
        return _sigmoid(o) * np.tanh(c), c
    if mode == "gru":
        (xr, xz, xn), (hr, hz, hn) = np.split(gx, 3, axis=-1), np.split(gh, 3, axis=-1)
        r, z = _sigmoid(xr + hr), _sigmoid(xz + hz)
        return (1 - z) * np.tanh(xn + r * hn) + z * h, c
    return (np.tanh(gx + gh) if mode == "rnn_tanh" else np.maximum(gx + gh, 0)), c


def _rnn_ref(layer: rnn.RNN, mode: str, x: np.ndarray, h0: np.ndarray, c0: np.ndarray):
    """Output (N, T, dirs*H) and final states (layers*dirs, N, H) from the layer's named
    per-gate parameters (l0_i2h_weight, r0_h2h_bias, ...), not from MXNet's packed vector."""
    dirs = ["l", "r"][: layer._dir]
    seq, hs, cs = x.transpose(1, 0, 2), [], []
    for li in range(layer._num_layers):
        outs = []
        for di, d in enumerate(dirs):
            p = {k: getattr(layer, f"{d}{li}_{k}").data().asnumpy().astype(np.float64)
                 for k in ("i2h_weight", "h2h_weight", "i2h_bias", "h2h_bias")}
            h, c = h0[li * len(dirs) + di], c0[li * len(dirs) + di]
            steps = range(len(seq)) if d == "l" else reversed(range(len(seq)))
            ys = [None] * len(seq)
            for t in steps:
                h, c = _cell(mode, seq[t], h, c, p["i2h_weight"], p["h2h_weight"], p["i2h_bias"], p["h2h_bias"])
                ys[t] = h
            outs.append(np.stack(ys))
            hs.append(h)
            cs.append(c)
        seq = np.concatenate(outs, axis=-1)
    return seq.transpose(1, 0, 2), np.stack(hs), np.stack(cs)


class _Recurrent(mx.gluon.HybridBlock):
    """A Gluon RNN layer (fused ``RNN`` op, batch-major like the importer's) whose initial
    states are inputs (N, layers*dirs, H), so every layer and direction gets its own."""

    def __init__(self, layer: rnn.RNN, lstm: bool):
        super().__init__()
        self.lstm = lstm
        with self.name_scope():
            self.layer = layer

    def hybrid_forward(self, F, x, h, c=None):
        states = [F.transpose(s, axes=(1, 0, 2)) for s in ([h, c] if self.lstm else [h])]
        out, states = self.layer(x, states)
        return [out, *states]


@pytest.mark.parametrize("mode,layers,bidirectional", [
    ("lstm", 1, True), ("lstm", 2, False), ("gru", 2, True), ("gru", 1, False),
    ("rnn_tanh", 1, True), ("rnn_relu", 3, False)])
def test_rnn_layers_and_directions(tmp_path, mode, layers, bidirectional):
    """mx.onnx had no bidirectional GRU/RNN and no third layer; outputs and final states
    (h, and c for LSTM) must match a numpy recurrence over every layer and direction."""
    T, I, H, N = 5, 4, 6, 2
    cls = {"lstm": rnn.LSTM, "gru": rnn.GRU}.get(mode, rnn.RNN)
    extra = {"activation": mode[4:]} if cls is rnn.RNN else {}
    layer = cls(H, layers, layout="NTC", bidirectional=bidirectional, input_size=I, **extra)
    block = _Recurrent(layer, mode == "lstm")
    mx.random.seed(5)
    block.initialize(mx.init.Uniform(0.5))  # weights large enough for every gate to matter
    dirs = 2 if bidirectional else 1
    rng = np.random.RandomState(5)
    feeds = {"x": rng.standard_normal((N, T, I)), "h": rng.standard_normal((N, layers * dirs, H)) * 0.5}
    if mode == "lstm":
        feeds["c"] = rng.standard_normal((N, layers * dirs, H)) * 0.5
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    shapes = {k: (1, *v.shape[1:]) for k, v in feeds.items()}
    model, got = _export_run(tmp_path, block, shapes, feeds)
    assert sum(n.op_type in ("LSTM", "GRU", "RNN") for n in model.graph.node) == layers
    f64 = {k: v.astype(np.float64) for k, v in feeds.items()}
    want = _rnn_ref(layer, mode, f64["x"], f64["h"].transpose(1, 0, 2),
                    f64.get("c", np.zeros_like(f64["h"])).transpose(1, 0, 2))
    assert len(got) == (3 if mode == "lstm" else 2)
    for g, w in zip(got, want):  # per step a gate sums I + H products and two biases
        assert_f32_close(g, w, scale=max(1.0, np.abs(w).max()), terms=I + H + 2, depth=T * layers)


def test_layer_names_that_extend_each_other(tmp_path):
    """PyTorch numbers repeated ops ``/attn/MatMul``, ``/attn/MatMul_1``; mx.onnx names the
    helper tensors of the first ``/attn/MatMul_0``, ``/attn/MatMul_1``..., which made the
    second op read an int64 helper (the transformer fixtures' failure)."""
    x = mx.sym.var("x")
    y = mx.sym.FullyConnected(x, mx.sym.var("w"), mx.sym.var("b"), num_hidden=5, flatten=False,
                              name="/attn/MatMul")
    sym = mx.sym.batch_dot(y, y, transpose_b=True, name="/attn/MatMul_1")
    rng = np.random.RandomState(6)
    params = {"w": rng.standard_normal((5, 4)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}
    data = rng.standard_normal((2, 3, 4)).astype(np.float32)
    model, (got,) = _export_run(tmp_path, _symbol_block(sym, ["x"], params), {"x": (1, 3, 4)}, {"x": data})
    assert [o.name for o in model.graph.output] == ["output"]
    y64 = data.astype(np.float64) @ params["w"].T.astype(np.float64) + params["b"]
    scale = np.abs(y64) @ np.abs(y64).transpose(0, 2, 1)  # Σ|a b| of the second product
    assert_f32_close(got, y64 @ y64.transpose(0, 2, 1), scale=scale, terms=5, depth=2)


# ------------------------------------------------------------------ the user's round trip

ROUND_TRIP = ["encoder_vit_legacy_op14", "gru_crnn_legacy_op17", "crnn_dynamo_op18",
              "batch_indexing_legacy_op17", "tv_lraspp_legacy_op17_dynhw"]


def _f32_budget(path: Path) -> tuple[int, int]:
    """(terms, depth) of ``helpers.f32_tol`` for two float32 runs of an ONNX graph: its widest
    dot product (Conv kernel volume, MatMul/Gemm inner size, RNN input + hidden + biases) and
    its number of such layers; mx.onnx rewrites some of them (Gemm for MatMul + Add, one LSTM
    per layer), so the two files may sum in different orders."""
    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*model.graph.value_info, *model.graph.input)}
    dims.update({t.name: list(t.dims) for t in model.graph.initializer})
    fan_in = []
    for node in model.graph.node:
        if node.op_type == "Conv":
            fan_in.append(int(np.prod(dims[node.input[1]][1:])))
        elif node.op_type in ("MatMul", "Gemm"):  # attention products: inner size unknown (0)
            fan_in.append((dims.get(node.input[0]) or [0])[-1])
        elif node.op_type in ("LSTM", "GRU"):
            fan_in.append(dims[node.input[1]][2] + dims[node.input[2]][2] + 2)
    return max(fan_in), len(fan_in)


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_imported_model_round_trips_through_a_symbol_checkpoint(tmp_path, name):
    """import → export_symbol → ``symbol:`` → export_onnx; the file must reproduce the block
    (export_onnx verifies that) and the source ONNX file, both in onnxruntime."""
    source = FIXTURES / f"{name}.onnx"
    entry = next(e for e in json.loads((FIXTURES / "MANIFEST.json").read_text())["fixtures"]
                 if e["file"] == source.name)
    shape, inp = tuple(entry["test_shapes"][-1][1:]), entry["input"]
    block = import_model(str(source), input_shapes={inp: (None, *shape)})
    export_symbol(block, tmp_path / "s", {inp: (1, *shape)})
    loaded = load_model(f"symbol:{tmp_path / 's'}", input_shapes={inp: (1, *shape)})
    path = export_onnx(loaded, tmp_path / "s.onnx", {inp: (1, *shape)})
    feeds = {inp: np.random.RandomState(7).standard_normal((2, *shape)).astype(np.float32)}
    terms, depth = _f32_budget(source)
    for got, want in zip(ort_run(path, feeds), ort_run(source, feeds), strict=True):
        assert_f32_close(got, want, terms=terms, depth=depth)
