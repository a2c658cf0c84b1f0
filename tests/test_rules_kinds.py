"""Rules by parameter kind, layer-wise lr decay and fastai's fine_tune flow, each against a
reference worked out by hand (timm's formula, the layers a model was built from, an SGD update)."""
import mxnet as mx
import numpy as np
import onnx
import pytest
from gluoncv.model_zoo import get_model
from tests.helpers import EPS32, run_cli
from onnx import TensorProto, helper, numpy_helper

from gluontl.errors import RecipeError, RuleError
from gluontl.naming import named_params
from gluontl.recipe import FineTune, FreezeAllButHead, LayerDecay, NoWeightDecay1d, Rule, parse_recipe
from gluontl.rules import apply_plan, expand, make_plan, param_kinds, trainable_params
from gluontl.sources import load_model

SHAPE = (3, 32, 32)
KINDS = ("bias", "norm", "depthwise", "1d")


# ----------------------------------------------------------------- kind: the same model from three sources

def _mobile_net():
    """Every kind once, and two near misses: a grouped conv that is not depthwise (8 channels in
    2 groups), a BatchNorm beta that is not a bias."""
    mx.random.seed(3)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 3, padding=1, in_channels=3),  # 0: weight, bias
            mx.gluon.nn.BatchNorm(in_channels=8),  # 1: gamma, beta, running mean/var
            mx.gluon.nn.Conv2D(8, 3, padding=1, groups=8, use_bias=False, in_channels=8),  # 2: depthwise
            mx.gluon.nn.Conv2D(8, 1, groups=2, in_channels=8),  # 3: grouped, not depthwise
            mx.gluon.nn.InstanceNorm(in_channels=8),  # 4: gamma, beta
            mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(3, in_units=8))  # 6: weight, bias
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 8, 8)))
    return net


MOBILE = {  # written out from the layers above
    "bias": {"0.bias", "3.bias", "6.bias"},
    "norm": {"1.gamma", "1.beta", "1.running_mean", "1.running_var", "4.gamma", "4.beta"},
    "depthwise": {"2.weight"},
    "1d": {"0.bias", "1.gamma", "1.beta", "1.running_mean", "1.running_var", "3.bias", "4.gamma", "4.beta",
           "6.bias"},
}


def _selected(block, kind):
    """What a rule with this kind selects, read off the plan it makes (wd_mult 0 where it applied)."""
    plan = make_plan(block, [Rule(kind=[kind], wd_mult=0.0, optional=True)])
    return {r.name for r in plan.rows if r.wd_mult == 0.0}


@pytest.mark.parametrize("kind", KINDS)
def test_kinds_on_a_gluon_model_and_its_symbol_checkpoint(kind, tmp_path):
    net = _mobile_net()
    assert _selected(net, kind) == MOBILE[kind]
    net.hybridize()
    net(mx.nd.zeros((1, 3, 8, 8)))
    net.export(str(tmp_path / "m"))
    graph = load_model(f"symbol:{tmp_path / 'm'}")
    # the checkpoint's names are Gluon's global names of the same layers
    global_name = {f"{i}.{k}": p.name for i, layer in enumerate(net) for k, p in layer._reg_params.items()}
    assert _selected(graph, kind) == {global_name[n] for n in MOBILE[kind]}


def _mobile_onnx(path):
    rs = np.random.RandomState(0)
    arrays = {"stem.w": (8, 3, 3, 3), "stem.b": (8,), "bn.scale": (8,), "bn.bias": (8,), "bn.mean": (8,),
              "bn.var": (8,), "dw.w": (8, 1, 3, 3), "g.w": (8, 4, 1, 1), "g.b": (8,), "fc.w": (3, 8), "fc.b": (3,)}
    inits = [numpy_helper.from_array((np.abs if k == "bn.var" else np.asarray)(rs.randn(*s)).astype(np.float32), k)
             for k, s in arrays.items()]
    nodes = [helper.make_node("Conv", ["x", "stem.w", "stem.b"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c0", "bn.scale", "bn.bias", "bn.mean", "bn.var"], ["b0"]),
             helper.make_node("Relu", ["b0"], ["r0"]),
             helper.make_node("Conv", ["r0", "dw.w"], ["c1"], pads=[1, 1, 1, 1], group=8),
             helper.make_node("Conv", ["c1", "g.w", "g.b"], ["c2"], group=2),
             helper.make_node("GlobalAveragePool", ["c2"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


ONNX_KINDS = {  # written out from the graph above: ONNX's own tensor names
    "bias": {"stem.b", "g.b", "fc.b"},
    "norm": {"bn.scale", "bn.bias", "bn.mean", "bn.var"},
    "depthwise": {"dw.w"},
    "1d": {"stem.b", "bn.scale", "bn.bias", "bn.mean", "bn.var", "g.b", "fc.b"},
}


@pytest.mark.parametrize("kind", KINDS)
def test_kinds_on_an_imported_onnx_model(kind, tmp_path):
    block = load_model(f"onnx:{_mobile_onnx(tmp_path / 'm.onnx')}")
    assert set(named_params(block)) == {n for names in ONNX_KINDS.values() for n in names} | \
        {"stem.w", "g.w", "fc.w"}
    assert _selected(block, kind) == ONNX_KINDS[kind]


def test_kinds_on_a_zoo_mobilenet():
    """MobileNet v1 (Howard et al. 2017, Table 1): 13 depthwise convs, each unit conv-BN-ReLU so
    a dw conv every 6th unit from features.3; 27 BatchNorms; bias-free convs, a Dense classifier."""
    net = get_model("mobilenet0.25", classes=5)
    net.initialize()
    net(mx.nd.zeros((1, *SHAPE)))
    kinds = param_kinds(named_params(net))
    of = {k: {n for n, ks in kinds.items() if k in ks} for k in KINDS}
    assert of["depthwise"] == {f"features.{3 + 6 * i}.weight" for i in range(13)}
    assert of["bias"] == {"output.bias"}
    assert len(of["norm"]) == 27 * 4 and all(n.endswith(("gamma", "beta", "running_mean", "running_var"))
                                             for n in of["norm"])
    assert of["1d"] == of["norm"] | of["bias"]


def test_kind_combines_with_the_other_selectors_and_names_itself_when_it_matches_nothing():
    from gluontl.rules import format_plan

    net = _mobile_net()
    plan = make_plan(net, [Rule(kind=["bias", "depthwise"], match=["[23].*"], lr_mult=0.5)])
    assert {r.name for r in plan.rows if r.lr_mult == 0.5} == {"2.weight", "3.bias"}
    assert plan.by_name()["3.bias"].decided_by["lr_mult"] == "1"
    assert format_plan(plan).splitlines()[1] == "  1: match=['[23].*'], kind=['bias', 'depthwise'], lr_mult=0.5"
    with pytest.raises(RuleError, match=r"rule 1 \(match \['0\.\*'\] and kind \['depthwise'\] \(this model has "
                                        r"1d, bias, depthwise, norm\)\) matches no parameter"):
        make_plan(net, [Rule(match=["0.*"], kind=["depthwise"], grad_req="null")])


def _kinds_of(block, x):
    block.initialize()
    block(x)
    return {n: set(k) for n, k in param_kinds(named_params(block)).items()}


def _graph(out, shape):
    data = mx.sym.var("data")
    blk = mx.gluon.SymbolBlock(out(data), [data])
    return _kinds_of(blk, mx.nd.ones(shape))


def test_kinds_at_the_edges():
    """Depthwise at its edges (2 groups, a 1-D conv; not a 1-channel input's plain conv, nor a graph
    conv without a num_group attribute); biases of a layer that is the whole model and of an RNN
    (``l0_i2h_bias``); a graph weight outside any layer; two graphs in one model."""
    nn = mx.gluon.nn
    assert _kinds_of(nn.Conv1D(4, 3, groups=4, in_channels=4), mx.nd.ones((1, 4, 8))) == {
        "weight": {"depthwise"}, "bias": {"bias", "1d"}}
    assert _kinds_of(nn.Conv2D(2, 3, groups=2, in_channels=2), mx.nd.ones((1, 2, 8, 8)))["weight"] == {"depthwise"}
    assert _kinds_of(nn.Conv2D(4, 3, in_channels=1), mx.nd.ones((1, 1, 8, 8)))["weight"] == set()
    lstm = _kinds_of(mx.gluon.rnn.LSTM(3, input_size=2), mx.nd.ones((4, 1, 2)))
    assert {n for n, k in lstm.items() if "bias" in k} == {"l0_i2h_bias", "l0_h2h_bias"}
    plain = _graph(lambda d: mx.sym.Group([mx.sym.Convolution(d, kernel=(3, 3), num_filter=4, name="c"),
                                           mx.sym.var("w", shape=(3,))]), (1, 1, 8, 8))
    assert plain == {"c_weight": set(), "c_bias": {"bias", "1d"}, "w": {"1d"}}

    def graph(name):
        data = mx.sym.var("data")
        return mx.gluon.SymbolBlock(mx.sym.Convolution(data, kernel=(1, 1), num_filter=2, name=name), [data])

    two = mx.gluon.nn.HybridSequential()
    two.add(graph("a"), graph("b"))
    assert {n for n, k in _kinds_of(two, mx.nd.ones((1, 2, 4, 4))).items() if "bias" in k} == {"0.a_bias", "1.b_bias"}
    bare = mx.gluon.nn.Dense(3, in_units=2, use_bias=False)
    bare.initialize()
    with pytest.raises(RuleError, match=r"rule 1 \(kind \['bias'\] \(this model has none of them\)\) matches no"):
        make_plan(bare, [Rule(kind=["bias"], wd_mult=0.0)])


def test_preset_no_weight_decay_1d_is_timms_default():
    plan = make_plan(_mobile_net(), [NoWeightDecay1d()])
    assert {r.name for r in plan.rows if r.wd_mult == 0.0} == MOBILE["1d"]
    assert {r.name for r in plan.rows if r.wd_mult == 1.0} == {"0.weight", "2.weight", "3.weight", "6.weight"}
    assert [(p.label, p.rule.kind, p.rule.wd_mult, p.rule.note) for p in plan.rules] == [
        ("1.1", ["1d"], 0.0, "no weight decay on 1-D parameters (timm's default)")]


def test_wd_mult_zero_on_bias_and_norm_reaches_the_optimizer():
    """One SGD step with weight decay: MXNet's sgd_update is w <- (1 - lr·wd)·w - lr·g/batch; a
    bias or BatchNorm gamma under wd_mult 0 must take the step without the decay term."""
    net = _mobile_net()
    apply_plan(net, make_plan(net, [Rule(kind=["bias", "norm"], wd_mult=0.0)]))
    rs = np.random.RandomState(1)
    for p in net.collect_params().values():  # biases start at 0, where decay would not show
        p.set_data(mx.nd.array(rs.uniform(0.5, 1.5, p.shape)))
    lr, wd, n = 0.1, 0.5, 4
    params = trainable_params(net)
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": lr, "wd": wd, "momentum": 0.0})
    x = mx.nd.array(np.random.RandomState(0).randn(n, 3, 8, 8))
    y = mx.nd.array([0, 1, 2, 0])
    with mx.autograd.record():
        loss = mx.gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
    loss.backward()
    before = {k: p.data().asnumpy().astype(np.float64) for k, p in params.items()}
    grads = {k: p.grad().asnumpy().astype(np.float64) for k, p in params.items()}
    trainer.step(n)
    for k in ("0.bias", "1.gamma", "4.beta", "6.bias", "0.weight", "6.weight"):
        w, g = before[k], grads[k]
        decayed = k.endswith("weight")
        want = (1 - lr * wd * decayed) * w - lr * g / n
        other = (1 - lr * wd * (not decayed)) * w - lr * g / n
        got = params[k].data().asnumpy()
        tol = 4 * EPS32 * (np.abs(w) + lr * np.abs(g) / n)  # a few roundings at the size of the terms
        assert np.all(np.abs(got - want) <= tol), k
        assert np.any(np.abs(got - other) > 10 * tol), k  # the decay term is visible at this wd


# ----------------------------------------------------------------- layer_decay

def test_layer_decay_is_timms_formula_on_a_hand_built_stage_list():
    """timm: layer_max = the last id (the head), scale = max(min_scale, rate^(layer_max - id))."""
    order = ["stem", 1, 2, "neck", "head"]
    got = [(p.label, p.rule.stage, p.rule.lr_mult)
           for p in expand([LayerDecay(rate=0.5, min_scale=0.1)], order)]
    # 0.5^4 = 0.0625 is below the floor; 0.5^3, 0.5^2, 0.5^1, 0.5^0
    assert got == [("1.1", ["stem"], 0.1), ("1.2", [1], 0.125), ("1.3", [2], 0.25), ("1.4", ["neck"], 0.5),
                   ("1.5", ["head"], 1.0)]
    assert [p.rule.note for p in expand([LayerDecay(rate=0.5, min_scale=0.1)], order)][::4] == [
        "layer decay 0.5^4, at least 0.1", "layer decay 0.5^0, at least 0.1"]
    last = expand([LayerDecay(rate=0.5, last=2)], order)
    assert [(p.rule.stage, p.rule.lr_mult, p.rule.note) for p in last] == [
        ([2], 0.25, "layer decay 0.5^2"), (["neck"], 0.5, "layer decay 0.5^1"), (["head"], 1.0, "layer decay 0.5^0")]
    no_head = expand([LayerDecay(rate=0.5, last=2)], ["stem", 1, 2])  # a graph cut: no head
    assert [(p.rule.stage, p.rule.lr_mult) for p in no_head] == [([1], 0.5), ([2], 1.0)]
    some = expand([LayerDecay(rate=0.5, stage=[1])], order)
    assert [(p.rule.stage, p.rule.lr_mult) for p in some] == [([1], 0.125)]  # depth from the whole model
    with pytest.raises(RuleError, match=r"names stage 7, 8, which this model does not have \(it has stem, 1, 2, "
                                        r"neck, head\)"):
        expand([LayerDecay(rate=0.5, stage=[1, 7, 8])], order)
    with pytest.raises(RuleError, match=r"preset layer_decay spreads over the model's stages"):
        expand([LayerDecay(rate=0.5)])


RESNET_STAGES = {"features.0.": "stem", "features.1.": "stem", "features.4.": 1, "features.5.": 2,
                 "features.6.": 3, "features.7.": 4, "output.": "head"}  # Gluon ResNet v1's layout
DEPTH = {"stem": 5, 1: 4, 2: 3, 3: 2, 4: 1, "head": 0}


def test_layer_decay_on_resnet18_keeps_frozen_parameters_frozen_and_yields_to_later_rules():
    net = get_model("resnet18_v1", classes=5)
    net.initialize()
    net(mx.nd.zeros((1, *SHAPE)))
    plan = make_plan(net, [FreezeAllButHead(), LayerDecay(rate=0.75),
                           Rule(match=["output.bias"], lr_mult=3.0)], input_shape=SHAPE)
    for r in plan.rows:
        if r.aux:
            continue
        stage = next(s for prefix, s in RESNET_STAGES.items() if r.name.startswith(prefix))
        want = 3.0 if r.name == "output.bias" else 0.75 ** DEPTH[stage]
        assert r.lr_mult == pytest.approx(want, rel=1e-15), r.name
        assert r.decided_by["lr_mult"] == ("3" if r.name == "output.bias" else f"2.{6 - DEPTH[stage]}")
        assert (r.grad_req, r.decided_by["grad_req"]) == (("write", "1.2") if stage == "head" else ("null", "1.1"))
    assert plan.by_name()["features.0.weight"].lr_mult == 0.2373046875  # 0.75^5, exact in binary


def test_plan_command_shows_layer_decay_set_on_the_command_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    recipe = tmp_path / "r.yaml"  # recipes/resnet18_freeze.yaml's model, head and rules
    recipe.write_text("name: r\nmodel: {source: zoo:resnet18_v1, input_shape: [3, 48, 48]}\n"
                      "surgery: {head: {classes: 5}}\nrules:\n  - preset: freeze_all_but_head\n")
    code, out, err = run_cli(capsys, "plan", "--recipe", str(recipe), "--set",
                             "rules.2={preset: layer_decay, rate: 0.75}")
    assert code == 0, err
    assert "  2.1: stage=['stem'], lr_mult=0.2373046875  # layer decay 0.75^5" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("features.", "output."))}
    assert rows["features.0.weight"][5:7] == ["null", "0.237305"]
    assert rows["features.7.1.body.0.weight"][5:7] == ["null", "0.75"]
    assert rows["output.weight"][5:7] == ["write", "1"]
    code, out, err = run_cli(capsys, "plan", "--recipe", str(recipe), "--set",
                             "rules.2={preset: layer_decay, rate: 1.5}")
    assert code == 2 and "rules.2.rate" in err and "Traceback" not in err


# ----------------------------------------------------------------- fine_tune

def test_fine_tune_expands_to_a_frozen_phase_and_discriminative_unfreezing():
    order = ["stem", 1, 2, "head"]
    rules = expand([FineTune(freeze_epochs=2, base_lr_div=8, train_bn=False, from_epoch=1)], order)
    got = [(p.label, p.rule.model_dump(exclude_defaults=True, exclude={"note", "lr_mult"}), p.rule.lr_mult)
           for p in rules]
    later = {"from_epoch": 3}  # the preset's 1 + freeze_epochs 2
    assert got == [
        ("1.1", {"match": ["*"], "grad_req": "null", "from_epoch": 1}, None),
        ("1.2", {"type": ["BatchNorm"], "bn": "frozen", "optional": True, "from_epoch": 1}, None),
        ("1.3", {"stage": ["head"], "grad_req": "write", "from_epoch": 1}, None),
        ("1.4", {"match": ["*"], "grad_req": "write", **later}, None),
        ("1.5", {"type": ["BatchNorm"], "bn": "train", "optional": True, **later}, None),
        # slice(lr/8, lr) over 4 stages: 8^-1, 8^-2/3, 8^-1/3, 1
        ("1.6", {"stage": ["stem"], **later}, pytest.approx(0.125, rel=1e-15)),
        ("1.7", {"stage": [1], **later}, pytest.approx(0.25, rel=1e-15)),
        ("1.8", {"stage": [2], **later}, pytest.approx(0.5, rel=1e-15)),
        ("1.9", {"stage": ["head"], **later}, 1.0)]
    assert [p.rule.note for p in rules] == [
        "fine_tune: freeze the body for 2 epoch(s)", "fine_tune: BatchNorm frozen", "fine_tune: train the head",
        "fine_tune: unfreeze", "fine_tune: BatchNorm trains", "fine_tune: discriminative lr 1/8^(3/3)",
        "fine_tune: discriminative lr 1/8^(2/3)", "fine_tune: discriminative lr 1/8^(1/3)",
        "fine_tune: discriminative lr 1/8^(0/3)"]
    default = expand([FineTune()], order)  # fastai's defaults: 1 epoch, lr_mult 100, train_bn
    assert default[1].rule.model_dump(exclude_defaults=True, exclude={"note"}) == {
        "type": ["BatchNorm"], "grad_req": "write", "bn": "train", "optional": True}  # a BN-free model has none
    assert [p.rule.from_epoch for p in default] == [0, 0, 0] + [1] * 5
    assert default[4].rule.lr_mult == pytest.approx(0.01, rel=1e-15)
    assert [p.rule.note for p in default[:2]] == ["fine_tune: freeze the body for 1 epoch(s)",
                                                  "fine_tune: BatchNorm trains"]
    # two stages: the stem gets the whole 1/base_lr_div; one stage: nothing to spread over
    assert [p.rule.lr_mult for p in expand([FineTune()], ["stem", "head"])[4:]] == [0.01, 1.0]
    assert [p.rule.lr_mult for p in expand([FineTune()], ["head"])[4:]] == [1.0]
    with pytest.raises(RuleError, match=r"^preset fine_tune spreads over the model's stages: it needs the model's "
                                        r"input shape \(model\.input_shape\)"):
        expand([FineTune()])


def test_fine_tune_run_trains_the_head_then_everything(tmp_path):
    from gluontl.train.loop import finetune
    from tests.helpers import checkpoint_params, tiny_recipe, tiny_symbol

    prefix = tiny_symbol(tmp_path)

    def recipe(epochs):
        return parse_recipe(tiny_recipe(prefix, name="ft", rules=[{"preset": "fine_tune", "freeze_epochs": 1}],
                                        epochs=epochs, lr=0.05))

    init = {k.split(":", 1)[1]: v.asnumpy() for k, v in mx.nd.load(f"{prefix}-0000.params").items()}
    head = {k for k in init if "dense" in k}
    assert len(head) == 2 and len(init) == 6

    first = finetune(recipe(1), runs_root=tmp_path / "runs", quiet=True)
    one = checkpoint_params(first.run_dir)
    assert {k for k in init if not np.array_equal(one[k], init[k])} == head  # epoch 1: the head alone
    second = finetune(recipe(2), runs_root=tmp_path / "runs", resume=first.run_dir, quiet=True)
    two = checkpoint_params(second.run_dir)
    assert {k for k in init if not np.array_equal(two[k], one[k])} == set(init)  # epoch 2: everything


# ----------------------------------------------------------------- validation names the key

@pytest.mark.parametrize("rule, key", [
    ({"preset": "layer_decay", "rate": 1.5}, "rules.1.rate"),
    ({"preset": "layer_decay", "rate": 0.0}, "rules.1.rate"),
    ({"preset": "layer_decay", "rate": 0.7, "min_scale": -0.1}, "rules.1.min_scale"),
    ({"preset": "layer_decay", "rate": 0.7, "last": 0}, "rules.1.last"),
    ({"preset": "layer_decay"}, "needs rate"),
    ({"preset": "layer_decay", "rate": 0.7, "last": 2, "stage": [3]}, "stage: [...] or last: N"),
    ({"preset": "layer_decay", "rate": 0.7, "freeze_epochs": 2}, "takes no key freeze_epochs"),
    ({"preset": "fine_tune", "freeze_epochs": 0}, "rules.1.freeze_epochs"),
    ({"preset": "fine_tune", "base_lr_div": 0.5}, "rules.1.base_lr_div"),
    ({"preset": "freeze_all_but_head", "match": "x"}, "takes no key match"),
    ({"kind": ["bais"], "wd_mult": 0}, "rules.1.kind.1"),
    ({"kind": "bias", "rate": 0.5, "wd_mult": 0}, "rate belongs to preset layer_decay"),
])
def test_bad_rule_keys_are_named(rule, key):
    with pytest.raises(RecipeError) as e:
        parse_recipe({"name": "x", "model": {"source": "zoo:resnet18_v1"}, "rules": [rule]})
    assert key in str(e.value)


def test_kind_alone_is_a_selector_and_a_string_is_a_list():
    def rules(*given):
        return parse_recipe({"name": "x", "model": {"source": "zoo:resnet18_v1"}, "rules": list(given)}).rules

    assert rules({"kind": "norm", "wd_mult": 0})[0].kind == ["norm"]
    with pytest.raises(RecipeError, match=r"'rules\.2\.kind\.1': Input should be 'bias', 'norm', 'depthwise' or "
                                          r"'1d' \(did you mean 'bias'\?\)"):
        rules({"kind": "norm", "wd_mult": 0}, {"kind": "bais", "wd_mult": 0})


def test_runs_from_before_the_new_rule_keys_keep_their_digest():
    """A checkpoint records its recipe's digest; rules that use none of the keys added here hash as
    they did before (the value below was computed by gluontl before they existed), so those runs
    still resume."""
    def digest(*rules):
        return parse_recipe({"name": "d", "model": {"source": "zoo:resnet18_v1"}, "rules": list(rules),
                             "data": {"source": "demo:digits"}, "train": {"epochs": 3}}).digest("rules")

    before = ({"preset": "freeze_all_but_head"}, {"match": "features.7.*", "lr_mult": 0.1, "from_epoch": 2})
    assert digest(*before) == "446b701eb4c11eb3"
    assert digest(*before, {"kind": "bias", "wd_mult": 0}) != digest(*before, {"match": "*bias", "wd_mult": 0})
    assert digest({"preset": "layer_decay", "rate": 0.5}) != digest({"preset": "layer_decay", "rate": 0.75})
