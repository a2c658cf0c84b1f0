"""Stage maps of imported graphs against timm's own stages, parameter by parameter.

The files in fixtures/timm/ are 12 timm architectures exported by both PyTorch exporters
(``scripts/make_timm_stage_fixtures.py``); beside each, a JSON reference gives every ONNX
initializer's timm group from ``group_matcher(coarse=True)`` (timm's hand-written table per
family, computed by timm at export time). gluontl's map comes from the graph alone; no torch
is needed here.

timm numbers groups 0..L: 0 is the stem, L what no pattern matched (the classifier, and any
norm after the last stage that the family's matcher leaves out), 1..L-1 the stage or block
patterns in order (a "match previous group" pattern such as EfficientNet's ``conv_head`` or
ViT's final ``norm`` joins the last one). gluontl numbers ``stem, 1..N, head``. The
correspondence, per family (STAGE_OF below): group 0 ↔ stem, group L ↔ head, and group g ↔
stage g where timm's groups are the stride stages (ResNet, RegNet, ConvNeXt, Swin,
EfficientFormer, RepVGG, DenseNet) or the transformer blocks (ViT, DeiT). EfficientNet,
MobileNetV3 and MobileViT group by "block stage", several per stride: there the table says at
which output stride each of timm's groups runs (from the architecture definitions: a stride-2
first stage is stem, two groups at stride 16 are both stage 3). Agreement is counted in
parameters (elements), as users count what they train; the tensor count is reported too.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import onnx
import pytest

from gluontl.naming import named_params
from gluontl.onnx import import_model
from gluontl.recipe import HEAD, STEM
from gluontl.rules import format_plan, make_plan
from gluontl.stages import stage_map

FIXTURES = Path(__file__).parent / "fixtures" / "timm"
MANIFEST = json.loads((FIXTURES / "MANIFEST.json").read_text())
CASES = [pytest.param(e, id=e["file"][:-len(".onnx")]) for e in MANIFEST["fixtures"]]


def _by_stride(*stages):
    """timm group g (0 = stem) → gluontl stage, the last group being the head."""
    return dict(enumerate(stages))


STAGE_OF = {  # family → {timm group: gluontl stage}; None: groups are stages one to one
    "resnet": None, "regnet": None, "convnext": None, "swin": None, "efficientformer": None,
    "repvgg": None, "densenet": None, "vit": None, "deit": None,
    # blocks.0 runs at stride 2 (stem); blocks.3-4 at 16 and blocks.5-6 (+ conv_head) at 32
    "efficientnet": _by_stride(STEM, STEM, 1, 2, 3, 3, 4, 4, HEAD),
    "mobilenetv3": _by_stride(STEM, STEM, 1, 2, 3, 3, 4, 4, HEAD),
    # stages.0 keeps the stem's stride 2
    "mobilevit": _by_stride(STEM, STEM, 1, 2, 3, 4, HEAD),
}


def expected_stage(model: str, group: int, last: int):
    table = STAGE_OF[model]
    if table is not None:
        return table[group]
    return STEM if group == 0 else HEAD if group == last else group


@functools.lru_cache(maxsize=None)
def _load(file: str):
    """The fixture, its reference and the import; a parameter the importer computed at import
    from an initializer (EfficientFormer's attention biases gathered by a constant index: the
    Gather's output) takes the reference of the initializer it came from."""
    entry = next(e for e in MANIFEST["fixtures"] if e["file"] == file)
    ref = json.loads((FIXTURES / entry["reference"]).read_text())
    inits = ref["initializers"]
    for node in onnx.load(str(FIXTURES / file)).graph.node:
        src = [inits[i] for i in node.input if i in inits]
        for o in node.output:
            if src and o not in inits:
                inits[o] = src[0]
    block = import_model(str(FIXTURES / file))
    return entry, ref, block


def agreement(file: str):
    """(agreeing elements, all elements, agreeing tensors, all tensors, disagreements)."""
    entry, ref, block = _load(file)
    shape = tuple(entry["input_shape"][1:])
    stages = stage_map(block, shape)
    inits = ref["initializers"]
    good = total = good_n = total_n = 0
    wrong = []
    for name, e in named_params(block).items():
        r = inits.get(e.param.name) or inits.get(name)
        assert r is not None, f"{file}: parameter {name} has no timm reference"
        want = expected_stage(entry["model"], r["group"], ref["last_group"])
        total += r["size"]
        total_n += 1
        if stages[name] == want:
            good += r["size"]
            good_n += 1
        else:
            wrong.append((r["torch"] or r["module"], r["size"], stages[name], want))
    return good, total, good_n, total_n, wrong


def test_every_architecture_and_exporter_is_there():
    have = {(e["model"], e["exporter"]) for e in MANIFEST["fixtures"]}
    assert {m for m, _ in have} == set(STAGE_OF)
    assert have == {(m, x) for m in STAGE_OF for x in ("legacy", "dynamo")}, MANIFEST["exporter_failures"]
    assert sum(e["bytes"] for e in MANIFEST["fixtures"]) < 15e6
    for e in MANIFEST["fixtures"]:  # the files are the ones the references were computed on
        assert hashlib.sha256((FIXTURES / e["file"]).read_bytes()).hexdigest() == e["sha256"], e["file"]


@pytest.mark.parametrize("entry", CASES)
def test_stage_agrees_with_timm_group_matcher(entry):
    good, total, good_n, total_n, wrong = agreement(entry["file"])
    assert good / total >= 0.98, (f"{entry['file']}: {good / total:.2%} of parameters "
                                  f"({good_n}/{total_n} tensors) agree; first disagreements {wrong[:8]}")


@pytest.mark.parametrize("entry", CASES)
def test_head_selects_only_the_classifier(entry):
    """``{stage: head}`` trains exactly the parameters timm leaves to its last group that come
    after the global pool: the classifier (and MobileNetV3's conv head, which runs on the pooled
    vector), never a norm or block before the pool."""
    _, ref, block = _load(entry["file"])
    plan = make_plan(block, [{"match": "*", "grad_req": "null"}, {"stage": "head", "grad_req": "write"}],
                     input_shape=tuple(entry["input_shape"][1:]))
    trained = {r.name for r in plan.rows if r.grad_req == "write"}
    inits = ref["initializers"]
    classifier = {name for name, e in named_params(block).items()
                  if ((inits.get(e.param.name) or inits[name])["torch"] or
                      (inits.get(e.param.name) or inits[name])["module"] or "").startswith(CLASSIFIER[entry["model"]])}
    assert classifier and trained == classifier


CLASSIFIER = {  # module paths of each family's classifier (after the global pool)
    "resnet": "fc", "regnet": "head.fc", "convnext": ("head.norm", "head.fc"), "swin": "head.fc",
    "efficientformer": ("head", "head_dist"), "repvgg": "head.fc", "densenet": "classifier",
    "vit": "head", "deit": ("head", "head_dist"), "efficientnet": "classifier",
    "mobilenetv3": ("conv_head", "classifier"), "mobilevit": "head.fc",
}


# ------------------------------------------------------------------ the other real-exporter fixtures

REAL = Path(__file__).parent / "fixtures"
REAL_MANIFEST = json.loads((REAL / "MANIFEST.json").read_text())
# model → its classifier's parameters (the layers after the global pool in
# scripts/make_onnx_fixtures.py and torchvision); the dynamo exporter drops torchvision's zero biases
REAL_HEADS = {
    "resnet": {"fc.weight", "fc.bias"}, "shufflenetv2": {"fc.weight", "fc.bias"},
    "regnet": {"fc.weight", "fc.bias"}, "tv_regnet": {"fc.weight", "fc.bias"},
    "mobilenetv2": {"classifier.1.weight", "classifier.1.bias"},
    "efficientnet": {"classifier.1.weight", "classifier.1.bias"},
    "tv_efficientnet": {"classifier.1.weight", "classifier.1.bias"},
    "mobilenetv3": {"classifier.0.weight", "classifier.0.bias", "classifier.3.weight", "classifier.3.bias"},
    # SqueezeNet classifies each position with a 1×1 conv, then pools: that conv is the head
    "squeezenet": {"classifier.1.weight", "classifier.1.bias"},
    "densenet": {"classifier.weight", "classifier.bias"},
    "vit": {"head.weight", "head.bias"}, "encoder_vit": {"head.weight", "head.bias"},
    "swin": {"head.weight", "head.bias"}, "tv_swin": {"head.weight", "head.bias"},
    "xcit_lpi": {"head.weight", "head.bias"}, "mobilevit_fold": {"head.weight", "head.bias"},
    "efficientformer_attn": {"head.weight", "head.bias"},
    "convnext": {"norm.weight", "norm.bias", "head.weight", "head.bias"},  # its norm follows the pool
    "tv_convnext": {"classifier.0.weight", "classifier.0.bias", "classifier.2.weight", "classifier.2.bias"},
    "tv_vit": {"heads.head.weight", "heads.head.bias"},
}
REAL_CASES = [pytest.param(e, id=e["file"][:-len(".onnx")]) for e in REAL_MANIFEST["fixtures"]
              if e["model"] in REAL_HEADS and 2 not in e["dynamic_dims"]]


@pytest.mark.parametrize("entry", REAL_CASES)
def test_head_of_real_exports_is_the_classifier(entry):
    """``{stage: head}`` on each classification export trains the classifier and nothing else
    (EfficientNet's and MobileNetV3's squeeze-excitation pools do not end the backbone)."""
    block = import_model(str(REAL / entry["file"]))
    plan = make_plan(block, [{"match": "*", "grad_req": "null"}, {"stage": "head", "grad_req": "write"}],
                     input_shape=tuple(entry["input_shape"][1:]))
    trained = {r.name for r in plan.rows if r.grad_req == "write"}
    head = REAL_HEADS[entry["model"]]
    assert {n for n in head if n.endswith("weight")} <= trained <= head, (trained, plan.stages_from)
    assert f"stages: {plan.stages_from}" in format_plan(plan).splitlines()
    assert plan.stages_from.startswith(("output stride", "repeated residual blocks"))


def test_head_of_paddleocr_classifier_is_its_fc():
    """PP-OCR's mobile direction classifier (a MobileNetV3 with squeeze-excitation, 48×192):
    the head is its 200→2 fc, 200·2 + 2 = 402 parameters; every other one stays frozen (the
    stride map once called everything after the first SE block head: 129,157 trained)."""
    from tests.onnx.test_real_models import _rapidocr_models

    if _rapidocr_models() is None:
        pytest.skip("pip install --no-deps rapidocr-onnxruntime==1.4.4 provides the models")
    path = _rapidocr_models() / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    block = import_model(str(path), input_shapes={"x": (None, 3, 48, 192)})
    plan = make_plan(block, [{"match": "*", "grad_req": "null"}, {"stage": "head", "grad_req": "write"}],
                     input_shape=(3, 48, 192))
    assert {r.name for r in plan.rows if r.trainable} == {"fc_0.w_0", "fc_0.b_0"}
    assert plan.totals()["trainable"] == 402
    assert plan.stages_from == "output stride, 2 stages, head after the last global pool"


def test_plan_says_how_a_zoo_map_was_found():
    """Zoo (Gluon) models keep their forward-pass map; the plan names it, and plan.json has it."""
    import mxnet as mx
    from gluoncv.model_zoo import get_model

    net = get_model("resnet18_v1", classes=5)
    net.initialize(mx.init.Xavier())
    plan = make_plan(net, [{"stage": "head", "grad_req": "write"}], input_shape=(3, 32, 32))
    assert plan.stages_from == "output stride of the top-level blocks, 4 stages"
    assert plan.to_json()["stages_from"] == plan.stages_from
    assert {r.name for r in plan.rows if r.stage == HEAD} == {"output.weight", "output.bias"}
