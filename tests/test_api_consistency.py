"""One convention across the API and the CLI (issue 11, item 7).

Rules are dicts or ``Rule`` objects; shapes are C,H,W or N,C,H,W wherever the meaning is not in
doubt and refused clearly where it is; ``--set rules.N.FIELD`` numbers rules from 1 like the
plan, and errors a ``--set`` caused name it; misspelt names get a close match; zoo models never
fetch weights unless ``pretrained: true``.
"""
import json
import os
import socket
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
import yaml
from gluoncv.model_zoo import get_model, model_store
from mxnet.gluon.model_zoo import model_store as mx_model_store
from tests.helpers import ONNX_FIXTURES, assert_one_paragraph, ort_run, run_cli

import gluontl
from gluontl import sources
from gluontl.errors import ExportError, ModelSourceError, OnnxImportError, RecipeError, RuleError
from gluontl.naming import named_params
from gluontl.recipe import Rule, parse_recipe
from gluontl.rules import apply_plan, make_plan

SHAPE = (3, 32, 32)
ONNX = ONNX_FIXTURES / "resnet_legacy_op13.onnx"  # input 'x', (batch, 3, 32, 32)
FREEZE_DICTS = [{"match": "*", "grad_req": "null", "bn": "frozen"}, {"stage": "head", "grad_req": "write", "lr_mult": 0.5}]
FREEZE_RULES = [Rule(match=["*"], grad_req="null", bn="frozen"), Rule(stage=["head"], grad_req="write", lr_mult=0.5)]


@pytest.fixture()
def resnet():
    net = get_model("resnet18_v1", classes=5)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, *SHAPE)))
    return net


# ----------------------------------------------------------------------------- rules as dicts


def test_rules_as_dicts_plan_and_apply_like_rule_objects(resnet):
    from_dicts = make_plan(resnet, FREEZE_DICTS, input_shape=SHAPE)
    assert from_dicts.settings() == make_plan(resnet, FREEZE_RULES, input_shape=SHAPE).settings()
    mixed = make_plan(resnet, [FREEZE_DICTS[0], FREEZE_RULES[1]], input_shape=SHAPE)
    assert mixed.settings() == from_dicts.settings()
    apply_plan(resnet, from_dicts)
    params = named_params(resnet)
    # worked out from the rules: everything frozen, then the classifier (output.*) trains at lr 0.5
    assert params["output.weight"].param.grad_req == "write" and params["output.weight"].param.lr_mult == 0.5
    assert params["features.7.1.body.0.weight"].param.grad_req == "null"
    assert params["features.1.gamma"].param.grad_req == "null"
    assert from_dicts.by_name()["output.weight"].decided_by["grad_req"] == "2"


@pytest.mark.parametrize("rules, needles", [
    ([FREEZE_DICTS[0], {"match": "*", "lr_mul": 2}], ["rule 2 is invalid", "unknown key 'lr_mul'",
                                                       "did you mean 'lr_mult'?"]),
    ([{"type": "BatchNorm", "bn": "frozn"}], ["rule 1 is invalid", "'bn'", "did you mean 'frozen'?"]),
    ([{"type": "Conv2D", "grad_req": "null"}], ["rule 1", "unknown layer type 'Conv2D'", "did you mean 'Conv'?"]),
    ([{"preset": "freeze_all_but_heads"}], ["rule 1", "did you mean 'freeze_all_but_head'?"]),
    ([FREEZE_RULES[0], "freeze"], ["rule 2 is a str", "dict"]),
])
def test_bad_rules_name_the_rule_from_1_and_suggest(resnet, rules, needles):
    with pytest.raises(RuleError) as e:
        make_plan(resnet, rules, input_shape=SHAPE)
    for n in needles:
        assert n in str(e.value), (n, str(e.value))


# ----------------------------------------------------------------------------- input shapes


def test_make_plan_takes_chw_and_nchw_alike(resnet):
    stages = {n: r.stage for n, r in make_plan(resnet, [], input_shape=SHAPE).by_name().items()}
    # independent of the code under test: ResNet-18's last stage is features.7, its classifier output
    assert stages["features.7.1.body.0.weight"] == 4 and stages["output.weight"] == "head"
    assert stages["features.0.weight"] == "stem"
    for shape in [(1, *SHAPE), (4, *SHAPE), {"data": (1, *SHAPE)}]:
        plan = make_plan(resnet, FREEZE_DICTS, input_shape=shape)
        assert {n: r.stage for n, r in plan.by_name().items()} == stages, shape
        assert plan.settings() == make_plan(resnet, FREEZE_DICTS, input_shape=SHAPE).settings()


@pytest.mark.parametrize("shape", [(32, 32), (1, 1, 3, 32, 32), (3, 0, 32), {"a": (1, *SHAPE), "b": (1, *SHAPE)}])
def test_other_shapes_are_refused_for_stages_and_noted_otherwise(resnet, shape):
    with pytest.raises(RuleError, match="C,H,W|inputs"):
        make_plan(resnet, [{"stage": 4, "lr_mult": 0.1}], input_shape=shape)
    plan = make_plan(resnet, [], input_shape=shape)  # no stage selector: the plan says why the column is empty
    assert all(r.stage is None for r in plan.rows)
    assert any(n.startswith("no stage column") for n in plan.notes), plan.notes


def test_import_onnx_takes_chw_and_nchw_alike():
    x = np.random.RandomState(5).uniform(-1, 1, (2, *SHAPE)).astype(np.float32)
    ref = ort_run(ONNX, x)[0]
    for shapes in ({"x": SHAPE}, {"x": (None, *SHAPE)}):
        block = gluontl.import_onnx(ONNX, input_shapes=shapes)
        got = block(mx.nd.array(x)).asnumpy()  # the file's free batch stays free: batch 2 runs
        # conv sums of <= 4608 float32 products, re-associated: far below 1e-4 of the logit scale
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    with pytest.raises(OnnxImportError, match="has rank 2 but .* declares rank 4"):
        gluontl.import_onnx(ONNX, input_shapes={"x": (32, 32)})


def test_batch_first_shapes_refuse_chw_where_it_could_be_misread(tmp_path):
    """Zoo and Gluon blocks declare no rank: (3, 32, 32) could be C,H,W or a batch of gray
    32-wide rows, so it is refused with the shape named, never guessed."""
    with pytest.raises(ModelSourceError, match=r"data \(3, 32, 32\) \(batch first\)"):
        sources.load_model("mobilenet0.25", input_shapes={"data": SHAPE})
    net = sources.load_model("mobilenet0.25", input_shapes={"data": (1, *SHAPE)})
    with pytest.raises(ExportError, match=r"\(3, 32, 32\); give a batch-1 shape"):
        gluontl.export_onnx(net, tmp_path / "m.onnx", {"data": SHAPE})
    assert not (tmp_path / "m.onnx").exists()


# ----------------------------------------------------------------------------- --set and key paths

BASE = {"name": "t", "model": {"source": "zoo:resnet18_v1", "input_shape": list(SHAPE)}, "rules": FREEZE_DICTS}


def test_set_addresses_rules_from_1_appends_and_leaves_the_data_alone():
    before = yaml.safe_dump(BASE)
    r = parse_recipe(BASE, "r.yaml", ["rules.2.lr_mult=0.1", "rules.1.grad_req=null",
                                      "rules.3={type: BatchNorm, bn: train}", "model.input_shape.2=48"])
    assert r.rules[0] == Rule(match=["*"], grad_req="null", bn="frozen")  # bare null means the string here
    assert r.rules[1] == Rule(stage=["head"], grad_req="write", lr_mult=0.1)
    assert r.rules[2] == Rule(type=["BatchNorm"], bn="train")
    assert r.model.input_shape == (3, 48, 32)
    assert yaml.safe_dump(BASE) == before
    r = parse_recipe({"name": "t", "model": BASE["model"]}, "r.yaml", ["rules.1.match=x*", "rules.1.lr_mult=2"])
    assert r.rules == [Rule(match=["x*"], lr_mult=2)]


@pytest.mark.parametrize("sets, needles", [
    (["rules.2.lr_mult=-1"], ["--set 'rules.2.lr_mult=-1'", "'rules.2.lr_mult'", "greater than or equal to 0"]),
    (["rules.4.lr_mult=1"], ["--set 'rules.4.lr_mult=1'", "list of 2 item(s)", "rules.1 to rules.2", "rules.3 to add"]),
    (["rules.0.lr_mult=1"], ["--set 'rules.0.lr_mult=1'", "numbered from 1"]),
    (["rules.x.lr_mult=1"], ["--set 'rules.x.lr_mult=1'", "numbered from 1"]),
    (["rules.1.lr_mul=1"], ["unknown key 'rules.1.lr_mul'", "did you mean 'lr_mult'?"]),
    (["rules.2.bn=fozen"], ["'rules.2.bn'", "did you mean 'frozen'?"]),
    (["trian.epochs=1"], ["unknown key 'trian'", "did you mean 'train'?"]),
    (["train.epoch=1"], ["unknown key 'train.epoch'", "did you mean 'epochs'?"]),
    (["name.x=1"], ["--set 'name.x=1'", "not a section"]),
    (["rules.1"], ["--set 'rules.1'", "section.key=value"]),
])
def test_set_errors_name_the_set_not_the_file(sets, needles):
    with pytest.raises(RecipeError) as e:
        parse_recipe(BASE, "my_recipe.yaml", sets)
    msg = str(e.value)
    assert "my_recipe.yaml" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)


def test_file_errors_number_rules_from_1_and_mark_set_ones():
    data = dict(BASE, rules=[*FREEZE_DICTS, {"type": "BatchNorm", "bn": "fixed"}])
    with pytest.raises(RecipeError) as e:
        parse_recipe(data, "my_recipe.yaml", ["train.lr=0"])
    msg = str(e.value)
    assert msg.startswith("my_recipe.yaml: invalid recipe: ") and "'rules.3.bn'" in msg, msg
    assert "'train.lr': Input should be greater than 0 (got 0) (from --set 'train.lr=0')" in msg, msg


def test_unknown_zoo_name_suggests_close_ones():
    with pytest.raises(ModelSourceError, match="resnet18_v1"):
        sources.load_model("zoo:resnet18_v9")


# ----------------------------------------------------------------------------- CLI


@pytest.fixture()
def recipe(tmp_path):
    path = tmp_path / "my_recipe.yaml"
    path.write_text(yaml.safe_dump(BASE))
    return str(path)


def test_cli_plan_with_set_on_a_rule(recipe, capsys):
    code, out, err = run_cli(capsys, "plan", "-r", recipe, "--set", "rules.2.lr_mult=0.25", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert [r["label"] for r in plan["rules"]] == ["1", "2"] and plan["rules"][1]["lr_mult"] == 0.25
    rows = {p["name"]: p for p in plan["params"]}
    assert rows["output.weight"]["lr_mult"] == 0.25 and rows["output.weight"]["decided_by"]["lr_mult"] == "2"
    assert rows["features.0.weight"]["lr_mult"] == 1.0


@pytest.mark.parametrize("argv, needles, absent", [
    (["--set", "rules.5.grad_req=write"], ["--set 'rules.5.grad_req=write'", "list of 2 item(s)"], "my_recipe.yaml"),
    (["--set", "rules.2.lr_mult=-1"], ["--set 'rules.2.lr_mult=-1'", "'rules.2.lr_mult'"], "my_recipe.yaml"),
    (["--set", "rules.1.match=nothing*"], ["rule 1 (match ['nothing*']) matches no parameter",
                                           "changed by --set rules.1.match=nothing*"], None),
    (["--set", "rules.1.grad_req=freeze"], ["'rules.1.grad_req'", "'write', 'null' or 'add'"], "my_recipe.yaml"),
])
def test_cli_set_errors_exit_2_naming_the_set(recipe, capsys, argv, needles, absent):
    code, out, err = run_cli(capsys, "plan", "-r", recipe, *argv)
    assert_one_paragraph(code, out, err, needles)
    assert absent is None or absent not in err


def test_cli_set_error_as_a_subprocess(recipe):
    r = subprocess.run([sys.executable, "-m", "gluontl", "plan", "-r", recipe, "--set", "rules.9.lr_mult=1"],
                       capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
    assert_one_paragraph(r.returncode, r.stdout, r.stderr, ["--set 'rules.9.lr_mult=1'", "rules.1 to rules.2"])
    assert "my_recipe.yaml" not in r.stderr


@pytest.mark.parametrize("pattern, needles", [("xyz", ["No model-zoo name contains 'xyz'", "332 names"]),
                                              ("resnet18_v9", ["'resnet18_v9'", "close names:", "resnet18_v1,"])])
def test_cli_zoo_without_a_match_exits_2(capsys, pattern, needles):
    code, out, err = run_cli(capsys, "zoo", pattern)
    assert_one_paragraph(code, out, err, needles)
    assert out == ""


def test_cli_zoo_lists_matches(capsys):
    from gluoncv.model_zoo import get_model_list

    code, out, err = run_cli(capsys, "zoo", "ResNet18_V1")
    assert code == 0, err
    assert out.split() == sorted({n.lower() for n in get_model_list() if "resnet18_v1" in n.lower()})
    assert "resnet18_v1b" in out.split()


def test_cli_inspect_defaults_to_the_zoo_models_own_size(capsys):
    code, out, err = run_cli(capsys, "inspect", "inceptionv3", "--nodes")
    assert code == 0, err
    rows = out.strip().splitlines()
    # Inception-v3 is made for 299x299: its stem conv (3x3, stride 2, no padding) gives (299 - 3) // 2 + 1 = 149
    assert rows[0].split()[-1] == "1x32x149x149" and rows[-1].split()[-1] == "1x1000"
    code, out, err = run_cli(capsys, "inspect", "inceptionv3", "--nodes", "--input-shape", "3,224,224")
    assert_one_paragraph(code, out, err, ["zoo:inceptionv3", "(1, 3, 224, 224)", "--input-shape"])


# ----------------------------------------------------------------------------- no downloads


@pytest.fixture()
def offline(monkeypatch, tmp_path):
    """No network and no zoo weight files: every attempt is recorded and fails."""
    attempts = []

    def refuse(what):
        def blocked(*args, **kwargs):
            attempts.append((what, args[:2]))
            raise AssertionError(f"{what} attempted: {args[:2]}")
        return blocked

    monkeypatch.setattr(socket.socket, "connect", refuse("network connect"))
    monkeypatch.setattr(model_store, "get_model_file", refuse("gluoncv weight file"))
    monkeypatch.setattr(mx_model_store, "get_model_file", refuse("mxnet weight file"))
    for var in ("MXNET_HOME", "GLUONTL_HOME"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    yield attempts
    assert not any(tmp_path.rglob("*")), "something was written to the model caches"


def test_offline_guard_catches_a_backbone_download(offline):
    with pytest.raises(AssertionError, match="weight file attempted"):  # GluonCV's own default: pretrained_base=True
        get_model("yolo3_mobilenet1.0_voc", pretrained=False)
    assert offline


@pytest.mark.parametrize("name", ["ssd_512_resnet50_v1_voc", "yolo3_mobilenet1.0_voc", "faster_rcnn_resnet50_v1b_voc",
                                  "deeplab_resnet101_voc", "center_net_resnet18_v1b_voc", "resnet18_v1"])
def test_zoo_models_download_nothing_unless_pretrained(offline, name):
    net = sources.zoo_block(name, None, {}, False, mx.cpu())  # the constructor is where GluonCV fetches backbones
    assert isinstance(net, mx.gluon.HybridBlock)
    assert offline == []


def test_zoo_detector_builds_offline_through_load_model(offline):
    net = sources.load_model("zoo:ssd_512_mobilenet1.0_voc", input_shapes={"data": (1, 3, 128, 128)})
    params = named_params(net)
    # vectors GluonCV's symbol feature expander leaves without an initializer: BN gamma ones, beta zeros
    gammas = [e.param.data().asnumpy() for n, e in params.items() if "expand_trans_bn0_gamma" in e.param.name]
    betas = [e.param.data().asnumpy() for n, e in params.items() if "expand_trans_bn0_beta" in e.param.name]
    assert gammas and all((g == 1).all() for g in gammas) and betas and all((b == 0).all() for b in betas)
    assert offline == []


@pytest.mark.parametrize("source, want", [("zoo:inceptionv3", (3, 299, 299)), ("resnet18_v1", (3, 224, 224)),
                                          ("zoo:ssd_512_resnet50_v1_voc", (3, 512, 512))])
def test_a_recipe_without_input_shape_takes_the_zoo_familys_size(source, want):
    from gluontl.recipe import ModelSpec

    assert ModelSpec(source=source).input_shape == want
    assert ModelSpec(source=source, input_shape=(3, 64, 64)).input_shape == (3, 64, 64)  # given: kept
