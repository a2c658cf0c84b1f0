"""Every preset on every fixture family: BatchNorm (zoo ResNet, an unfolded PyTorch export), BatchNorm
folded into convolutions (legacy PyTorch exports), LayerNorm only (ViT, Swin), squeeze-excitation
(EfficientNet, MobileNetV3) and attention (Swin, EfficientFormer). Each plans without error, and its
trainable count equals a count made here from the ONNX file (initializers, and the node reading each)
or from the Gluon block's layers, never from the plan code.

The head-only presets (freeze_all_but_head, freeze_until_stage, fine_tune's first epoch) train exactly
the classifier after the last global pool, on SE and attention graphs too (a pool inside a block is
not the end of the backbone).
"""
from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest
from gluoncv.model_zoo import get_model

from gluontl.onnx import import_model
from gluontl.recipe import FineTune, FreezeAllButHead, FreezeBn, FreezeUntilStage, LayerDecay, NoWeightDecay1d, Rule
from gluontl.rules import make_plan

FIXTURES = Path(__file__).parents[1] / "onnx" / "fixtures"
MANIFEST = {e["file"]: e for e in json.loads((FIXTURES / "MANIFEST.json").read_text())["fixtures"]}
FAMILIES = {  # file → families it stands for
    "resnet_legacy_op13_nofold.onnx": "batchnorm",
    "resnet_legacy_op13.onnx": "folded batchnorm",
    "efficientnet_legacy_op13.onnx": "folded batchnorm, squeeze-excitation",
    "mobilenetv3_legacy_op13.onnx": "folded batchnorm, squeeze-excitation",
    "vit_legacy_op13.onnx": "layernorm only",
    "swin_dynamo_op18.onnx": "layernorm only, attention",
    "efficientformer_attn_legacy_op17.onnx": "folded batchnorm, attention",
}
NOTHING = "no BatchNorm layer in this model, nothing to do"
PRESETS = [FreezeAllButHead(), FreezeUntilStage(until_stage="neck"), FreezeBn(), NoWeightDecay1d(),
           LayerDecay(rate=0.5), FineTune()]


class Count:
    """Parameter sizes of a model, counted from its file or its Gluon layers."""

    def __init__(self, sizes: dict[str, tuple[int, ...]], bn_affine: set[str], bn_stats: set[str],
                 classifier: set[str]):
        self.shapes, self.bn_affine, self.bn_stats, self.classifier = sizes, bn_affine, bn_stats, classifier

    def size(self, names) -> int:
        return sum(int(np.prod(self.shapes[n])) for n in names)

    @property
    def learnable(self) -> set[str]:
        return set(self.shapes) - self.bn_stats


def onnx_count(path: Path) -> Count:
    """Parameters are the float initializers of rank >= 1 (rank-0 floats are scalar constants);
    BatchNormalization's inputs 1-2 are its affine parameters, 3-4 its running statistics; the
    classifier is what the Gemms after the graph's last GlobalAveragePool read (MobileNetV3 has two),
    else what its last Gemm reads (a transformer's token or mean pool is no single op)."""
    g = onnx.load(str(path)).graph
    shapes = {t.name: tuple(t.dims) for t in g.initializer if t.data_type == onnx.TensorProto.FLOAT and t.dims}
    bn = [n for n in g.node if n.op_type == "BatchNormalization"]
    pools = [i for i, n in enumerate(g.node) if n.op_type == "GlobalAveragePool"]
    gemms = [n for n in g.node[pools[-1]:] if n.op_type == "Gemm"] if pools else \
        [[n for n in g.node if n.op_type == "Gemm"][-1]]
    return Count(shapes, {x for n in bn for x in n.input[1:3]}, {x for n in bn for x in n.input[3:5]},
                 {x for n in gemms for x in n.input[1:] if x in shapes})


def zoo_count(net) -> Count:
    shapes, affine, stats = {}, set(), set()

    def walk(block, prefix):
        for k, p in block._reg_params.items():
            shapes[prefix + k] = p.shape
            if isinstance(block, mx.gluon.nn.BatchNorm):
                (stats if k.startswith("running") else affine).add(prefix + k)
        for name, child in block._children.items():
            walk(child, f"{prefix}{name}.")

    walk(net, "")
    return Count(shapes, affine, stats, {"output.weight", "output.bias"})


def _model(which: str):
    if which.startswith("zoo:"):
        net = get_model(which[4:], classes=5, pretrained=False)
        net.initialize(mx.init.Xavier(), ctx=mx.cpu())
        net(mx.nd.zeros((1, 3, 32, 32)))
        return net, (3, 32, 32), zoo_count(net)
    entry = MANIFEST[which]
    shape = tuple(entry["test_shapes"][0])
    return import_model(str(FIXTURES / which), input_shapes={entry["input"]: shape}), shape, \
        onnx_count(FIXTURES / which)


@pytest.fixture(scope="module", params=[*FAMILIES, "zoo:resnet18_v1"])
def model(request):
    return request.param, *_model(request.param)


def _graph_names(plan) -> dict[str, object]:
    """Rows by the graph's own tensor name (the ONNX initializer), as the hand count names them."""
    return {r.global_name: r for r in plan.rows}


@pytest.mark.parametrize("rule", PRESETS, ids=[r.preset for r in PRESETS])
def test_every_preset_plans_on_every_family_with_a_hand_count(model, rule):
    which, net, shape, count = model
    plan = make_plan(net, [rule], input_shape=shape, epoch=0)
    rows = plan.by_name() if which.startswith("zoo:") else _graph_names(plan)
    assert set(rows) == set(count.shapes)
    trainable = {n for n, r in rows.items() if r.trainable}
    total = count.size(count.learnable)
    has_bn = bool(count.bn_affine)
    bn_note = [n for n in plan.notes if NOTHING in n]
    if rule.preset == "freeze_bn":
        assert trainable == count.learnable - count.bn_affine
        assert plan.totals()["trainable"] == total - count.size(count.bn_affine)
        assert {n for n, r in rows.items() if r.bn == "frozen"} == count.bn_affine | count.bn_stats
    elif rule.preset == "no_weight_decay_1d":
        assert plan.totals()["trainable"] == total
        assert sum(r.size for r in rows.values() if r.wd_mult == 0.0 and not r.aux) == \
            count.size(n for n in count.learnable if len(count.shapes[n]) == 1)
    elif rule.preset == "layer_decay":
        assert plan.totals()["trainable"] == total
        assert all(rows[n].lr_mult == 1.0 for n in count.classifier)  # the head: depth 0 in any stage map
    elif rule.preset == "fine_tune":
        later = make_plan(net, [rule], input_shape=shape, epoch=1)
        assert later.totals()["trainable"] == total
        first = count.classifier | count.bn_affine  # the head, and BatchNorm trains (fastai's train_bn)
        assert first <= trainable
        assert plan.totals()["trainable"] == count.size(first)
    else:  # freeze_all_but_head, freeze_until_stage neck: only the head trains
        assert count.classifier <= trainable
        assert {n for n, r in rows.items() if r.bn == "frozen"} == count.bn_affine | count.bn_stats
        assert plan.totals()["trainable"] == count.size(count.classifier)
    sets_bn = rule.preset in ("freeze_all_but_head", "freeze_until_stage", "freeze_bn", "fine_tune")
    assert len(bn_note) == (sets_bn and not has_bn)


def test_the_note_names_the_presets_rule_on_a_model_without_batchnorm():
    net, shape, _ = _model("vit_legacy_op13.onnx")
    plan = make_plan(net, [Rule(match=["head.*"], lr_mult=10.0), FreezeAllButHead()],
                     input_shape=shape)
    assert plan.notes[0] == f"rule 2.1 (freeze_all_but_head: bn: frozen): {NOTHING}"
    assert plan.by_name()["head.weight"].lr_mult == 10.0  # the other rules apply as written


@pytest.mark.parametrize("file", [f for f in MANIFEST if f.split("_")[0] in ("vit", "swin") or
                                  f.startswith(("tv_vit", "tv_swin"))])
def test_freeze_all_but_head_on_every_vit_and_swin_export(file):
    """The issue's case: ViT and Swin have no BatchNorm, and freeze_all_but_head used to refuse them."""
    net, shape, _ = _model(file)
    plan = make_plan(net, [FreezeAllButHead()], input_shape=shape, epoch=0)
    last_gemm = [n for n in onnx.load(str(FIXTURES / file), load_external_data=False).graph.node
                 if n.op_type in ("Gemm", "MatMul")][-1]
    rows = {r.global_name: r for r in plan.rows}
    assert all(rows[x].trainable for x in last_gemm.input[1:] if x in rows)  # the classifier trains
    assert plan.notes[0] == f"rule 1.1 (freeze_all_but_head: bn: frozen): {NOTHING}"


def test_a_presets_bn_setting_on_a_part_without_batchnorm_says_where():
    """freeze_until_stage: stem on a model whose BatchNorm comes after its stem: the stem is frozen,
    the BatchNorm is left as it was, and the note says the selection (not the model) has none."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, padding=1, in_channels=3), mx.gluon.nn.Conv2D(4, 3, strides=4, padding=1,
                                                                                   in_channels=4),
            mx.gluon.nn.BatchNorm(in_channels=4), mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(2, in_units=4))
    net.initialize()
    net(mx.nd.zeros((1, 3, 16, 16)))
    plan = make_plan(net, [FreezeUntilStage(until_stage="stem")], input_shape=(3, 16, 16))
    rows = plan.by_name()
    assert {n for n, r in rows.items() if not r.trainable} == {"0.weight", "0.bias", "2.running_mean",
                                                               "2.running_var"}
    assert rows["2.gamma"].bn == "train" and plan.notes[0] == (
        "rule 1.1 (freeze_until_stage: bn: frozen): no BatchNorm layer among the parameters it selects, nothing to do")
