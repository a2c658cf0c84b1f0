"""ONNX out for models that came in as ONNX: the source graph patched, not re-converted.

Every real model (PyTorch legacy/dynamo exports, torchvision, PaddleOCR): import → hybridize →
one SGD step on every weight → export → onnxruntime reproduces the block, the file keeps the
source's opset and names, and holds exactly the trained values. Surgery on a small hand-built
graph: each edit shows up as the graph edit it stands for.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gluontl.export import export_onnx
from gluontl.onnx import import_model
from gluontl.recipe import HeadSpec, Rule
from gluontl.rules import apply_plan, make_plan
from gluontl.surgery import attach_head, cut_at, drop_last, ignore
from tests.helpers import ONNX_FIXTURES, REPO, ort_run

FIXTURES = ONNX_FIXTURES
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())["fixtures"]
SATURATING = {"Sigmoid", "Softmax", "HardSigmoid"}


def _paddle_models() -> list[tuple[str, tuple[int, ...]]]:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None:
        return []
    folder = Path(spec.origin).parent / "models"
    sizes = {"det": (3, 64, 96), "rec": (3, 48, 160), "cls": (3, 48, 192)}
    return [(str(p), next(v for k, v in sizes.items() if k in p.name)) for p in sorted(folder.glob("*.onnx"))]


CASES = [pytest.param(str(FIXTURES / e["file"]), e["input"], tuple(e["test_shapes"][-1][1:]),
                      2 in e["dynamic_dims"], id=e["file"][:-5]) for e in MANIFEST]
CASES += [pytest.param(path, "x", shape, True, id=Path(path).stem) for path, shape in _paddle_models()]


def _predict(block, x: np.ndarray) -> list[np.ndarray]:
    with mx.autograd.predict_mode():
        out = block(mx.nd.array(x))
    return [o.asnumpy() for o in (out if isinstance(out, (list, tuple)) else [out])]


def _assert_outputs_match(got: list[np.ndarray], want: list[np.ndarray], squashed: list[bool]) -> None:
    """Within 1e-4 of each output's range; a Sigmoid/Softmax output's range is at least 1
    (onnxruntime's Sigmoid is accurate to ~1e-7 absolute, not relative, near 0 and 1)."""
    assert len(got) == len(want)
    for g, w, sq in zip(got, want, squashed):
        assert g.shape == w.shape
        scale = max(float(np.ptp(w)), 1.0 if sq else 0.0) or float(np.abs(w).max()) or 1.0
        assert np.abs(g.astype(np.float64) - w).max() <= 1e-4 * scale


def _squashed(model: onnx.ModelProto) -> list[bool]:
    producer = {o: n for n in model.graph.node for o in n.output}
    out = []
    for o in model.graph.output:
        n = producer.get(o.name)
        while n is not None and n.op_type == "Identity":
            n = producer.get(n.input[0])
        out.append(n is not None and n.op_type in SATURATING)
    return out


def _live_nodes(model: onnx.ModelProto, held: set[str]) -> set[str]:
    """Nodes an output still needs once the tensors in ``held`` are stored values: the source's
    nodes minus those that only computed weights the importer folded (e.g. Swin's relative
    position bias gathered from its table)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    live, stack = set(), [o.name for o in model.graph.output]
    while stack:
        t = stack.pop()
        n = producer.get(t)
        if t in held or n is None or n.name in live:
            continue
        live.add(n.name)
        stack.extend(x for x in n.input if x)
    return live


def _tensor_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    values[n.output[0]] = numpy_helper.to_array(a.t)
    return values


@pytest.mark.parametrize("path,input_name,sample,free_hw", CASES)
def test_real_model_trains_on_every_weight_and_exports_its_own_graph(path, input_name, sample, free_hw, tmp_path):
    source = onnx.load(path)
    block = import_model(path, input_shapes={input_name: (None, *sample)} if free_hw else None)
    params = block.collect_params()
    # The Gluon contract: every Parameter knows its shape and dtype, like a Gluon-built one.
    for name, p in params.items():
        assert p.shape == p.data().shape and np.dtype(p.dtype) == p.data().dtype, name
    rng = np.random.RandomState(0)
    x = rng.standard_normal((2, *sample)).astype(np.float32)
    block.hybridize()
    trainable = {n: p for n, p in params.items() if p.grad_req != "null"}
    before = {n: p.data().asnumpy().copy() for n, p in trainable.items()}
    trainer = mx.gluon.Trainer(trainable, "sgd", {"learning_rate": 0.05})
    with mx.autograd.record():
        out = block(mx.nd.array(x))
        loss = sum((o.astype("float32") ** 2).mean() for o in (out if isinstance(out, tuple) else [out]))
    loss.backward()
    trainer.step(2)
    moved = [n for n, p in trainable.items() if not np.array_equal(p.data().asnumpy(), before[n])]
    assert len(moved) >= len(trainable) // 2, f"only {len(moved)} of {len(trainable)} weights trained"

    exported = onnx.load(export_onnx(block, tmp_path / "out.onnx", {input_name: (1, *sample)}))
    assert [(o.domain, o.version) for o in exported.opset_import] == [(o.domain, o.version) for o in source.opset_import]
    assert [i.name for i in exported.graph.input if i.name == input_name] == [input_name]
    assert [o.name for o in exported.graph.output] == [o.name for o in source.graph.output]
    values = _tensor_values(exported)
    for name in trainable:  # the trained values, bit for bit, under their own names
        np.testing.assert_array_equal(values[name].reshape(-1).astype(np.float32),
                                      trainable[name].data().asnumpy().reshape(-1), err_msg=name)
    assert _live_nodes(source, set(trainable)) == {n.name for n in exported.graph.node}
    for batch in (1, 2):
        _assert_outputs_match(ort_run(exported, {input_name: x[:batch]}),
                              _predict(block, x[:batch]), _squashed(exported))


# ------------------------------------------------------------------ surgery on a known graph

def _graph() -> onnx.ModelProto:
    """x → conv → bn → relu → drop → conv2 → relu2 → gap → flat → fc → softmax."""
    rng = np.random.RandomState(3)
    inits = {"w1": rng.randn(6, 3, 3, 3) * 0.3, "gamma": rng.rand(6) + 0.5, "beta": rng.randn(6) * 0.1,
             "mean": rng.randn(6) * 0.1, "var": rng.rand(6) + 0.5, "w2": rng.randn(8, 6, 3, 3) * 0.2,
             "b2": rng.randn(8) * 0.1, "fc_w": rng.randn(5, 8) * 0.3, "fc_b": rng.randn(5) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "gamma", "beta", "mean", "var"], ["b1"], name="bn"),
             helper.make_node("Relu", ["b1"], ["r1"], name="relu"),
             helper.make_node("Dropout", ["r1"], ["d1"], name="drop"),
             helper.make_node("Conv", ["d1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["g"], name="gap"),
             helper.make_node("Flatten", ["g"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
             helper.make_node("Softmax", ["logits"], ["prob"], name="softmax", axis=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["N", 5])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


SHAPE = (3, 8, 8)


def _x(batch: int = 2) -> np.ndarray:
    return np.random.RandomState(11).standard_normal((batch, *SHAPE)).astype(np.float32)


def _export(block, tmp_path, name="m.onnx") -> onnx.ModelProto:
    return onnx.load(export_onnx(block, tmp_path / name))


def _node_names(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in model.graph.node]


@pytest.mark.parametrize("edit,nodes,output", [
    (lambda b: cut_at(b, "relu2"), ["conv", "bn", "relu", "drop", "conv2", "relu2"], "r2"),
    (lambda b: cut_at(b, "c1"), ["conv"], "c1"),  # a tensor name works too
    (lambda b: drop_last(b, 3), ["conv", "bn", "relu", "drop", "conv2", "relu2", "gap"], "g"),
    (lambda b: ignore(b, ["relu"]), ["conv", "bn", "drop", "conv2", "relu2", "gap", "flat", "fc", "softmax"], "prob"),
    (lambda b: ignore(b, ["drop"]), ["conv", "bn", "relu", "conv2", "relu2", "gap", "flat", "fc", "softmax"], "prob"),
])
def test_surgery_becomes_graph_edits(edit, nodes, output, tmp_path):
    block = edit(import_model(_graph()))
    model = _export(block, tmp_path)
    assert _node_names(model) == nodes
    assert [o.name for o in model.graph.output] == [output]
    assert _squashed(model) == [output == "prob"]
    _assert_outputs_match(ort_run(model, {"x": _x()}), _predict(block, _x()), _squashed(model))


def test_ignoring_a_dropout_keeps_the_layer_before_it():
    """Dropout is an identity in the block; ignoring it must not take the relu with it."""
    full = import_model(_graph())
    want = _predict(full, _x())[0]
    got = _predict(ignore(full, ["drop"]), _x())[0]
    np.testing.assert_array_equal(got, want)
    without_relu = _predict(ignore(full, ["relu"]), _x())[0]
    assert np.abs(without_relu - want).max() > 1e-3


def test_ignore_rewires_readers_of_the_removed_node(tmp_path):
    model = _export(ignore(import_model(_graph()), ["relu"]), tmp_path)
    conv2 = next(n for n in model.graph.node if n.name == "conv2")
    drop = next(n for n in model.graph.node if n.name == "drop")
    assert drop.input[0] == "b1" and conv2.input[0] == "d1"


@pytest.mark.parametrize("spec", [
    HeadSpec(classes=4),
    HeadSpec(classes=4, hidden=[7], activation="gelu", dropout=0.3),
    HeadSpec(classes=3, hidden=[5, 6], activation="tanh", pool="max", inputs=["relu", "relu2"]),
    HeadSpec(classes=2, activation="sigmoid", hidden=[3], pool="none", inputs=["relu2"]),
])
def test_new_head_is_appended_as_onnx_nodes(spec, tmp_path):
    base = import_model(_graph())
    cut = base if spec.inputs else cut_at(base, "relu2")
    block = attach_head(cut, spec, SHAPE)
    x = _x()
    with mx.autograd.record():
        loss = (block(mx.nd.array(x)) ** 2).sum()
    loss.backward()
    mx.gluon.Trainer(block.collect_params(), "sgd", {"learning_rate": 0.1}).step(2)
    model = _export(block, tmp_path)
    ops = [n.op_type for n in model.graph.node if n.name.startswith("head/")]
    assert ops.count("Gemm") == len(spec.hidden) + 1
    pool = {"max": "GlobalMaxPool", "none": None}.get(spec.pool, "GlobalAveragePool")
    assert ops.count(pool) == (len(spec.inputs) or 1) if pool else not any("Pool" in o for o in ops)
    assert ("Erf" in ops) == (spec.activation == "gelu" and bool(spec.hidden))
    assert "Dropout" not in ops
    values = _tensor_values(model)
    for name, p in block.collect_params().items():
        if name.startswith("head."):
            np.testing.assert_array_equal(values[name], p.data().asnumpy())
    assert "fc" not in _node_names(model) and "softmax" not in _node_names(model)
    _assert_outputs_match(ort_run(model, {"x": x}), _predict(block, x), [False])


def test_training_settings_do_not_leak_into_the_file(tmp_path):
    """Frozen BatchNorm and grad_req 'add' change training, not inference: same bytes."""
    block = import_model(_graph())
    plain = export_onnx(block, tmp_path / "plain.onnx").read_bytes()
    apply_plan(block, make_plan(block, [Rule(match=["*"], grad_req="add"), Rule(type=["BatchNorm"], bn="frozen"),
                                        Rule(match=["w2"], grad_req="null")]))
    block.hybridize()
    _predict(block, _x())
    assert export_onnx(block, tmp_path / "set.onnx").read_bytes() == plain


def test_running_statistics_are_written_back(tmp_path):
    block = import_model(_graph())
    apply_plan(block, make_plan(block, [Rule(type=["BatchNorm"], bn="train")]))
    block.hybridize()
    params = block.collect_params()
    mean0 = params["mean"].data().asnumpy().copy()
    with mx.autograd.record():
        loss = block(mx.nd.array(_x(4))).sum()
    loss.backward()
    mx.nd.waitall()
    mean1 = params["mean"].data().asnumpy()
    assert np.abs(mean1 - mean0).max() > 1e-4  # BatchNorm trained: its statistics moved
    values = _tensor_values(_export(block, tmp_path))
    np.testing.assert_array_equal(values["mean"], mean1)
    np.testing.assert_array_equal(values["var"], params["var"].data().asnumpy())


def test_constant_node_weights_are_written_into_the_constant(tmp_path):
    """Paddle keeps weights in Constant nodes: the trained value goes back into the node."""
    model = _graph()
    w1 = next(t for t in model.graph.initializer if t.name == "w1")
    model.graph.node.insert(0, helper.make_node("Constant", [], ["w1"], name="w1_const", value=w1))
    model.graph.initializer.remove(w1)
    block = import_model(model)
    block.collect_params()["w1"].set_data(mx.nd.ones((6, 3, 3, 3)) * 0.25)
    out = _export(block, tmp_path)
    const = next(n for n in out.graph.node if n.name == "w1_const")
    np.testing.assert_array_equal(numpy_helper.to_array(const.attribute[0].t), np.full((6, 3, 3, 3), 0.25, np.float32))


def test_folded_weight_becomes_an_initializer(tmp_path):
    """A weight the importer folded out of a computation (here a Transpose of a stored
    matrix) is trained as itself; the file holds the trained value in place of that
    computation."""
    model = _graph()
    fc_w = next(t for t in model.graph.initializer if t.name == "fc_w")
    fc_w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(fc_w).T.copy(), "fc_w"))
    model.graph.node.insert(0, helper.make_node("Transpose", ["fc_w"], ["fc_wt"], name="t", perm=[1, 0]))
    gemm = next(n for n in model.graph.node if n.name == "fc")
    gemm.input[1] = "fc_wt"
    block = import_model(model)
    assert "fc_wt" in block.collect_params().keys()
    block.collect_params()["fc_wt"].set_data(mx.nd.ones((5, 8)))
    out = _export(block, tmp_path)
    assert "t" not in _node_names(out) and "fc_w" not in _tensor_values(out)
    np.testing.assert_array_equal(_tensor_values(out)["fc_wt"], np.ones((5, 8), np.float32))
    _assert_outputs_match(ort_run(out, {"x": _x()}), _predict(block, _x()), [True])


def test_inputs_keep_their_names_unless_others_are_given(tmp_path):
    block = import_model(_graph())
    assert [i.name for i in _export(block, tmp_path, "a.onnx").graph.input] == ["x"]
    renamed = onnx.load(export_onnx(block, tmp_path / "b.onnx", {"data": (1, *SHAPE)}))
    assert [i.name for i in renamed.graph.input] == ["data"]
    assert next(n for n in renamed.graph.node if n.name == "conv").input[0] == "data"


def test_finetuned_onnx_recipe_exports_its_source_graph(tmp_path):
    """The recipe path: an ONNX model cut, given a head and fine-tuned goes out as the source
    graph up to the cut plus the head, under the source's input name and opset, holding the
    trained head and the untouched backbone."""
    from gluontl.recipe import load_recipe
    from gluontl.train.loop import finetune
    from gluontl.train.runs import export_run, load_run

    recipe = load_recipe(REPO / "recipes" / "onnx_resnet_cut.yaml", ["train.epochs=1"])
    recipe = recipe.model_copy(update={"export": recipe.export.model_copy(update={"input_names": None})})
    run = finetune(recipe, runs_root=tmp_path, quiet=True).run_dir
    (path,) = export_run(run)
    model = onnx.load(path)
    source = onnx.load(recipe.model.source.split(":", 1)[1])
    assert [i.name for i in model.graph.input] == ["x"]
    assert model.opset_import[0].version == source.opset_import[0].version
    assert _live_nodes(source, set()) >= {n.name for n in model.graph.node if not n.name.startswith("head/")}
    assert "/layer2/layer2.1/Relu_1" in _node_names(model) and "/fc/Gemm" not in _node_names(model)
    _, net = load_run(run)
    values = _tensor_values(model)
    for name, p in net.collect_params().items():
        if name in values:
            np.testing.assert_array_equal(values[name].astype(np.float32), p.data().asnumpy(), err_msg=name)
    assert {"head.fc1.weight", "head.fc.weight"} <= set(values)
    x = np.random.RandomState(2).standard_normal((2, 3, 32, 32)).astype(np.float32)
    _assert_outputs_match(ort_run(model, {"x": x}), _predict(net, x), [False])
