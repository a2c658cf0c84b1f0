"""Whole models: Gluon zoo exports, the onnx package's light models, PaddleOCR (rapidocr).

Gluon models get random weights and randomized BatchNorm statistics (no downloads),
are exported with dynamic batch by ``mx.onnx.export_model`` and imported back.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest
from tests.helpers import assert_f32_close, ort_run
from onnx import numpy_helper

from gluontl.mxinternals import onnx_info
from gluontl.onnx import import_model
from tests.onnx.test_importer import graph_ops, rel_err
from tests.onnx.test_torch_exports import f32_model_tol

SIZE = 64  # spatial input size: small keeps the file fast, global pooling makes it valid


def _export(name: str, folder: Path) -> Path:
    mx.random.seed(0)  # the same weights whatever ran before
    net = mx.gluon.model_zoo.vision.get_model(name)
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net(mx.nd.zeros((1, 3, SIZE, SIZE)))
    rng = np.random.RandomState(0)
    for key, p in net.collect_params().items():
        if key.endswith(("running_mean", "beta")):
            p.set_data(mx.nd.array(rng.uniform(-0.2, 0.2, p.shape)))
        elif key.endswith(("running_var", "gamma")):
            p.set_data(mx.nd.array(rng.uniform(0.5, 1.5, p.shape)))
    net.hybridize()
    net(mx.nd.zeros((1, 3, SIZE, SIZE)))
    net.export(str(folder / name))
    out = folder / f"{name}.onnx"
    mx.onnx.export_model(str(folder / f"{name}-symbol.json"), str(folder / f"{name}-0000.params"),
                         [(1, 3, SIZE, SIZE)], np.float32, str(out), dynamic=True,
                         dynamic_input_shapes=[(None, 3, SIZE, SIZE)])
    return out


@pytest.fixture(scope="module", params=["resnet18_v1", "mobilenetv2_1.0"])
def zoo(request, tmp_path_factory):
    path = _export(request.param, tmp_path_factory.mktemp(request.param))
    return path, onnx.load(str(path))


def test_zoo_model_matches_onnxruntime_at_batch_1_and_2(zoo):
    path, model = zoo
    block = import_model(str(path))
    name = onnx_info(block).inputs[0]
    for b in (1, 2):
        x = np.random.RandomState(b).randn(b, 3, SIZE, SIZE).astype("f")
        got = block(mx.nd.array(x)).asnumpy()
        ref = ort_run(str(path), {name: x})[0]
        assert got.shape == ref.shape and rel_err(got, ref) <= 1e-4, rel_err(got, ref)
    assert not {"shape_array", "size_array"} & set(graph_ops(block)), "shape ops must fold"


def test_zoo_model_hybridized_equals_imperative(zoo):
    path, _ = zoo
    x = mx.nd.array(np.random.RandomState(0).randn(2, 3, SIZE, SIZE))
    plain = import_model(str(path))
    hybrid = import_model(str(path))
    hybrid.hybridize(static_alloc=True, static_shape=True)
    # kernels may differ (hybridized graphs fuse): the float32 bound of the deeper model,
    # mobilenetv2 (53 convs in sequence; resnet18 sums the most, 512·3·3, per output)
    assert_f32_close(hybrid(x).asnumpy(), plain(x).asnumpy(), terms=512 * 9, depth=53)


def test_zoo_model_params_aux_states_and_one_sgd_step(zoo):
    path, model = zoo
    block = import_model(str(path))
    params = block.collect_params()
    graph = block._cached_graph[1]
    aux = set(graph.list_auxiliary_states())
    stats = {n for n in params if n.endswith(("running_mean", "running_var"))}
    assert stats and stats == aux, "BN running statistics must be MXNet auxiliary states"
    inits = {t.name for t in model.graph.initializer}
    assert set(params) <= inits, "parameters keep their ONNX initializer names"
    # Freeze the first conv like a user rule would; everything else with 'write' must move.
    first = next(n for n in params if n.endswith("weight") and params[n].grad_req == "write")
    params[first].grad_req = "null"
    before = {n: p.data().asnumpy().copy() for n, p in params.items()}
    trainer = mx.gluon.Trainer({n: p for n, p in params.items() if p.grad_req == "write"}, "sgd",
                               {"learning_rate": 0.1})
    x = mx.nd.array(np.random.RandomState(0).randn(2, 3, SIZE, SIZE))
    with mx.autograd.record():
        loss = block(x).square().sum()
    loss.backward()
    trainer.step(2)
    for n, p in params.items():
        changed = not np.array_equal(before[n], p.data().asnumpy())
        if n in aux:
            continue  # running statistics follow the batch in training mode, by design
        assert changed == (p.grad_req == "write"), n


# ------------------------------------------------------------------ onnx light models

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem) for p in sorted(LIGHT.glob("light_*.onnx"))])
def test_light_model_matches_stored_output(path):
    """Input as the onnx backend runner makes it: arange(n)/n in the declared shape."""
    model = onnx.load(str(path))
    inits = {t.name for t in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in inits]
    shape = tuple(d.dim_value or 1 for d in inp.type.tensor_type.shape.dim)
    x = (np.arange(np.prod(shape)).reshape(shape) / np.prod(shape)).astype(np.float32)
    t = onnx.TensorProto()
    t.ParseFromString((LIGHT / f"{path.stem}_output_0.pb").read_bytes())
    expected = numpy_helper.to_array(t)
    got = import_model(str(path))(mx.nd.array(x)).asnumpy()
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=1e-5)


# ------------------------------------------------------------------ PaddleOCR (rapidocr)

def _rapidocr_models() -> Path | None:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "models"


OCR = [("ch_ppocr_mobile_v2.0_cls_infer.onnx", (3, 48, 192)),
       ("ch_PP-OCRv4_det_infer.onnx", (3, 96, 128)),
       ("ch_PP-OCRv4_rec_infer.onnx", (3, 48, 160))]
_needs_rapidocr = pytest.mark.skipif(
    _rapidocr_models() is None, reason="pip install --no-deps rapidocr-onnxruntime==1.4.4 provides the models")


def _text_image(seed: int, chw: tuple[int, int, int], det: bool) -> np.ndarray:
    """A light page with dark glyph-like blocks on text lines, normalised as PaddleOCR does
    (det: ImageNet mean/std; cls/rec: (x - 0.5) / 0.5), so the maps are not saturated."""
    _, h, w = chw
    rs = np.random.RandomState(seed)
    img = np.full((h, w, 3), rs.uniform(200, 250))
    for row in range(h // 6, h - 12, 16 if det else h):
        for col in range(rs.randint(4, 16), rs.randint(w // 2, w - 4), 6):
            img[row:row + min(9, h // 3), col:col + 4] = rs.uniform(0, 60)
    if det:
        img = (img / 255 - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    else:
        img = (img / 255 - 0.5) / 0.5
    return img.transpose(2, 0, 1).astype(np.float32)


def _ort_with(path: Path, x: np.ndarray, extra: tuple[str, ...] = ()) -> list[np.ndarray]:
    """onnxruntime's outputs, plus the named inner tensors."""
    model = onnx.load(str(path))
    model.graph.output.extend(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT, None)
                              for t in extra)
    return ort_run(model, {"x": x})


def _inner(block, tensor: str, x: np.ndarray) -> np.ndarray:
    """The imported block's value of ONNX tensor ``tensor``."""
    inputs, out = block._cached_graph
    name = onnx_info(block).tensor_outputs[tensor]
    part = mx.gluon.SymbolBlock(out.get_internals()[name], inputs, params=block.collect_params())
    return part(mx.nd.array(x)).asnumpy()


@_needs_rapidocr
@pytest.mark.parametrize("fname,chw", OCR, ids=[f.split("_infer")[0] for f, _ in OCR])
def test_paddleocr_model_matches_onnxruntime(fname, chw):
    """Batch 1 and 2 of text-like images, within the float32 bound of the model's
    contractions (relative error in norm)."""
    path = _rapidocr_models() / fname
    block = import_model(str(path), input_shapes={"x": (None, *chw)})
    params = block.collect_params()
    assert sum(p.grad_req == "write" for p in params.values()) > 50
    assert any(n.startswith("conv") for n in params), "Paddle weight names are kept"
    tol = f32_model_tol(str(path))
    for b in (1, 2):
        x = np.stack([_text_image(b + i, chw, "det" in fname) for i in range(b)])
        got = block(mx.nd.array(x)).asnumpy()
        ref = ort_run(str(path), {"x": x})[0]
        assert got.shape == ref.shape and rel_err(got, ref) <= tol, (rel_err(got, ref), tol)


@_needs_rapidocr
def test_paddleocr_detector_map_and_logits_match_onnxruntime():
    """The detector ends in a sigmoid that saturates most of the map, which hides errors in
    a relative comparison of probabilities. Judged twice: the logits before the sigmoid
    (relative error in norm, float32 bound), and the probability map by its largest
    absolute error, against the output's range [0, 1] (sigmoid' <= 1/4, so at most a
    quarter of the largest logit error). The page must give a non-trivial map."""
    fname, chw = OCR[1]
    path = _rapidocr_models() / fname
    block = import_model(str(path), input_shapes={"x": (None, *chw)})
    x = np.stack([_text_image(s, chw, det=True) for s in (0, 1)])
    logits_name = onnx.load(str(path)).graph.node[-1].input[0]  # Sigmoid(logits)
    prob, logits = _ort_with(path, x, (logits_name,))
    assert prob.max() - prob.min() > 0.9 and 0.05 < (prob > 0.3).mean() < 0.5, "map is not informative"
    tol = f32_model_tol(str(path))
    got_logits = _inner(block, logits_name, x)
    assert rel_err(got_logits, logits) <= tol, rel_err(got_logits, logits)
    got = block(mx.nd.array(x)).asnumpy()
    assert np.abs(got - prob).max() <= 0.25 * tol * np.abs(logits).max(), np.abs(got - prob).max()


# ------------------------------------------------------------------ QDQ-quantized zoo model

def _qdq(model: onnx.ModelProto) -> onnx.ModelProto:
    """Quantize every Conv the way QDQ exporters do: int8 per-channel weights behind
    DequantizeLinear, uint8 activations through QuantizeLinear→DequantizeLinear."""
    from onnx import helper

    inits = {t.name: t for t in model.graph.initializer}
    nodes, seen = [], set()
    for n in model.graph.node:
        if n.op_type == "Conv" and n.input[1] in inits:
            w = numpy_helper.to_array(inits[n.input[1]])
            scale = (np.abs(w).reshape(len(w), -1).max(axis=1) / 127).astype(np.float32)
            q = np.clip(np.round(w / scale[:, None, None, None]), -127, 127).astype(np.int8)
            wq, act = n.input[1] + "_quantized", n.input[0]
            model.graph.initializer.extend([
                numpy_helper.from_array(q, wq), numpy_helper.from_array(scale, wq + "_scale"),
                numpy_helper.from_array(np.zeros(len(w), np.int8), wq + "_zero")])
            nodes.append(helper.make_node("DequantizeLinear", [wq, wq + "_scale", wq + "_zero"],
                                          [n.input[1] + "_dq"], axis=0, name=wq + "_dq"))
            if act not in seen:
                seen.add(act)
                model.graph.initializer.extend([
                    numpy_helper.from_array(np.float32(0.05), act + "_scale"),
                    numpy_helper.from_array(np.uint8(128), act + "_zero")])
                nodes += [helper.make_node("QuantizeLinear", [act, act + "_scale", act + "_zero"],
                                           [act + "_q"], name=act + "_q"),
                          helper.make_node("DequantizeLinear", [act + "_q", act + "_scale",
                                                                act + "_zero"],
                                           [act + "_qdq"], name=act + "_qdq")]
            n.input[0], n.input[1] = act + "_qdq", n.input[1] + "_dq"
        nodes.append(n)
    used = {x for n in nodes for x in n.input}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.node[:], model.graph.initializer[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(keep)
    del model.graph.input[1:]  # mx.onnx lists weights as inputs too
    return model


def test_qdq_quantized_model_imports_as_float_and_matches_the_spec(tmp_path):
    """The oracle is the onnx package's numpy implementation of the spec (ReferenceEvaluator:
    QuantizeLinear as rint(x / scale) + zero point, saturated), not an onnxruntime kernel."""
    from onnx.reference import ReferenceEvaluator

    src = onnx.load(str(_export("resnet18_v1", tmp_path)))
    model = _qdq(src)
    path = tmp_path / "qdq.onnx"
    onnx.save(model, str(path))
    block = import_model(str(path))
    params = block.collect_params()
    convs = [n.input[1] for n in model.graph.node if n.op_type == "Conv"]
    assert all(params[c].grad_req == "write" and params[c].dtype == np.float32 for c in convs)
    assert not any(n.endswith(("_quantized", "_scale", "_zero")) for n in params if
                   params[n].grad_req == "write"), "quantization metadata is not trainable"
    x = np.random.RandomState(0).randn(2, 3, SIZE, SIZE).astype("f")
    ref = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x})[0]
    got = block(mx.nd.array(x)).asnumpy()
    # Summation order differs between MXNet's and numpy's convolutions, so an activation can
    # land on the other side of a rounding tie; perturbing x by 1e-5 (a few such flips) moves
    # the reference output by 2-3 % (measured), while a wrong axis, scale or rounding rule
    # gives errors of 10 % and more. Without flips the two agree to float32 (4e-7 measured).
    assert rel_err(got, ref) <= 3e-2, rel_err(got, ref)
