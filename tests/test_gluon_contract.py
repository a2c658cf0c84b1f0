"""Every block gluontl returns behaves like a Gluon-built one.

Tools built on Gluon count parameters from ``Parameter.shape``, print and summarize blocks,
save/load parameters, export and re-import, and hand parameters to a Trainer with a kvstore.
This runs that contract over every kind of block: imported ONNX files (all real-model
fixtures and PaddleOCR), zoo families, symbol checkpoints and surgery results.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from gluontl.recipe import HeadSpec, ModelSpec
from gluontl.sources import build_model, load_model
from gluontl.surgery import attach_head, cut_at, feature_end

FIXTURES = Path(__file__).parent / "onnx" / "fixtures"
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())["fixtures"]


def _paddle() -> list:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None:
        return []
    sizes = {"det": (3, 64, 64), "rec": (3, 48, 160), "cls": (3, 48, 192)}
    return [pytest.param(f"onnx:{p}", {"x": (1, *next(v for k, v in sizes.items() if k in p.name))}, id=p.stem)
            for p in sorted((Path(spec.origin).parent / "models").glob("*.onnx"))]


# One file per architecture (every fixture's parameter shapes are checked in test_export_patch.py).
_FAMILIES = {e["model"]: e for e in reversed(MANIFEST)}
ONNX = [pytest.param(f"onnx:{FIXTURES / e['file']}", {e["input"]: tuple(e["test_shapes"][-1])}, id=e["file"][:-5])
        for e in _FAMILIES.values()] + _paddle()
ZOO = ["resnet18_v1", "resnet18_v2", "resnet18_v1b", "mobilenet0.25", "mobilenetv2_0.25", "mobilenetv3_small",
       "squeezenet1.1", "densenet121", "se_resnet18_v1", "cifar_resnet20_v1"]


def _load(source: str, shapes: dict[str, tuple[int, ...]]):
    if source.startswith("onnx:"):
        return load_model(source, input_shapes={k: (None, *v[1:]) for k, v in shapes.items()})
    return load_model(ModelSpec(source=source, input_shape=next(iter(shapes.values()))[1:]))


def _inputs(shapes: dict[str, tuple[int, ...]], batch: int = 2) -> list[mx.nd.NDArray]:
    rng = np.random.RandomState(0)
    return [mx.nd.array(rng.uniform(-1, 1, (batch, *s[1:])).astype(np.float32)) for s in shapes.values()]


def _outputs(out) -> list[np.ndarray]:
    return [o.asnumpy() for o in (out if isinstance(out, (list, tuple)) else [out])]


def _check_contract(block, shapes: dict[str, tuple[int, ...]], tmp_path: Path) -> None:
    params = block.collect_params()
    # Initialized, shapes and dtypes set: p.data() works and p.shape counts parameters.
    total = 0
    for name, p in params.items():
        data = p.data()
        assert p.shape is not None and tuple(p.shape) == data.shape and 0 not in p.shape, name
        assert np.dtype(p.dtype) == data.dtype, name
        total += int(np.prod(p.shape))
    assert total == sum(p.data().size for p in params.values()) > 0
    assert type(block).__name__ in repr(block)
    x = _inputs(shapes)
    with mx.autograd.predict_mode():
        want = _outputs(block(*x))
    block.summary(*x)
    # save_parameters / load_parameters round trip
    saved = {n: p.data().asnumpy().copy() for n, p in params.items()}
    block.save_parameters(str(tmp_path / "p.params"))
    for p in params.values():
        if np.dtype(p.data().dtype).kind == "f":
            p.set_data(p.data() * 0 + 1)
    block.load_parameters(str(tmp_path / "p.params"))
    for n, p in params.items():
        np.testing.assert_array_equal(p.data().asnumpy(), saved[n], err_msg=n)
    # HybridBlock.export and SymbolBlock.imports of it
    block.hybridize()
    with mx.autograd.predict_mode():
        block(*x)
    block.export(str(tmp_path / "exp"))
    again = mx.gluon.SymbolBlock.imports(str(tmp_path / "exp-symbol.json"), list(shapes),
                                         str(tmp_path / "exp-0000.params"))
    with mx.autograd.predict_mode():
        got = _outputs(again(*x))
    for g, w in zip(got, want):
        scale = max(float(np.ptp(w)), float(np.abs(w).max()), 1e-30)
        assert np.abs(g - w).max() <= 1e-4 * scale
    # a Trainer with a kvstore takes the trainable parameters and steps
    trainable = {n: p for n, p in params.items() if p.grad_req != "null"}
    trainer = mx.gluon.Trainer(trainable, "sgd", {"learning_rate": 1e-3}, kvstore="device")
    with mx.autograd.record():
        loss = sum((o.astype("float32") ** 2).mean() for o in (block(*x) if isinstance(block(*x), (list, tuple))
                                                               else [block(*x)]))
    loss.backward()
    trainer.step(2)
    mx.nd.waitall()


@pytest.mark.parametrize("source,shapes", ONNX)
def test_imported_onnx_models_keep_the_gluon_contract(source, shapes, tmp_path):
    _check_contract(_load(source, shapes), shapes, tmp_path)


@pytest.mark.parametrize("name", ZOO)
def test_zoo_models_keep_the_gluon_contract(name, tmp_path):
    size = 32 if name.startswith("cifar") else 224 if name in ("squeezenet1.1", "densenet121") else 64
    _check_contract(_load(f"zoo:{name}", {"data": (1, 3, size, size)}), {"data": (1, 3, size, size)}, tmp_path)


def test_symbol_checkpoints_keep_the_gluon_contract(tmp_path):
    net = mx.gluon.model_zoo.vision.get_model("resnet18_v1", classes=4)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, 3, 32, 32)))
    net.export(str(tmp_path / "r18"))
    shapes = {"data": (1, 3, 32, 32)}
    _check_contract(_load(f"symbol:{tmp_path / 'r18'}", shapes), shapes, tmp_path)


@pytest.mark.parametrize("source,shapes", [
    ONNX[0], pytest.param("zoo:resnet18_v1b", {"data": (1, 3, 64, 64)}, id="zoo")])
def test_surgery_results_keep_the_gluon_contract(source, shapes, tmp_path):
    spec = ModelSpec(source=source, input_shape=next(iter(shapes.values()))[1:],
                     input_name=next(iter(shapes)))
    block, _ = build_model(spec)
    shape = spec.input_shape
    cut = cut_at(block, feature_end(block, shape), input_shape=shape)
    _check_contract(attach_head(cut, HeadSpec(classes=3, hidden=[4]), shape), shapes, tmp_path)
