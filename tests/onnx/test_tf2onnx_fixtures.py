"""Files written by the real tf2onnx 1.16.1 from Keras models (tensorflow 2.15.1; issue 39).

The fixtures (``tests/onnx/fixtures/tf2onnx/``, from ``scripts/make_tf_fixtures.py``; tensorflow
is not needed here) are a Keras CNN (NHWC input, Conv2D same/stride 2 and valid, DepthwiseConv2D,
BatchNormalization, PReLU per channel and on the 2-D logits, Dense) exported from Keras at
opset 13 (explicit pads), with free H/W at opset 17 (``auto_pad`` SAME_UPPER) and through
TFLite at 13 (the ONNX ``PRelu`` op, BatchNorm folded into the depthwise Conv); a Keras LSTM
and a GRU into a bidirectional LSTM (tf2onnx writes the ONNX ``LSTM``/``GRU`` ops); a Keras
SimpleRNN and an LSTM written with ``tf.while_loop`` (each a ``Loop`` with no trip count, the
weights carried through it, a scan output) at opsets 13 and 17, and that LSTM with
``maximum_iterations`` (the Loop's trip count a constant).
Each imports, matches onnxruntime at batch 1 and 2, hybridizes, takes an SGD step that moves
every weight, and re-exports verified (the re-exported file computes what the block does).
"""
from __future__ import annotations

import functools
import json
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from gluontl.errors import OnnxImportError
from gluontl.export import export_onnx
from gluontl.onnx import control, import_model
from gluontl.rules import trainable_params
from tests.helpers import assert_f32_close, ort_run, sgd_step

FIXTURES = Path(__file__).parent / "fixtures" / "tf2onnx"
MANIFEST = {e["file"]: e for e in json.loads((FIXTURES / "MANIFEST.json").read_text())["fixtures"]}
FILES = sorted(MANIFEST)
LOOPS = [f for f in FILES if MANIFEST[f]["loop"]]
T = 6  # the LSTMs' sequence length (the script's T)
# (terms, depth) of helpers.f32_tol: the widest dot product and the contractions in sequence;
# an LSTM step sums FEATURES + HIDDEN = 12 products and feeds the next one
BUDGET = {"cnn": (72, 5), "keras_lstm": (12, T + 1), "keras_simplernn": (12, T + 1),
          "keras_gru_bilstm": (12, 2 * T + 1), "while_lstm": (12, T + 1)}
WHILE = "while_lstm_op13.onnx"  # mutated below into loops that must be refused


def _budget(file: str) -> tuple[int, int]:
    return BUDGET[MANIFEST[file]["keras_model"]]


def _fresh(file: str):
    e = MANIFEST[file]
    shapes = {e["input"]: [None] + e["test_shape"]} if e["free_hw"] else None  # H/W free in the file
    return import_model(str(FIXTURES / file), input_shapes=shapes)


@functools.lru_cache(maxsize=None)
def _import(file: str):
    return _fresh(file)


def _x(file: str, batch: int, seed: int = 0) -> np.ndarray:
    return np.random.RandomState(seed + batch).randn(batch, *MANIFEST[file]["test_shape"]).astype(np.float32)


def _graph_ops(block) -> list[str]:
    return [n["op"] for n in json.loads(block._cached_graph[1].tojson())["nodes"] if n["op"] != "null"]


def _weights(file: str) -> set[str]:
    """The model's weights: float initializers of rank >= 1 (scalars are tf2onnx's constants:
    a loop bound, the zeros of an initial state) but BatchNormalization's statistics."""
    graph = onnx.load(str(FIXTURES / file)).graph
    stats = {x for n in graph.node if n.op_type == "BatchNormalization" for x in n.input[3:5]}
    return {t.name for t in graph.initializer if t.data_type == TensorProto.FLOAT and t.dims} - stats


def test_the_fixtures_are_what_the_manifest_says():
    """Small files of the kinds issue 39 names, from the exporter and versions recorded."""
    for file, e in MANIFEST.items():
        proto = onnx.load(str(FIXTURES / file))
        assert proto.producer_name == "tf2onnx" and proto.producer_version == e["tf2onnx"] == "1.16.1"
        assert e["tensorflow"] == "2.15.1" and (FIXTURES / file).stat().st_size < 1 << 20
        assert sorted({n.op_type for n in proto.graph.node}) == e["op_types"], file
    convs = {f: [helper.get_attribute_value(a) for n in onnx.load(str(FIXTURES / f)).graph.node
                 if n.op_type == "Conv" for a in n.attribute if a.name in ("auto_pad", "pads")]
             for f in ("keras_cnn_op13.onnx", "keras_cnn_freehw_op17.onnx")}
    assert convs["keras_cnn_freehw_op17.onnx"] == [b"SAME_UPPER"] * 2  # H/W free: tf2onnx cannot pad
    assert convs["keras_cnn_op13.onnx"] == [[1, 1, 1, 1], [0, 0, 1, 1]]  # 15 -> 8; 6 -> 3 (asymmetric)
    assert "PRelu" in MANIFEST["tflite_cnn_op13.onnx"]["op_types"]
    assert "PRelu" not in MANIFEST["keras_cnn_op13.onnx"]["op_types"]  # Relu/Neg/Mul/Add instead
    assert "LSTM" in MANIFEST["keras_lstm_op13.onnx"]["op_types"]
    assert {"GRU", "LSTM"} <= set(MANIFEST["keras_gru_bilstm_op15.onnx"]["op_types"])
    assert LOOPS == ["keras_simplernn_op13.onnx", "while_lstm_maxiter_op13.onnx", "while_lstm_op13.onnx",
                     "while_lstm_op17.onnx"]


@pytest.mark.parametrize("file", FILES)
def test_matches_onnxruntime_at_batch_1_and_2_and_hybridized(file):
    terms, depth = _budget(file)
    block = _import(file)
    for b in (1, 2):
        x = _x(file, b)
        want = ort_run(str(FIXTURES / file), x)[0]
        got = block(mx.nd.array(x)).asnumpy()
        assert_f32_close(got, want, terms=terms, depth=depth, err_msg=f"{file} batch {b}")
    x = _x(file, 2, seed=5)
    plain = block(mx.nd.array(x)).asnumpy()
    hybrid = _fresh(file)
    hybrid.hybridize(static_alloc=True, static_shape=True)
    assert_f32_close(hybrid(mx.nd.array(x)).asnumpy(), plain, terms=terms, depth=depth)
    assert np.abs(plain[0] - plain[1]).max() > 1e-2 * np.abs(plain).max()  # depends on the input


@pytest.mark.parametrize("file", LOOPS)
def test_tf_while_loop_unrolls_with_or_without_trip_count(file):
    """tf2onnx writes a while loop as Loop(M='', cond=Less(0, T)) whose body recomputes
    ``t + 1 < T`` and carries the weights along with the state and the counter; the folded
    conditions fix T iterations (before this, a Loop without M was refused as 'trip count
    not known'). With ``maximum_iterations=T`` M is that constant (the path onnx.helper
    replicas take). One copy of the body per step: T times its Tanh/Sigmoid nodes (MXNet
    Activation)."""
    proto = onnx.load(str(FIXTURES / file))
    loop = next(n for n in proto.graph.node if n.op_type == "Loop")
    trips = {t.name: int(onnx.numpy_helper.to_array(t)) for t in proto.graph.initializer if t.name == loop.input[0]}
    assert trips == ({loop.input[0]: T} if "maxiter" in file else {}) and loop.input[1]
    carried = set(loop.input[2:])
    assert _weights(file) - carried == {x for x in _weights(file) if "dense" in x}  # RNN weights carried
    acts = sum(n.op_type in ("Tanh", "Sigmoid") for n in loop.attribute[0].g.node)
    block = _import(file)
    block(mx.nd.array(_x(file, 1)))
    ops = _graph_ops(block)
    assert acts and ops.count("Activation") == T * acts and "_foreach" not in ops and "_while_loop" not in ops


def _mutated_loop(file: str, edit) -> onnx.ModelProto:
    proto = onnx.load(str(FIXTURES / file))
    edit(proto.graph, next(n for n in proto.graph.node if n.op_type == "Loop"))
    return proto


def test_loop_with_a_trip_count_known_only_at_run_time_is_refused_by_name():
    """The real Loop given M = the batch size (Shape(seq)[0]): not known at import."""
    def edit(graph, loop):
        graph.node.insert(0, helper.make_node("Shape", [graph.input[0].name], ["seq_shape"], name="seq_shape"))
        graph.node.insert(1, helper.make_node("Gather", ["seq_shape", "zero_i64"], ["batch_trips"],
                                              name="batch_trips", axis=0))
        graph.initializer.append(onnx.numpy_helper.from_array(np.array(0, np.int64), "zero_i64"))
        loop.input[0] = "batch_trips"
    file = WHILE
    with pytest.raises(OnnxImportError) as e:
        import_model(_mutated_loop(file, edit))
    msg = str(e.value)
    assert "Loop node 'while_lstm/while_lstm/while_loop'" in msg and "trip count ('batch_trips')" in msg, msg
    assert "INVALID_GRAPH" not in msg


def test_loop_without_trip_count_whose_condition_outlasts_the_unroll_limit_is_refused(monkeypatch):
    monkeypatch.setattr(control, "MAX_UNROLL", T - 1)  # the real loop runs T: one too many
    with pytest.raises(OnnxImportError) as e:
        import_model(str(FIXTURES / WHILE))
    msg = str(e.value)
    assert "Loop node 'while_lstm/while_lstm/while_loop'" in msg and f"after {T - 1} iterations" in msg, msg


def test_loop_with_neither_trip_count_nor_condition_is_refused():
    def edit(graph, loop):
        loop.input[1] = ""
    with pytest.raises(OnnxImportError) as e:
        import_model(_mutated_loop(WHILE, edit))
    assert "neither a trip count nor a condition" in str(e.value), str(e.value)


@pytest.mark.parametrize("file", FILES)
def test_an_sgd_step_moves_every_weight(file):
    block = _import(file)
    params = trainable_params(block)
    assert {p.name for p in params.values()} == _weights(file), sorted(p.name for p in params.values())
    # every array, BatchNorm's running statistics too (a training step moves them): the block is
    # the cached one the other tests read, in any order
    saved = {k: p.data().asnumpy().copy() for k, p in block.collect_params().items()}
    sgd_step(block, mx.nd.array(_x(file, 2, seed=3)), mx.nd.array([1, 2]))
    unchanged = [k for k, p in params.items() if np.array_equal(p.data().asnumpy(), saved[k])]
    assert not unchanged, unchanged
    for k, p in block.collect_params().items():
        p.set_data(mx.nd.array(saved[k]))


@pytest.mark.parametrize("file", FILES)
def test_re_exports_verified_and_carries_trained_weights(file, tmp_path):
    terms, depth = _budget(file)
    block = _fresh(file)
    x = _x(file, 2, seed=9)
    out = export_onnx(block, tmp_path / "same.onnx")  # verified at batch 1 and 2
    assert_f32_close(ort_run(str(out), x)[0], ort_run(str(FIXTURES / file), x)[0], terms=terms, depth=depth)
    sgd_step(block, mx.nd.array(x), mx.nd.array([0, 2]), lr=0.5)
    trained = export_onnx(block, tmp_path / "trained.onnx")
    with mx.autograd.predict_mode():
        want = block(mx.nd.array(x)).asnumpy()
    assert_f32_close(ort_run(str(trained), x)[0], want, terms=terms, depth=depth)
    assert np.abs(want - ort_run(str(FIXTURES / file), x)[0]).max() > 1e-3  # the step changed the outputs
