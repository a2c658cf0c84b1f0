"""LoRA adapters (gluontl/adapters.py) as a rule setting, on zoo, symbol and imported ONNX models.

References: the base model's own output (bit for bit at initialisation), numpy (the adapted
Dense forward, the merged kernel as Σ_r B·A), onnxruntime's float kernels (merged exports),
parameter values before and after real SGD steps, files that round-trip."""
from __future__ import annotations

import hashlib
import json

import mxnet as mx
import numpy as np
import onnx
import pytest
from tests.helpers import assert_f32_close, batch, ort_run, resnet18_weights, run_cli, sgd_step, tiny_symbol
from onnx import TensorProto, helper, numpy_helper

import gluontl
from gluontl.adapters import adapters_of, add_lora, load_adapters, merge_adapters, save_adapters
from gluontl.errors import AdapterError, RuleError
from gluontl.export import export_onnx
from gluontl.export.exporters import export_block
from gluontl.mxinternals import lora_record, onnx_info
from gluontl.naming import named_params
from gluontl.recipe import as_rules, load_recipe
from gluontl.rules import apply_plan, attach_adapters, format_plan, make_plan, trainable_params

LORA = {"kind": "lora", "rank": 4, "alpha": 8}


def _values(net) -> dict[str, np.ndarray]:
    return {n: e.param.data().asnumpy().copy() for n, e in named_params(net).items()}


def _predict(net, x) -> np.ndarray:
    with mx.autograd.predict_mode():
        return net(x if isinstance(x, mx.nd.NDArray) else mx.nd.array(x)).asnumpy()


def _adapt(net, rules, input_shape=None):
    net = attach_adapters(net, rules, input_shape=input_shape)
    plan = make_plan(net, rules, input_shape=input_shape)
    apply_plan(net, plan)
    return net, plan


def _onnx_file(path, kind: str) -> str:
    """A tiny ONNX model: two Conv (3x3 stride 2 pad 1 with bias, then 1x1) and a pooled output, or
    Gemm (transB=1) then MatMul + Add."""
    rs = np.random.RandomState(7)
    t = lambda name, *shape: numpy_helper.from_array((rs.randn(*shape) * 0.3).astype(np.float32), name)  # noqa: E731
    if kind == "conv":
        inits = [t("w1", 8, 3, 3, 3), t("b1", 8), t("w2", 4, 8, 1, 1)]
        nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1], strides=[2, 2]),
                 helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
                 helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
                 helper.make_node("GlobalAveragePool", ["c2"], ["p"], name="pool"),
                 helper.make_node("Flatten", ["p"], ["y"], name="flat")]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    else:
        inits = [t("g_w", 5, 6), t("g_b", 5), t("m_w", 5, 3), t("m_b", 3)]
        nodes = [helper.make_node("Gemm", ["x", "g_w", "g_b"], ["h"], name="gemm", transB=1),
                 helper.make_node("Relu", ["h"], ["r"], name="relu"),
                 helper.make_node("MatMul", ["r", "m_w"], ["mm"], name="matmul"),
                 helper.make_node("Add", ["mm", "m_b"], ["y"], name="add")]
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])
    model = helper.make_model(helper.make_graph(nodes, kind, [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    out = str(path / f"{kind}.onnx")
    onnx.save(model, out)
    return out


# ----------------------------------------------------------------- the setting

@pytest.mark.parametrize("adapter, words", [
    ({"rank": 0}, "rank"), ({"alpha": 0}, "alpha"), ({"dropout": 1.0}, "dropout"),
    ({"kind": "loha"}, "lora"), ({"rank": 4, "bogus": 1}, "bogus")])
def test_adapter_setting_is_validated(adapter, words):
    with pytest.raises(RuleError) as e:
        as_rules([{"match": "features.7.*", "adapter": adapter}])
    assert words in str(e.value) and "adapter" in str(e.value)


def test_adapter_refuses_from_epoch_and_presets():
    with pytest.raises(RuleError, match="from_epoch"):
        as_rules([{"match": "x", "adapter": LORA, "from_epoch": 2}])
    with pytest.raises(RuleError, match="preset takes no adapter"):
        as_rules([{"preset": "freeze_bn", "adapter": LORA}])
    assert as_rules([{"match": "x", "adapter": {}}])[0].adapter.rank == 8  # PEFT-like defaults: rank 8, alpha 16


def test_rule_errors_name_the_layer():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, in_channels=4, groups=2), mx.gluon.nn.BatchNorm(in_channels=4),
            mx.gluon.nn.Dense(2, in_units=4))
    net.initialize()
    rules = [{"match": "0.*", "adapter": LORA}]
    with pytest.raises(RuleError) as e:  # a rule whose adapter fits none of the layers it selects
        make_plan(attach_adapters(net, rules), rules)
    assert "grouped convolution" in str(e.value) and "'0'" in str(e.value) and "rule 1 (adapter)" in str(e.value)
    with pytest.raises(RuleError, match="matches no Conv or Dense layer"):  # BatchNorm only
        make_plan(attach_adapters(net, [{"type": ["BatchNorm"], "adapter": LORA}]),
                  [{"type": ["BatchNorm"], "adapter": LORA}])
    with pytest.raises(RuleError, match="attach_adapters"):  # planned on a block without its adapters
        make_plan(net, [{"match": "2.*", "adapter": LORA}])


def _graph(sym) -> gluontl.mxinternals.graphblock.GraphBlock:
    net = gluontl.mxinternals.graphblock.GraphBlock(sym, [mx.sym.var("data")])
    net.initialize()
    return net


def test_layers_lora_cannot_adapt_are_refused_by_name():
    data = mx.sym.var("data")
    grouped = _graph(mx.sym.Convolution(data, kernel=(3, 3), num_filter=4, num_group=2, name="g"))
    with pytest.raises(AdapterError, match="layer 'g' is a grouped convolution"):
        add_lora(grouped, {"g": LORA})
    w, b = mx.sym.var("w", shape=(4, 2, 3, 3)), mx.sym.var("b", shape=(4,))
    computed = _graph(mx.sym.Convolution(data, weight=w * 2, bias=b, kernel=(3, 3), num_filter=4, name="c"))
    with pytest.raises(AdapterError, match="node 'c' computes its weight"):
        add_lora(computed, {"c": LORA})
    outer = mx.gluon.nn.HybridSequential()
    outer.add(_graph(mx.sym.FullyConnected(data, num_hidden=3, name="fc")))
    with pytest.raises(AdapterError, match="does not know its input size"):
        add_lora(outer[0], {"fc": LORA})
    with pytest.raises(AdapterError, match="graph inside a Gluon block"):
        add_lora(outer, {"fc": LORA})
    nhwc = mx.gluon.nn.HybridSequential()
    nhwc.add(mx.gluon.nn.Conv2D(4, 3, in_channels=2, layout="NHWC"))
    nhwc.initialize()
    with pytest.raises(AdapterError, match="layout NHWC"):
        add_lora(nhwc, {"0": LORA})


@pytest.mark.parametrize("graph", [False, True])
def test_adapter_dropout_acts_in_training_only(graph):
    """Dropout on the adapter's input: training outputs differ from predict-mode ones, with 0 they do not."""
    x = mx.nd.array(np.random.RandomState(5).randn(64, 6))
    outs = {}
    for p in (0.0, 0.5):
        if graph:
            net = _graph(mx.sym.FullyConnected(mx.sym.var("data"), mx.sym.var("w", shape=(5, 6)), num_hidden=5,
                                               no_bias=True, name="fc"))
            net(x)  # shapes known
            net = add_lora(net, {"fc": {"rank": 2, "dropout": p}})
        else:
            net = mx.gluon.nn.HybridSequential()
            net.add(mx.gluon.nn.Dense(5, in_units=6))
            net.initialize()
            net = add_lora(net, {"0": {"rank": 2, "dropout": p}})
        b = next(e.param for n, e in named_params(net).items() if n.endswith("lora_b.weight"))
        b.set_data(mx.nd.ones(b.shape))
        with mx.autograd.record(train_mode=True):
            train = net(x).asnumpy()
        outs[p] = (train, _predict(net, x))
    np.testing.assert_array_equal(*outs[0.0])
    assert not np.allclose(*outs[0.5])


class _Doubled(mx.gluon.nn.Dense):
    def hybrid_forward(self, F, x, weight, bias=None):
        return super().hybrid_forward(F, x, weight, bias) * 2


def test_a_layer_with_its_own_forward_is_refused_by_name():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(3, in_units=2), _Doubled(3, in_units=3))
    net.initialize()
    with pytest.raises(AdapterError, match="layer '1' \\(_Doubled\\) computes its own forward"):
        add_lora(net, {"1": LORA})
    with pytest.raises(AdapterError, match="no layer 'nope'"):
        add_lora(net, {"nope": LORA})
    assert adapters_of(add_lora(net, {"0": LORA})).keys() == {"0"}


def test_cli_plan_names_the_depthwise_convolutions_an_adapter_leaves_out(tmp_path, capsys):
    """MobileNet: the pointwise convolutions get adapters, the depthwise ones are named in a note."""
    (tmp_path / "r.yaml").write_text("name: m\nmodel: {source: 'zoo:mobilenet0.25', input_shape: [3, 32, 32]}\n"
                                     "rules:\n  - {match: 'features.*', type: [Conv], adapter: {rank: 4}}\n")
    code, out, err = run_cli(capsys, "plan", "--recipe", str(tmp_path / "r.yaml"), "--json")
    assert code == 0, err
    plan = json.loads(out)
    (note,) = [n for n in plan["notes"] if "leaves out" in n]
    assert "rule 1's adapter leaves out 13 selected layer(s)" in note and "grouped convolution" in note
    adapted = {p["name"].split(".lora_")[0] for p in plan["params"] if ".lora_a." in p["name"]}
    assert "features.3" in note and "features.3" not in adapted and "features.6" in adapted


# ----------------------------------------------------------------- zoo model

def _resnet(classes=3):
    from gluoncv.model_zoo import get_model

    mx.random.seed(3)
    net = get_model("resnet18_v1", classes=classes)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 32, 32)))  # shapes known: no deferred initialization left
    return net


RESNET_RULES = [{"match": "*", "grad_req": "null", "bn": "frozen"},
                {"match": "features.7.*", "type": ["Conv"], "adapter": LORA},
                {"match": "output.*", "grad_req": "write"}]


def test_zoo_model_equals_base_at_init_trains_only_adapters_and_merges():
    net = _resnet()
    x, y = batch(n=4, hw=32)
    base_out = _predict(net, x)
    net, plan = _adapt(net, RESNET_RULES, (3, 32, 32))
    np.testing.assert_array_equal(_predict(net, x), base_out)
    net.hybridize()
    np.testing.assert_array_equal(_predict(net, x), base_out)
    rows = plan.by_name()
    convs = [n for n in rows if n.startswith("features.7.") and n.endswith(".weight") and rows[n].layer_type == "Conv"]
    assert len(convs) == 5
    for n in convs:
        layer = n.removesuffix(".weight")
        assert rows[n].grad_req == "null" and rows[n].decided_by["grad_req"] == "2"
        for f in ("lora_a", "lora_b"):
            assert rows[f"{layer}.{f}.weight"].grad_req == "write"
            assert rows[f"{layer}.{f}.weight"].decided_by["grad_req"] == "2"
    assert "features.7.0.body.0.lora_a.weight" in format_plan(plan)
    assert rows["features.7.0.body.0.lora_a.weight"].global_name == "resnetv10_stage4_conv0_lora_a_weight"
    assert rows["features.7.0.body.0.lora_b.weight"].global_name == "resnetv10_stage4_conv0_lora_b_weight"
    b0 = rows["features.7.0.body.0.lora_b.weight"]
    assert b0.shape == (512, 4, 1, 1) and rows["features.7.0.body.0.lora_a.weight"].shape == (4, 256, 3, 3)
    before = _values(net)
    assert not any(before[f"{n.removesuffix('.weight')}.lora_b.weight"].any() for n in convs)  # B starts at 0
    a0, bound = before["features.7.0.body.0.lora_a.weight"], 1 / np.sqrt(256 * 9)  # PEFT's Kaiming-uniform
    assert 0.99 * bound < np.abs(a0).max() <= bound and abs(a0.mean()) < 0.05 * bound
    sgd_step(net, x, y, lr=0.05, steps=3)
    after = _values(net)
    for n in before:
        moved = not np.array_equal(before[n], after[n])
        if ".lora_" in n or n.startswith("output."):
            assert moved, n
        elif not rows[n].aux:
            assert not moved, n  # base weights frozen bit for bit, whatever else
    merged = merge_adapters(net)
    assert not adapters_of(merged) and not any(".lora_" in n for n in named_params(merged))
    assert all(p._trainer is None for p in merged.collect_params().values())  # the Trainer keeps the adapted block's
    layer = merged.features[7][0].body[0]
    assert type(layer) is mx.gluon.nn.Conv2D and not hasattr(layer, "_lora") and not layer._children.get("lora_a")
    want = _predict(net, x)
    assert_f32_close(_predict(merged, x), want, terms=512 * 9, depth=20)
    np.testing.assert_array_equal(_predict(net, x), want)  # merging left the adapted block as it was
    assert np.array_equal(after["features.7.0.body.0.weight"], _values(net)["features.7.0.body.0.weight"])


def test_lora_trains_under_a_tenth_of_the_layers_parameters():
    """resnet18_v1 features.7 convolutions: rank 8 adapters vs the same layers trained in full."""
    net = _resnet(classes=10)
    full = make_plan(net, [{"match": "*", "grad_req": "null"},
                           {"match": "features.7.*", "type": ["Conv"], "grad_req": "write"}]).totals()["trainable"]
    rules = [{"match": "*", "grad_req": "null"},
             {"match": "features.7.*", "type": ["Conv"], "adapter": {"rank": 8, "alpha": 16}}]
    _, plan = _adapt(net, rules)
    lora = plan.totals()["trainable"]
    # by hand: 512x256x3x3 + 3 x 512x512x3x3 + 512x256x1x1 in full; A r x in x k x k and B 512 x r each
    assert full == 512 * 256 * 9 + 3 * 512 * 512 * 9 + 512 * 256 == 8_388_608
    assert lora == 8 * (256 * 9 + 3 * 512 * 9 + 256) + 5 * 512 * 8 == 151_552
    assert lora < 0.1 * full  # 1.8 %


def test_gluon_dense_forward_and_merge_against_numpy():
    """y = W x + b + alpha/rank · B A x, and the merged weight W + alpha/rank · B A, in float64 numpy."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(7, in_units=5, activation="relu"))
    net.initialize(mx.init.Uniform(0.5))
    net = add_lora(net, {"0": {"rank": 3, "alpha": 6}})
    rs = np.random.RandomState(0)
    layer = net[0]
    layer.lora_b.weight.set_data(mx.nd.array(rs.randn(7, 3)))
    w, b = layer.weight.data().asnumpy(), layer.bias.data().asnumpy()
    a, bb = layer.lora_a.weight.data().asnumpy(), layer.lora_b.weight.data().asnumpy()
    assert np.abs(a).max() <= 1 / np.sqrt(5)  # Kaiming-uniform bound 1/sqrt(fan_in), as PEFT
    x = rs.randn(4, 5).astype(np.float32)
    x64 = x.astype(np.float64)
    pre = x64 @ w.T + b + 2.0 * (x64 @ a.T) @ bb.T
    scale = np.abs(x64) @ np.abs(w.T) + np.abs(b) + 2.0 * (np.abs(x64) @ np.abs(a.T)) @ np.abs(bb.T)
    assert_f32_close(_predict(net, x), np.maximum(pre, 0), scale=scale, terms=5, depth=2)
    merged = merge_adapters(net)
    want = w.astype(np.float64) + 2.0 * bb.astype(np.float64) @ a.astype(np.float64)
    assert_f32_close(merged[0].weight.data().asnumpy(), want, scale=np.abs(w) + 2.0 * np.abs(bb) @ np.abs(a), terms=3)
    assert type(merged[0]) is mx.gluon.nn.Dense and not merged[0]._children.get("lora_a")


@pytest.mark.parametrize("flatten", [False, True])
@pytest.mark.parametrize("graph", [False, True])
def test_dense_adapter_reads_its_input_as_the_layer_does(graph, flatten):
    """On (N, T, C) inputs, flatten=False maps the last axis (y[n, t] = W x[n, t] + b + s · B A x[n, t]),
    flatten=True (Gluon's and MXNet's default) the flattened input; against numpy."""
    rs = np.random.RandomState(8)
    x = rs.randn(2, 5, 3).astype(np.float32)
    kw = {} if flatten else {"flatten": False}  # the graph node without the attribute: its default
    if graph:
        net = _graph(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc", **kw))
        net(mx.nd.array(x))  # shapes known
        name, pre = "fc", "fc_"
    else:
        net = mx.gluon.nn.Dense(4, in_units=15 if flatten else 3, **kw)
        net.initialize(mx.init.Uniform(0.5))
        name, pre = "", ""
    net = add_lora(net, {name: {"rank": 2, "alpha": 3}})
    params = {n.removeprefix("fc."): e.param for n, e in named_params(net).items()}
    params["lora_b.weight"].set_data(mx.nd.array(rs.randn(4, 2)))
    w, bias, a, b = (params[n].data().asnumpy().astype(np.float64) for n in (
        f"{pre}weight", f"{pre}bias", "lora_a.weight", "lora_b.weight"))
    xs = x.reshape(2, 15) if flatten else x
    want = xs @ w.T + bias + 1.5 * (xs @ a.T) @ b.T
    scale = np.abs(xs) @ np.abs(w.T) + np.abs(bias) + 1.5 * (np.abs(xs) @ np.abs(a.T)) @ np.abs(b.T)
    assert_f32_close(_predict(net, x), want, scale=scale, terms=xs.shape[-1], depth=2)


@pytest.mark.parametrize("graph", [False, True])
def test_merged_weight_is_the_float64_sum_rounded_once(graph):
    """W + s·B·A computed in float64 and rounded to float32 once: every merged element is within half
    a float32 ulp of numpy's float64 value (rank 32: a float32 product would be off by several ulps)."""
    rs = np.random.RandomState(11)
    if graph:
        net = _graph(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=16, no_bias=True, name="fc"))
        net(mx.nd.zeros((1, 64)))
        name, weight = "fc", "fc_weight"
    else:
        net = mx.gluon.nn.Dense(16, in_units=64, use_bias=False)
        net.initialize()
        name, weight = "", "weight"
    net = add_lora(net, {name: {"rank": 32, "alpha": 7}})
    params = {n: e.param for n, e in named_params(net).items()}
    prefix = f"{name}." if name else ""
    params[f"{prefix}lora_b.weight"].set_data(mx.nd.array(rs.randn(16, 32)))
    w, a, b = (params[n].data().asnumpy().astype(np.float64) for n in (
        weight, f"{prefix}lora_a.weight", f"{prefix}lora_b.weight"))
    want = w + 7 / 32 * (b @ a)
    got = named_params(merge_adapters(net))[weight].param.data().asnumpy()
    assert np.all(np.abs(got - want) <= np.spacing(np.abs(want).astype(np.float32)) / 2)


def test_merged_conv_kernel_is_the_composition_of_b_and_a():
    conv = mx.gluon.nn.Conv2D(6, 3, strides=2, padding=1, dilation=1, in_channels=4)
    net = mx.gluon.nn.HybridSequential()
    net.add(conv)
    net.initialize(mx.init.Uniform(0.5))
    net = add_lora(net, {"0": {"rank": 2, "alpha": 5}})
    rs = np.random.RandomState(1)
    conv.lora_b.weight.set_data(mx.nd.array(rs.randn(6, 2, 1, 1)))
    w, a, b = (p.data().asnumpy().astype(np.float64) for p in (conv.weight, conv.lora_a.weight, conv.lora_b.weight))
    want = w.copy()
    for o in range(6):
        for r in range(2):
            want[o] += 2.5 * b[o, r, 0, 0] * a[r]
    merged = merge_adapters(net)
    assert_f32_close(merged[0].weight.data().asnumpy(), want, scale=np.abs(w) + 2.5 * 2 * np.abs(a).max(), terms=2)
    x = rs.randn(2, 4, 9, 9).astype(np.float32)
    assert _predict(net, x).shape == (2, 6, 5, 5)
    assert_f32_close(_predict(merged, x), _predict(net, x), terms=4 * 9, depth=2)


# ----------------------------------------------------------------- graphs: symbol and ONNX

def _graph_case(tmp_path, kind):
    if kind == "symbol":
        net = gluontl.load_model(f"symbol:{tiny_symbol(tmp_path)}")
        convs = sorted({e.layer.name for e in named_params(net).values() if e.layer and e.layer.type == "Conv"})
        return net, [{"match": "*", "grad_req": "null"}, {"type": ["Conv"], "adapter": {**LORA, "dropout": 0.2}}], \
            batch(n=4, hw=16), 5, convs
    net = gluontl.load_model(_onnx_file(tmp_path, kind))
    if kind == "conv":
        return net, [{"type": ["Conv"], "adapter": {"rank": 2, "alpha": 4}}], batch(n=4, hw=8, classes=4), 4, \
            ["conv1", "conv2"]
    rs = np.random.RandomState(2)
    xy = mx.nd.array(rs.randn(4, 6)), mx.nd.array(rs.randint(0, 3, 4))
    return net, [{"match": "m_b", "grad_req": "null"}, {"match": ["g_w", "m_w"], "adapter": {"rank": 2, "alpha": 4}}], \
        xy, 3, ["gemm", "matmul"]


@pytest.mark.parametrize("kind", ["symbol", "conv", "dense"])
def test_graph_model_equals_base_trains_adapters_and_exports_merged(tmp_path, kind):
    net, rules, (x, y), classes, layers = _graph_case(tmp_path, kind)
    base_out = _predict(net, x)
    net, plan = _adapt(net, rules)
    assert sorted(adapters_of(net)) == sorted(layers)
    np.testing.assert_array_equal(_predict(net, x), base_out)
    rows = plan.by_name()
    for name in layers:
        for f in ("lora_a", "lora_b"):  # MXNet's name is the structural one, as for every graph parameter
            assert rows[f"{name}.{f}.weight"].grad_req == "write"
            assert rows[f"{name}.{f}.weight"].global_name == f"{name}.{f}.weight"
    new_nodes = {n["name"] for n in json.loads(net._cached_graph[1].tojson())["nodes"]} - {
        n["name"] for n in json.loads(lora_record(net).base.tojson())["nodes"]}
    assert new_nodes == {f"{name}.{f}" for name in adapters_of(net) for f in (
        "lora_a", "lora_a.weight", "lora_b", "lora_b.weight", "lora_scale", "lora_sum",
        *(("lora_dropout",) if kind == "symbol" else ()))}  # named after the layer, none twice
    before = _values(net)
    sgd_step(net, x, y, lr=0.1, steps=3)
    after = _values(net)
    for n in before:
        assert (".lora_" in n) == (not np.array_equal(before[n], after[n])), n
    want = _predict(net, x)
    folder = tmp_path / "export"
    name = "x" if kind != "symbol" else "data"
    written = export_block(net, folder, "m", {name: (1, *x.shape[1:])}, formats=["onnx", "symbol"])
    model = onnx.load(str(folder / "m.onnx"))
    names = {t.name for t in model.graph.initializer} | {v for n in model.graph.node for v in (*n.input, n.name)}
    assert not any("lora" in v for v in names)
    if kind != "symbol":  # the imported graph itself, patched: same nodes, merged values
        source = onnx.load(onnx_info(net).source)
        assert [n.name for n in model.graph.node] == [n.name for n in source.graph.node]
    terms = int(np.prod(x.shape[1:])) * 9
    assert_f32_close(ort_run(folder / "m.onnx", x.asnumpy())[0], want, terms=terms, depth=3)
    assert all(p.is_file() for p in written)
    assert "lora" not in (folder / "m-symbol.json").read_text()
    reloaded = mx.gluon.SymbolBlock.imports(str(folder / "m-symbol.json"), [name], str(folder / "m-0000.params"))
    assert_f32_close(_predict(reloaded, x), want, terms=terms, depth=3)


def test_adapters_added_twice_merge_into_the_base_graph(tmp_path):
    net = gluontl.load_model(_onnx_file(tmp_path, "conv"))
    base = net._cached_graph[1].tojson()
    assert add_lora(net, {}) is net
    once = add_lora(net, {"conv1": LORA})
    twice = add_lora(once, {"conv2": LORA})
    with pytest.raises(AdapterError, match="layer 'conv1' already has an adapter"):
        add_lora(twice, {"conv1": LORA})
    assert sorted(adapters_of(twice)) == ["conv1", "conv2"] and "conv2" not in adapters_of(once)
    merged = merge_adapters(twice)
    assert merged._cached_graph[1].tojson() == base and onnx_info(merged) is onnx_info(net)


def test_onnx_matmul_merge_is_transposed_into_the_onnx_weight(tmp_path):
    """ONNX MatMul keeps W as (in, out): the merged initializer is W + (scale · B A)ᵀ."""
    net = gluontl.load_model(_onnx_file(tmp_path, "dense"))
    net = add_lora(net, {"matmul/Wt": {"rank": 2, "alpha": 3}})
    params = {n: e.param for n, e in named_params(net).items()}
    params["matmul.lora_b.weight"].set_data(mx.nd.array(np.random.RandomState(4).randn(3, 2)))
    w, a, b = (params[n].data().asnumpy().astype(np.float64) for n in ("m_w", "matmul.lora_a.weight",
                                                                          "matmul.lora_b.weight"))
    path = export_onnx(net, tmp_path / "m.onnx")
    got = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
    assert_f32_close(got["m_w"], w + 1.5 * (b @ a).T, scale=np.abs(w) + 1.5 * (np.abs(b) @ np.abs(a)).T, terms=2)
    assert not any("lora" in n for n in got)


def test_onnx_model_with_a_new_head_exports_the_merged_head(tmp_path):
    """Surgery's head on an imported graph is written from the Head block: it gets the merged values too."""
    from gluontl.surgery import attach_head, cut_at

    net = attach_head(cut_at(gluontl.load_model(_onnx_file(tmp_path, "conv")), "relu1"), {"classes": 3}, (3, 8, 8))
    rules = [{"match": ["head.*", "w1"], "type": ["Dense", "Conv"], "adapter": {"rank": 2, "alpha": 4}}]
    net, _ = _adapt(net, rules)
    assert sorted(t.kind for t in adapters_of(net).values()) == ["Conv", "Dense"]
    x, y = batch(n=4, hw=8, classes=3)
    sgd_step(net, x, y, lr=0.1, steps=2)
    path = export_onnx(net, tmp_path / "m.onnx")
    assert not any("lora" in t.name for t in onnx.load(str(path)).graph.initializer)
    assert_f32_close(ort_run(path, x.asnumpy())[0], _predict(net, x), terms=27 * 8, depth=2)
    assert onnx_info(merge_adapters(net)).head is not onnx_info(net).head  # merged values in a copy
    graph_only = add_lora(attach_head(cut_at(gluontl.load_model(_onnx_file(tmp_path, "conv")), "relu1"),
                                      {"classes": 3}, (3, 8, 8)), {"conv1": LORA})
    assert onnx_info(merge_adapters(graph_only)) is onnx_info(graph_only)  # no head value changed


# ----------------------------------------------------------------- a tiny Gluon model (fast: the mutation tests')

def _tiny(seed=3):
    """Conv 3x3 with bias and relu ('0'), a nested bias-free 1x1 Conv and BatchNorm ('1.0', '1.1'),
    pooling and a Dense head ('3'): the zoo model's layer kinds in milliseconds."""
    mx.random.seed(seed)
    net = mx.gluon.nn.HybridSequential()
    body = mx.gluon.nn.HybridSequential()
    body.add(mx.gluon.nn.Conv2D(5, 1, in_channels=6, use_bias=False), mx.gluon.nn.BatchNorm(in_channels=5))
    net.add(mx.gluon.nn.Conv2D(6, 3, padding=1, in_channels=3, activation="relu"), body,
            mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(3, in_units=5))
    net.initialize(mx.init.Xavier())
    return net


TINY_RULES = [{"match": "*", "grad_req": "null", "bn": "frozen"}, {"type": ["Conv"], "adapter": LORA},
              {"match": "3.*", "grad_req": "write"}]


def test_tiny_model_equals_base_at_init_trains_only_adapters_and_merges():
    net = _tiny()
    x, y = batch(n=4, hw=8, classes=3)
    base_out = _predict(net, x)
    net, plan = _adapt(net, TINY_RULES)
    assert {n: (t.kind, t.weight, t.frozen) for n, t in adapters_of(net).items()} == {
        "0": ("Conv", "0.weight", ("0.weight", "0.bias")), "1.0": ("Conv", "1.0.weight", ("1.0.weight",))}
    np.testing.assert_array_equal(_predict(net, x), base_out)
    rows = plan.by_name()
    assert rows["0.lora_a.weight"].shape == (4, 3, 3, 3) and rows["0.lora_b.weight"].shape == (6, 4, 1, 1)
    assert rows["1.0.lora_a.weight"].shape == (4, 6, 1, 1) and rows["1.0.lora_b.weight"].shape == (5, 4, 1, 1)
    assert rows["0.lora_a.weight"].layer_type == "LoRA" and rows["0.lora_a.weight"].decided_by["grad_req"] == "2"
    assert {n for n, r in rows.items() if r.grad_req != "null"} == {
        "0.lora_a.weight", "0.lora_b.weight", "1.0.lora_a.weight", "1.0.lora_b.weight", "3.weight", "3.bias"}
    before = _values(net)
    assert not before["0.lora_b.weight"].any() and not before["1.0.lora_b.weight"].any()
    bound = 1 / np.sqrt(27)  # PEFT's Kaiming-uniform: 1/sqrt(fan_in), 3x3x3 inputs
    assert 0.9 * bound < np.abs(before["0.lora_a.weight"]).max() <= bound
    sgd_step(net, x, y, lr=0.5, steps=3)
    after = _values(net)
    moved = {n for n in before if not np.array_equal(before[n], after[n])}
    assert moved == {"0.lora_a.weight", "0.lora_b.weight", "1.0.lora_a.weight", "1.0.lora_b.weight", "3.weight",
                     "3.bias"}
    want = _predict(net, x)
    net.hybridize()  # the adapter's forward as a graph computes the same
    assert_f32_close(_predict(net, x), want, terms=54, depth=3)
    merged = merge_adapters(net)
    assert adapters_of(net).keys() == {"0", "1.0"} and not adapters_of(merged)
    assert sorted(named_params(merged)) == ["0.bias", "0.weight", "1.0.weight", "1.1.beta", "1.1.gamma",
                                            "1.1.running_mean", "1.1.running_var", "3.bias", "3.weight"]
    assert [type(b) for b in (merged[0], merged[1][0])] == [mx.gluon.nn.Conv2D] * 2
    assert merged[0].act is not None and merged[1][0].bias is None
    assert all(p._trainer is None for p in merged.collect_params().values())  # the Trainer keeps the adapted block's
    assert_f32_close(_predict(merged, x), want, terms=54, depth=3)
    np.testing.assert_array_equal(_values(net)["0.weight"], before["0.weight"])  # merging left the block as it was


@pytest.mark.parametrize("layer", ["dense", "conv"])
def test_a_bare_layer_that_is_the_whole_model_takes_an_adapter(tmp_path, layer):
    """Its structural path is '': parameters 'weight', 'lora_a.weight', ... (it failed with KeyError: '')."""
    rs = np.random.RandomState(6)
    if layer == "dense":
        net, x = mx.gluon.nn.Dense(3, in_units=4), rs.randn(5, 4)
    else:
        net, x = mx.gluon.nn.Conv2D(3, 3, in_channels=2), rs.randn(2, 2, 5, 5)
    net.initialize(mx.init.Uniform(0.5))
    x = mx.nd.array(x)
    base_out, base = _predict(net, x), _values(net)
    rules = [{"match": "*", "adapter": {"rank": 2, "alpha": 2}}]
    net, plan = _adapt(net, rules)
    assert adapters_of(net).keys() == {""}
    assert sorted(plan.by_name()) == ["bias", "lora_a.weight", "lora_b.weight", "weight"]
    assert {n for n, r in plan.by_name().items() if r.grad_req == "write"} == {"lora_a.weight", "lora_b.weight"}
    np.testing.assert_array_equal(_predict(net, x), base_out)
    trainer = mx.gluon.Trainer(trainable_params(net), "sgd", {"learning_rate": 0.5})
    with mx.autograd.record():
        loss = (net(x) * mx.nd.array(rs.randn(*base_out.shape))).sum()
    loss.backward()
    trainer.step(1)
    trained = _values(net)
    np.testing.assert_array_equal(trained["weight"], base["weight"])
    assert trained["lora_b.weight"].any()
    w, a, b = (trained[n].astype(np.float64) for n in ("weight", "lora_a.weight", "lora_b.weight"))
    want = w + (b.reshape(3, 2) @ a.reshape(2, -1)).reshape(w.shape)
    merged = merge_adapters(net)
    assert type(merged) is {"dense": mx.gluon.nn.Dense, "conv": mx.gluon.nn.Conv2D}[layer]
    assert_f32_close(merged.weight.data().asnumpy(), want, scale=np.abs(w).max() + 2 * np.abs(b).max(), terms=2)
    path = save_adapters(net, tmp_path / "a.params")
    assert json.loads((tmp_path / "a.json").read_text())["layers"][""]["weight"] == "weight"
    plain = mx.gluon.nn.Dense(3, in_units=4) if layer == "dense" else mx.gluon.nn.Conv2D(3, 3, in_channels=2)
    plain.initialize()
    plain.weight.set_data(mx.nd.array(base["weight"]))
    plain.bias.set_data(mx.nd.array(base["bias"]))
    np.testing.assert_array_equal(_predict(load_adapters(plain, path), x), _predict(net, x))


def test_factors_live_on_the_layers_contexts_and_are_named_after_it(tmp_path):
    """A model on cpu(1) and cpu(2) (distinct devices to MXNet): the factors of Gluon and graph layers
    live on the layer's contexts, and so do merged weights; their MXNet names extend the layer's
    (the plan's 'mxnet name' column)."""
    ctxs = [mx.cpu(1), mx.cpu(2)]
    net = _tiny()
    net.collect_params().reset_ctx(ctxs)
    net, plan = _adapt(net, TINY_RULES)
    rows = plan.by_name()
    for layer, block in (("0", net[0]), ("1.0", net[1][0])):
        for f in ("lora_a", "lora_b"):
            assert rows[f"{layer}.{f}.weight"].global_name == f"{block.prefix}{f}_weight"
            assert named_params(net)[f"{layer}.{f}.weight"].param.list_ctx() == ctxs
    assert named_params(merge_adapters(net))["0.weight"].param.list_ctx() == ctxs
    graph = gluontl.load_model(_onnx_file(tmp_path, "conv"))
    graph.collect_params().reset_ctx(ctxs)
    graph = add_lora(graph, {"conv1": LORA})
    assert named_params(graph)["conv1.lora_a.weight"].param.list_ctx() == ctxs
    assert named_params(merge_adapters(graph))["w1"].param.list_ctx() == ctxs


def test_the_adapted_graph_keeps_the_layers_node_names():
    """Hybridized, an adapted layer's own op keeps the node name Gluon gives it (``<prefix>fwd``: what
    frozen-prefix boundaries and profiles name), with the factors' nodes named after the layer."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, in_channels=2, use_bias=False), mx.gluon.nn.Conv2D(4, 1, in_channels=4),
            mx.gluon.nn.Dense(3, in_units=36, use_bias=False), mx.gluon.nn.Dense(2, in_units=3))
    net.initialize()

    def nodes(block):
        return {n["name"] for n in json.loads(block(mx.sym.var("data")).tojson())["nodes"] if n["op"] != "null"}

    base = nodes(net)
    x = mx.nd.array(np.random.RandomState(1).randn(2, 2, 5, 5))
    want = _predict(net, x)
    net = add_lora(net, {"0": LORA, "1": LORA, "2": LORA, "3": LORA})
    np.testing.assert_array_equal(_predict(net, x), want)  # with and without bias, Conv and Dense
    added = nodes(net) - base
    assert base <= nodes(net)
    assert added >= {f"{layer.prefix}{f}_fwd" for layer in net for f in ("lora_a", "lora_b")}


def test_a_users_own_subclass_without_a_forward_is_adapted_and_merged_back():
    class Mine(mx.gluon.nn.Dense):  # a new class each run: the adapted class is made, not found cached
        pass

    net = mx.gluon.nn.HybridSequential()
    net.add(Mine(3, in_units=2), Mine(2, in_units=3))
    net.initialize()
    net = add_lora(net, {"0": LORA, "1": LORA})
    assert type(net[0]) is type(net[1]) and type(net[0]).__name__ == "LoraMine"
    assert isinstance(net[0], Mine) and type(net[0]).__bases__ == (gluontl.adapters._LoraLayer, Mine)
    merged = merge_adapters(net)
    assert type(merged[0]) is Mine and type(merged[1]) is Mine


def test_add_lora_names_what_it_refuses():
    net = _tiny()
    with pytest.raises(AdapterError) as e:
        add_lora(net, {"0": 4})
    assert str(e.value) == ("adapter of layer '0' is a int; give it as a dict with the recipe's keys (e.g. "
                            "{'rank': 8, 'alpha': 16}) or as a gluontl.recipe.AdapterSpec.")
    with pytest.raises(AdapterError, match="adapter of layer '0' is invalid: .*rank"):
        add_lora(net, {"0": {"rank": 0}})
    with pytest.raises(AdapterError) as e:
        add_lora(net, {"nope": LORA})
    assert "the model has no layer 'nope' to put an adapter on (layers look like: 0, 1.0, 1.1);" in str(e.value)
    with pytest.raises(AdapterError) as e:
        add_lora(net, {"1.1": LORA})
    assert str(e.value) == "layer '1.1' is a BatchNorm layer; LoRA adapts Conv and Dense layers."
    deferred = mx.gluon.nn.HybridSequential()
    deferred.add(mx.gluon.nn.Dense(3))
    deferred.initialize()
    with pytest.raises(AdapterError, match=r"layer '0' does not know its input size yet \(weight shape \(3, 0\)\)"):
        add_lora(deferred, {"0": LORA})
    assert not adapters_of(net)


def test_graph_layers_lora_cannot_adapt_are_refused_by_name():
    """A weight read through an op (an explicit transpose, a scaling, a plain transpose under a
    convolution) is not a layer weight an adapter could be merged into; a channel-last graph
    convolution is refused like a Gluon one."""
    data = mx.sym.var("data")
    w = mx.sym.var("w", shape=(3, 4))
    cases = {
        "t": mx.sym.FullyConnected(data, mx.sym.transpose(w, axes=(1, 0), name="t"), num_hidden=4, no_bias=True),
        "m": mx.sym.FullyConnected(data, mx.sym.elemwise_mul(w, w, name="m"), num_hidden=3, no_bias=True),
        "k": mx.sym.Convolution(data, mx.sym.transpose(mx.sym.var("w", shape=(3, 3, 2, 4)), name="k"),
                                kernel=(3, 3), num_filter=4, no_bias=True),
    }
    for name, sym in cases.items():
        with pytest.raises(AdapterError) as e:
            add_lora(_graph(sym), {name: LORA})
        assert str(e.value) == f"layer '{name}' is a parameterized layer; LoRA adapts Conv and Dense layers."
    nhwc = _graph(mx.sym.Convolution(data, kernel=(3, 3), num_filter=4, layout="NHWC", name="n"))
    with pytest.raises(AdapterError, match="layer 'n' has layout NHWC"):
        add_lora(nhwc, {"n": LORA})


def test_graph_adapters_read_the_right_output_and_keep_the_dilation():
    """A convolution dilated by 2 reading the second output of a split: equal to the base at step 0,
    and the merged graph equals the adapted one once B has moved."""
    halves = mx.sym.split(mx.sym.var("data"), num_outputs=2, axis=1, name="s")
    net = _graph(mx.sym.Convolution(halves[1], kernel=(3, 3), dilate=(2, 2), pad=(1, 1), num_filter=3, name="c"))
    rs = np.random.RandomState(3)
    x = mx.nd.array(rs.randn(2, 4, 9, 9))
    base = _predict(net, x)
    net = add_lora(net, {"c": {"rank": 2, "alpha": 2}})
    np.testing.assert_array_equal(_predict(net, x), base)
    b = named_params(net)["c.lora_b.weight"].param
    b.set_data(mx.nd.array(rs.randn(*b.shape)))
    got = _predict(net, x)
    assert got.shape == (2, 3, 7, 7) and not np.allclose(got, base)
    assert_f32_close(_predict(merge_adapters(net), x), got, terms=18, depth=2)


@pytest.mark.parametrize("graph", [False, True])
def test_adapter_dropout_drops_its_rate_and_rescales(graph):
    """Training-mode adapter output on an all-ones input: each element is 0 (dropped, at rate p) or
    scale / (1 - p); the base path (weight 0) adds nothing."""
    p, n = 0.25, 20000
    x = mx.nd.ones((n, 1))
    if graph:
        net = _graph(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=1, no_bias=True, name="fc"))
        net(x)
        net = add_lora(net, {"fc": {"rank": 1, "alpha": 3, "dropout": p}})
        weight = "fc_weight"
    else:
        net = mx.gluon.nn.Dense(1, in_units=1, use_bias=False)
        net.initialize()
        net = add_lora(net, {"": {"rank": 1, "alpha": 3, "dropout": p}})
        weight = "weight"
    params = {k: e.param for k, e in named_params(net).items()}
    params[weight].set_data(mx.nd.zeros((1, 1)))
    for f in ("lora_a", "lora_b"):
        params[f"{'fc.' if graph else ''}{f}.weight"].set_data(mx.nd.ones((1, 1)))
    mx.random.seed(0)
    with mx.autograd.record(train_mode=True):
        out = net(x).asnumpy().ravel()
    kept = out != 0
    np.testing.assert_allclose(out[kept], 3.0 / (1 - p), rtol=1e-6)
    assert abs((~kept).mean() - p) < 0.02  # binomial: sd 0.003


# ----------------------------------------------------------------- files

def _tiny_adapted(base_file, rules=TINY_RULES[:2]):
    net = _tiny(seed=9)
    net.load_parameters(str(base_file))
    return _adapt(net, rules)[0] if rules else net


def test_save_load_adapters_round_trip_and_refuse_another_base(tmp_path):
    base_file = tmp_path / "base.params"
    _tiny().save_parameters(str(base_file))
    net = _tiny_adapted(base_file)
    x, y = batch(n=4, hw=8, classes=3)
    sgd_step(net, x, y, lr=0.5, steps=2)
    path = save_adapters(net, tmp_path / "adapters.params")
    assert path == tmp_path / "adapters.params"
    saved = mx.nd.load(str(path))
    assert sorted(saved) == ["0.lora_a.weight", "0.lora_b.weight", "1.0.lora_a.weight", "1.0.lora_b.weight"]
    config = json.loads((tmp_path / "adapters.json").read_text())
    assert config["format"] == "gluontl-lora/1"
    assert config["layers"]["1.0"] == {
        "source": "1.0", "kind": "lora", "rank": 4, "alpha": 8.0, "dropout": 0.0, "weight": "1.0.weight",
        "weight_shape": [5, 6, 1, 1], "weight_sha256": hashlib.sha256(
            _values(net)["1.0.weight"].astype(np.float32).tobytes()).hexdigest()}

    loaded = load_adapters(_tiny_adapted(base_file, None), path)  # a plain base model: adapters added from the file
    assert sorted(adapters_of(loaded)) == ["0", "1.0"]
    want, got = _values(net), _values(loaded)
    assert sorted(got) == sorted(want)
    for n in saved:
        np.testing.assert_array_equal(got[n], want[n])
    np.testing.assert_array_equal(_predict(loaded, x), _predict(net, x))
    again = _tiny_adapted(base_file)  # a model with the same adapter rules
    np.testing.assert_array_equal(_predict(load_adapters(again, path), x), _predict(net, x))

    ranked = _tiny_adapted(base_file, [{"type": ["Conv"], "adapter": {**LORA, "rank": 2}}])
    with pytest.raises(AdapterError) as e:
        load_adapters(ranked, path)
    assert f"'{path}' holds adapters that do not fit this model's: layer '0' differs in rank/alpha/dropout" \
        in str(e.value)
    more = _tiny_adapted(base_file, [{"type": ["Conv", "Dense"], "adapter": LORA}])
    with pytest.raises(AdapterError, match="layer '3' is in only one"):
        load_adapters(more, path)
    one = _tiny_adapted(base_file, [{"match": "1.*", "type": ["Conv"], "adapter": LORA}])
    with pytest.raises(AdapterError, match="layer '0' is in only one"):
        load_adapters(one, path)
    other = _tiny_adapted(base_file, None)  # same architecture, one base weight fine-tuned elsewhere
    w = named_params(other)["1.0.weight"].param
    w.set_data(w.data() * 1.01)
    with pytest.raises(AdapterError) as e:
        load_adapters(other, path)
    assert f"'{path}' was trained on other base weights: parameter '1.0.weight' of layer '1.0'" in str(e.value)
    small = mx.gluon.nn.HybridSequential()
    small.add(mx.gluon.nn.Dense(2, in_units=3))
    small.initialize()
    with pytest.raises(AdapterError) as e:
        load_adapters(small, path)
    assert f"'{path}' holds adapters for layer '1.0', which this model does not have: they were made for another " \
        f"base model." in str(e.value)
    with pytest.raises(AdapterError, match="adapter file '.*none.params' does not exist"):
        load_adapters(_tiny(), tmp_path / "none.params")
    config_file = tmp_path / "adapters.json"
    config_file.write_text(json.dumps({**config, "format": "other/1"}))
    with pytest.raises(AdapterError, match="not a gluontl adapter file pair \\(format 'other/1'"):
        load_adapters(_tiny(), path)
    config_file.write_text(json.dumps(config))
    mx.nd.save(str(path), {k: (v[:1] if k == "1.0.lora_b.weight" else v) for k, v in saved.items()})
    with pytest.raises(AdapterError, match=r"no tensor '1.0.lora_b.weight' of shape \(5, 4, 1, 1\) "
                                           r"\(it has \(1, 4, 1, 1\)\)"):
        load_adapters(_tiny_adapted(base_file, None), path)
    mx.nd.save(str(path), {k: v for k, v in saved.items() if k != "0.lora_a.weight"})
    with pytest.raises(AdapterError, match=r"no tensor '0.lora_a.weight' of shape \(4, 3, 3, 3\) \(missing\)"):
        load_adapters(_tiny_adapted(base_file, None), path)
    with pytest.raises(AdapterError, match="the model has no adapters to save to '.*x.params'"):
        save_adapters(_tiny(), tmp_path / "x.params")
    with pytest.raises(AdapterError, match=f"Cannot write '{tmp_path / 'missing' / 'a.params'}'"):
        save_adapters(net, tmp_path / "missing" / "a.params")
    (tmp_path / "b.json").mkdir()  # the configuration cannot be written where a folder is
    with pytest.raises(AdapterError, match="b.json"):
        save_adapters(net, tmp_path / "b.params")


# ----------------------------------------------------------------- the recipe

def test_resnet18_freeze_recipe_with_lora_trains_and_exports_plain_onnx(tmp_path, monkeypatch):
    """The issue's acceptance recipe (shrunk to 32 px and one epoch): plan, run folder, export."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    weights = resnet18_weights(tmp_path / "backbone.params")
    recipe = load_recipe(root / "recipes" / "resnet18_freeze.yaml", [
        'rules.2={match: "features.7.*", type: [Conv], adapter: {kind: lora, rank: 4, alpha: 8}}',
        f"model.weights={weights}", "model.weights_from=null", "model.input_shape=[3, 32, 32]",
        "data.train_transform={resize: 32}", "data.val_transform={resize: 32}", "train.epochs=1",
        "data.batch_size=64", "export.formats=[onnx]"])
    result = gluontl.finetune(recipe, runs_root=tmp_path / "runs", quiet=True)
    run = Path(result.run_dir)
    plan = (run / "plan.txt").read_text()
    assert "features.7.1.body.3.lora_b.weight" in plan and "lora_a rank 4 alpha 8" in plan
    assert (run / "adapters.params").is_file() and (run / "adapters.json").is_file()
    (onnx_path,) = [p for p in result.exported if p.suffix == ".onnx"]
    model = onnx.load(str(onnx_path))
    assert not any("lora" in t.name for t in model.graph.initializer)
    # base weights of the adapted convs are the backbone file's, bit for bit, in the best checkpoint
    _, net = gluontl.train.runs.load_run(run)
    backbone = mx.nd.load(weights)
    trained = _values(net)
    for n in ("features.7.0.body.0.weight", "features.7.1.body.3.weight"):
        np.testing.assert_array_equal(trained[n], backbone[n].asnumpy())
    x = np.random.RandomState(0).uniform(-1, 1, (2, 3, 32, 32)).astype(np.float32)
    assert_f32_close(ort_run(onnx_path, x.astype(np.float32))[0], _predict(net, x), terms=512 * 9, depth=20)


def test_the_plan_shows_an_adapter_rule_with_its_settings_even_when_they_are_the_defaults():
    from gluontl.rules import format_plan, make_plan

    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(4, in_units=3))
    net.initialize()
    rule = {"match": "*", "adapter": {}}  # rank 8, alpha 16: the defaults, which the plan must still say
    text = format_plan(make_plan(attach_adapters(net, [rule]), [rule]))
    assert "adapter={'kind': 'lora', 'rank': 8, 'alpha': 16.0, 'dropout': 0.0}" in text


def test_an_adapter_rules_multipliers_go_to_its_factors_and_later_rules_still_win():
    """The layers an adapter rule selects are frozen, so its lr_mult/wd_mult can only mean the factors
    (LoRA under the recipe's SGD at lr 0.1 diverges where the same layers trained in full do not)."""
    rules = [TINY_RULES[0], {"type": ["Conv"], "adapter": LORA, "lr_mult": 0.1, "wd_mult": 0.0},
             {"match": "1.0.lora_b.weight", "lr_mult": 2.0}, TINY_RULES[2]]
    net, plan = _adapt(_tiny(), rules)
    rows = plan.by_name()
    got = {n: (r.lr_mult, r.wd_mult, r.decided_by["lr_mult"], r.decided_by["wd_mult"])
           for n, r in rows.items() if "lora" in n}
    assert got == {"0.lora_a.weight": (0.1, 0.0, "2", "2"), "0.lora_b.weight": (0.1, 0.0, "2", "2"),
                   "1.0.lora_a.weight": (0.1, 0.0, "2", "2"), "1.0.lora_b.weight": (2.0, 0.0, "3", "2")}
    params = {n: e.param for n, e in named_params(net).items()}
    assert [params[n].lr_mult for n in sorted(got)] == [0.1, 0.1, 0.1, 2.0]
    assert [params[n].wd_mult for n in sorted(got)] == [0.0] * 4
    assert rows["0.weight"].grad_req == "null"


@pytest.mark.parametrize("rank, alpha, want", [(4, 8, 0.1), (4, 16, 0.025), (8, 16, 0.1), (8, 1, 1.0)])
def test_factors_default_to_a_smaller_rate_that_scales_with_alpha_over_rank(rank, alpha, want):
    """Without lr_mult in the adapter rule the factors train at 0.4 / (alpha/rank)^2 (capped at 1):
    scale 2 at 0.1 is what trained recipes/resnet18_freeze.yaml where lr_mult 1 diverged."""
    rules = [TINY_RULES[0], {"type": ["Conv"], "adapter": {"rank": rank, "alpha": alpha}}, TINY_RULES[2]]
    net, plan = _adapt(_tiny(), rules)
    rows = {n: r for n, r in plan.by_name().items() if "lora" in n}
    assert len(rows) == 4 and {(r.lr_mult, r.decided_by["lr_mult"]) for r in rows.values()} == {(want, "2")}
    params = {n: e.param for n, e in named_params(net).items()}
    assert {params[n].lr_mult for n in rows} == {want}  # what the Trainer gets
    assert any(f"rule 2's LoRA factors train at lr_mult {want:g}" in note for note in plan.notes)
    # a later rule still wins, and a rule's own lr_mult replaces the default (no note then)
    later = make_plan(net, [*rules, {"match": "*.lora_a.weight", "lr_mult": 0.5}])
    assert {r.lr_mult for n, r in later.by_name().items() if "lora_a" in n} == {0.5}
    own = make_plan(net, [rules[0], {**rules[1], "lr_mult": 0.3}, rules[2]])
    assert {r.lr_mult for n, r in own.by_name().items() if "lora" in n} == {0.3}
    assert not any("LoRA factors train" in note for note in own.notes)


def test_the_divergence_hint_names_the_adapter_rule_and_its_lr_mult():
    from gluontl.train.loop import lower_lr_hint

    _, plan = _adapt(_tiny(), TINY_RULES)
    hint = lower_lr_hint(plan)
    assert "4 LoRA factors at lr_mult 0.1" in hint and "rule 2" in hint and "lr_mult: 0.01" in hint
    plain = make_plan(_tiny(), [TINY_RULES[0], TINY_RULES[2]])
    assert lower_lr_hint(plain) == "Lower train.lr or set train.clip_gradient."
