"""If/Loop/Scan bodies that read outer-scope values: never folded as constants; a Loop
unrolls when its trip count is known at import (tf2onnx writes LSTMs so), a Scan when its
sequence length is, else they are refused by name; a Loop that reads only constants folds."""
from __future__ import annotations

import json

import mxnet as mx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tests.helpers import assert_f32_close
from onnx import helper, numpy_helper

from gluontl.errors import OnnxImportError
from gluontl.onnx import import_model

F, I64, B = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.BOOL
T, IN, H = 5, 3, 4


def _model(nodes, inputs, outputs, inits, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def lstm_body(cond_out=None):
    """tf2onnx's shape: (i, cond, h, c) -> (cond, h, c, y); x_t = Gather(Xt, i) reads the
    outer time-major sequence; W, R, B are outer initializers too. Gates in order i, o, f, c."""
    n = helper.make_node
    nodes = [n("Gather", ["Xt", "i"], ["x_t"], name="x_t", axis=0),
             n("MatMul", ["x_t", "W"], ["xw"], name="xw"),
             n("MatMul", ["h_prev", "R"], ["hr"], name="hr"),
             n("Add", ["xw", "hr"], ["g0"], name="g0"),
             n("Add", ["g0", "Bias"], ["g"], name="g"),
             n("Split", ["g"], ["gi", "go", "gf", "gc"], name="split", axis=1),
             n("Sigmoid", ["gi"], ["it"], name="it"), n("Sigmoid", ["go"], ["ot"], name="ot"),
             n("Sigmoid", ["gf"], ["ft"], name="ft"), n("Tanh", ["gc"], ["ct"], name="ct"),
             n("Mul", ["ft", "c_prev"], ["fc"], name="fc"), n("Mul", ["it", "ct"], ["ic"], name="ic"),
             n("Add", ["fc", "ic"], ["c_new"], name="c_new"),
             n("Tanh", ["c_new"], ["tc"], name="tc"), n("Mul", ["ot", "tc"], ["h_new"], name="h_new"),
             n("Identity", ["h_new"], ["y"], name="y")]
    if cond_out is None:
        nodes.append(n("Identity", ["cond_in"], ["cond_out"], name="cond_out"))
    else:
        nodes += cond_out
    return helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("h_prev", F, None), helper.make_tensor_value_info("c_prev", F, None)],
        [helper.make_tensor_value_info(x, t, None) for x, t in
         (("cond_out", B), ("h_new", F), ("c_new", F), ("y", F))])


def lstm_loop_model(body=None, seq=T, zeros_from_shape=True):
    """Keras via tf2onnx: X (N, T, IN) transposed to time-major Xt, Loop(M = Shape(X)[1],
    true, h0, c0) with h0 = c0 = zeros(N, H) from Shape(X)[0], Y transposed back."""
    rng = np.random.RandomState(0)
    inits = {"W": rng.randn(IN, 4 * H).astype(np.float32) * 0.5,
             "R": rng.randn(H, 4 * H).astype(np.float32) * 0.5,
             "Bias": rng.randn(4 * H).astype(np.float32) * 0.1,
             "one": np.array([1], np.int64),
             "hid": np.array([H], np.int64), "true": np.array(True)}
    n = helper.make_node
    zeros = [n("Slice", ["xs", "zero1", "one"], ["nb"], name="nb"),
             n("Concat", ["nb", "hid"], ["hshape"], name="hshape", axis=0),
             n("ConstantOfShape", ["hshape"], ["h0"], name="h0"),
             n("Identity", ["h0"], ["c0"], name="c0")]
    nodes = [n("Transpose", ["X"], ["Xt"], name="Xt", perm=[1, 0, 2]),
             n("Shape", ["X"], ["xs"], name="xs"),
             n("Gather", ["xs", "one_s"], ["M"], name="M", axis=0),
             *(zeros if zeros_from_shape else []),
             n("Loop", ["M", "true", "h0", "c0"], ["hT", "cT", "Yt"], name="lstm_loop",
               body=body or lstm_body()),
             n("Transpose", ["Yt"], ["Y"], name="Y", perm=[1, 0, 2])]
    inits.update(one_s=np.array(1, np.int64), zero1=np.array([0], np.int64))
    if not zeros_from_shape:  # the state as stored zeros (1, H): a batch-1 export
        inits.update(h0=np.zeros((1, H), np.float32), c0=np.zeros((1, H), np.float32))
    return _model(nodes, [helper.make_tensor_value_info("X", F, ["N", seq, IN])],
                  [helper.make_tensor_value_info("Y", F, None),
                   helper.make_tensor_value_info("hT", F, None)], inits)


def ort_run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def graph_ops(block):
    return [x["op"] for x in json.loads(block._cached_graph[1].tojson())["nodes"] if x["op"] != "null"]


@pytest.mark.parametrize("opset", [11, 17])
def test_tf2onnx_loop_lstm_unrolls_and_matches_onnxruntime(opset):
    model = lstm_loop_model()
    if opset < 13:  # Split/Unsqueeze attribute forms; the body above has none
        model.opset_import[0].version = opset
    block = import_model(model, input_shapes={"X": (1, T, IN)})
    for batch in (1, 2):
        x = np.random.RandomState(batch).randn(batch, T, IN).astype(np.float32)
        got = block(mx.nd.array(x))
        ref = ort_run(model, {"X": x})
        for g, r in zip(got, ref):  # T chained steps of IN + H products
            assert_f32_close(g.asnumpy(), r, terms=IN + H, depth=T)
    assert graph_ops(block).count("SliceChannel") == T  # the body's Split, once per step


def test_loop_lstm_gradients_reach_every_weight():
    block = import_model(lstm_loop_model(), input_shapes={"X": (1, T, IN)})
    params = {k: p for k, p in block.collect_params().items() if p.grad_req != "null"}
    assert len(params) == 3
    x = mx.nd.array(np.random.RandomState(0).randn(2, T, IN).astype(np.float32))
    with mx.autograd.record():
        y, h = block(x)
        loss = (y * y).sum() + h.sum()
    loss.backward()
    for k, p in params.items():
        assert np.abs(p.grad().asnumpy()).sum() > 0, k


def test_loop_with_unknown_trip_count_is_refused_by_name():
    model = lstm_loop_model(seq="T", zeros_from_shape=False)
    with pytest.raises(OnnxImportError) as e:
        import_model(model, input_shapes={"X": (1, None, IN)}, fixed_batch=True)
    msg = str(e.value)
    assert "Loop node 'lstm_loop'" in msg and "'Xt'" in msg and "trip count" in msg, msg
    assert "INVALID_GRAPH" not in msg


def test_loop_whose_condition_reads_data_is_refused_by_name():
    n = helper.make_node
    stop = [n("ReduceMax", ["h_new"], ["hmax"], name="hmax", keepdims=0),
            n("Less", ["hmax", "half"], ["cond_out"], name="cond_out")]
    body = lstm_body(cond_out=stop)
    body.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "half"))
    with pytest.raises(OnnxImportError) as e:
        import_model(lstm_loop_model(body=body), input_shapes={"X": (1, T, IN)})
    msg = str(e.value)
    assert "Loop node 'lstm_loop'" in msg and "'Xt'" in msg and "condition" in msg, msg


def scan_model(directions=None):
    """Scan over time-major Xt with state s0 = mean_t X; the body reads that mean (Xm) and a
    weight from the outer graph: s = tanh(s * w + x_t + Xm), y = s."""
    n = helper.make_node
    body = helper.make_graph(
        [n("Mul", ["s_prev", "w"], ["sw"], name="sw"), n("Add", ["sw", "x_t"], ["a"], name="a"),
         n("Add", ["a", "Xm"], ["b"], name="b"), n("Tanh", ["b"], ["s_new"], name="s_new"),
         n("Identity", ["s_new"], ["y"], name="y")], "body",
        [helper.make_tensor_value_info("s_prev", F, None), helper.make_tensor_value_info("x_t", F, None)],
        [helper.make_tensor_value_info("s_new", F, None), helper.make_tensor_value_info("y", F, None)])
    extra = {} if directions is None else {"scan_input_directions": directions}
    nodes = [n("Transpose", ["X"], ["Xt"], name="Xt", perm=[1, 0, 2]),
             n("ReduceMean", ["X"], ["Xm"], name="Xm", axes=[1], keepdims=0),
             n("Scan", ["Xm", "Xt"], ["sT", "ys"], name="scan", body=body, num_scan_inputs=1, **extra),
             n("Transpose", ["ys"], ["Y"], name="Y", perm=[1, 0, 2])]
    w = np.array([0.5, -1.0, 2.0], np.float32)
    return _model(nodes, [helper.make_tensor_value_info("X", F, ["N", T, IN])],
                  [helper.make_tensor_value_info("Y", F, None), helper.make_tensor_value_info("sT", F, None)],
                  {"w": w}, opset=17)


def test_scan_reading_outer_data_unrolls_and_matches_onnxruntime():
    model = scan_model()
    block = import_model(model, input_shapes={"X": (1, T, IN)})
    for batch in (1, 2):
        x = np.random.RandomState(batch).randn(batch, T, IN).astype(np.float32)
        for g, r in zip(block(mx.nd.array(x)), ort_run(model, {"X": x})):
            assert_f32_close(g.asnumpy(), r, terms=T, depth=T)  # Xm sums T values


def test_scan_in_reverse_is_refused_by_name():
    with pytest.raises(OnnxImportError) as e:
        import_model(scan_model(directions=[1]), input_shapes={"X": (1, T, IN)})
    msg = str(e.value)
    assert "Scan node 'scan'" in msg and "reads 'Xm'" in msg and "forward" in msg, msg


def test_loop_reading_only_constants_folds_at_import():
    """acc += C * i over 4 steps, C an outer initializer: folded by onnxruntime at import,
    so the block is the one Add of the folded constant to X."""
    n = helper.make_node
    body = helper.make_graph(
        [n("Cast", ["i"], ["fi"], name="fi", to=F), n("Mul", ["C", "fi"], ["ci"], name="ci"),
         n("Add", ["acc_prev", "ci"], ["acc_new"], name="acc"),
         n("Identity", ["cond_in"], ["cond_out"], name="cond")], "body",
        [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("cond_in", B, []),
         helper.make_tensor_value_info("acc_prev", F, [IN])],
        [helper.make_tensor_value_info("cond_out", B, []),
         helper.make_tensor_value_info("acc_new", F, [IN])])
    c = np.array([1.0, -2.0, 0.5], np.float32)
    model = _model([n("Loop", ["M", "", "acc0"], ["acc"], name="const_loop", body=body),
                    n("Add", ["X", "acc"], ["out"], name="out")],
                   [helper.make_tensor_value_info("X", F, ["N", IN])],
                   [helper.make_tensor_value_info("out", F, None)],
                   {"M": np.array(4, np.int64), "acc0": np.zeros(IN, np.float32), "C": c})
    block = import_model(model, input_shapes={"X": (1, IN)})
    x = np.random.RandomState(0).randn(2, IN).astype(np.float32)
    got = block(mx.nd.array(x)).asnumpy()
    np.testing.assert_array_equal(got, ort_run(model, {"X": x})[0])
    np.testing.assert_array_equal(got, x + 6 * c)  # 0 + 1 + 2 + 3 = 6, exact in float32
    assert len(graph_ops(block)) == 1, graph_ops(block)  # the Add; the Loop folded


def test_loop_whose_nested_if_reads_the_sequence_unrolls():
    """The outer read hides in an If inside the body (reading the body's own ``i`` too):
    the Loop is still not constant, and each unrolled copy's If reads that copy's ``i``."""
    n = helper.make_node
    body = lstm_body()
    branch = [helper.make_graph([n("Gather", ["Xt", idx], [f"x_{tag}"], name=f"g_{tag}", axis=0)],
                                tag, [], [helper.make_tensor_value_info(f"x_{tag}", F, None)])
              for tag, idx in (("then", "i"), ("else", "first"))]
    gather = next(k for k, x in enumerate(body.node) if x.name == "x_t")
    body.node.remove(body.node[gather])
    body.node.insert(gather, n("If", ["flag"], ["x_t"], name="pick", then_branch=branch[0],
                               else_branch=branch[1]))
    model = lstm_loop_model(body=body)
    model.graph.initializer.extend([numpy_helper.from_array(np.array(True), "flag"),
                                    numpy_helper.from_array(np.array(0, np.int64), "first")])
    block = import_model(model, input_shapes={"X": (1, T, IN)})
    x = np.random.RandomState(3).randn(2, T, IN).astype(np.float32)
    for g, r in zip(block(mx.nd.array(x)), ort_run(model, {"X": x})):
        assert_f32_close(g.asnumpy(), r, terms=IN + H, depth=T)
