"""Export tests: every file written is run in onnxruntime (or reloaded in MXNet) and compared
with the block's predict-mode outputs; failure paths must leave no file behind."""
from __future__ import annotations

from pathlib import Path

import gluoncv
import mxnet as mx
import numpy as np
import onnx
import pytest
from mxnet.gluon import nn
from mxnet.gluon.model_zoo import vision
from onnx import numpy_helper

from gluontl.errors import ExportError
from gluontl.export import export_onnx, export_symbol, verify_onnx
from tests.helpers import ort_run

SHAPE = (1, 3, 64, 64)


def _randomize_batchnorm(net: mx.gluon.Block, seed: int, stats: bool = True) -> None:
    """Give BN layers non-trivial affine terms (and statistics), so folding them is really tested."""
    rng = np.random.RandomState(seed)
    for name, param in net.collect_params().items():
        if name.endswith("beta") or (stats and name.endswith(("running_mean", "moving_mean"))):
            param.set_data(mx.nd.array(rng.normal(0, 0.1, param.shape)))
        elif name.endswith("gamma") or (stats and name.endswith(("running_var", "moving_var"))):
            param.set_data(mx.nd.array(rng.uniform(0.5, 1.5, param.shape)))


def _calibrate_batchnorm(net: mx.gluon.Block, shape: tuple[int, ...], seed: int) -> None:
    """Set running statistics to real batch statistics (one train-mode step, momentum 0;
    MXNet updates them in the backward pass).

    Random statistics on a deep random net let BN shifts drown the input signal (outputs
    become input-independent, so a wrong weight would go unnoticed); real ones keep it.
    """
    bns = [b for b in _walk(net) if isinstance(b, nn.BatchNorm)]
    for bn in bns:
        bn._kwargs["momentum"] = 0.0
    with mx.autograd.record(train_mode=True):
        out = net(mx.nd.array(np.random.RandomState(seed).uniform(-1, 1, (16, *shape[1:]))))
    out.backward()
    for bn in bns:
        bn._kwargs["momentum"] = 0.9
    assert not np.allclose(bns[-1].running_var.data().asnumpy(), 1.0)  # the stats really moved


def _walk(block: mx.gluon.Block):
    yield block
    for child in block._children.values():
        yield from _walk(child)


def _batches(shapes: dict[str, tuple[int, ...]], seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.RandomState(seed)
    return [{k: rng.uniform(-1, 1, (b, *s[1:])).astype(np.float32) for k, s in shapes.items()} for b in (1, 2)]


def _zoo(name: str) -> mx.gluon.HybridBlock:
    if name == "resnet18_v1b":
        net = gluoncv.model_zoo.get_model("resnet18_v1b", classes=10, pretrained=False)
    else:
        net = vision.get_model(name, classes=10)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros(SHAPE))
    _randomize_batchnorm(net, seed=len(name), stats=False)
    _calibrate_batchnorm(net, SHAPE, seed=len(name))
    net.hybridize()
    return net


@pytest.fixture(scope="module", params=["resnet18_v1", "mobilenetv2_1.0", "resnet18_v1b"])
def zoo_export(request, tmp_path_factory) -> tuple[mx.gluon.HybridBlock, Path]:
    net = _zoo(request.param)
    path = export_onnx(net, tmp_path_factory.mktemp(request.param) / "model.onnx", {"data": SHAPE})
    return net, path


def test_zoo_lean_export_matches_mxnet(zoo_export):
    net, path = zoo_export
    for batch in _batches({"data": SHAPE}, seed=7):
        report = verify_onnx(net, path, batch)
        assert report.ok and report.max_rel <= 1e-4, report.describe()
        assert report.outputs[0].shape == (len(batch["data"]), 10)
    # The outputs must depend on the input, or agreement would prove little.
    out = net(mx.nd.array(batch["data"])).asnumpy()
    assert np.abs(out[0] - out[1]).max() > 0.05 * np.abs(out).max()


def test_zoo_lean_file_structure(zoo_export):
    _, path = zoo_export
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["data"]  # no weight graph-inputs
    assert len(model.graph.initializer) > 10
    ops = {n.op_type for n in model.graph.node}
    assert "BatchNormalization" not in ops and "Identity" not in ops and "Dropout" not in ops
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    out_dims = model.graph.output[0].type.tensor_type.shape.dim
    assert (out_dims[0].dim_param, out_dims[1].dim_value) == ("batch", 10)
    assert {o.domain: o.version for o in model.opset_import}[""] == 13


def test_raw_keeps_weight_inputs_and_batchnorm_and_agrees_with_lean(tmp_path):
    net = _zoo("resnet18_v1")
    raw = onnx.load(export_onnx(net, tmp_path / "raw.onnx", {"data": SHAPE}, lean=False))
    lean_path = export_onnx(net, tmp_path / "lean.onnx", {"data": SHAPE})
    raw_ops = [n.op_type for n in raw.graph.node]
    assert raw_ops.count("BatchNormalization") == 20 and len(raw.graph.input) > 50
    for batch in _batches({"data": SHAPE}, seed=3):
        assert verify_onnx(net, tmp_path / "raw.onnx", batch).max_rel <= 1e-4
        assert verify_onnx(net, lean_path, batch).max_rel <= 1e-4


def test_corrupted_weight_is_caught(zoo_export, tmp_path):
    net, path = zoo_export
    model = onnx.load(path)
    first_conv = next(n for n in model.graph.node if n.op_type == "Conv")
    init = next(t for t in model.graph.initializer if t.name == first_conv.input[1])
    weights = numpy_helper.to_array(init).copy()
    idx = np.unravel_index(np.argmax(np.abs(weights)), weights.shape)
    weights[idx] = -weights[idx]
    init.CopyFrom(numpy_helper.from_array(weights, init.name))
    onnx.save(model, tmp_path / "bad.onnx")
    batch = _batches({"data": SHAPE}, seed=11)[1]
    assert verify_onnx(net, path, batch).ok
    report = verify_onnx(net, tmp_path / "bad.onnx", batch)
    assert not report.ok and report.max_rel > 1e-4 and report.max_abs > 0
    with pytest.raises(ExportError, match=r"do not fit"):
        verify_onnx(net, path, {"data": np.zeros((1, 3, 32, 33), np.float32)})
    (tmp_path / "cut.onnx").write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ExportError, match=r"cut\.onnx"):
        verify_onnx(net, tmp_path / "cut.onnx", batch)


SB_SHAPES = {"meta": (1, 4), "img": (1, 3, 8, 8)}


def _two_headed_symbol_block(frozen_bn: bool = False) -> mx.gluon.SymbolBlock:
    """Inputs named img/meta (positional order meta, img), outputs from two branches."""
    mx.random.seed(0)
    with mx.name.NameManager():  # same auto-generated op names on every call
        img, meta = mx.sym.var("img"), mx.sym.var("meta")
        x = mx.sym.Convolution(img, kernel=(3, 3), num_filter=6, pad=(1, 1), name="c1")
        x = mx.sym.BatchNorm(x, fix_gamma=False, use_global_stats=frozen_bn, name="bn1")
        x = mx.sym.Activation(x, act_type="relu")
        x = mx.sym.Pooling(x, global_pool=True, pool_type="avg", kernel=(1, 1))
        x = mx.sym.concat(mx.sym.flatten(x), meta, dim=1)
        logits = mx.sym.FullyConnected(x, num_hidden=5, name="fc_logits")
        aux = mx.sym.sigmoid(mx.sym.FullyConnected(meta, num_hidden=3, name="fc_aux"))
    block = mx.gluon.SymbolBlock(mx.sym.Group([logits, aux]), [meta, img])
    block.initialize(mx.init.Normal(0.5))
    block(mx.nd.zeros(SB_SHAPES["meta"]), mx.nd.zeros(SB_SHAPES["img"]))
    _randomize_batchnorm(block, seed=5)
    return block




def test_symbol_block_named_inputs_two_outputs(tmp_path):
    block = _two_headed_symbol_block()
    path = export_onnx(block, tmp_path / "sb.onnx", SB_SHAPES, output_names=["logits", "aux"])
    model = onnx.load(path)
    assert [i.name for i in model.graph.input] == ["meta", "img"]
    assert [o.name for o in model.graph.output] == ["logits", "aux"]
    assert "BatchNormalization" not in {n.op_type for n in model.graph.node}
    for batch in _batches(SB_SHAPES, seed=1):
        report = verify_onnx(block, path, batch)
        assert report.ok, report.describe()
        assert [o.shape for o in report.outputs] == [(len(batch["img"]), 5), (len(batch["img"]), 3)]


def test_symbol_block_symbol_round_trip(tmp_path):
    block = _two_headed_symbol_block()
    json_path, params_path = export_symbol(block, tmp_path / "sb", SB_SHAPES, epoch=3)
    assert params_path.name == "sb-0003.params" and json_path.name == "sb-symbol.json"
    reloaded = mx.gluon.SymbolBlock.imports(str(json_path), ["meta", "img"], str(params_path))
    args = [mx.nd.array(v) for v in _batches(SB_SHAPES, seed=2)[1].values()]
    for got, want in zip(reloaded(*args), block(*args)):
        np.testing.assert_allclose(got.asnumpy(), want.asnumpy(), rtol=1e-6, atol=1e-7)


def test_zoo_symbol_round_trip(tmp_path):
    net = _zoo("resnet18_v1")
    json_path, params_path = export_symbol(net, tmp_path / "r18", {"data": SHAPE})
    reloaded = mx.gluon.SymbolBlock.imports(str(json_path), ["data"], str(params_path))
    x = mx.nd.array(_batches({"data": SHAPE}, seed=4)[1]["data"])
    np.testing.assert_allclose(reloaded(x).asnumpy(), net(x).asnumpy(), rtol=1e-6, atol=1e-6)


def test_fixed_gamma_and_unfoldable_batchnorm(tmp_path):
    """fix_gamma BN ignores its stored gamma in MXNet, so the export must too; a BN with no
    Conv in front cannot be folded and must survive as an inference-mode BatchNormalization;
    predict-mode Dropout is a no-op and must disappear."""
    net = nn.HybridSequential()
    net.add(nn.BatchNorm(scale=False, center=False), nn.Conv2D(4, 3), nn.BatchNorm(scale=False),
            nn.Activation("relu"), nn.Dropout(0.5), nn.Dense(3))
    net.initialize()
    net.hybridize()  # imperative BN would reset a fixed gamma to 1 in place; hybridized BN keeps 3
    net(mx.nd.zeros((1, 2, 6, 6)))
    _randomize_batchnorm(net, seed=9)
    for bn in (net[0], net[2]):
        bn.gamma.set_data(mx.nd.full(bn.gamma.shape, 3.0))
    path = export_onnx(net, tmp_path / "bn.onnx", {"data": (1, 2, 6, 6)})
    ops = [n.op_type for n in onnx.load(path).graph.node]
    assert ops == ["BatchNormalization", "Conv", "Relu", "Flatten", "Gemm"]  # Dropout gone, one BN folded
    for batch in _batches({"data": (1, 2, 6, 6)}, seed=6):
        assert verify_onnx(net, path, batch).max_rel <= 1e-4


def test_frozen_batchnorm_exports_same_graph(tmp_path):
    net = _zoo("resnet18_v1")
    unfrozen = onnx.load(export_onnx(net, tmp_path / "a.onnx", {"data": SHAPE}))
    for block in _walk(net):
        if isinstance(block, nn.BatchNorm):
            block._kwargs["use_global_stats"] = True
    net.collect_params().setattr("grad_req", "null")
    frozen = onnx.load(export_onnx(net, tmp_path / "b.onnx", {"data": SHAPE}))
    assert frozen.graph.SerializeToString() == unfrozen.graph.SerializeToString()


def test_frozen_symbol_block_batchnorm_exports_same_graph(tmp_path):
    frozen_block = _two_headed_symbol_block(frozen_bn=True)
    frozen_block.collect_params().setattr("grad_req", "null")
    assert '"use_global_stats": "True"' in frozen_block(mx.sym.var("meta"), mx.sym.var("img"))[0].tojson()
    unfrozen = onnx.load(export_onnx(_two_headed_symbol_block(), tmp_path / "a.onnx", SB_SHAPES))
    frozen = onnx.load(export_onnx(frozen_block, tmp_path / "b.onnx", SB_SHAPES))
    assert frozen.graph.SerializeToString() == unfrozen.graph.SerializeToString()


def test_refuses_overwrite_without_force(tmp_path):
    block = _two_headed_symbol_block()
    path = export_onnx(block, tmp_path / "m.onnx", SB_SHAPES)
    before = path.read_bytes()
    path.write_bytes(b"not onnx")
    with pytest.raises(ExportError, match=r"m\.onnx already exists.*force"):
        export_onnx(block, path, SB_SHAPES)
    assert path.read_bytes() == b"not onnx"
    with pytest.raises(ExportError, match="force"):
        export_symbol(block, tmp_path / "m", SB_SHAPES) and export_symbol(block, tmp_path / "m", SB_SHAPES)
    export_onnx(block, path, SB_SHAPES, force=True)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m-0000.params", "m-symbol.json", "m.onnx"]


def test_unwritable_destination_leaves_nothing(tmp_path):
    block = _two_headed_symbol_block()
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(ExportError, match=r"file\.txt.*not a directory"):
        export_onnx(block, tmp_path / "file.txt" / "out.onnx", SB_SHAPES)
    with pytest.raises(ExportError, match=r"file\.txt.*not a directory"):
        export_symbol(block, tmp_path / "file.txt" / "out", SB_SHAPES)
    # /proc is a directory nobody, not even root, can create files in.
    with pytest.raises(ExportError, match=r"Cannot write /proc/gluontl-out\.onnx: creating a file in /proc failed"):
        export_onnx(block, "/proc/gluontl-out.onnx", SB_SHAPES)
    with pytest.raises(ExportError, match="is a directory"):
        export_onnx(block, tmp_path, SB_SHAPES, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["file.txt"]


def test_failed_verification_writes_nothing(tmp_path):
    net = _zoo("mobilenetv2_1.0")
    with pytest.raises(ExportError, match=r"m\.onnx was not written.*of the output's range"):
        export_onnx(net, tmp_path / "m.onnx", {"data": SHAPE}, rtol=1e-15)
    assert list(tmp_path.iterdir()) == []


def test_bad_input_names_and_sample(tmp_path):
    block = _two_headed_symbol_block()
    with pytest.raises(ExportError, match="batch-1 shape"):
        export_onnx(block, tmp_path / "a.onnx", {"meta": (4,), "img": (1, 3, 8, 8)})
    with pytest.raises(ExportError, match="output_names"):
        export_onnx(block, tmp_path / "a.onnx", SB_SHAPES, output_names=["only_one"])
    with pytest.raises(ExportError, match=r"sample\['img'\] has shape"):
        export_onnx(block, tmp_path / "a.onnx", SB_SHAPES,
                    sample={"meta": np.zeros((2, 4)), "img": np.zeros((2, 3, 9, 9))})
    # A sample is verified on too: one whose outputs are NaN cannot be verified, so nothing is written.
    bad = {"meta": np.full((3, 4), np.nan), "img": np.zeros((3, 3, 8, 8))}
    with pytest.raises(ExportError, match="sample batch of 1"):
        export_onnx(block, tmp_path / "a.onnx", SB_SHAPES, sample=bad)
    good = {"meta": np.ones((3, 4)), "img": np.zeros((3, 3, 8, 8))}
    assert export_onnx(block, tmp_path / "a.onnx", SB_SHAPES, sample=good).is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["a.onnx"]


class _TwoInputs(mx.gluon.HybridBlock):
    """Plain Gluon block: two inputs, BN after Dense (a Gemm fold), one output passing an input through."""

    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.fc = nn.Dense(3)
            self.bn = nn.BatchNorm()

    def hybrid_forward(self, F, a, b):
        return self.bn(self.fc(a)) * b, a


@pytest.mark.parametrize("opset", [13, 17])
def test_plain_block_two_inputs_gemm_fold(tmp_path, opset):
    net = _TwoInputs()
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 5)), mx.nd.zeros((1, 3)))
    _randomize_batchnorm(net, seed=2)
    shapes = {"a": (1, 5), "b": (1, 3)}
    path = export_onnx(net, tmp_path / "two.onnx", shapes, opset=opset, output_names=["y", "a_out"])
    model = onnx.load(path)
    assert {o.domain: o.version for o in model.opset_import}[""] == opset
    # BN folded into the Gemm, Flatten of a 2-D input dropped; the pass-through output keeps
    # its Identity (an input name cannot also be an output name).
    assert [n.op_type for n in model.graph.node] == ["Gemm", "Mul", "Identity"]
    assert [o.name for o in model.graph.output] == ["y", "a_out"]
    for batch in _batches(shapes, seed=8):
        assert verify_onnx(net, path, batch).max_rel <= 1e-4


class _Softsign(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, x):
        return F.softsign(x)


def test_unsupported_op_is_a_clear_error(tmp_path):
    with pytest.raises(ExportError, match="softsign"):
        export_onnx(_Softsign(), tmp_path / "s.onnx", {"data": (1, 4)})
    assert list(tmp_path.iterdir()) == []


def test_default_output_name_avoids_existing_node_name(tmp_path):
    data = mx.sym.var("x")
    block = mx.gluon.SymbolBlock(mx.sym.FullyConnected(data, num_hidden=2, name="output"), [data])
    block.initialize()
    path = export_onnx(block, tmp_path / "o.onnx", {"x": (1, 3)})
    assert [o.name for o in onnx.load(path).graph.output] == ["_output"]
    with pytest.raises(ExportError, match="output_names"):
        export_onnx(block, tmp_path / "p.onnx", {"x": (1, 3)}, output_names=["output"])


class _ReshapeNoop(mx.gluon.HybridBlock):
    def hybrid_forward(self, F, x):
        return F.relu(F.reshape(F.relu(x), shape=(0, -1)))


def test_shape_preserving_reshape_is_dropped(tmp_path):
    raw = export_onnx(_ReshapeNoop(), tmp_path / "raw.onnx", {"data": (1, 6)}, lean=False)
    lean = export_onnx(_ReshapeNoop(), tmp_path / "lean.onnx", {"data": (1, 6)})
    assert "Reshape" in [n.op_type for n in onnx.load(raw).graph.node]
    assert [n.op_type for n in onnx.load(lean).graph.node] == ["Relu", "Relu"]
    for batch in _batches({"data": (1, 6)}, seed=1):
        assert verify_onnx(_ReshapeNoop(), lean, batch).max_rel <= 1e-4


def test_dense_default_flatten_on_4d_input(tmp_path):
    """A symbol FullyConnected without a flatten attribute flattens (MXNet's default); mx.onnx
    alone reads it as flatten=False and writes a file onnxruntime rejects."""
    x = mx.sym.var("x")
    block = mx.gluon.SymbolBlock(
        mx.sym.FullyConnected(mx.sym.Convolution(x, kernel=(3, 3), num_filter=4), num_hidden=5), [x])
    block.initialize()
    assert "flatten" not in block(x).tojson()
    path = export_onnx(block, tmp_path / "fc.onnx", {"x": (1, 2, 5, 5)})
    assert [n.op_type for n in onnx.load(path).graph.node] == ["Conv", "Flatten", "Gemm"]
    for batch in _batches({"x": (1, 2, 5, 5)}, seed=3):
        assert verify_onnx(block, path, batch).max_rel <= 1e-4


def test_onnx_import_then_export_round_trip(zoo_export, tmp_path):
    """gluontl's ONNX importer maps Gemm to FullyConnected(flatten=False); re-exporting the
    imported block must give back the same lean graph and the same numbers."""
    from gluontl.onnx.importer import import_model

    _, path = zoo_export
    imported = import_model(path, {"data": SHAPE})
    again = export_onnx(imported, tmp_path / "again.onnx", {"data": SHAPE})
    first, second = onnx.load(path), onnx.load(again)
    assert [n.op_type for n in second.graph.node] == [n.op_type for n in first.graph.node]
    x = _batches({"data": SHAPE}, seed=12)[1]
    np.testing.assert_allclose(ort_run(again, x)[0], ort_run(path, x)[0], rtol=1e-5, atol=1e-6)


def test_block_living_on_another_context(tmp_path):
    """Trained with ctx cpu:1 (or several contexts): export must not call it with cpu(0) arrays."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, 3), nn.BatchNorm(), nn.Dense(2))
    net.initialize(ctx=[mx.cpu(1)])
    net.hybridize()
    path = export_onnx(net, tmp_path / "c.onnx", {"data": (1, 3, 6, 6)})
    json_path, params_path = export_symbol(net, tmp_path / "c", {"data": (1, 3, 6, 6)})
    x = _batches({"data": (1, 3, 6, 6)}, seed=4)[1]
    want = net(mx.nd.array(x["data"], ctx=mx.cpu(1))).asnumpy()
    np.testing.assert_allclose(ort_run(path, x)[0], want, rtol=1e-4, atol=1e-6)
    reloaded = mx.gluon.SymbolBlock.imports(str(json_path), ["data"], str(params_path))
    np.testing.assert_allclose(reloaded(mx.nd.array(x["data"])).asnumpy(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_batchnorm_folds_into_any_gemm(trans_b):
    """mx.onnx only writes Gemm(alpha=1, beta=1, transB=1); the fold must be exact for the rest."""
    from onnx import TensorProto, helper

    from gluontl.export.lean import fold_batchnorm

    rng = np.random.RandomState(trans_b)
    w = rng.normal(size=(3, 4) if trans_b else (4, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for a, n in [
        (w, "w"), (rng.normal(size=3), "c"), (rng.uniform(0.5, 1.5, 3), "g"), (rng.normal(size=3), "b"),
        (rng.normal(size=3), "m"), (rng.uniform(0.3, 2, 3), "v")]]
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "c"], ["h"], alpha=0.5, beta=2.0, transB=trans_b),
         helper.make_node("BatchNormalization", ["h", "g", "b", "m", "v"], ["y"], epsilon=1e-3)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    x = {"x": rng.normal(size=(5, 4)).astype(np.float32)}
    before = ort_run(model, x)[0]
    assert fold_batchnorm(model.graph) == 1
    assert [n.op_type for n in model.graph.node] == ["Gemm"]
    after = ort_run(model, x)[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ what "verified" means

def test_error_is_relative_to_the_output_range():
    from gluontl.export.verify import output_error

    rng = np.random.RandomState(0)
    logits = rng.standard_normal((4, 10)) * 3 + 1000.0  # a large offset must not hide errors
    noise = rng.uniform(-1, 1, logits.shape) * 1e-6 * np.ptp(logits)
    assert output_error(logits + noise, logits)[1] <= 1.01e-6
    shifted = logits.copy()
    shifted[0, 0] += 1e-3 * np.ptp(logits)  # one logit off by 0.1 % of the spread
    max_abs, rel = output_error(shifted, logits)
    assert rel == pytest.approx(1e-3, rel=1e-6) and max_abs == pytest.approx(1e-3 * np.ptp(logits), rel=1e-6)
    assert output_error(np.full((3,), 5.0), np.full((3,), 5.0 + 5e-4))[1] == pytest.approx(1e-4, rel=1e-3)
    assert output_error(np.zeros(3), np.full(3, 2e-5))[1] == pytest.approx(1.0)  # constant: its magnitude
    assert output_error(np.zeros(3), np.zeros(3)) == (0.0, 0.0)
    assert output_error(np.array([1.0, np.nan]), np.array([1.0, np.nan]))[1] == np.inf  # NaN proves nothing
    assert output_error(np.zeros((2, 3)), np.zeros((3, 2)))[1] == np.inf


def test_saturated_outputs_are_judged_on_the_codomain_of_their_op():
    """A sigmoid map that is ~0 everywhere (a detector on a blank image): onnxruntime's Sigmoid
    is accurate to ~1e-7 absolute near 0, which is 2 % of such a map's range but noise on
    [0, 1]; a real error of 1e-3 on one pixel is still caught."""
    from gluontl.export.verify import output_error

    rng = np.random.RandomState(1)
    want = 1 / (1 + np.exp(-rng.uniform(-17, -15, (1, 1, 32, 32))))
    got = want + rng.uniform(-1, 1, want.shape) * 9e-8
    assert output_error(got, want)[1] > 1e-3  # judged on the map's own range: looks broken
    assert output_error(got, want, floor=1.0)[1] <= 1e-7
    broken = got.copy()
    broken[0, 0, 3, 4] += 1e-3
    assert output_error(broken, want, floor=1.0)[1] > 1e-4


def test_saturating_scales_follow_identity_nodes():
    from onnx import TensorProto, helper

    from gluontl.export.verify import saturating_scales

    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Identity", ["s"], ["prob"]),
             helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Softmax", ["x"], ["p"])]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("prob", "t", "r", "p")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])], outs)
    assert saturating_scales(helper.make_model(graph)) == {"prob": 1.0, "t": 2.0, "p": 1.0}


def test_export_refuses_a_file_off_by_a_thousandth_of_the_range(zoo_export, tmp_path):
    """The default tolerance (the graph's float32 bound, gluontl.export.errorbound) and the old
    fixed one (1e-4 of the range) both separate float noise from a real error: the same file
    verifies against its block and fails against the block with one weight moved."""
    import inspect

    net, path = zoo_export
    assert inspect.signature(export_onnx).parameters["rtol"].default is None
    batch = _batches({"data": SHAPE}, seed=5)[1]
    for rtol in (None, 1e-4):
        assert verify_onnx(net, path, batch, rtol=rtol).ok  # float noise of a deep net: ~1e-5 of the range
    last = [p for n, p in net.collect_params().items() if n.endswith("weight")][-1]  # the classifier
    original = last.data().copy()
    try:
        last.set_data(original * (1 + 2e-3))  # every logit 0.2 % off
        for rtol in (None, 1e-4):
            report = verify_onnx(net, path, batch, rtol=rtol)
            assert not report.ok and 1e-4 < report.max_rel < 1e-2, report.describe()
    finally:
        last.set_data(original)


# ------------------------------------------------------------------ compare(): inputs, outputs, the report

def _cast_model(onnx_type: int, outputs: int = 1) -> bytes:
    """x (of ``onnx_type``) -> float32 copies; what a block taking ids or masks exports to."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cast", ["x"], [f"y{i}"], to=TensorProto.FLOAT) for i in range(outputs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx_type, ["N", 3])],
                              [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["N", 3])
                               for i in range(outputs)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


class _ToFloat(nn.HybridBlock):
    def __init__(self, outputs=1, scale=1.0):
        super().__init__()
        self.outputs, self.scale = outputs, scale

    def hybrid_forward(self, F, x):
        y = F.cast(x, "float32") * self.scale
        return y if self.outputs == 1 else [y] * self.outputs


@pytest.mark.parametrize("onnx_type", ["FLOAT", "DOUBLE", "FLOAT16", "INT64", "INT32", "INT8", "UINT8", "BOOL"])
def test_compare_feeds_each_input_in_the_files_type(onnx_type):
    # onnxruntime refuses an input of the wrong type; compare casts what it is given
    from onnx import TensorProto

    from gluontl.export.verify import compare, ort_session

    session = ort_session(_cast_model(getattr(TensorProto, onnx_type)), "cast model")
    x = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]])  # float64, values every type holds exactly
    report = compare(session, _ToFloat(), {"x": x}, rtol=0.0)
    assert report.ok and report.max_abs == 0.0 and report.max_rel == 0.0


def test_compare_refuses_inputs_and_outputs_that_do_not_fit():
    from onnx import TensorProto

    from gluontl.export.verify import compare, ort_session

    session = ort_session(_cast_model(TensorProto.FLOAT), "cast model")
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ExportError, match=r"^The ONNX file takes inputs \['x'\] but \['data'\] were given; "
                                          r"pass one array per file input, keyed by its name\.$"):
        compare(session, _ToFloat(), {"data": x}, rtol=1e-4)
    with pytest.raises(ExportError, match=r"^The inputs \{'x': \(2, 4\)\} do not fit the ONNX file or the block "):
        compare(session, _ToFloat(), {"x": np.ones((2, 4), np.float32)}, rtol=1e-4)
    with pytest.raises(ExportError, match=r"^The ONNX file has 1 outputs \['y0'\] but the block returns 2; "
                                          r"this file was not exported from this block\.$"):
        compare(session, _ToFloat(outputs=2), {"x": x}, rtol=1e-4)


def test_compare_reports_the_worst_output_and_judges_it_against_rtol():
    from onnx import TensorProto

    from gluontl.export.verify import compare, ort_session

    session = ort_session(_cast_model(TensorProto.FLOAT, outputs=2), "cast model")
    x = np.array([[0.0, 2.0, 4.0], [1.0, 3.0, 4.0]], np.float32)  # range 4
    block = _ToFloat(outputs=2, scale=1.5)  # MXNet: 1.5 x (range 6); ONNX: x, off by up to 2 (= 1/3 of 6)
    report = compare(session, block, {"x": x}, rtol=1 / 3)
    assert [(o.name, o.shape) for o in report.outputs] == [("y0", (2, 3)), ("y1", (2, 3))]
    assert report.max_abs == 2.0 and report.max_rel == pytest.approx(1 / 3) and report.rtol == 1 / 3
    assert report.ok  # rel == rtol passes
    assert not compare(session, block, {"x": x}, rtol=0.33).ok
    assert report.describe() == "; ".join(
        f"{y}[2, 3]: max |difference| 2.00e+00 at [0, 2] (onnxruntime 4, MXNet 6), 3.33e-01 of the range; "
        "tolerance 2.00e+00 (rtol 0.333333 of the range)" for y in ("y0", "y1"))
    # a saturating op's codomain is the scale when wider than the range
    report = compare(session, block, {"x": x}, rtol=1.0, scales={"y1": 8.0})
    assert [o.rel for o in report.outputs] == [pytest.approx(1 / 3), 0.25] and report.max_rel == pytest.approx(1 / 3)


def test_ort_session_names_the_file_it_cannot_load(tmp_path):
    from gluontl.export.verify import ort_session

    bad = tmp_path / "cut.onnx"
    bad.write_bytes(_cast_model(1)[:20])
    with pytest.raises(ExportError, match=rf"^onnxruntime cannot load my label: .*A truncated or edited file "
                                          r"needs re-exporting; if export_onnx itself produced it, the model has "
                                          r"a layer mx\.onnx converts wrongly, so ship it with export_symbol and "
                                          r"report the model\.$"):
        ort_session(bad, "my label")
    good = tmp_path / "cast.onnx"
    good.write_bytes(_cast_model(1))
    assert [i.name for i in ort_session(good, "x").get_inputs()] == ["x"]  # a path works as bytes do


def test_verify_onnx_judges_a_saturated_sigmoid_on_its_codomain(tmp_path):
    # outputs ~1e-7 everywhere: onnxruntime's Sigmoid is off by ~1e-7 absolute there, which
    # is float noise on [0, 1] but most of these outputs' own range
    net = nn.HybridSequential()
    net.add(nn.Dense(3, in_units=4), nn.Activation("sigmoid"))
    net.initialize()
    net[0].weight.set_data(mx.nd.array(np.random.RandomState(0).uniform(-0.5, 0.5, (3, 4))))
    net[0].bias.set_data(mx.nd.full((3,), -16.0))
    net.hybridize()
    path = export_onnx(net, tmp_path / "s.onnx", {"data": (1, 4)})
    x = {"data": np.random.RandomState(1).uniform(-1, 1, (8, 4)).astype(np.float32)}
    report = verify_onnx(net, path, x)
    assert report.ok and report.max_rel <= 1e-6, report.describe()
    net[0].bias.set_data(mx.nd.full((3,), -6.0))  # the file's outputs are now ~2e-3 too small
    assert not verify_onnx(net, path, x).ok


def test_verify_onnx_names_the_file_it_cannot_load_and_inputs_that_do_not_fit(tmp_path):
    net = nn.HybridSequential()
    net.add(nn.Dense(3, in_units=4))
    net.initialize()
    path = export_onnx(net, tmp_path / "d.onnx", {"data": (1, 4)})
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ExportError, match=rf"^onnxruntime cannot load {cut}: "):
        verify_onnx(net, cut, {"data": np.ones((2, 4), np.float32)})
    with pytest.raises(ExportError) as e:
        verify_onnx(net, path, {"data": np.ones((2, 5), np.float32)})
    msg = str(e.value)
    assert msg.startswith("The inputs {'data': (2, 5)} do not fit the ONNX file or the block (")
    assert "Got invalid dimensions for input: data" in msg
    assert msg.endswith("); pass arrays shaped like the export's input_shapes with any batch size.")


def test_output_error_edge_cases_worked_out_by_hand():
    from gluontl.export.verify import output_error

    assert output_error(np.array([1.0]), np.array([2.0])) == (1.0, 0.5)  # one value: judged on its magnitude
    assert output_error(np.zeros((0, 3)), np.zeros((0, 3))) == (0.0, 0.0)  # an empty output agrees
    assert output_error(np.full(3, 1e-3), np.zeros(3)) == (1e-3, 1e-3)  # all-zero output: absolute error
    want = np.array([100.0, 100.5])  # range 0.5 on an offset of 100: the range is the scale
    assert output_error(want + [0.0, 1e-3], want)[1] == pytest.approx(2e-3)
    # a NaN on either side fails, whatever the other side holds
    assert output_error(np.array([np.nan, 1.0]), np.array([0.0, 1.0])) == (np.inf, np.inf)
    assert output_error(np.array([0.0, 1.0]), np.array([np.nan, 1.0])) == (np.inf, np.inf)


def test_compare_judges_small_outputs_on_their_own_range():
    # outputs in [0, 4e-3] off by 1e-3 of themselves: 1e-3 of their range, however small it is
    from onnx import TensorProto

    from gluontl.export.verify import compare, ort_session

    session = ort_session(_cast_model(TensorProto.FLOAT), "cast model")
    x = np.array([[0.0, 2e-3, 4e-3], [1e-3, 3e-3, 4e-3]], np.float32)
    report = compare(session, _ToFloat(scale=1.001), {"x": x}, rtol=1e-4)
    assert report.max_rel == pytest.approx(1e-3, rel=1e-3) and not report.ok
