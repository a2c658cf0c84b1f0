"""Graph surgery on every model source: zoo (Gluon ResNet v1 and GluonCV v1b), symbol
checkpoints, and imported ONNX models written PyTorch-style and Paddle-style.

Cut models are compared with the original model's internal activation (forward hooks,
``get_internals``, or onnxruntime with the cut tensor added as a graph output); kept
parameters must be the original Parameter objects; one SGD step must change exactly
what the plan trains.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np
import onnx
import pytest
from gluoncv.model_zoo import get_model
from mxnet.gluon import HybridBlock, SymbolBlock, nn
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from gluontl.cli import app
from gluontl.errors import RecipeError, SurgeryError
from gluontl.export import export_onnx
from gluontl.mxinternals import onnx_info
from gluontl.naming import named_params
from gluontl.onnx import import_model
from gluontl.pipeline import prepare
from gluontl.recipe import FreezeAllButHead, FreezeBn, HeadSpec, parse_recipe
from gluontl.rules import apply_plan, make_plan
from gluontl import surgery as S
from tests.helpers import assert_f32_close, ort_session, sgd_step, snapshot

SHAPE = (3, 32, 32)
FREEZE = [FreezeAllButHead()]
# float32 bound for any cut of resnet18 computed two ways (tests/helpers.py: f32_tol):
# at most 17 conv layers in sequence, at most 512·3·3 products per output
R18 = {"terms": 512 * 9, "depth": 17}


def _x(n=2, seed=0):
    return mx.nd.array(np.random.RandomState(seed).uniform(-1, 1, (n, *SHAPE)))


def _randomize_bn(net: HybridBlock) -> None:
    """Non-trivial BN statistics, so a cut that skipped or doubled a BN would show."""
    rng = np.random.RandomState(1)
    for name, e in named_params(net).items():
        if name.endswith(("running_mean", "beta")):
            e.param.set_data(mx.nd.array(rng.uniform(-0.2, 0.2, e.param.shape)))
        elif name.endswith(("running_var", "gamma")):
            e.param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, e.param.shape)))


def _zoo(name: str, **kwargs) -> HybridBlock:
    mx.random.seed(0)
    net = get_model(name, classes=10, **kwargs)
    net.initialize(mx.init.Xavier())
    net(_x(1))
    _randomize_bn(net)
    return net


def _hooked(net: HybridBlock, path: str, x) -> np.ndarray:
    """The output of the block at ``path`` during the original model's forward."""
    block = net
    for part in path.split("."):
        block = block._children[part]
    seen = {}
    h = block.register_forward_hook(lambda b, i, o: seen.setdefault("out", o.asnumpy()))
    with mx.autograd.predict_mode():
        net(x)
    h.detach()
    return seen["out"]


def _same_objects(new: HybridBlock, old: HybridBlock) -> set[str]:
    """Names in ``new`` that hold the very Parameter objects ``old`` has under the same name."""
    a, b = named_params(new), named_params(old)
    return {n for n in a if n in b and a[n].param is b[n].param}


def _snap(net: HybridBlock) -> dict[str, np.ndarray]:
    mx.nd.waitall()  # a predict-mode forward may still be reordering oneDNN weights in place
    return snapshot(net)


def _changed(before: dict, net: HybridBlock) -> set[str]:
    after = _snap(net)
    return {n for n in before if not np.array_equal(before[n], after[n])}


def _trains_only_head(net: HybridBlock, classes: int, hybridize: bool) -> None:
    plan = make_plan(net, FREEZE, input_shape=SHAPE)
    apply_plan(net, plan)
    head = {r.name for r in plan.rows if r.trainable}
    assert head and all(n.startswith("head.") for n in head)
    assert {r.name for r in plan.rows if r.stage == "head" and not r.aux} == head
    if hybridize:
        net.hybridize()
    before = _snap(net)
    x = _x(4, seed=3)
    sgd_step(net, x, mx.nd.array(np.arange(4) % classes))
    assert _changed(before, net) == head  # BN statistics frozen too


def _bn_frozen_takes_effect(cut: HybridBlock) -> None:
    """Training-mode outputs use batch statistics until ``bn: frozen`` is applied to the cut model."""
    x = _x(4, seed=7)

    def gap():
        with mx.autograd.train_mode():
            train = cut(x).asnumpy()
        with mx.autograd.predict_mode():
            return np.max(np.abs(train - cut(x).asnumpy()))
    assert gap() > 1e-3
    apply_plan(cut, make_plan(cut, [FreezeBn()], input_shape=SHAPE))
    assert gap() < 1e-5


# ============================================================================ zoo models

@pytest.mark.parametrize("name,cut,shape", [("resnet18_v1", "features.6", (2, 256, 2, 2)),
                                            ("resnet18_v1b", "layer3", (2, 256, 2, 2)),
                                            ("resnet18_v1b", "layer2.0", (2, 128, 4, 4))])
@pytest.mark.parametrize("hybridize", [False, True])
def test_gluon_cut_matches_internal_activation(name, cut, shape, hybridize):
    net = _zoo(name)
    x = _x()
    want = _hooked(net, cut, x)
    out = S.cut_at(net, cut, input_shape=SHAPE)
    if hybridize:
        out.hybridize()
    got = out(x).asnumpy()
    assert got.shape == shape
    assert_f32_close(got, want, **R18)
    kept = set(named_params(out))
    assert kept == _same_objects(out, net)  # same names, same Parameter objects
    stop = cut.split(".")[0]
    assert not any(n.startswith(("output.", "fc.", "layer4.")) for n in kept)
    assert any(n.startswith(stop + ".") for n in kept)
    _bn_frozen_takes_effect(out)


def test_gluon_drop_last_and_ignore():
    v1, v1b = _zoo("resnet18_v1"), _zoo("resnet18_v1b")
    x = _x()
    d = S.drop_last(v1b, 3, input_shape=SHAPE)  # fc, flat, avgpool
    assert [p for p, _ in d.units][-1] == "layer4.1"
    assert_f32_close(d(x).asnumpy(), _hooked(v1b, "layer4", x), **R18)
    assert not {n for n in named_params(d) if n.startswith("fc.")}
    assert S.drop_last(v1, 1, input_shape=SHAPE)(x).shape == (2, 512, 1, 1)
    # The output is 1x1 at 32 px, so the pooling (v1) and flatten (v1b) are no-ops: same outputs.
    with mx.autograd.predict_mode():
        for net, unit in ((v1, "features.8"), (v1b, "flat")):
            ig = S.ignore(net, [unit], input_shape=SHAPE)
            assert unit not in [p for p, _ in ig.units]
            assert_f32_close(ig(x).asnumpy(), net(x).asnumpy(), **R18)
            assert set(named_params(ig)) == set(named_params(net)) == _same_objects(ig, net)


@pytest.mark.parametrize("hybridize", [False, True])
def test_gluon_head_trains_only_head(hybridize):
    net = _zoo("resnet18_v1")
    spec = HeadSpec(classes=3, hidden=[16], dropout=0.2, init="normal")
    out = S.attach_head(S.cut_at(net, "features.7", input_shape=SHAPE), spec, SHAPE)
    assert out(_x()).shape == (2, 3)
    params = named_params(out)
    assert [n for n in params if n.startswith("head.")] == ["head.fc1.weight", "head.fc1.bias",
                                                           "head.fc.weight", "head.fc.bias"]
    assert params["head.fc1.weight"].param.shape == (16, 512)
    assert params["features.0.weight"].param is named_params(net)["features.0.weight"].param
    _trains_only_head(out, 3, hybridize)


def test_gluon_feature_taps_pool_and_concatenate():
    net = _zoo("resnet18_v1b")
    x = _x()
    spec = HeadSpec(classes=4, inputs=["layer3", "layer4.0"], pool="max")
    out = S.attach_head(net, spec, SHAPE)
    assert [p for p, _ in out.units][-1] == "layer4.0"  # nothing after the last tap is kept
    w = named_params(out)["head.fc.weight"].param
    assert w.shape == (4, 256 + 512)
    feats = [_hooked(net, "layer3", x), _hooked(net, "layer4", x)]
    f3 = feats[0].max(axis=(2, 3))
    f4 = S.cut_at(net, "layer4.0", input_shape=SHAPE)(x).asnumpy().max(axis=(2, 3))
    want = np.concatenate([f3, f4], 1) @ w.data().asnumpy().T + named_params(out)["head.fc.bias"].param.data().asnumpy()
    np.testing.assert_allclose(out(x).asnumpy(), want, rtol=1e-4, atol=1e-5)
    out.hybridize()
    np.testing.assert_allclose(out(x).asnumpy(), want, rtol=1e-4, atol=1e-5)


def test_gluon_bad_names_list_close_matches():
    net = _zoo("resnet18_v1")
    with pytest.raises(SurgeryError, match=r"'feature\.6'.*Close matches: features\.6"):
        S.cut_at(net, "feature.6")
    with pytest.raises(SurgeryError, match=r"ignore 'features\.6\.0\.body'.*features\.6\.0"):
        S.ignore(net, ["features.6.0.body"])
    with pytest.raises(SurgeryError, match="drop every unit"):
        S.drop_last(net, 10)
    with pytest.raises(SurgeryError, match="head input 'output\\.1'"):
        S.attach_head(net, HeadSpec(classes=2, inputs=["output.1"]), SHAPE)


class _Residual(HybridBlock):
    """Top-level children that are not a chain: cutting by unit would be wrong."""

    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.a = nn.Conv2D(4, 3, padding=1)
            self.b = nn.Conv2D(4, 3, padding=1)

    def hybrid_forward(self, F, x):
        y = self.a(x)
        return y + self.b(y)


def test_gluon_model_that_is_not_a_chain_is_refused():
    net = _Residual()
    net.initialize()
    with pytest.raises(SurgeryError, match="not the chain of its units.*symbol:PREFIX"):
        S.cut_at(net, "a", input_shape=SHAPE)


# ============================================================================ symbol checkpoints

@pytest.fixture(scope="module")
def symbol_model(tmp_path_factory):
    net = _zoo("resnet18_v1", prefix="r18_")  # global names independent of earlier models
    net.hybridize()
    net(_x(1))
    prefix = str(tmp_path_factory.mktemp("sym") / "r18")
    net.export(prefix)
    return prefix


def _load_symbol(prefix: str) -> SymbolBlock:
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return mx.gluon.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"], f"{prefix}-0000.params")


def _internal(block: SymbolBlock, output: str, x) -> np.ndarray:
    """An internal output of the original graph, from an executor bound to its internals."""
    sym = block._cached_graph[1].get_internals()[output]
    values = {n: p.data() for n, p in block.params.items()}
    args = {n: x if n == "data" else values[n] for n in sym.list_arguments()}
    exe = sym.bind(mx.cpu(), args, aux_states={n: values[n] for n in sym.list_auxiliary_states()})
    return exe.forward(is_train=False)[0].asnumpy()


def test_symbol_cut_drop_ignore(symbol_model):
    sb = _load_symbol(symbol_model)
    x = _x()
    cut = S.cut_at(sb, "r18_stage3_activation1")
    assert_f32_close(cut(x).asnumpy(), _internal(sb, "r18_stage3_activation1_output", x), **R18)
    assert set(cut.params.keys()) == _same_objects(cut, sb)
    assert "r18_dense0_weight" not in cut.params.keys()
    assert "r18_stage4_conv0_weight" not in cut.params.keys()
    # drop_last: dense (1), pool (2), relu (3) -> the residual add's output.
    d3 = S.drop_last(sb, 3)
    assert_f32_close(d3(x).asnumpy(), _internal(sb, "r18_stage4__plus1_output", x), **R18)
    with pytest.raises(SurgeryError, match=r"drop_last 4: node 'r18_stage4__plus1' has 2 data inputs"):
        S.drop_last(sb, 4)
    cut.hybridize()
    _bn_frozen_takes_effect(cut)
    ig = S.ignore(sb, ["r18_pool1_fwd"])  # 1x1 at 32 px: dropping the pool changes nothing
    assert_f32_close(ig(x).asnumpy(), sb(x).asnumpy(), **R18)
    assert "Pooling" not in [n.op for n in S.list_nodes(ig, SHAPE)[-3:]]
    with pytest.raises(SurgeryError, match=r"'r18_stage4_activaton1'.*r18_stage4_activation1"):
        S.cut_at(sb, "r18_stage4_activaton1")
    with pytest.raises(SurgeryError, match="only single-input nodes can be ignored"):
        S.ignore(sb, ["r18_stage4__plus1"])


def test_symbol_head_with_frozen_bn_trains_only_head(symbol_model):
    sb = _load_symbol(symbol_model)
    # stage 3 (2x2 at 32 px): graph stage maps probe at the given size, where stage 4 is 1x1 = "head"
    out = S.attach_head(S.cut_at(sb, "r18_stage3_activation1"), HeadSpec(classes=3, hidden=[8]), SHAPE)
    assert isinstance(out, SymbolBlock) and out(_x()).shape == (2, 3)
    assert {n for n in out.params.keys() if n.startswith("head.")} == {
        "head.fc1.weight", "head.fc1.bias", "head.fc.weight", "head.fc.bias"}
    _trains_only_head(out, 3, hybridize=True)


# ============================================================================ ONNX models

def _onnx_model(nodes, inits, out: str, name: str) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *SHAPE])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, ["N", 10])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    return model


def _conv_bn(rng, prefix, node, x, cin, cout, inits, nodes, stride=1, relu=True):
    """PyTorch-exporter names: weights ``layer1.0.conv1.weight``, nodes ``/layer1/layer1.0/conv1/Conv``."""
    inits[f"{prefix}conv.weight"] = rng.randn(cout, cin, 3, 3).astype("f") * 0.3
    for k, v in (("weight", rng.uniform(0.5, 1.5, cout)), ("bias", rng.uniform(-0.2, 0.2, cout)),
                 ("running_mean", rng.uniform(-0.2, 0.2, cout)), ("running_var", rng.uniform(0.5, 1.5, cout))):
        inits[f"{prefix}bn.{k}"] = v.astype("f")
    nodes.append(helper.make_node("Conv", [x, f"{prefix}conv.weight"], [f"{node}/conv/Conv_output_0"],
                                  name=f"{node}/conv/Conv", pads=[1, 1, 1, 1], strides=[stride, stride]))
    nodes.append(helper.make_node("BatchNormalization", [f"{node}/conv/Conv_output_0"] +
                                  [f"{prefix}bn.{k}" for k in ("weight", "bias", "running_mean", "running_var")],
                                  [f"{node}/bn/BatchNormalization_output_0"], name=f"{node}/bn/BatchNormalization"))
    if not relu:
        return f"{node}/bn/BatchNormalization_output_0"
    nodes.append(helper.make_node("Relu", [f"{node}/bn/BatchNormalization_output_0"], [f"{node}/relu/Relu_output_0"],
                                  name=f"{node}/relu/Relu"))
    return f"{node}/relu/Relu_output_0"


def pytorch_style() -> onnx.ModelProto:
    rng = np.random.RandomState(0)
    inits, nodes = {}, []
    x = _conv_bn(rng, "stem.", "/stem", "input", 3, 8, inits, nodes, stride=2)
    y = _conv_bn(rng, "layer1.0.", "/layer1/layer1.0", x, 8, 8, inits, nodes, relu=False)
    nodes.append(helper.make_node("Add", [y, x], ["/layer1/layer1.0/Add_output_0"], name="/layer1/layer1.0/Add"))
    nodes.append(helper.make_node("Relu", ["/layer1/layer1.0/Add_output_0"], ["/layer1/layer1.0/relu_1/Relu_output_0"],
                                  name="/layer1/layer1.0/relu_1/Relu"))
    z = _conv_bn(rng, "layer2.0.", "/layer2/layer2.0", "/layer1/layer1.0/relu_1/Relu_output_0", 8, 16, inits,
                 nodes, stride=2)
    inits["fc.weight"] = rng.randn(10, 16).astype("f") * 0.3
    inits["fc.bias"] = rng.randn(10).astype("f")
    nodes += [helper.make_node("GlobalAveragePool", [z], ["/avgpool/GlobalAveragePool_output_0"],
                               name="/avgpool/GlobalAveragePool"),
              helper.make_node("Flatten", ["/avgpool/GlobalAveragePool_output_0"], ["/Flatten_output_0"],
                               name="/Flatten"),
              helper.make_node("Gemm", ["/Flatten_output_0", "fc.weight", "fc.bias"], ["/fc/Gemm_output_0"],
                               name="/fc/Gemm", transB=1),
              helper.make_node("Softmax", ["/fc/Gemm_output_0"], ["probs"], name="/Softmax", axis=1)]
    return _onnx_model(nodes, inits, "probs", "torch_jit")


def paddle_style() -> onnx.ModelProto:
    """Paddle2ONNX habits: weights in Constant nodes (``conv2d_0.w_0``), Reshape+MatMul+Add head."""
    rng = np.random.RandomState(1)

    def const(name, value):
        return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(value, name))
    nodes = [const("conv2d_0.w_0", rng.randn(8, 3, 3, 3).astype("f") * 0.3),
             helper.make_node("Conv", ["input", "conv2d_0.w_0"], ["conv2d_0.tmp_0"], name="conv2d_0",
                              pads=[1, 1, 1, 1], strides=[2, 2])]
    for k, v in (("w_0", rng.uniform(0.5, 1.5, 8)), ("b_0", rng.uniform(-0.2, 0.2, 8)),
                 ("w_1", rng.uniform(-0.2, 0.2, 8)), ("w_2", rng.uniform(0.5, 1.5, 8))):
        nodes.append(const(f"batch_norm_0.{k}", v.astype("f")))
    nodes += [helper.make_node("BatchNormalization", ["conv2d_0.tmp_0"] + [f"batch_norm_0.{k}" for k in
                                                                             ("w_0", "b_0", "w_1", "w_2")],
                               ["batch_norm_0.tmp_2"], name="batch_norm_0"),
              helper.make_node("Relu", ["batch_norm_0.tmp_2"], ["relu_0.tmp_0"], name="relu_0"),
              const("conv2d_1.w_0", rng.randn(16, 8, 3, 3).astype("f") * 0.3),
              helper.make_node("Conv", ["relu_0.tmp_0", "conv2d_1.w_0"], ["conv2d_1.tmp_0"], name="conv2d_1",
                               pads=[1, 1, 1, 1], strides=[2, 2]),
              helper.make_node("Relu", ["conv2d_1.tmp_0"], ["relu_1.tmp_0"], name="relu_1"),
              helper.make_node("GlobalAveragePool", ["relu_1.tmp_0"], ["pool2d_0.tmp_0"], name="pool2d_0"),
              const("shape_0", np.array([0, -1], dtype=np.int64)),
              helper.make_node("Reshape", ["pool2d_0.tmp_0", "shape_0"], ["reshape2_0.tmp_0"], name="reshape2_0"),
              const("fc_0.w_0", rng.randn(16, 10).astype("f") * 0.3),
              helper.make_node("MatMul", ["reshape2_0.tmp_0", "fc_0.w_0"], ["fc_0.tmp_0"], name="matmul_0"),
              const("fc_0.b_0", rng.randn(10).astype("f")),
              helper.make_node("Add", ["fc_0.tmp_0", "fc_0.b_0"], ["fc_0.tmp_1"], name="elementwise_add_0"),
              helper.make_node("Softmax", ["fc_0.tmp_1"], ["softmax_0.tmp_0"], name="softmax_0", axis=1)]
    return _onnx_model(nodes, {}, "softmax_0.tmp_0", "paddle")


def _ort(model: onnx.ModelProto, tensor: str, x: np.ndarray) -> np.ndarray:
    """onnxruntime's value of any tensor: the tensor is added as a graph output."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if tensor not in [o.name for o in m.graph.output]:
        m.graph.output.append(helper.make_tensor_value_info(tensor, TensorProto.FLOAT, None))
    return ort_session(m).run([tensor], {"input": x})[0]


@pytest.mark.parametrize("build,cut,tensor", [
    (pytorch_style, "/layer1/layer1.0/relu_1/Relu", "/layer1/layer1.0/relu_1/Relu_output_0"),
    (pytorch_style, "/layer2/layer2.0/bn/BatchNormalization_output_0", "/layer2/layer2.0/bn/BatchNormalization_output_0"),
    (paddle_style, "relu_0", "relu_0.tmp_0"),
    (paddle_style, "reshape2_0.tmp_0", "reshape2_0.tmp_0")])
def test_onnx_cut_matches_onnxruntime(build, cut, tensor):
    model = build()
    block = import_model(model)
    out = S.cut_at(block, cut)
    x = _x(2).asnumpy()
    got = out(mx.nd.array(x)).asnumpy()
    want = _ort(model, tensor, x)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    kept = set(out.params.keys())
    assert kept == _same_objects(out, block) and kept < set(block.params.keys())
    assert not kept & {"fc.weight", "fc_0.w_0"}
    assert onnx_info(out).outputs == (tensor,)  # the ONNX tensor the exported graph will end at
    _bn_frozen_takes_effect(out)  # the BatchNormalization before the cut, rewritten in the new graph


def test_onnx_ignore_and_drop_last_count_onnx_nodes():
    x = _x(2).asnumpy()
    torch_model, paddle_model = pytorch_style(), paddle_style()
    tb, pb = import_model(torch_model), import_model(paddle_model)
    logits = S.ignore(tb, ["/Softmax"])
    np.testing.assert_allclose(logits(mx.nd.array(x)).asnumpy(), _ort(torch_model, "/fc/Gemm_output_0", x),
                               rtol=1e-4, atol=1e-5)
    # Softmax, Gemm -> the Flatten output; Softmax, Gemm, Flatten, GlobalAveragePool -> the last Relu.
    for n, tensor in ((2, "/Flatten_output_0"), (4, "/layer2/layer2.0/relu/Relu_output_0")):
        got = S.drop_last(tb, n)(mx.nd.array(x)).asnumpy()
        np.testing.assert_allclose(got, _ort(torch_model, tensor, x), rtol=1e-4, atol=1e-5)
    assert "fc.weight" not in S.drop_last(tb, 2).params.keys()
    # Paddle: softmax (1), bias Add (2), MatMul (3): the Reshape output; weights in Constant nodes stay named.
    d3 = S.drop_last(pb, 3)
    np.testing.assert_allclose(d3(mx.nd.array(x)).asnumpy(), _ort(paddle_model, "reshape2_0.tmp_0", x),
                               rtol=1e-4, atol=1e-5)
    assert {"conv2d_0.w_0", "batch_norm_0.w_0", "conv2d_1.w_0"} <= set(d3.params.keys())
    assert not {"fc_0.w_0", "fc_0.b_0"} & set(d3.params.keys())
    two = S.ignore(pb, ["softmax_0", "elementwise_add_0"])  # a run of ignored nodes
    np.testing.assert_allclose(two(mx.nd.array(x)).asnumpy(), _ort(paddle_model, "fc_0.tmp_0", x),
                               rtol=1e-4, atol=1e-5)
    with pytest.raises(SurgeryError, match=r"'/layer1/layer1\.0/Add' has 2 data inputs"):
        S.ignore(tb, ["/layer1/layer1.0/Add"])
    with pytest.raises(SurgeryError, match=r"'/layer1/layer1\.0/relu1/Relu'.*/layer1/layer1\.0/relu_1/Relu"):
        S.cut_at(tb, "/layer1/layer1.0/relu1/Relu")


def test_onnx_feature_taps_and_list_nodes(tmp_path):
    model = pytorch_style()
    model.graph.node[-1].name = ""  # an unnamed node is listed by its output tensor
    onnx.save(model, str(tmp_path / "m.onnx"))  # op types come from the file
    block = import_model(str(tmp_path / "m.onnx"))
    nodes = {n.name: n for n in S.list_nodes(block, SHAPE)}
    assert nodes["probs"].op == "Softmax" and nodes["probs"].shape == (1, 10)
    assert nodes["/layer1/layer1.0/Add"].op == "Add" and nodes["/layer1/layer1.0/Add"].shape == (1, 8, 16, 16)
    assert nodes["/fc/Gemm"].shape == (1, 10) and len(nodes) == len(model.graph.node)
    assert list(nodes)[0] == "/stem/conv/Conv" and list(nodes)[-1] == "probs"
    assert S.feature_end(block, SHAPE) == "/avgpool/GlobalAveragePool"
    spec = HeadSpec(classes=5, inputs=["/layer1/layer1.0/relu_1/Relu", "/layer2/layer2.0/relu/Relu"])
    out = S.attach_head(block, spec, SHAPE)
    assert out(_x()).shape == (2, 5)
    assert out.params["head.fc.weight"].shape == (5, 8 + 16)
    assert "fc.weight" not in out.params.keys()  # the old classifier is dead code, dropped
    _trains_only_head(out, 5, hybridize=False)


def test_onnx_round_trip_cut_head_train_export_import(tmp_path):
    block = import_model(pytorch_style())
    out = S.attach_head(S.cut_at(block, "/layer2/layer2.0/relu/Relu"), HeadSpec(classes=4, hidden=[6]), SHAPE)
    apply_plan(out, make_plan(out, FREEZE, input_shape=SHAPE))
    before = _snap(out)
    sgd_step(out, _x(4, seed=5), mx.nd.array([0, 1, 2, 3]), steps=3)
    assert _changed(before, out) == {"head.fc1.weight", "head.fc1.bias", "head.fc.weight", "head.fc.bias"}
    path = export_onnx(out, tmp_path / "cut.onnx", {"input": (1, *SHAPE)})
    back = import_model(str(path))
    x = _x(3, seed=6)
    want, got = out(x).asnumpy(), back(x).asnumpy()
    assert got.shape == (3, 4)
    assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))


# ============================================================================ recipes, prepare, CLI

def _recipe(source, surgery, weights=None, **model):
    return parse_recipe({"name": "t", "model": {"source": source, "input_shape": list(SHAPE), "weights": weights,
                                                **model},
                         "surgery": surgery, "rules": [{"preset": "freeze_all_but_head"}]})


def test_prepare_routes_surgery(tmp_path):
    plain = prepare(_recipe("zoo:resnet18_v1", {"head": {"classes": 5}}))
    names = set(named_params(plain.block))
    assert "output.weight" in names and not any(n.startswith("head.") for n in names)  # zoo's own head
    custom = prepare(_recipe("zoo:resnet18_v1", {"head": {"classes": 5, "hidden": [8]}}))
    rows = custom.plan.by_name()
    assert rows["head.fc1.weight"].shape == (8, 512) and rows["head.fc1.weight"].trainable
    assert "output.weight" not in rows and not rows["features.0.weight"].trainable
    onnx.save(pytorch_style(), str(tmp_path / "m.onnx"))
    cut = prepare(_recipe(f"onnx:{tmp_path / 'm.onnx'}", {"ignore": ["/Softmax"], "drop_last": 1,
                                                           "head": {"classes": 3}}, input_name="input"))
    assert cut.block(_x()).shape == (2, 3)
    rows = cut.plan.by_name()
    assert rows["head.fc.weight"].shape == (3, 16)  # Softmax ignored, Gemm dropped: the Flatten output
    assert "fc.weight" not in rows and not rows["layer2.0.conv.weight"].trainable


def test_prepare_restores_after_surgery(tmp_path):
    """A file of the whole original model (old classifier included) restores into the cut model."""
    src = _zoo("resnet18_v1")
    src.save_parameters(str(tmp_path / "full.params"))
    prep = prepare(_recipe("zoo:resnet18_v1", {"cut_at": "features.7", "head": {"classes": 3}},
                           weights=str(tmp_path / "full.params")))
    assert "output.weight" in prep.restore.unexpected and "head.fc.weight" in prep.restore.missing
    got = named_params(prep.block)["features.7.1.body.1.running_var"].param.data().asnumpy()
    np.testing.assert_array_equal(got, named_params(src)["features.7.1.body.1.running_var"].param.data().asnumpy())


def test_schema_rejects_conflicting_surgery():
    with pytest.raises(RecipeError, match="cut_at and drop_last"):
        _recipe("zoo:resnet18_v1", {"cut_at": "features.6", "drop_last": 2})
    with pytest.raises(RecipeError, match="head.inputs already says"):
        _recipe("zoo:resnet18_v1", {"cut_at": "features.6", "head": {"classes": 2, "inputs": ["features.5"]}})
    with pytest.raises(RecipeError, match="surgery.head.pool"):
        _recipe("zoo:resnet18_v1", {"head": {"classes": 2, "pool": "mean"}})


def test_cli_inspect_nodes(tmp_path):
    onnx.save(paddle_style(), str(tmp_path / "p.onnx"))
    res = CliRunner().invoke(app, ["inspect", f"onnx:{tmp_path / 'p.onnx'}", "--nodes", "--input-shape", "3,32,32"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split() == ["conv2d_0", "Conv", "1x8x16x16"]
    assert lines[-1].split() == ["softmax_0", "Softmax", "1x10"]
    res = CliRunner().invoke(app, ["inspect", "zoo:resnet18_v1", "--nodes", "--input-shape", "3,32,32"])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[6].split() == ["features.6", "HybridSequential", "1x256x2x2"]


def test_symbol_taps_and_pooling_choices(symbol_model):
    sb = _load_symbol(symbol_model)
    x = _x()
    s3, s4 = "r18_stage3_activation1", "r18_stage4_activation1"
    flat = S.attach_head(sb, HeadSpec(classes=2, inputs=[s3], pool="none"), SHAPE)
    assert flat.params["head.fc.weight"].shape == (2, 256 * 2 * 2)  # flattened, not pooled
    both = S.attach_head(sb, HeadSpec(classes=2, inputs=[s3, s4], pool="max", hidden=[5], activation="tanh"), SHAPE)
    assert both.params["head.fc1.weight"].shape == (5, 256 + 512)
    f = np.concatenate([_internal(sb, s3 + "_output", x).max(axis=(2, 3)),
                        _internal(sb, s4 + "_output", x).max(axis=(2, 3))], 1)
    p = {k: v.data().asnumpy() for k, v in both.params.items() if k.startswith("head.")}
    h = np.tanh(f @ p["head.fc1.weight"].T + p["head.fc1.bias"])
    np.testing.assert_allclose(both(x).asnumpy(), h @ p["head.fc.weight"].T + p["head.fc.bias"],
                               rtol=1e-4, atol=1e-5)
    assert "r18_dense0_weight" not in both.params.keys()
    with pytest.raises(SurgeryError, match=r"head input 'r18_stage9_activation1'.*r18_stage"):
        S.attach_head(sb, HeadSpec(classes=2, inputs=["r18_stage9_activation1"]), SHAPE)


def test_gluon_cut_with_head_exports_to_onnx(tmp_path):
    net = _zoo("resnet18_v1b")
    out = S.attach_head(S.drop_last(net, 3, input_shape=SHAPE), HeadSpec(classes=3, hidden=[8]), SHAPE)
    out.hybridize()
    path = export_onnx(out, tmp_path / "v1b.onnx", {"data": (1, *SHAPE)})  # verified against onnxruntime
    back = import_model(str(path))
    x = _x(2, seed=9)
    np.testing.assert_allclose(back(x).asnumpy(), out(x).asnumpy(), rtol=1e-4, atol=1e-5)


def test_paddle_style_head_on_dropped_classifier_trains_only_head():
    pb = import_model(paddle_style())
    out = S.attach_head(S.drop_last(pb, 3), HeadSpec(classes=3, init="zeros"), SHAPE)
    assert out.params["head.fc.weight"].shape == (3, 16)
    assert not out.params["head.fc.weight"].data().asnumpy().any()  # the spec's initializer
    assert out.params["conv2d_0.w_0"] is pb.params["conv2d_0.w_0"]
    _trains_only_head(out, 3, hybridize=True)


def test_gluon_ignore_that_breaks_shapes_is_a_surgery_error():
    net = _zoo("resnet18_v1")
    with pytest.raises(SurgeryError, match=r"after ignoring features\.0 the model no longer runs"):
        S.ignore(net, ["features.0"], input_shape=SHAPE)  # the stem conv: 3 channels reach a 64-channel BN


def test_graph_ignore_that_breaks_shapes_is_a_surgery_error(symbol_model):
    sb = _load_symbol(symbol_model)
    with pytest.raises(SurgeryError, match=r"after ignoring r18_conv0_fwd the model does not fit"):
        S.ignore(sb, ["r18_conv0_fwd"], input_shape=SHAPE)


def test_cli_inspect_nodes_json_for_symbol_models(symbol_model):
    import json
    res = CliRunner().invoke(app, ["inspect", f"symbol:{symbol_model}", "--nodes", "--json", "--input-shape", "3,32,32"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert rows[0] == {"name": "r18_conv0_fwd", "op": "Convolution", "shape": [1, 64, 16, 16]}
    assert rows[-1] == {"name": "r18_dense0_fwd", "op": "FullyConnected", "shape": [1, 10]}


def test_default_cut_skips_nodes_that_keep_one_sample():
    """A head goes on the last feature map of every sample, not on a ``t[:1]`` slice of it."""
    from gluontl.recipe import SurgerySpec

    rng = np.random.RandomState(4)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"], name="relu"),
         helper.make_node("Slice", ["r", "zero", "one", "zero"], ["first"], name="first_sample"),
         helper.make_node("GlobalAveragePool", ["first"], ["g"], name="gap")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 4, 1, 1])],
        [numpy_helper.from_array(rng.randn(4, 3, 3, 3).astype("f"), "w"),
         numpy_helper.from_array(np.array([0], np.int64), "zero"),
         numpy_helper.from_array(np.array([1], np.int64), "one")])
    block = import_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert S.feature_end(block, (3, 8, 8)) == "relu"
    net = S.apply_surgery(block, SurgerySpec(head=HeadSpec(classes=2)), (3, 8, 8))
    assert net(mx.nd.array(rng.randn(3, 3, 8, 8))).shape == (3, 2)
