"""Import → head swap → short fine-tune → verified ONNX export → re-import, for every
architecture of the importer's real-model set (PyTorch legacy and dynamo exports, PaddleOCR).
The export is the source graph patched: cut where the head goes, the head appended."""
import importlib.util
import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from gluontl.export import export_onnx
from gluontl.mxinternals import onnx_info
from gluontl.onnx import import_model
from gluontl.recipe import HeadSpec, Rule, SurgerySpec
from gluontl.rules import apply_plan, make_plan, trainable_params
from gluontl.sources.restore import snapshot
from gluontl.surgery import apply_surgery, list_nodes
from tests.helpers import ONNX_FIXTURES, ort_run

FIXTURES = ONNX_FIXTURES
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())["fixtures"]
# one legacy and one dynamo export per architecture
CASES = {}
for e in MANIFEST:
    kind = "dynamo" if "dynamo" in e["file"] else "legacy"
    if "dynhw" not in e["file"] and "nofold" not in e["file"]:
        CASES.setdefault(f"{e['model']}-{kind}", e)


def _surgery(arch: str, block, sample_shape) -> SurgerySpec:
    """Where a new classifier goes: on the last feature map for CNNs; on the token features
    the old classifier read for transformers; on the last conv map of the CRNN (its sequence
    output is time-major, not a batch of features)."""
    head = HeadSpec(classes=3, hidden=[8])
    if arch in ("vit", "encoder_vit", "tv_vit"):
        return SurgerySpec(drop_last=1, head=head)
    if arch in ("crnn", "gru_crnn"):
        convs = [n.name for n in list_nodes(block, tuple(sample_shape)) if n.op == "Conv"]
        return SurgerySpec(cut_at=convs[-1], head=head)
    return SurgerySpec(head=head)


def _finetune_and_export(block, input_name, sample_shape, tmp_path, arch="cnn"):
    net = apply_surgery(block, _surgery(arch, block, sample_shape), tuple(sample_shape))
    plan = make_plan(net, [Rule(match=["*"], grad_req="null"), Rule(match=["head.*"], grad_req="write")])
    apply_plan(net, plan)
    net.hybridize()
    before = snapshot(net)
    rs = np.random.RandomState(0)
    x = mx.nd.array(rs.rand(4, *sample_shape).astype("f"))
    y = mx.nd.array(rs.randint(0, 3, 4))
    trainer = mx.gluon.Trainer(list(trainable_params(net).values()), "sgd", {"learning_rate": 0.1})
    for _ in range(2):
        with mx.autograd.record():
            loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
        loss.backward()
        trainer.step(4)
    after = snapshot(net)
    changed = {n for n in before if not np.array_equal(before[n], after[n])}
    assert changed and all(n.startswith("head.") for n in changed), sorted(changed)[:5]
    path = export_onnx(net, tmp_path / "out.onnx", {input_name: (1, *sample_shape)})  # verifies b=1, 2
    xs = rs.rand(3, *sample_shape).astype("f")
    with mx.autograd.predict_mode():
        ref = net(mx.nd.array(xs)).asnumpy()
    got = ort_run(path, {input_name: xs})[0]
    assert np.linalg.norm(got - ref) <= 1e-4 * np.linalg.norm(ref)
    again = import_model(str(path))
    np.testing.assert_allclose(again(mx.nd.array(xs)).asnumpy(), ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("entry", [pytest.param(e, id=k) for k, e in CASES.items()])
def test_torch_export_head_swap_finetune_export(entry, tmp_path):
    block = import_model(str(FIXTURES / entry["file"]))
    _finetune_and_export(block, entry["input"], entry["test_shapes"][0][1:], tmp_path, entry["model"])


def test_paddleocr_classifier_head_swap_finetune_export(tmp_path):
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None:
        pytest.skip("pip install --no-deps rapidocr-onnxruntime==1.4.4 provides the models")
    model = next(Path(spec.origin).parent.rglob("*cls*.onnx"))
    block = import_model(str(model), input_shapes={"x": (None, 3, 48, 192)})
    _finetune_and_export(block, onnx_info(block).inputs[0], (3, 48, 192), tmp_path)
