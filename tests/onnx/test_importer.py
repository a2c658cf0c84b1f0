"""Importer core on tiny graphs: folding, batch freedom, parameters, errors, QDQ."""
from __future__ import annotations

import json
import os

import mxnet as mx
import numpy as np
import onnx
import pytest
from tests.helpers import (assert_f32_close, assert_requantized, conv_integer_ref, dequantize_ref,
                     dynamic_quantize_ref, matmul_integer_ref, quantize_ref, requantize_ref,
                     ort_run, requantize_slack)
from onnx import helper, numpy_helper

from gluontl.errors import OnnxImportError
from gluontl.mxinternals import onnx_info
from gluontl.onnx import import_model

F = onnx.TensorProto.FLOAT


# ----------------------------------------------------------------- helpers (shared)

def make_model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    """``inputs``/``outputs``: (name, dims), dims None when unknown; ``inits``: name -> array."""
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, F, d) for n, d in inputs],
        [helper.make_tensor_value_info(n, F, d) for n, d in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in dict(inits).items()])
    ids = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=ids)
    model.ir_version = 8
    return model


def mx_run(block, feeds):
    out = block(*[mx.nd.array(v, dtype=v.dtype) for v in feeds.values()])
    return [o.asnumpy() for o in (out if isinstance(out, (list, tuple)) else [out])]


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


def assert_matches_ort(model, block, feeds, terms=1, depth=1):
    """Outputs equal onnxruntime's within helpers.f32_tol (``terms``: the most products one
    output sums, ``depth``: how many such sums are chained)."""
    got, ref = mx_run(block, feeds), ort_run(model, feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert_f32_close(g, r, terms=terms, depth=depth)


def graph_ops(block):
    nodes = json.loads(block._cached_graph[1].tojson())["nodes"]
    return [n["op"] for n in nodes if n["op"] != "null"]


def node(op, ins, outs, name=None, **attrs):
    return helper.make_node(op, ins, outs, name=name or outs[0], **attrs)


def const(name, value):
    return node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


# ----------------------------------------------------------------- folding / batch

def flatten_by_shape_model():
    """PyTorch-style flatten: Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1]))."""
    nodes = [node("Relu", ["x"], ["r"]), node("Shape", ["r"], ["s"]), const("zero", np.int64(0)),
             node("Gather", ["s", "zero"], ["b"], axis=0), node("Unsqueeze", ["b", "ax"], ["bu"]),
             node("Concat", ["bu", "m1"], ["shp"], axis=0), node("Reshape", ["r", "shp"], ["y"])]
    return make_model(nodes, [("x", ["N", 3, 4])], [("y", None)],
                      {"ax": np.array([0], np.int64), "m1": np.array([-1], np.int64)})


def test_shape_chain_folds_and_batch_stays_free():
    model = flatten_by_shape_model()
    block = import_model(model)
    for b in (1, 2, 5):
        assert_matches_ort(model, block, {"x": np.random.randn(b, 3, 4).astype("f")})
    ops = graph_ops(block)
    assert "shape_array" not in ops and "take" not in ops and "Concat" not in ops, ops
    assert list(block.collect_params()) == [], "folded shape vectors must not become parameters"


def test_batch_folded_into_channels_uses_minus_one():
    # Reshape(x, [N*3, 4]) computed from Shape: the batch entry is not a copy of x's dim 0.
    nodes = [node("Shape", ["x"], ["s"]), node("Slice", ["s", "z", "o"], ["n"]),
             node("Mul", ["n", "three"], ["n3"]), node("Concat", ["n3", "four"], ["shp"], axis=0),
             node("Reshape", ["x", "shp"], ["y"])]
    model = make_model(nodes, [("x", ["N", 3, 4])], [("y", None)],
                       {"z": np.array([0], np.int64), "o": np.array([1], np.int64),
                        "three": np.array([3], np.int64), "four": np.array([4], np.int64)})
    block = import_model(model)
    for b in (1, 3):
        assert_matches_ort(model, block, {"x": np.random.randn(b, 3, 4).astype("f")})


def test_batch_dependent_float_is_computed_at_run_time():
    # y = x * float(batch size): the folded value differs per batch, so it runs as graph ops.
    nodes = [node("Shape", ["x"], ["s"]), node("Slice", ["s", "z", "o"], ["n"]),
             node("Cast", ["n"], ["nf"], to=F), node("Mul", ["x", "nf"], ["y"])]
    model = make_model(nodes, [("x", ["N", 2])], [("y", None)],
                       {"z": np.array([0], np.int64), "o": np.array([1], np.int64)})
    block = import_model(model)
    for b in (1, 3):
        assert_matches_ort(model, block, {"x": np.random.randn(b, 2).astype("f")})


def test_batch_sized_shape_vector_broadcasts_at_run_time():
    # Expand (N, 1) to (N, N): the second N becomes a broadcast to the batch size.
    nodes = [node("Shape", ["x"], ["s"]), node("Slice", ["s", "z", "o"], ["n"]),
             node("Concat", ["n", "n"], ["nn"], axis=0), node("Expand", ["x", "nn"], ["y"])]
    model = make_model(nodes, [("x", ["N", 1])], [("y", None)],
                       {"z": np.array([0], np.int64), "o": np.array([1], np.int64)})
    block = import_model(model)
    for b in (1, 3):
        assert_matches_ort(model, block, {"x": np.random.randn(b, 1).astype("f")})


def test_batch_dependent_static_input_is_refused_unless_batch_fixed():
    # ConstantOfShape([2N]): neither a batch-free vector nor a broadcast to N expresses it.
    nodes = [node("Shape", ["x"], ["s"]), node("Slice", ["s", "z", "o"], ["n"]),
             node("Mul", ["n", "two"], ["n2"]), node("ConstantOfShape", ["n2"], ["c"], name="fill_2n"),
             node("Concat", ["c", "flat"], ["y"], axis=0), node("Reshape", ["x", "m1"], ["flat"])]
    model = make_model(nodes, [("x", ["N", 2])], [("y", None)],
                       {"z": np.array([0], np.int64), "o": np.array([1], np.int64),
                        "two": np.array([2], np.int64), "m1": np.array([-1], np.int64)})
    with pytest.raises(OnnxImportError, match="fill_2n.*batch size.*fixed_batch=True"):
        import_model(model)
    fixed = import_model(model, input_shapes={"x": (3, 2)}, fixed_batch=True)
    assert_matches_ort(model, fixed, {"x": np.random.randn(3, 2).astype("f")})


def test_input_shapes_fill_symbolic_dims_for_folding():
    # Reshape to (N, H*W) where H, W are symbolic in the file: folds once input_shapes gives them.
    nodes = [node("Shape", ["x"], ["s"]), node("Slice", ["s", "one", "three"], ["hw"]),
             node("ReduceProd", ["hw"], ["p"], keepdims=1), node("Concat", ["m1", "p"], ["shp"], axis=0),
             node("Reshape", ["x", "shp"], ["y"])]
    model = make_model(nodes, [("x", ["N", "H", "W"])], [("y", None)],
                       {"one": np.array([1], np.int64), "three": np.array([3], np.int64),
                        "m1": np.array([-1], np.int64)})
    block = import_model(model, input_shapes={"x": (None, 4, 5)})
    assert "shape_array" not in graph_ops(block)
    for b in (1, 2):
        assert_matches_ort(model, block, {"x": np.random.randn(b, 4, 5).astype("f")})
    assert onnx_info(block).input_shapes == {"x": (None, 4, 5)}
    assert onnx_info(block).batch_free == {"x"}


def test_node_order_is_not_trusted():
    model = flatten_by_shape_model()
    shuffled = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(shuffled)
    before = model.SerializeToString()
    block = import_model(model)
    assert model.SerializeToString() == before, "the caller's ModelProto is not modified"
    assert_matches_ort(flatten_by_shape_model(), block, {"x": np.random.randn(2, 3, 4).astype("f")})


# ----------------------------------------------------------------- transformer-style graph

D, H, S = 8, 2, 5  # width, heads, tokens
def vit_block():
    """Tokens (N, S, D) -> prepend cls token (Expand to batch) -> attention with
    PyTorch-style Shape/Gather/Concat reshapes -> mean over tokens."""
    i64 = lambda *v: np.array(v, np.int64)
    nodes = [
        node("Shape", ["x"], ["xs"]), node("Gather", ["xs", "i0"], ["bsz"], axis=0),
        node("Unsqueeze", ["bsz", "ax0"], ["bsz1"]),
        node("Concat", ["bsz1", "one", "d"], ["cls_shape"], axis=0),
        node("Expand", ["cls_token", "cls_shape"], ["cls"]),
        node("Concat", ["cls", "x"], ["t"], axis=1),
        node("LayerNormalization", ["t", "ln.weight", "ln.bias"], ["tn"], axis=-1),
        node("MatMul", ["tn", "qkv.weight"], ["qkv0"]), node("Add", ["qkv0", "qkv.bias"], ["qkv"]),
        node("Shape", ["qkv"], ["qs"]), node("Gather", ["qs", "i0"], ["qb"], axis=0),
        node("Gather", ["qs", "i1"], ["qn"], axis=0),
        node("Unsqueeze", ["qb", "ax0"], ["qb1"]), node("Unsqueeze", ["qn", "ax0"], ["qn1"]),
        node("Concat", ["qb1", "qn1", "three_h_hd"], ["qkv_shape"], axis=0),
        node("Reshape", ["qkv", "qkv_shape"], ["qkv5"]),
        node("Transpose", ["qkv5"], ["qkvt"], perm=[2, 0, 3, 1, 4]),
        node("Split", ["qkvt", "split3"], ["q", "k", "v"], axis=0),
        node("Squeeze", ["q", "ax0"], ["q4"]), node("Squeeze", ["k", "ax0"], ["k4"]),
        node("Squeeze", ["v", "ax0"], ["v4"]),
        node("Transpose", ["k4"], ["kt"], perm=[0, 1, 3, 2]),
        node("MatMul", ["q4", "kt"], ["att0"]), node("Mul", ["att0", "scale"], ["att1"]),
        node("Softmax", ["att1"], ["att"], axis=-1), node("MatMul", ["att", "v4"], ["o4"]),
        node("Transpose", ["o4"], ["o4t"], perm=[0, 2, 1, 3]),
        node("Concat", ["qb1", "qn1", "d"], ["o_shape"], axis=0),
        node("Reshape", ["o4t", "o_shape"], ["o"]),
        node("ReduceMean", ["o"], ["y"], axes=[1], keepdims=0)]
    rng = np.random.RandomState(1)
    inits = {"i0": np.array(0, np.int64), "i1": np.array(1, np.int64), "ax0": i64(0),
             "one": i64(1), "d": i64(D),
             "three_h_hd": i64(3, H, D // H), "split3": i64(1, 1, 1),
             "cls_token": rng.randn(1, 1, D).astype("f"), "ln.weight": rng.rand(D).astype("f") + 0.5,
             "ln.bias": rng.randn(D).astype("f"), "qkv.weight": rng.randn(D, 3 * D).astype("f"),
             "qkv.bias": rng.randn(3 * D).astype("f"), "scale": np.float32((D // H) ** -0.5)}
    return make_model(nodes, [("x", ["N", S, D])], [("y", None)], inits, opset=17)


def test_attention_block_with_pytorch_style_shape_chains_and_batch_cls_token():
    model = vit_block()
    block = import_model(model)
    for b in (1, 2, 3):
        # LayerNorm and the qkv projection sum D values, attention S, then the mean S again
        assert_matches_ort(model, block, {"x": np.random.randn(b, S, D).astype("f")}, terms=D, depth=4)
    ops = graph_ops(block)
    assert "shape_array" not in ops and "broadcast_like" in ops, ops  # cls token follows the batch
    assert sorted(block.collect_params()) == ["cls_token", "ln.bias", "ln.weight", "qkv.bias",
                                              "qkv.weight"]


# ----------------------------------------------------------------- parameters

def weights_model(seed=0):
    rs = np.random.RandomState(seed)
    w = rs.randn(4, 3, 3, 3).astype("f")
    scale = rs.rand(1, 4, 1, 1).astype("f") + 0.5  # Paddle-style weight in a Constant node
    nodes = [node("Conv", ["x", "conv1.weight", "conv1.bias"], ["c"], pads=[1, 1, 1, 1]),
             const("channel_scale", scale), node("Mul", ["c", "channel_scale"], ["m"]),
             const("eps", np.float32(0.5)), node("Add", ["m", "eps"], ["a"]),
             node("Relu", ["a"], ["y"])]
    return make_model(nodes, [("x", ["N", 3, 6, 6])], [("y", None)],
                      {"conv1.weight": w, "conv1.bias": rs.randn(4).astype("f")})


def test_weights_become_named_params_and_scalars_constants():
    model = weights_model()
    block = import_model(model)
    params = block.collect_params()
    info = onnx_info(block)
    trainable = {n for n, p in params.items() if p.grad_req == "write"}
    assert trainable == {"conv1.weight", "conv1.bias", "channel_scale"}
    assert set(params) - trainable == set(info.constants) <= {"eps"}  # a scalar is never a weight
    np.testing.assert_array_equal(params["conv1.weight"].data().asnumpy(),
                                  numpy_helper.to_array(model.graph.initializer[0]))
    for b in (1, 2):
        assert_matches_ort(model, block, {"x": np.random.randn(b, 3, 6, 6).astype("f")}, terms=3 * 9 + 1)


def test_training_step_changes_only_trainable_params():
    block = import_model(weights_model())
    params = block.collect_params()
    before = {n: p.data().asnumpy().copy() for n, p in params.items()}
    trainer = mx.gluon.Trainer({n: p for n, p in params.items() if p.grad_req != "null"}, "sgd",
                               {"learning_rate": 0.1})
    x = mx.nd.array(np.random.randn(2, 3, 6, 6))
    with mx.autograd.record():
        loss = block(x).sum()
    loss.backward()
    trainer.step(2)
    for n, p in params.items():
        changed = not np.array_equal(before[n], p.data().asnumpy())
        assert changed == (p.grad_req == "write"), n


def test_node_outputs_allow_cutting_at_a_node():
    model = weights_model()
    block = import_model(model)
    out_name = onnx_info(block).node_outputs["m"]  # the Mul node (named after its output)
    assert onnx_info(block).node_outputs["c"] == onnx_info(block).node_outputs["c"]
    cut = block._cached_graph[1].get_internals()[out_name]
    sub = mx.gluon.SymbolBlock(cut, [mx.sym.var("x")], params=block.collect_params())
    x = np.random.randn(1, 3, 6, 6).astype("f")
    inter = onnx.helper.make_tensor_value_info("m", F, None)
    model.graph.output.append(inter)
    ref = ort_run(model, {"x": x})[1]
    assert_f32_close(sub(mx.nd.array(x)).asnumpy(), ref, terms=3 * 9 + 1)


def test_identity_shares_the_weight_and_outputs_can_be_constants():
    w = np.random.randn(3, 3).astype("f")
    nodes = [node("Identity", ["w"], ["w2"]), node("MatMul", ["x", "w"], ["a"]),
             node("MatMul", ["a", "w2"], ["y"]), node("Dropout", ["y"], ["yd"]),
             const("k", np.arange(3, dtype=np.float32))]
    model = make_model(nodes, [("x", ["N", 3])], [("yd", None), ("k", None)], {"w": w})
    block = import_model(model)
    assert set(block.collect_params()) == {"w", "k"}
    info = onnx_info(block)
    assert info.node_outputs["w2"] == info.node_outputs["w"] == "w"  # Identity is an alias
    out = block(mx.nd.ones((2, 3)))
    assert isinstance(out, tuple) and [o.shape for o in out] == [(2, 3), (3,)]
    assert_matches_ort(model, block, {"x": np.random.randn(2, 3).astype("f")}, terms=3, depth=2)


# ----------------------------------------------------------------- errors

def test_unsupported_ops_reported_all_at_once():
    nodes = [node("Relu", ["x"], ["a"]), node("FancyOp", ["a"], ["b"], domain="com.acme"),
             node("FancyOp", ["b"], ["c"], name="fancy2", domain="com.acme"),
             node("NonMaxSuppression", ["c", "c"], ["d"]),
             node("QLinearSigmoid", ["d"], ["y"], domain="com.microsoft")]
    model = make_model(nodes, [("x", [1, 4])], [("y", None)],
                       extra_opsets=[("com.acme", 1), ("com.microsoft", 1)])
    with pytest.raises(OnnxImportError) as e:
        import_model(model)
    msg = str(e.value)
    for part in ("FancyOp (custom domain 'com.acme', 2 nodes", "'fancy2'", "NonMaxSuppression",
                 "QLinearSigmoid", "opset 17", "QDQ"):
        assert part in msg, msg


def test_data_dependent_shape_names_the_node():
    nodes = [node("Cast", ["x"], ["xi"], to=onnx.TensorProto.INT64),
             node("Reshape", ["x", "xi"], ["y"], name="bad_reshape")]
    model = make_model(nodes, [("x", [2])], [("y", None)])
    with pytest.raises(OnnxImportError, match="bad_reshape"):
        import_model(model)


@pytest.mark.parametrize("problem", ["missing", "garbage", "truncated", "cycle", "dangling",
                                     "init_mismatch", "negative_dim", "escaping_external",
                                     "bad_input_shapes", "no_default_opset", "missing_output",
                                     "wrong_dtype", "huge_dim", "string_input"])
def test_malformed_inputs_raise_import_error(tmp_path, problem):
    path = tmp_path / "m.onnx"
    model = weights_model()
    if problem == "garbage":
        path.write_bytes(b"\x00\xffnot a protobuf at all" * 50)
    elif problem == "truncated":
        data = model.SerializeToString()
        path.write_bytes(data[: len(data) // 2])
    elif problem == "cycle":
        model = make_model([node("Relu", ["x", ], ["a"]), node("Add", ["a", "c"], ["b"]),
                            node("Relu", ["b"], ["c"])], [("x", [1])], [("b", None)])
    elif problem == "dangling":
        model.graph.node[2].input[0] = "nowhere"
    elif problem == "init_mismatch":
        model.graph.input.append(helper.make_tensor_value_info("conv1.bias", F, [7]))
    elif problem == "negative_dim":
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = -3
    elif problem == "string_input":
        model.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.STRING
    elif problem == "huge_dim":
        model.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 1 << 40
    elif problem == "escaping_external":
        onnx.external_data_helper.convert_model_to_external_data(
            model, all_tensors_to_one_file=True, location="../outside.bin", size_threshold=0)
    elif problem == "wrong_dtype":  # an int64 bias added to float activations
        model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.ones(4, np.int64),
                                                                    "conv1.bias"))
    elif problem == "missing_output":
        model.graph.output.append(helper.make_tensor_value_info("ghost", F, None))
    elif problem == "no_default_opset":
        model.opset_import[0].domain = "com.other"
    if problem not in ("missing", "garbage", "truncated"):
        path.write_bytes(model.SerializeToString())
    kwargs = {"input_shapes": {"x": (1, 3, 0, 6)}} if problem == "bad_input_shapes" else {}
    with pytest.raises(OnnxImportError) as e:
        import_model(str(path), **kwargs)
    if problem != "bad_input_shapes":
        assert "m.onnx" in str(e.value)
    if problem in ("cycle", "dangling"):
        assert problem in str(e.value) or "cycle" in str(e.value)


def test_external_data_next_to_model_loads(tmp_path):
    model = weights_model()
    inline = model.SerializeToString()
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="m.data", size_threshold=0)
    assert os.path.getsize(tmp_path / "m.data") > 0
    block = import_model(str(tmp_path / "m.onnx"))
    assert onnx_info(block).source == str(tmp_path / "m.onnx")
    assert_matches_ort(inline, block, {"x": np.random.randn(1, 3, 6, 6).astype("f")}, terms=3 * 9 + 1)


# ----------------------------------------------------------------- quantization

def qdq_model(rs):
    w = rs.randn(4, 3).astype("f")
    scale = np.float32(np.abs(w).max() / 127)
    wq = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    nodes = [node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             node("DequantizeLinear", ["fc.weight_quantized", "ws"], ["fc.weight_dq"]),
             node("Gemm", ["xd", "fc.weight_dq"], ["y"], transB=1)]
    return make_model(nodes, [("x", ["N", 3])], [("y", None)],
                      {"xs": np.float32(0.05), "xz": np.uint8(128), "ws": scale,
                       "fc.weight_quantized": wq})


def test_qdq_weights_become_float_params_and_activations_fake_quantize():
    rs = np.random.RandomState(5)
    model = qdq_model(rs)
    block = import_model(model)
    params = block.collect_params()
    assert [n for n, p in params.items() if p.grad_req == "write"] == ["fc.weight_dq"]
    assert params["fc.weight_dq"].dtype == np.float32
    x = (rs.randn(6, 3) * 0.5).astype("f")
    # Ties of the 0.05 step (ONNX rounds half to even), and x/s = -27.499998 whose
    # x/s + 128 is a float32 tie: ONNX rounds before adding the zero point.
    x[0, :3] = [0.025, 0.075, -1.3749999]
    x[1, :3] = [10.0, -10.0, 0.0]  # saturates at 255 and 0
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    xd = dequantize_ref(quantize_ref(x, inits["xs"], inits["xz"]), inits["xs"], inits["xz"])
    wd = dequantize_ref(inits["fc.weight_quantized"], inits["ws"])
    np.testing.assert_array_equal(params["fc.weight_dq"].data().asnumpy(), wd)
    want = xd.astype(np.float64) @ wd.T.astype(np.float64)
    assert_f32_close(mx_run(block, {"x": x})[0], want, scale=np.abs(xd) @ np.abs(wd).T, terms=3)
    xa = mx.nd.array(x)
    xa.attach_grad()
    with mx.autograd.record():
        loss = block(xa).sum()
    loss.backward()
    assert np.abs(xa.grad.asnumpy()).sum() > 0, "fake quantization must pass gradients"


def test_none_in_input_shapes_frees_a_batch_pinned_by_the_exporter():
    pinned = flatten_by_shape_model()
    pinned.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1  # exported at batch 1
    x = np.random.randn(3, 3, 4).astype("f")
    # Pinned, the folded Reshape target keeps the batch of 1, as the file says.
    assert import_model(pinned)(mx.nd.array(x)).shape == (1, 36)
    with pytest.raises(OnnxImportError, match="give None there to free the batch"):
        import_model(pinned, input_shapes={"x": (3, 3, 4)})
    block = import_model(pinned, input_shapes={"x": (None, 3, 4)})
    assert_matches_ort(flatten_by_shape_model(), block, {"x": x})


def test_resize_sizes_from_shape_chain_keep_the_batch_free():
    # PyTorch F.interpolate(size=...) export: sizes = Concat(Shape(x)[:2], [8, 10]).
    nodes = [node("Shape", ["x"], ["s"]), node("Slice", ["s", "z", "two"], ["nc"]),
             node("Concat", ["nc", "hw"], ["sizes"], axis=0),
             node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest")]
    model = make_model(nodes, [("x", ["N", 2, 4, 5])], [("y", None)],
                       {"z": np.array([0], np.int64), "two": np.array([2], np.int64),
                        "hw": np.array([8, 10], np.int64)})
    block = import_model(model)
    for b in (1, 2):
        assert_matches_ort(model, block, {"x": np.random.randn(b, 2, 4, 5).astype("f")})


def test_slice_end_at_the_batch_size_becomes_open_ended():
    nodes = [node("Shape", ["x"], ["s"]), node("Slice", ["s", "z", "o"], ["n"]),
             node("Concat", ["n", "three"], ["ends"], axis=0),
             node("Slice", ["x", "starts", "ends", "axes"], ["y"])]
    model = make_model(nodes, [("x", ["N", 5])], [("y", None)],
                       {"z": np.array([0], np.int64), "o": np.array([1], np.int64),
                        "three": np.array([3], np.int64), "starts": np.array([0, 1], np.int64),
                        "axes": np.array([0, 1], np.int64)})
    block = import_model(model)
    for b in (1, 4):
        assert_matches_ort(model, block, {"x": np.random.randn(b, 5).astype("f")})


def test_single_channel_bias_is_a_trainable_weight():
    nodes = [node("Conv", ["x", "head.weight", "head.bias"], ["y"])]
    model = make_model(nodes, [("x", ["N", 2, 3, 3])], [("y", None)],
                       {"head.weight": np.random.randn(1, 2, 1, 1).astype("f"),
                        "head.bias": np.array([0.5], np.float32)})
    block = import_model(model)
    assert {n: p.grad_req for n, p in block.collect_params().items()} == {
        "head.weight": "write", "head.bias": "write"}
    assert_matches_ort(model, block, {"x": np.random.randn(2, 2, 3, 3).astype("f")}, terms=2 + 1)


def test_imported_block_round_trips_through_mxnet_export(tmp_path):
    """ONNX names (dots, colons, slashes) survive MXNet's symbol/params files."""
    block = import_model(vit_block())
    block.hybridize()
    x = mx.nd.array(np.random.randn(2, S, D))
    want = block(x).asnumpy()
    block.export(str(tmp_path / "m"))
    back = mx.gluon.SymbolBlock.imports(str(tmp_path / "m-symbol.json"), ["x"],
                                        str(tmp_path / "m-0000.params"))
    np.testing.assert_array_equal(back(x).asnumpy(), want)


def test_dynamically_quantized_matmul_imports_as_float():
    """onnxruntime quantize_dynamic output: DynamicQuantizeLinear (expanded from its ONNX
    function) and MatMulInteger (dequantize → MatMul) become a float graph whose int8
    weight is a trainable float parameter, and compute what exact integer arithmetic gives."""
    rs = np.random.RandomState(6)
    w = rs.randn(6, 3).astype("f")
    ws = np.float32(np.abs(w).max() / 127)
    wq = np.round(w / ws).astype(np.int8)
    nodes = [node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"], name="dql"),
             node("MatMulInteger", ["xq", "fc.w_quantized", "xz", "fc.w_zero"], ["acc"], name="mmi"),
             node("Cast", ["acc"], ["accf"], to=F), node("Mul", ["xs", "fc.w_scale"], ["s"]),
             node("Mul", ["accf", "s"], ["y"])]
    model = make_model(nodes, [("x", ["N", 6])], [("y", None)],
                       {"fc.w_quantized": wq, "fc.w_zero": np.int8(0), "fc.w_scale": ws})
    block = import_model(model)
    assert [n for n, p in block.collect_params().items() if p.grad_req == "write"] == [
        "fc.w_quantized/float"]
    for b in (1, 4):
        x = rs.randn(b, 6).astype("f")
        xq, xs, xz = dynamic_quantize_ref(x)
        acc = matmul_integer_ref(xq, wq, xz, 0)  # exact in float32 too: |acc| < 2**24
        want = acc.astype(np.float32) * (xs * ws)
        np.testing.assert_array_equal(mx_run(block, {"x": x})[0], want)


def test_qlinear_conv_imports_as_float_fake_quantization():
    """QOperator-format models: QLinearConv runs as dequantize → Conv → quantize, with
    trainable float weight and bias, and matches exact integer arithmetic."""
    rs = np.random.RandomState(7)
    w = rs.randn(4, 2, 3, 3).astype("f")
    ws = (np.abs(w).reshape(4, -1).max(axis=1) / 127).astype("f")
    xs, ys, z = np.float32(0.02), np.float32(0.05), np.uint8(128)
    wq = np.round(w / ws[:, None, None, None]).astype(np.int8)
    bias = np.round(rs.randn(4) / (xs * ws)).astype(np.int32)
    nodes = [node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             node("QLinearConv", ["xq", "xs", "xz", "wq", "ws", "wz", "ys", "yz", "b"], ["yq"],
                  name="qconv", pads=[1, 1, 1, 1]),
             node("DequantizeLinear", ["yq", "ys", "yz"], ["y"])]
    model = make_model(nodes, [("x", ["N", 2, 5, 5])], [("y", None)],
                       {"xs": xs, "xz": z, "ys": ys, "yz": z, "b": bias, "wq": wq, "ws": ws,
                        "wz": np.zeros(4, np.int8)})
    block = import_model(model)
    assert sorted(n for n, p in block.collect_params().items() if p.grad_req == "write") == [
        "b/dequantized", "wq/dequantized"]
    x = rs.randn(2, 2, 5, 5).astype("f")
    got = mx_run(block, {"x": x})[0]
    xq = quantize_ref(x, xs, z)
    acc = conv_integer_ref(xq, wq, z, 0, pads=(1, 1, 1, 1)) + bias.reshape(1, 4, 1, 1)
    multiplier = (np.float64(xs) * ws.astype(np.float64) / np.float64(ys)).reshape(1, 4, 1, 1)
    want, real = requantize_ref(acc, multiplier, z)
    got_q = np.rint(got / ys) + np.float64(z)
    np.testing.assert_array_equal(got, dequantize_ref(got_q.astype(np.uint8), ys, z))
    # float32 accumulation may round the other way only within its error of a tie
    abs_acc = conv_integer_ref(np.abs(xq.astype(np.int64) - z), np.abs(wq.astype(np.int64)),
                               pads=(1, 1, 1, 1)) + np.abs(bias).reshape(1, 4, 1, 1)
    assert_requantized(got_q, want, real, requantize_slack(abs_acc, multiplier, 2 * 9 + 1, real))


def test_model_local_functions_are_inlined():
    """torch.onnx dynamo exports wrap modules in local functions with attributes."""
    act = helper.make_node("LeakyRelu", ["m"], ["out"])
    act.attribute.append(helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))
    body = [helper.make_node("Mul", ["a", "w"], ["m"]), act]
    fn = helper.make_function("pkg.blocks", "ScaledAct", ["a", "w"], ["out"], body,
                              [helper.make_opsetid("", 17)], attributes=["alpha"])
    call = helper.make_node("ScaledAct", ["x", "block.w"], ["y"], domain="pkg.blocks", alpha=0.3)
    model = make_model([call], [("x", ["N", 4])], [("y", None)],
                       {"block.w": np.random.randn(4).astype("f")}, extra_opsets=[("pkg.blocks", 1)])
    model.functions.append(fn)
    block = import_model(model)
    assert [n for n, p in block.collect_params().items() if p.grad_req == "write"] == ["block.w"]
    assert_matches_ort(model, block, {"x": np.random.randn(3, 4).astype("f")})


def test_constant_node_onnxruntime_cannot_evaluate_runs_in_the_graph():
    # onnxruntime has no int16 Min kernel: the folding attempt fails, the converter takes over.
    nodes = [node("Min", ["a", "b"], ["ab"]), node("Cast", ["ab"], ["abf"], to=F),
             node("Add", ["x", "abf"], ["y"])]
    model = make_model(nodes, [("x", ["N", 3])], [("y", None)],
                       {"a": np.array([1, 2, 3], np.int16), "b": np.array([3, -2, 5], np.int16)})
    block = import_model(model)
    x = np.random.randn(2, 3).astype("f")
    assert_f32_close(mx_run(block, {"x": x})[0], x + np.array([1, -2, 3]))


def test_if_on_a_static_shape_condition_inlines_the_taken_branch():
    """Scripted exports guard code with ``if x.dim() == 3``: the condition folds."""
    then = helper.make_graph([node("Mul", ["xr", "w"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, None)])
    other = helper.make_graph([node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, None)])
    nodes = [node("Shape", ["x"], ["s"]), node("Size", ["s"], ["rank"]),
             node("Equal", ["rank", "three"], ["is3"]),
             node("If", ["is3"], ["y"], name="guard", then_branch=then, else_branch=other),
             node("Relu", ["x"], ["xr"])]  # read by the branch, listed after the If
    model = make_model(nodes, [("x", ["N", 2, 4])], [("y", None)],
                       {"three": np.array(3, np.int64), "w": np.random.randn(4).astype("f")})
    block = import_model(model)
    assert [n for n, p in block.collect_params().items() if p.grad_req == "write"] == ["w"]
    assert "negative" not in graph_ops(block)
    for b in (1, 2):
        assert_matches_ort(model, block, {"x": np.random.randn(b, 2, 4).astype("f")})


# ----------------------------------------------------------------- free sequence axes (issue 39)

def _token_model(extra_nodes=(), extra_outputs=()):
    """int64 ``ids``/``mask`` [N, S]: rows of a table at the ids plus the rows at arange(S)
    (position ids), and the mask broadcast to [N, S, S] by Expand to a shape built from Shape."""
    I64 = onnx.TensorProto.INT64
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.int64), name)  # noqa: E731
    nodes = [helper.make_node("Shape", ["ids"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
             helper.make_node("Range", ["zero", "s", "one"], ["pos"]),
             helper.make_node("Unsqueeze", ["pos", "axis0"], ["pos2"]),
             helper.make_node("Gather", ["table", "ids"], ["tok"]),
             helper.make_node("Gather", ["table", "pos2"], ["at"]),
             helper.make_node("Add", ["tok", "at"], ["emb"]),
             helper.make_node("Unsqueeze", ["n", "axis0"], ["n1"]),
             helper.make_node("Unsqueeze", ["s", "axis0"], ["s1"]),
             helper.make_node("Concat", ["n1", "s1", "s1"], ["nss"], axis=0),
             helper.make_node("Unsqueeze", ["mask", "axis1"], ["m3"]),
             helper.make_node("Expand", ["m3", "nss"], ["mm"]),
             helper.make_node("Cast", ["mm"], ["square"], to=F), *extra_nodes]
    graph = helper.make_graph(
        nodes, "tokens", [helper.make_tensor_value_info(n, I64, ["N", "S"]) for n in ("ids", "mask")],
        [helper.make_tensor_value_info(n, F, None) for n in ("emb", "square", *extra_outputs)],
        [numpy_helper.from_array(np.random.RandomState(0).randn(40, 3).astype(np.float32), "table"),
         c("zero", 0), c("one", 1), c("axis0", [0]), c("axis1", [1]), c("two", 2)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _token_feeds(batch, seq):
    rs = np.random.RandomState(batch * 100 + seq)
    return {"ids": rs.randint(0, 40, (batch, seq)).astype(np.int64),
            "mask": (rs.rand(batch, seq) > 0.3).astype(np.int64)}


def test_free_sequence_axis_of_integer_inputs_stays_free():
    """A symbolic length of int64 inputs is tracked like the batch: position ids become
    arange_like, the mask's Expand target a broadcast along the length, so one import runs
    at every (batch, length); a length given in input_shapes is fixed (and refused by name)."""
    model = _token_model()
    block = import_model(model)
    assert onnx_info(block).free_axes == {"ids": {1: ("S", 5)}, "mask": {1: ("S", 5)}}
    for batch, seq in ((1, 4), (2, 6), (3, 11)):
        assert_matches_ort(model, block, _token_feeds(batch, seq))
    pinned = import_model(model, input_shapes={"ids": [None, 6], "mask": [None, 6]})
    assert onnx_info(pinned).free_axes == {}
    assert_matches_ort(model, pinned, _token_feeds(2, 6))
    with pytest.raises(OnnxImportError, match=r"'ids' has shape \(2, 4\).*imported for \['N', 6\]"):
        mx_run(pinned, _token_feeds(2, 4))


@pytest.mark.parametrize("last", ["Range", "ConstantOfShape"])
def test_value_of_twice_the_free_length_is_refused_by_name(last):
    """arange(2·S) and a fill of shape [2·S] have no shape-free form: the refusal names the
    node and asks for the length; with the length given they import."""
    extra = [helper.make_node("Mul", ["s", "two"], ["s2"])]
    if last == "Range":
        extra += [helper.make_node("Range", ["zero", "s2", "one"], ["twice"], name="double_range"),
                  helper.make_node("Cast", ["twice"], ["out"], to=F)]
    else:
        extra += [helper.make_node("Unsqueeze", ["s2", "axis0"], ["s2v"]),
                  helper.make_node("ConstantOfShape", ["s2v"], ["out"], name="double_fill")]
    model = _token_model(extra, ("out",))
    with pytest.raises(OnnxImportError, match=r"double_.*free.*input_shapes"):
        import_model(model)
    block = import_model(model, input_shapes={"ids": [None, 6], "mask": [None, 6]})
    assert_matches_ort(model, block, _token_feeds(2, 6))
