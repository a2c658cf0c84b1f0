"""Bad recipes: every case exits with code 2 and one clear paragraph, never a traceback."""
import math
import subprocess
import sys
import textwrap

import mxnet as mx
import pytest
from gluoncv.model_zoo import get_model

from tests.helpers import run_cli

GOOD = """
name: t
model: {source: "zoo:resnet18_v1", input_shape: [3, 32, 32]}
surgery: {head: {classes: 5}}
rules:
  - preset: freeze_all_but_head
"""


@pytest.fixture()
def weights(tmp_path):
    net = get_model("resnet18_v1", classes=5)
    net.initialize()
    net(mx.nd.zeros((1, 3, 32, 32)))
    path = tmp_path / "w.params"
    net.save_parameters(str(path))
    return path


BAD = {
    "unknown_top_key": (GOOD + "trian: {epochs: 3}\n", ["unknown key 'trian'"]),
    "unknown_nested_key": (GOOD.replace("input_shape", "inputshape"), ["unknown key 'model.inputshape'"]),
    "bad_grad_req": (GOOD + "  - {match: '*', grad_req: freeze}\n", ["rules.2.grad_req", "'write', 'null' or 'add'"]),
    "bad_bn_value": (GOOD + "  - {type: BatchNorm, bn: fixed}\n", ["rules.2.bn", "'train' or 'frozen'"]),
    "rule_matches_nothing": (GOOD + "  - {match: 'layer4.*', grad_req: 'null'}\n", ["rule 2", "layer4.*", "matches no parameter"]),
    "bn_on_conv": (GOOD + "  - {type: Conv, bn: frozen}\n", ["rule 2 sets bn: frozen", "no BatchNorm"]),
    "wrong_type_lr": (GOOD + "train: {lr: fast}\n", ["train.lr", "greater than 0, or auto"]),
    "negative_lr_mult": (GOOD + "  - {match: '*', lr_mult: -1}\n", ["rules.2.lr_mult", "greater than or equal to 0"]),
    "missing_weights": (GOOD.replace('input_shape: [3, 32, 32]', 'input_shape: [3, 32, 32], weights: nope.params'),
                        ["Weights file 'nope.params' does not exist"]),
    "yaml_syntax": ("name: t\nmodel: {source: zoo:resnet18_v1\n", ["not valid YAML"]),
    "not_a_mapping": ("- just\n- a list\n", ["must be a YAML mapping"]),
    "unknown_source_scheme": (GOOD.replace('"zoo:resnet18_v1"', '"hub:resnet18"'), ["model.source", "zoo:NAME"]),
    "unknown_zoo_name": (GOOD.replace("resnet18_v1", "resnet19_v1"), ["not a Gluon or GluonCV", "Close matches"]),
    "rule_without_selector": (GOOD + "  - {grad_req: 'null'}\n", ["needs a selector"]),
    "rule_without_setting": (GOOD + "  - {match: '*'}\n", ["needs at least one setting"]),
    "unknown_layer_type": (GOOD + "  - {type: Convolution, grad_req: 'null'}\n", ["unknown layer type 'Convolution'", "valid: Conv"]),
    "unknown_preset": (GOOD + "  - {preset: freeze_everything}\n", ["unknown preset", "freeze_all_but_head"]),
    "bad_ctx": (GOOD + "train: {ctx: 'tpu:0'}\n", ["train.ctx", "gpu:0"]),
    "ctx_device_twice": (GOOD + "train: {ctx: 'cpu:0,0'}\n", ["train.ctx", "lists a device twice"]),
    "bare_source_typo": (GOOD.replace('"zoo:resnet18_v1"', '"resnet19_v1"'),
                         ["model.source", "'resnet19_v1' is not a file", "resnet18_v1", "zoo:NAME"]),
    "bare_source_missing_file": (GOOD.replace('"zoo:resnet18_v1"', '"models/net.onnx"'),
                                 ["ONNX file 'models/net.onnx' does not exist"]),
    "yaml_alias_bomb": ("a: &a [x, x]\nb: [*a, *a]\nname: t\n", ["aliases"]),
    "stage_out_of_range": (GOOD + "  - {stage: 7, grad_req: 'null'}\n", ["stage [7]", "matches no parameter"]),
    "bad_name": (GOOD.replace("name: t", "name: 'a b/c'"), ["'name'", "pattern"]),
    "mismatch_not_expected": (None, ["shape mismatch", "expect_mismatch"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_recipe_exits_2_with_one_paragraph(case, tmp_path, capsys, weights):
    text, needles = BAD[case]
    if text is None:  # a 10-class file restored into a 5-class head without declaring it
        net = get_model("resnet18_v1", classes=10)
        net.initialize()
        net(mx.nd.zeros((1, 3, 32, 32)))
        net.save_parameters(str(tmp_path / "w10.params"))
        text = GOOD.replace('input_shape: [3, 32, 32]', f'input_shape: [3, 32, 32], weights: "{tmp_path}/w10.params"')
    path = tmp_path / "r.yaml"
    path.write_text(textwrap.dedent(text))
    code, out, err = run_cli(capsys, "plan", "--recipe", str(path))
    assert code == 2, (out, err)
    assert "Traceback" not in err and err.startswith("error: ")
    flat = " ".join(err.split())
    for n in needles:
        assert n in flat, (n, flat)
    assert "\n\n" not in err.strip()


def test_missing_recipe_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "plan", "--recipe", str(tmp_path / "none.yaml"))
    assert code == 2 and "does not exist" in " ".join(err.split())  # wrapped at 100 columns


def test_plan_json_lists_every_parameter(capsys, tmp_path, weights):
    import json
    path = tmp_path / "r.yaml"
    path.write_text(GOOD.replace('input_shape: [3, 32, 32]', f'input_shape: [3, 32, 32], weights: "{weights}"'))
    code, out, err = run_cli(capsys, "plan", "--recipe", str(path), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert len(data["params"]) == 102
    trainable = {p["name"] for p in data["params"] if p["grad_req"] == "write" and not p["aux"]}
    assert trainable == {"output.weight", "output.bias"}
    assert data["totals"]["trainable"] == 5 * 512 + 5
    assert data["params"][1]["decided_by"]["bn"] == "1.1" and data["params"][1]["bn"] == "frozen"


def test_bare_zoo_name_in_a_recipe_is_the_zoo_model(capsys, tmp_path, weights):
    path = tmp_path / "r.yaml"
    path.write_text(GOOD.replace('"zoo:resnet18_v1", input_shape: [3, 32, 32]',
                                 f'resnet18_v1, input_shape: [3, 32, 32], weights: "{weights}"'))
    code, out, err = run_cli(capsys, "plan", "--recipe", str(path), "--json")
    assert code == 0, err
    import json
    assert json.loads(out)["totals"]["trainable"] == 5 * 512 + 5


def test_console_script_help_and_bad_recipe_subprocess(tmp_path):
    exe = [sys.executable, "-m", "gluontl"]
    h = subprocess.run(exe + ["--help"], capture_output=True, text=True)
    assert h.returncode == 0
    for cmd in ("plan", "inspect", "zoo"):
        assert cmd in h.stdout
    (tmp_path / "r.yaml").write_text("name: t\nmodel: {source: 'zoo:resnet18_v1', bogus: 1}\n")
    r = subprocess.run(exe + ["plan", "--recipe", str(tmp_path / "r.yaml")], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "unknown key 'model.bogus'" in " ".join(r.stderr.split())


RECIPES = sorted((__import__("pathlib").Path(__file__).parent.parent / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=[p.stem for p in RECIPES])
def test_bundled_recipes_plan(path, capsys, monkeypatch):
    """Every recipe in recipes/ validates and plans (before any pretraining has run)."""
    monkeypatch.chdir(path.parent.parent)
    if "efficientnet_lite0_imagenet.onnx" in path.read_text():  # scripts/demo.sh makes this model first
        from gluontl.convert.efficientnet_lite import ensure_imagenet_onnx
        ensure_imagenet_onnx()
    code, out, err = run_cli(capsys, "plan", "--recipe", str(path.relative_to(path.parent.parent)), "--json")
    assert code == 0, err
    import json
    plan = json.loads(out)
    assert 0 < plan["totals"]["trainable"] and plan["totals"]["params"] == len(plan["params"])
    if path.stem == "resnet18_freeze":
        assert plan["totals"]["trainable"] == 5 * 512 + 5
        assert all(p["bn"] == "frozen" for p in plan["params"] if p["layer_type"] == "BatchNorm")
        assert plan["feature_cache"].startswith("feature cache: on")
    if path.stem == "elpv_efficientnet_lite0":  # the last stage, conv_head and the new head train
        import onnx
        from gluontl.convert.efficientnet_lite import ensure_imagenet_onnx
        graph = onnx.load(str(ensure_imagenet_onnx())).graph
        stats = {n.input[i] for n in graph.node if n.op_type == "BatchNormalization" for i in (3, 4)}
        want = sum(math.prod(t.dims) for t in graph.initializer
                   if t.name not in stats and t.name.startswith(("blocks.15.", "conv_head.")))
        assert plan["totals"]["trainable"] == want + 1280 * 2 + 2
        assert all(p["bn"] == "frozen" for p in plan["params"] if p["layer_type"] == "BatchNorm")
        assert plan["feature_cache"].startswith("feature cache: on")


def test_recipes_cannot_write_outside_the_working_directory(tmp_path, capsys, monkeypatch):
    """Where it matters — files gluontl writes — recipe paths stay inside cwd or $GLUONTL_HOME."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    (tmp_path / "r.yaml").write_text(GOOD.replace('input_shape: [3, 32, 32]',
                                                  'input_shape: [3, 32, 32], weights: ../escape.params, '
                                                  'weights_from: r.yaml') + "data: {source: 'demo:digits'}\n")
    code, _, err = run_cli(capsys, "finetune", "--recipe", "r.yaml", "-q")
    assert code == 2 and "outside the working directory" in " ".join(err.split())
    assert not (tmp_path.parent / "escape.params").exists()
    (tmp_path / "n.yaml").write_text(GOOD.replace("name: t", "name: '..'"))
    code, _, err = run_cli(capsys, "plan", "--recipe", "n.yaml")
    assert code == 2 and "'name'" in " ".join(err.split())


@pytest.mark.parametrize("command", ["plan", "finetune"])
def test_one_class_folder_is_refused_before_training(command, tmp_path, capsys, weights, monkeypatch):
    """One class: softmax over one logit is 1.0 for any image, so a run would 'reach' val_acc 1.0."""
    import numpy as np
    from PIL import Image

    rs = np.random.RandomState(0)
    for i in range(6):
        (tmp_path / "imgs" / "cat").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rs.randint(0, 256, (32, 32, 3), dtype=np.uint8)).save(tmp_path / "imgs" / "cat" / f"{i}.png")
    path = tmp_path / "r.yaml"
    path.write_text(GOOD.replace('input_shape: [3, 32, 32]', f'input_shape: [3, 32, 32], weights: "{weights}"')
                    + f"data: {{source: 'folder:{tmp_path / 'imgs'}', batch_size: 2}}\ntrain: {{epochs: 1}}\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, command, "--recipe", str(path))
    text = " ".join(err.split())
    assert code == 2, (out, err)
    assert "one class ('cat')" in text and "at least two" in text and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    if command == "plan":  # one class listed of a demo set with ten
        code, _, err = run_cli(capsys, "plan", "--recipe", str(path), "--set", "data.source=demo:digits",
                               "--set", "data.classes=[5]")
        assert code == 2 and "one class ('5')" in " ".join(err.split())
