"""Models exported by PyTorch's own exporters (legacy TorchScript and dynamo).

Users bring exactly these graphs: Shape/Gather/Concat chains around every view,
Clip with tensor bounds, Split with size inputs, allowzero Reshapes, BatchNorm fused
into convs, dynamo's ``as_strided`` gathers at ``arange(B) * C`` (torchvision ConvNeXt
and Swin), F.interpolate to the input size (torchvision segmentation heads). The files
come from ``scripts/make_onnx_fixtures.py`` (torch is never a dependency here);
MANIFEST.json records how each was exported and its sha256. Every file imports: a
model the importer cannot convert exactly must fail with a clear error, never xfail.

Forward results are compared at batch 1 and 2 (the sizes the importer folds shape
arithmetic at) and 3 (one it never saw), within a float32 error bound derived from the
model's contractions (:func:`f32_model_tol`).
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from gluontl.errors import OnnxImportError
from gluontl.mxinternals import onnx_info
from gluontl.onnx import import_model
from tests.helpers import EPS32, ort_run
from tests.onnx.test_importer import rel_err

FIXTURES = Path(__file__).parent / "fixtures"
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())
FIXTURE_PARAMS = [pytest.param(e, id=e["file"][:-len(".onnx")]) for e in MANIFEST["fixtures"]]


def _sample_shape(entry) -> list[int]:
    """Per-sample input shape: a dynamic-H/W export is run at a size other than its
    example's (the last test shape), the others at their declared size."""
    return entry["test_shapes"][-1][1:]


@functools.lru_cache(maxsize=None)
def _import(file: str):
    """One import per fixture and process (tests that change the block undo it)."""
    entry = next(e for e in MANIFEST["fixtures"] if e["file"] == file)
    shapes = {entry["input"]: [None, *_sample_shape(entry)]} if 2 in entry["dynamic_dims"] else None
    return import_model(str(FIXTURES / file), input_shapes=shapes)


def _input(entry, batch: int, seed: int = 0) -> np.ndarray:
    return np.random.RandomState(seed + batch).randn(batch, *_sample_shape(entry)).astype(np.float32)


def _outputs(block, x: np.ndarray) -> list[np.ndarray]:
    out = block(mx.nd.array(x))
    return [o.asnumpy() for o in (out if isinstance(out, tuple) else (out,))]


@functools.lru_cache(maxsize=None)
def f32_model_tol(path: str) -> float:
    """Relative (norm) error two correct float32 evaluations of the model may show:
    helpers.f32_tol's 8·eps32·sqrt(terms) per contraction (Conv, Gemm, MatMul, one per
    recurrent step), summed along the graph, each layer's error passed on at about its
    size (normalised networks). The fixtures measure 1e-7..2e-6; a wrong converter 1e-2+."""
    model = onnx.shape_inference.infer_shapes(onnx.load(path))
    g = model.graph
    dims = {t.name: list(t.dims) for t in g.initializer}
    for v in list(g.value_info) + list(g.input) + list(g.output):
        dims.setdefault(v.name, [d.dim_value or 1 for d in v.type.tensor_type.shape.dim])
    total = 0.0
    for n in g.node:
        if n.op_type in ("Conv", "ConvTranspose"):
            w = dims[n.input[1]]
            terms = math.prod(w[1:]) * (w[0] if n.op_type == "ConvTranspose" else 1)
        elif n.op_type in ("Gemm", "MatMul"):
            a = dims.get(n.input[0]) or [1]
            trans = n.op_type == "Gemm" and any(x.name == "transA" and x.i for x in n.attribute)
            terms = a[-2] if trans else a[-1]
        elif n.op_type in ("LSTM", "GRU", "RNN"):
            x, w = dims.get(n.input[0]) or [1], dims[n.input[1]]
            total += x[0] * math.sqrt(w[-1] + w[1] // {"LSTM": 4, "GRU": 3, "RNN": 1}[n.op_type])
            continue
        else:
            continue
        total += math.sqrt(max(terms, 1))
    return 8.0 * EPS32 * max(total, 1.0)


def test_manifest_records_every_file_its_hash_and_the_exporters():
    files = {e["file"] for e in MANIFEST["fixtures"]}
    assert files == {p.name for p in FIXTURES.glob("*.onnx")}
    for e in MANIFEST["fixtures"]:
        assert hashlib.sha256((FIXTURES / e["file"]).read_bytes()).hexdigest() == e["sha256"], e["file"]
    assert {e["exporter"] for e in MANIFEST["fixtures"]} == {"legacy", "dynamo"}
    assert any(2 in e["dynamic_dims"] for e in MANIFEST["fixtures"]), "one export has free H/W"


@pytest.mark.parametrize("entry", FIXTURE_PARAMS)
def test_matches_onnxruntime_at_batch_1_2_and_3(entry):
    block = _import(entry["file"])
    tol = f32_model_tol(str(FIXTURES / entry["file"]))
    for batch in (1, 2, 3):
        x = _input(entry, batch)
        got, ref = _outputs(block, x), ort_run(str(FIXTURES / entry["file"]), {entry["input"]: x})
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert g.shape == r.shape and rel_err(g, r) <= tol, (batch, g.shape, r.shape, rel_err(g, r), tol)


@pytest.mark.parametrize("entry", FIXTURE_PARAMS)
def test_hybridized_equals_imperative(entry):
    block = _import(entry["file"])
    x = _input(entry, 2, seed=7)
    plain = _outputs(block, x)
    block.hybridize(static_alloc=True, static_shape=True)
    try:
        hybrid = _outputs(block, x)
        nodes = json.loads(block._cached_graph[1].tojson())["nodes"]
    finally:
        block.hybridize(active=False)
    for p, h in zip(plain, hybrid):
        np.testing.assert_allclose(h, p, rtol=1e-5, atol=1e-6)
    # A converter may read a run-time size itself (GatherND's negative-index fix on the batch
    # axis); the exporters' own Shape/Size nodes must all fold.
    shape_nodes = {n.name for n in onnx.load(str(FIXTURES / entry["file"])).graph.node
                   if n.op_type in ("Shape", "Size")}
    unfolded = [n["name"] for n in nodes if n["op"] in ("shape_array", "size_array")
                and any(n["name"] == s or n["name"].startswith(s + "/") for s in shape_nodes)]
    assert not unfolded, f"the exporters' shape arithmetic must fold: {unfolded[:3]}"


@pytest.mark.parametrize("entry", FIXTURE_PARAMS)
def test_training_backward_gives_finite_weight_gradients(entry):
    """A training-mode step as fine-tuning runs it (batch statistics, dropout on), on a
    fresh import: training moves BatchNorm running statistics, the cached block must not."""
    block = _import.__wrapped__(entry["file"])
    params = {n: p for n, p in block.collect_params().items() if p.grad_req == "write"}
    assert params, "an imported model must have trainable weights"
    with mx.autograd.record():
        out = block(mx.nd.array(_input(entry, 2)))
        loss = sum((o ** 2).mean() for o in (out if isinstance(out, tuple) else (out,)))
    loss.backward()
    grads = {n: p.grad().asnumpy() for n, p in params.items()}
    assert all(np.isfinite(g).all() for g in grads.values())
    assert any(np.abs(g).max() > 0 for g in grads.values()), "no weight received a gradient"


@pytest.mark.parametrize("entry", FIXTURE_PARAMS)
def test_parameter_names_are_onnx_initializer_names(entry):
    """Trainable weights keep their initializer names, so PyTorch's ``layer1.0.conv1.weight``
    survive wherever the exporter kept them (legacy exports fold BN into convs and rename
    those to ``onnx::Conv_*``); values the importer derives itself are frozen constants.
    A weight computed at import from initializers alone (Swin's relative-position bias,
    gathered from its table) trains under the name of the tensor it replaces."""
    block = _import(entry["file"])
    params = block.collect_params()
    graph = onnx.load(str(FIXTURES / entry["file"])).graph
    inits = {t.name for t in graph.initializer}
    tensors = inits | {o for n in graph.node for o in n.output}
    trainable = {n for n, p in params.items() if p.grad_req == "write"}
    assert trainable <= tensors, sorted(trainable - tensors)[:5]
    assert set(params) - tensors <= onnx_info(block).constants
    assert set(entry["torch_names"]) <= set(params), sorted(set(entry["torch_names"]) - set(params))[:5]


@pytest.mark.parametrize("file, names", [
    ("resnet_legacy_op13_nofold.onnx", ("layer1.0.conv1.weight", "layer2.0.downsample.1.running_var")),
    # dynamo fuses BN into the conv but keeps the conv's name (the values are the fused ones)
    ("resnet_dynamo_op18.onnx", ("layer1.0.conv1.weight", "layer2.0.downsample.0.weight", "fc.weight"))])
def test_torch_weight_names_survive(file, names):
    params = _import(file).collect_params()
    assert set(names) <= set(params), sorted(set(names) - set(params))


@pytest.mark.parametrize("file", ["resnet_legacy_op13_dynhw.onnx", "resnet_dynamo_op18_dynhw.onnx"])
def test_free_hw_without_input_shapes_runs_at_any_size(file):
    """A fully convolutional net with global pooling has no shape arithmetic on H/W."""
    block = import_model(str(FIXTURES / file))
    for shape in ((1, 3, 32, 32), (2, 3, 56, 40)):
        x = np.random.RandomState(0).randn(*shape).astype(np.float32)
        (got,), (ref,) = _outputs(block, x), ort_run(str(FIXTURES / file), {"x": x})
        assert rel_err(got, ref) <= 1e-4


def test_free_hw_anchor_arithmetic_asks_for_input_shapes():
    """YOLOv8's anchors come from Range over the feature map sizes: without the H/W they
    cannot fold, and the error says what to pass."""
    with pytest.raises(OnnxImportError, match="input_shapes"):
        import_model(str(FIXTURES / "yolov8_legacy_op17_dynhw.onnx"))


SEGMENTATION = [e for e in MANIFEST["fixtures"] if e["model"] in ("tv_lraspp", "tv_fcn", "tv_deeplabv3")]


@pytest.mark.parametrize("entry", [pytest.param(e, id=e["file"][:-5]) for e in SEGMENTATION])
def test_segmentation_follows_the_input_size_given_at_import(entry):
    """F.interpolate back to the input size: Resize sizes fold from input_shapes, so a
    second import at another H/W gives masks of that size, matching onnxruntime."""
    path = str(FIXTURES / entry["file"])
    block = import_model(path, input_shapes={entry["input"]: [None, 3, 48, 112]})
    x = np.random.RandomState(3).randn(2, 3, 48, 112).astype(np.float32)
    got, ref = _outputs(block, x), ort_run(path, {entry["input"]: x})
    for g, r in zip(got, ref):
        assert g.shape == r.shape == (2, 5, 48, 112)
        assert rel_err(g, r) <= f32_model_tol(path), rel_err(g, r)


@pytest.mark.parametrize("entry", [pytest.param(e, id=e["file"][:-5]) for e in SEGMENTATION])
def test_segmentation_without_input_hw_asks_for_it(entry):
    """MXNet fixes shapes when the graph is built; the upsampling size comes from the
    input's H/W, so without them the import says what to pass."""
    with pytest.raises(OnnxImportError, match="Resize node .*sizes.*input_shapes"):
        import_model(str(FIXTURES / entry["file"]))
