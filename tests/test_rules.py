"""The plan decides exactly what trains; apply() makes MXNet do exactly that."""
import fnmatch

import mxnet as mx
import numpy as np
import pytest
from gluoncv.model_zoo import get_model
from tests.helpers import assert_f32_close, batch, sgd_step, snapshot

from gluontl.errors import RuleError
from gluontl.recipe import FreezeAllButHead, FreezeBn, FreezeUntilStage, Rule
from gluontl.rules import apply_plan, make_plan, trainable_params

SHAPE = (3, 32, 32)


def zoo(name, classes=5):
    net = get_model(name, classes=classes)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, *SHAPE)))
    return net


RECIPES = {
    "head_only": [FreezeAllButHead()],
    "last_stage": [FreezeAllButHead(), Rule(stage=[4], grad_req="write", bn="train", lr_mult=0.1)],
    "by_type": [Rule(type=["BatchNorm"], grad_req="null", bn="frozen"), Rule(match=["*conv*", "features.0.*"],
                                                                            grad_req="null", optional=True)],
}


HEAD = {"resnet18_v1": "output.", "resnet18_v1b": "fc."}  # name prefixes, read off the models
STAGE4 = {"resnet18_v1": "features.7.", "resnet18_v1b": "layer4."}
STATS = ("running_mean", "running_var")
BN_PARAMS = ("gamma", "beta") + STATS


def expected(model, recipe, names):
    """What RECIPES[recipe] trains and whose BatchNorm statistics move, worked out by hand
    from the rules as written above (not from the plan under test)."""
    head = {n for n in names if n.startswith(HEAD[model])}
    if recipe == "head_only":  # everything frozen (BN too), then the head trains
        return head, set()
    if recipe == "last_stage":  # ... and stage 4 trains with its BN in train mode
        stage4 = {n for n in names if n.startswith(STAGE4[model])}
        return head | {n for n in stage4 if not n.endswith(STATS)}, {n for n in stage4 if n.endswith(STATS)}
    assert recipe == "by_type"  # BN frozen; conv weights (resnet18_v1: the stem conv) frozen
    frozen = {n for n in names if n.endswith(BN_PARAMS) or fnmatch.fnmatch(n, "*conv*")
              or n.startswith("features.0.")}
    return set(names) - frozen, set()


@pytest.mark.parametrize("model", ["resnet18_v1", "resnet18_v1b"])
@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("hybrid", [False, True])
def test_step_changes_exactly_planned_params(model, recipe, hybrid):
    net = zoo(model)
    plan = make_plan(net, RECIPES[recipe], input_shape=SHAPE)
    apply_plan(net, plan)
    if hybrid:
        net.hybridize(static_alloc=True, static_shape=True)
    before = snapshot(net)
    trains, moving_stats = expected(model, recipe, before)
    assert 0 < len(trains) < len(before)
    assert {n for n, r in plan.by_name().items() if r.trainable} == trains
    assert set(trainable_params(net)) == trains
    x, y = batch()
    sgd_step(net, x, y, steps=2)
    after = snapshot(net)
    changed = {n for n in before if not np.array_equal(before[n], after[n])}
    assert changed == trains | moving_stats


def test_grad_req_add_accumulates_sum_of_two_backwards():
    net = zoo("resnet18_v1")
    apply_plan(net, make_plan(net, [Rule(match=["*"], grad_req="add"), Rule(type=["BatchNorm"], bn="frozen")],
                              input_shape=SHAPE))
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    (x1, y1), (x2, y2) = batch(seed=1), batch(seed=2)
    grads = []
    for x, y in ((x1, y1), (x2, y2)):
        for p in net.collect_params().values():
            if p.grad_req != "null":
                p.zero_grad()
        with mx.autograd.record():
            loss_fn(net(x), y).backward()
        grads.append({k: p.grad().asnumpy().copy() for k, p in trainable_params(net).items()})
    for p in net.collect_params().values():
        if p.grad_req != "null":
            p.zero_grad()
    for x, y in ((x1, y1), (x2, y2)):
        with mx.autograd.record():
            loss_fn(net(x), y).backward()
    for k, p in trainable_params(net).items():  # the same kernels, plus one float32 addition
        assert_f32_close(p.grad().asnumpy(), grads[0][k] + grads[1][k], terms=2, err_msg=k,
                         scale=np.abs(grads[0][k]).max() + np.abs(grads[1][k]).max())


def test_lr_mult_scales_the_update():
    x, y = batch()
    deltas = {}
    for mult in (1.0, 0.1):
        mx.random.seed(0)
        net = zoo("resnet18_v1")
        apply_plan(net, make_plan(net, [FreezeAllButHead(),
                                        Rule(match=["output.*"], lr_mult=mult)], input_shape=SHAPE))
        before = snapshot(net)["output.weight"]
        sgd_step(net, x, y)
        deltas[mult] = snapshot(net)["output.weight"] - before
    # w - lr·g is rounded to float32 at w's size, so each delta is off by up to eps32·|w|
    assert_f32_close(deltas[0.1], deltas[1.0] * 0.1, scale=np.abs(before), terms=1)
    assert np.abs(deltas[1.0]).max() > 0


@pytest.mark.parametrize("hybrid", [False, True])
def test_bn_frozen_keeps_statistics_and_uses_them(hybrid):
    net = zoo("resnet18_v1")
    # Everything trains (so backward reaches every BN) but BN statistics are frozen.
    apply_plan(net, make_plan(net, [Rule(type=["BatchNorm"], bn="frozen")], input_shape=SHAPE))
    if hybrid:
        net.hybridize(static_alloc=True, static_shape=True)
    bn_stats = [n for n in snapshot(net) if n.endswith(("running_mean", "running_var"))]
    before = snapshot(net)
    x, y = batch()
    sgd_step(net, x, y, steps=2)
    after = snapshot(net)
    for n in bn_stats:
        assert np.array_equal(before[n], after[n]), n
    with mx.autograd.record(train_mode=True):
        train_out = net(x)
    with mx.autograd.predict_mode():
        infer_out = net(x)
    # batch statistics would differ by orders of magnitude; kernels differ by rounding only
    # (resnet18: 17 conv layers in sequence, at most 512·3·3 products per output)
    assert_f32_close(train_out.asnumpy(), infer_out.asnumpy(), terms=512 * 9, depth=17)


@pytest.mark.parametrize("hybrid", [False, True])
def test_bn_train_moves_statistics_of_trainable_bn(hybrid):
    net = zoo("resnet18_v1")
    apply_plan(net, make_plan(net, [], input_shape=SHAPE))
    if hybrid:
        net.hybridize(static_alloc=True, static_shape=True)
    before = snapshot(net)
    x, y = batch()
    sgd_step(net, x, y)
    after = snapshot(net)
    stats = [n for n in before if n.endswith(("running_mean", "running_var"))]
    assert all(not np.array_equal(before[n], after[n]) for n in stats)


def test_rules_changed_after_hybridized_forward_take_effect():
    net = zoo("resnet18_v1")
    net.hybridize(static_alloc=True, static_shape=True)
    apply_plan(net, make_plan(net, [FreezeAllButHead()], input_shape=SHAPE))
    x, y = batch()
    sgd_step(net, x, y)  # traced with the backbone frozen
    apply_plan(net, make_plan(net, [Rule(match=["features.*"], grad_req="null", bn="frozen"),
                                    Rule(match=["features.7.*"], grad_req="write", bn="train")],
                              input_shape=SHAPE))
    before = snapshot(net)
    sgd_step(net, x, y)
    after = snapshot(net)
    assert not np.array_equal(before["features.7.1.body.0.weight"], after["features.7.1.body.0.weight"])
    assert not np.array_equal(before["features.7.1.body.1.running_mean"], after["features.7.1.body.1.running_mean"])
    assert np.array_equal(before["features.0.weight"], after["features.0.weight"])
    # and back: freezing stage 4 again stops it from moving, statistics included
    apply_plan(net, make_plan(net, [FreezeAllButHead()], input_shape=SHAPE))
    before = snapshot(net)
    sgd_step(net, x, y)
    after = snapshot(net)
    assert np.array_equal(before["features.7.1.body.0.weight"], after["features.7.1.body.0.weight"])
    assert np.array_equal(before["features.7.1.body.1.running_var"], after["features.7.1.body.1.running_var"])
    assert not np.array_equal(before["output.weight"], after["output.weight"])


def test_later_rules_override_field_by_field_and_plan_names_the_rule():
    net = zoo("resnet18_v1")
    plan = make_plan(net, [Rule(match=["*"], grad_req="null", lr_mult=0.5),
                           Rule(match=["features.7.*"], grad_req="write"),
                           Rule(match=["*.weight"], wd_mult=0.0)], input_shape=SHAPE)
    row = plan.by_name()["features.7.0.body.0.weight"]
    assert (row.grad_req, row.lr_mult, row.wd_mult) == ("write", 0.5, 0.0)
    assert row.decided_by == {"grad_req": "2", "lr_mult": "1", "wd_mult": "3", "bn": "-"}
    gamma = plan.by_name()["features.1.gamma"]
    assert (gamma.grad_req, gamma.wd_mult, gamma.decided_by["wd_mult"]) == ("null", 1.0, "default")


def test_stage_map_and_presets_on_two_families():
    for name, stage4, head in (("resnet18_v1", "features.7.0.body.0.weight", "output.weight"),
                               ("resnet18_v1b", "layer4.0.conv1.weight", "fc.weight")):
        net = zoo(name)
        plan = make_plan(net, [FreezeUntilStage(until_stage=3)], input_shape=SHAPE)
        rows = plan.by_name()
        assert rows[stage4].stage == 4 and rows[stage4].trainable
        assert rows[head].stage == "head" and rows[head].trainable
        assert all(not r.trainable for r in rows.values() if r.stage in ("stem", 1, 2, 3))
        assert [r.label for r in plan.rules] == ["1.1"]


def test_errors_rule_matching_nothing_and_bn_on_conv():
    net = zoo("resnet18_v1")
    with pytest.raises(RuleError, match=r"rule 1 .*layer4\.\*.*matches no parameter"):
        make_plan(net, [Rule(match=["layer4.*"], grad_req="null")], input_shape=SHAPE)
    with pytest.raises(RuleError, match=r"rule 1 sets bn: frozen but matches no BatchNorm"):
        make_plan(net, [Rule(type=["Conv"], bn="frozen")], input_shape=SHAPE)
    plan = make_plan(net, [Rule(match=["layer4.*"], grad_req="null", optional=True)], input_shape=SHAPE)
    assert all(r.grad_req == "write" for r in plan.rows if not r.aux)


def test_plan_notes_bn_train_that_cannot_move():
    net = zoo("resnet18_v1")
    plan = make_plan(net, [Rule(match=["features.*"], grad_req="null")], input_shape=SHAPE)
    assert any("will not move" in n for n in plan.notes)


def test_graph_stage_map_at_small_input_keeps_stage_4(tmp_path):
    """A 1×1 map at 32² is still stage 4; the head starts at global pooling."""
    from gluontl.naming import named_params
    from gluontl.recipe import ModelSpec
    from gluontl.sources import load_model
    from gluontl.stages import stage_map

    net = zoo("resnet18_v1")
    net.hybridize()
    net(mx.nd.zeros((1, *SHAPE)))
    net.export(str(tmp_path / "r"))
    graph = load_model(ModelSpec(source=f"symbol:{tmp_path / 'r'}"))
    stages = stage_map(graph, SHAPE)
    names = list(named_params(graph))
    assert stages[next(n for n in names if n.endswith("stage4_conv4_weight"))] == 4
    assert stages[next(n for n in names if n.endswith("conv0_weight"))] == "stem"
    assert {n for n, s in stages.items() if s == "head"} == {n for n in names if "dense" in n}
    gluon = stage_map(net, SHAPE)
    assert gluon["features.7.1.body.3.weight"] == 4 and gluon["output.weight"] == "head"


def test_head_stays_head_after_global_pooling_mobilenetv2():
    """MobileNetV2's classifier is a 1×1 conv after the global pool: still the head."""
    net = zoo("mobilenetv2_0.25")
    plan = make_plan(net, [FreezeAllButHead()], input_shape=SHAPE)
    assert {r.name for r in plan.rows if r.trainable} == {"output.0.weight"}
    assert {r.stage for r in plan.rows} == {"stem", 1, 2, 3, 4, "head"}


# ------------------------------------------------------------ the plan as users read it; presets; errors


def _small():
    """conv -> BatchNorm -> dense: small enough to write its plan out by hand."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, in_channels=3), mx.gluon.nn.BatchNorm(in_channels=4),
            mx.gluon.nn.Dense(2, in_units=4 * 6 * 6))
    net.initialize()
    net(mx.nd.zeros((1, 3, 8, 8)))
    return net


def test_format_plan_totals_and_json_written_out_by_hand():
    from gluontl.rules import format_plan

    plan = make_plan(_small(), [Rule(match=["0.*"], grad_req="null", note="freeze the conv"),
                                Rule(type=["BatchNorm"], bn="frozen", lr_mult=0.5, wd_mult=0.0)])
    # trainable: gamma 4 + beta 4 + dense 288 + 2; frozen: conv 108 + 4, running mean/var 4 + 4
    assert plan.totals() == {"params": 8, "trainable": 298, "frozen": 120, "trainable_bytes": 1192,
                             "frozen_bytes": 480}
    assert [line.rstrip() for line in format_plan(plan).splitlines()] == [
        "rules (epoch 0):",
        "  1: match=['0.*'], grad_req=null  # freeze the conv",
        "  2: type=['BatchNorm'], lr_mult=0.5, wd_mult=0.0, bn=frozen",
        "",
        "name            mxnet name               shape    count  stage  grad_req  lr   wd  bn      rules g/lr/wd/bn",
        "--------------  -----------------------  -------  -----  -----  --------  ---  --  ------  "
        "-------------------------",
        "0.weight        conv0_weight             4x3x3x3  108           null      1    1           "
        "1/default/default/-",
        "0.bias          conv0_bias               4        4             null      1    1           "
        "1/default/default/-",
        "1.gamma         batchnorm0_gamma         4        4             write     0.5  0   frozen  default/2/2/2",
        "1.beta          batchnorm0_beta          4        4             write     0.5  0   frozen  default/2/2/2",
        "1.running_mean  batchnorm0_running_mean  4        4             aux                frozen  aux/aux/aux/2",
        "1.running_var   batchnorm0_running_var   4        4             aux                frozen  aux/aux/aux/2",
        "2.weight        dense0_weight            2x144    288           write     1    1           "
        "default/default/default/-",
        "2.bias          dense0_bias              2        2             write     1    1           "
        "default/default/default/-",
        "",
        "8 parameters: trainable 298 (0.0 MiB), frozen 120 (0.0 MiB)",
    ]
    js = plan.to_json()
    assert (js["epoch"], js["totals"], js["notes"]) == (0, plan.totals(), [])
    assert js["rules"] == [{"label": "1", "match": ["0.*"], "grad_req": "null", "note": "freeze the conv"},
                           {"label": "2", "type": ["BatchNorm"], "lr_mult": 0.5, "wd_mult": 0.0, "bn": "frozen"}]
    assert js["params"][4] == {"name": "1.running_mean", "global_name": "batchnorm0_running_mean", "shape": (4,),
                               "size": 4, "layer": "1", "layer_type": "BatchNorm", "stage": None, "aux": True,
                               "grad_req": "null", "lr_mult": 0.5, "wd_mult": 0.0, "bn": "frozen",
                               "decided_by": {"grad_req": "aux", "lr_mult": "aux", "wd_mult": "aux", "bn": "2"}}
    assert [p["name"] for p in js["params"]] == list(plan.by_name())
    assert plan.settings()["2.weight"] == ("write", 1.0, 1.0, None)
    assert plan.settings()["1.gamma"] == ("write", 0.5, 0.0, "frozen")


def test_format_plan_lists_stages_and_notes_with_sizes_in_mib():
    from gluontl.rules import format_plan

    net = zoo("resnet18_v1")
    text = format_plan(make_plan(net, [Rule(match=["features.*"], grad_req="null")], input_shape=SHAPE))
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("features.7.1.body.0.weight "))
    assert row.split()[2:6] == ["512x512x3x3", "2,359,296", "4", "null"]
    assert next(line for line in lines if line.startswith("output.weight ")).split()[2:5] == ["5x512", "2,560", "head"]
    # resnet18_v1: 20 bias-free convs, 20 BatchNorms (4 arrays each), the dense head: 102 arrays.
    # Backbone weights 11,176,512 (11,689,512 of ImageNet resnet18 less its 513,000-weight fc) plus
    # the running mean/var of 4,800 BN channels (64 + 4·64 + 5·128 + 5·256 + 5·512) stay frozen;
    # the 5-class head trains, 512·5 + 5 = 2,565. 11,186,112 · 4 bytes = 42.7 MiB.
    assert lines[-2] == ("102 parameters: trainable 2,565 (0.0 MiB), frozen 11,186,112 (42.7 MiB)")
    assert lines[-1].startswith("note: 20 BatchNorm layer(s) are in bn: train but neither they nor anything before "
                                "them trains (e.g. features.1): MXNet updates running statistics")


def test_preset_freeze_bn_freezes_every_batchnorm_and_nothing_else():
    plan = make_plan(_small(), [FreezeBn()])
    rows = plan.by_name()
    assert {n for n, r in rows.items() if r.trainable} == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert {n: r.bn for n, r in rows.items() if r.bn} == dict.fromkeys(
        ["1.gamma", "1.beta", "1.running_mean", "1.running_var"], "frozen")
    assert rows["1.gamma"].decided_by == {"grad_req": "1.1", "lr_mult": "default", "wd_mult": "default", "bn": "1.1"}
    assert [(p.label, p.rule.note) for p in plan.rules] == [("1.1", "freeze every BatchNorm")]


def test_presets_take_the_rules_from_epoch_and_optional():
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(3, in_units=4))
    net.initialize()
    # a preset's rule for a layer type the model lacks is no error: the plan says there is nothing to do
    plan = make_plan(net, [FreezeBn()])
    assert all(r.trainable for r in plan.rows) and plan.notes == [
        "rule 1.1 (freeze_bn: bn: frozen): no BatchNorm layer in this model, nothing to do"]
    assert all(r.trainable for r in make_plan(net, [FreezeBn(optional=True)]).rows)
    with pytest.raises(RuleError, match=r"rule 1 \(type \['BatchNorm'\] \(this model has Dense\)\) matches no "
                                        r"parameter \(names look like: 0\.weight, 0\.bias\)"):
        make_plan(net, [Rule(type=["BatchNorm"], bn="frozen")])  # the user's own rule stays strict
    big = zoo("resnet18_v1")
    rules = [FreezeAllButHead(from_epoch=2)]
    assert all(r.trainable for r in make_plan(big, rules, epoch=1, input_shape=SHAPE).rows if not r.aux)
    late = make_plan(big, rules, epoch=2, input_shape=SHAPE)
    assert {r.name for r in late.rows if r.trainable} == {"output.weight", "output.bias"} and late.epoch == 2
    assert [(p.label, p.rule.from_epoch) for p in late.rules] == [("1.1", 2), ("1.2", 2)]


def test_freeze_until_stage_stem_head_and_missing():
    net = zoo("resnet18_v1")
    stem = make_plan(net, [FreezeUntilStage(until_stage="stem")], input_shape=SHAPE)
    assert {r.stage for r in stem.rows if not r.trainable and not r.aux} == {"stem"}
    assert [p.rule.note for p in stem.rules] == ["freeze stem..stem"]
    assert {r.name for r in stem.rows if r.stage == "stem"} == {"features.0.weight", "features.1.gamma",
                                                                "features.1.beta", "features.1.running_mean",
                                                                "features.1.running_var"}
    two = make_plan(net, [FreezeUntilStage(until_stage=2)], input_shape=SHAPE)
    assert {r.stage for r in two.rows if not r.trainable and not r.aux} == {"stem", 1, 2}
    everything = make_plan(net, [FreezeUntilStage(until_stage="head")], input_shape=SHAPE)
    assert not any(r.trainable for r in everything.rows[:-2])  # every stage up to 4 ...
    assert all(r.trainable for r in everything.rows[-2:])  # ... but the head, which no stage number reaches
    with pytest.raises(RuleError, match=r"^preset freeze_until_stage needs until_stage: N \(stem, 1, 2, …\)\.$"):
        make_plan(net, [FreezeUntilStage()], input_shape=SHAPE)


def test_rule_errors_name_every_rule_and_what_the_model_has():
    net = zoo("resnet18_v1")
    with pytest.raises(RuleError) as e:
        make_plan(net, [Rule(match=["layer4.*"], type=["Conv"], stage=[4], grad_req="null"),
                        Rule(match=["features.0.*"], bn="frozen")], input_shape=SHAPE)
    assert str(e.value) == (
        "The rules do not fit this model: rule 1 (match ['layer4.*'] and type ['Conv'] (this model has BatchNorm, "
        "Conv, Dense) and stage [4] (this model has stem, 1, 2, 3, 4, head)) matches no parameter (names look "
        "like: features.0.weight, features.1.gamma, features.1.beta); rule 2 sets bn: frozen but matches no "
        "BatchNorm layer (it matches 1 parameters of Conv layers); bn applies only to BatchNorm — add type: "
        "BatchNorm or fix match. Mark a rule optional: true if matching nothing is intended; `gluontl inspect` "
        "lists every parameter name.")
    with pytest.raises(RuleError, match=r"^stage selectors need the model's input shape \(model\.input_shape\)\.$"):
        make_plan(net, [Rule(stage=[1], grad_req="null")])


class _Scale(mx.gluon.HybridBlock):
    """A block holding its own parameter: a layer of no known type."""

    def __init__(self):
        super().__init__()
        with self.name_scope():
            self.w = self.params.get("w", shape=(3,))

    def hybrid_forward(self, F, x, w):
        return F.broadcast_mul(x, w)


def test_type_selector_on_a_model_without_typed_layers():
    net = mx.gluon.nn.HybridSequential()
    net.add(_Scale())
    net.initialize()
    net(mx.nd.ones((1, 3)))
    with pytest.raises(RuleError, match=r"rule 1 \(type \['Conv'\] \(this model has no typed layers\)\) matches no "
                                        r"parameter \(names look like: 0\.w\)\. Mark a rule optional"):
        make_plan(net, [Rule(type=["Conv"], grad_req="null")])
    assert make_plan(net, [Rule(match=["0.*"], grad_req="null")]).by_name()["0.w"].grad_req == "null"


@pytest.mark.parametrize("frozen,bn,note", [
    ((1, 2), "train", False),  # conv0 trains: backward runs through bn2, its statistics move
    ((0, 1), "train", False),  # bn2's own gamma/beta train
    ((0, 1, 2), "train", True),  # nothing at or before bn2 trains: its statistics cannot move
    ((0, 1, 2), "frozen", False),  # ... which bn: frozen says
])
def test_plan_notes_only_batchnorm_whose_statistics_cannot_move(frozen, bn, note):
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, in_channels=3), mx.gluon.nn.Conv2D(4, 3, in_channels=4),
            mx.gluon.nn.BatchNorm(in_channels=4))
    net.initialize()
    net(mx.nd.zeros((1, 3, 8, 8)))
    rules = [Rule(match=[f"{i}.*"], grad_req="null") for i in frozen] + [Rule(type=["BatchNorm"], bn=bn)]
    notes = make_plan(net, rules).notes
    assert notes == ([f"1 BatchNorm layer(s) are in bn: train but neither they nor anything before them trains "
                      f"(e.g. 2): MXNet updates running statistics during backward on CPU, so their statistics "
                      f"will not move. Use bn: frozen to say so, or let the layer's gamma/beta train."] if note else [])


def test_batchnorm_mode_defaults_to_train():
    rows = make_plan(_small(), [Rule(match=["0.*"], grad_req="null")]).by_name()
    assert (rows["1.gamma"].bn, rows["1.gamma"].decided_by["bn"]) == ("train", "default")
    assert (rows["0.weight"].bn, rows["0.weight"].decided_by["bn"]) == (None, "-")


def test_every_rule_error_is_reported_with_the_kinds_of_layers_matched():
    net = zoo("resnet18_v1")
    with pytest.raises(RuleError) as e:
        make_plan(net, [Rule(match=["features.0.*", "output.*"], bn="frozen"),
                        Rule(type=["BatchNorm"], grad_req="null"), Rule(match=["nothing*"], grad_req="null")])
    msg = str(e.value)
    assert ("rule 1 sets bn: frozen but matches no BatchNorm layer (it matches 3 parameters of Conv, Dense layers)"
            in msg)
    assert "rule 3 (match ['nothing*']) matches no parameter" in msg and "rule 2" not in msg


def test_graph_parameter_outside_any_layer():
    # a graph output that is a weight itself: the weight belongs to no layer
    data = mx.sym.var("data")
    out = mx.sym.Group([mx.sym.broadcast_mul(data, mx.sym.var("s", shape=(3,))), mx.sym.var("w", shape=(3,))])
    blk = mx.gluon.SymbolBlock(out, [data])
    blk.initialize()
    blk(mx.nd.ones((1, 3)))
    plan = make_plan(blk, [Rule(match=["w"], grad_req="null")])
    assert [(r.name, r.layer, r.layer_type, r.aux, r.trainable) for r in plan.rows] == [
        ("s", "broadcast_mul0", None, False, True), ("w", None, None, False, False)]
    with pytest.raises(RuleError, match=r"matches no BatchNorm layer \(it matches 2 parameters of other layers\)"):
        make_plan(blk, [Rule(match=["*"], bn="frozen")])


def test_preset_rules_are_listed_with_their_notes():
    from gluontl.rules import format_plan

    plan = make_plan(zoo("resnet18_v1"), [FreezeAllButHead()], input_shape=SHAPE)
    assert format_plan(plan).splitlines()[:3] == [
        "rules (epoch 0):",
        "  1.1: match=['*'], grad_req=null, bn=frozen  # freeze everything",
        "  1.2: stage=['head'], grad_req=write  # train the head"]
    plan = make_plan(zoo("resnet18_v1"), [FreezeUntilStage(until_stage=2)], input_shape=SHAPE)
    assert format_plan(plan).splitlines()[1] == ("  1.1: stage=['stem', 1, 2], grad_req=null, bn=frozen  "
                                                 "# freeze stem..2")


def test_a_rule_waiting_for_its_epoch_does_not_hold_back_later_rules():
    rules = [Rule(match=["0.*"], grad_req="null", from_epoch=3), Rule(match=["2.*"], lr_mult=0.1)]
    rows = make_plan(_small(), rules, epoch=1).by_name()
    assert (rows["0.weight"].grad_req, rows["2.weight"].lr_mult, rows["2.weight"].decided_by["lr_mult"]) == \
        ("write", 0.1, "2")
    assert make_plan(_small(), rules, epoch=3).by_name()["0.weight"].grad_req == "null"


def test_format_plan_of_a_trainable_net_and_of_one_without_parameters():
    from gluontl.rules import format_plan

    # all of resnet18_v1 trains: 11,176,512 + 2,565 weights, 4 bytes each = 42.6 MiB; the
    # 9,600 running statistics are the frozen part
    text = format_plan(make_plan(zoo("resnet18_v1"), []))
    assert text.splitlines()[-1] == "102 parameters: trainable 11,179,077 (42.6 MiB), frozen 9,600 (0.0 MiB)"
    empty = mx.gluon.nn.HybridSequential()
    empty.add(mx.gluon.nn.Activation("relu"))
    assert format_plan(make_plan(empty, [])).splitlines() == [
        "rules (epoch 0):", "",
        "name  mxnet name  shape  count  stage  grad_req  lr  wd  bn  rules g/lr/wd/bn",
        "----  ----------  -----  -----  -----  --------  --  --  --  ----------------", "",
        "0 parameters: trainable 0 (0.0 MiB), frozen 0 (0.0 MiB)"]


def test_every_preset_name_the_recipe_accepts_has_an_expansion():
    """Each preset the recipe accepts is a model of its own with its own expansion, listed in the
    order error messages list them."""
    from gluontl.recipe import PRESET_NAMES, PRESETS, Preset

    assert PRESET_NAMES == ("freeze_all_but_head", "freeze_until_stage", "freeze_bn", "no_weight_decay_1d",
                            "layer_decay", "fine_tune") == tuple(PRESETS)
    for name, cls in PRESETS.items():
        assert cls.expand is not Preset.expand and cls.model_fields["preset"].default == name, name
