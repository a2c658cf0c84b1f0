"""Hostile input to every command: exit code 2 and one paragraph naming the culprit, never a traceback.

Most cases run in-process through ``gluontl.cli.main`` (the console script's entry point); a
representative few run as ``python -m gluontl`` subprocesses. The bare model forms (a path,
a symbol prefix, a zoo name) are checked to work, against independent references.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests import helpers
from tests.helpers import assert_one_paragraph, ort_run, run_cli
import mxnet as mx
import numpy as np
import onnx
import pytest
import yaml
from PIL import Image

from gluontl import cli
from gluontl.recipe import ModelSpec, parse_recipe, resolve_source

FIXTURES = Path(__file__).parent / "onnx" / "fixtures"
ONNX = FIXTURES / "resnet_legacy_op13.onnx"  # input 'x', (batch, 3, 32, 32)
DYN = FIXTURES / "resnet_legacy_op13_dynhw.onnx"  # input 'x', (batch, 3, height, width)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Hostile files, a tiny symbol model and a real (one-epoch) run folder, plus broken copies of it."""
    d = tmp_path_factory.mktemp("hostile")
    rs = np.random.RandomState(0)
    for name in ("empty.onnx", "empty.yaml", "empty", "empty.png"):
        (d / name).write_bytes(b"")
    for name in ("garbage.onnx", "garbage.yaml", "garbage.png", "garbage"):
        (d / name).write_bytes(rs.bytes(4096))
    Image.fromarray(rs.randint(0, 255, (16, 16, 3)).astype(np.uint8)).save(d / "photo.jpg")
    Image.fromarray(rs.randint(0, 255, (16, 16, 3)).astype(np.uint8)).save(d / "digit.png")
    mx.nd.save(str(d / "w.params"), {"w": mx.nd.ones((2, 2))})
    (d / "adir").mkdir()
    (d / "badsym-symbol.json").write_text("{not json")
    mx.nd.save(str(d / "badsym-0000.params"), {"arg:w": mx.nd.ones((2,))})
    sym = helpers.tiny_symbol(d, deep=False)
    good = {"name": "tiny", "model": {"source": sym, "input_shape": [3, 16, 16]}, "data": helpers.DIGITS_5_9,
            "train": {"epochs": 1, "log_every": 5}, "export": {"formats": []}}

    def recipe(name, **model):
        data = dict(good, model=dict(good["model"], **model))
        (d / name).write_text(yaml.safe_dump(data))

    recipe("good.yaml")
    recipe("jpg_weights.yaml", weights=str(d / "photo.jpg"))
    recipe("jpg_model.yaml", source=str(d / "photo.jpg"))
    recipe("dir_model.yaml", source=str(d / "adir"))
    recipe("hwc_onnx.yaml", source=str(ONNX), input_shape=[32, 32, 3])  # the file declares (batch, 3, 32, 32)
    recipe("hwc_symbol.yaml", input_shape=[16, 16, 3])  # a symbol declares no shape
    (d / "ctx.yaml").write_text(yaml.safe_dump(dict(good, train={"ctx": "cpu:0,0"})))
    (d / "gpu.yaml").write_text(yaml.safe_dump(dict(good, train={"ctx": "gpu:0"})))  # setup.cfg's mxnet: CPU-only

    from gluontl.train.loop import finetune
    run = finetune(parse_recipe(good), runs_root=d / "runs", quiet=True).run_dir

    def broken(name, change):
        target = d / name
        shutil.copytree(run, target)
        change(target)

    (d / "run_empty").mkdir()
    broken("run_nockpt", lambda t: shutil.rmtree(t / "checkpoints"))
    broken("run_lastonly", lambda t: [p.unlink() for p in (t / "checkpoints").glob("best.*")])
    # no data: section and, like runs from before preprocess.json, no stored class names either
    broken("run_nodata", lambda t: ((t / "preprocess.json").unlink(), (t / "recipe.yaml").write_text(
        yaml.safe_dump({k: v for k, v in yaml.safe_load((t / "recipe.yaml").read_text()).items() if k != "data"}))))
    broken("run_badrecipe", lambda t: (t / "recipe.yaml").write_bytes(rs.bytes(512)))
    broken("run_binmetrics", lambda t: (t / "metrics.jsonl").write_bytes(rs.bytes(512)))
    broken("run_emptymetrics", lambda t: (t / "metrics.jsonl").write_text(""))
    broken("run_wrongmetrics", lambda t: (t / "metrics.jsonl").write_text('{"step": 1, "loss": "low", "lr": 1}\n[1]\n'))
    return {"d": str(d), "run": str(run), "sym": sym, "onnx": str(ONNX), "dyn": str(DYN)}


# id -> (argv, words the one paragraph must contain: the offending path/option and what is wrong)
CASES = {
    # plan / finetune: recipes
    "plan-missing-recipe": (["plan", "-r", "{d}/none.yaml"], ["{d}/none.yaml", "does not exist"]),
    "plan-empty-recipe": (["plan", "-r", "{d}/empty.yaml"], ["{d}/empty.yaml", "YAML mapping"]),
    "plan-garbage-recipe": (["plan", "-r", "{d}/garbage.yaml"], ["{d}/garbage.yaml"]),
    "plan-params-as-recipe": (["plan", "-r", "{d}/w.params"], ["{d}/w.params"]),
    "plan-jpeg-as-recipe": (["plan", "-r", "{d}/photo.jpg"], ["{d}/photo.jpg", "not UTF-8"]),
    "plan-dir-as-recipe": (["plan", "-r", "{d}/adir"], ["{d}/adir", "is a directory"]),
    "plan-ctx-device-twice": (["plan", "-r", "{d}/ctx.yaml"], ["train.ctx", "cpu:0,0", "twice"]),
    "plan-jpeg-weights": (["plan", "-r", "{d}/jpg_weights.yaml"], ["{d}/photo.jpg", "Invalid NDArray file format"]),
    "plan-jpeg-model": (["plan", "-r", "{d}/jpg_model.yaml"], ["model.source", "{d}/photo.jpg", "neither an ONNX"]),
    "plan-dir-model": (["plan", "-r", "{d}/dir_model.yaml"], ["model.source", "{d}/adir", "is a directory"]),
    "plan-input-shape-hwc": (["plan", "-r", "{d}/hwc_onnx.yaml"], ["model.input_shape 32,32,3", "H,W,C",
                                                                   "C,H,W: 3,32,32"]),
    "plan-input-shape-hwc-symbol": (["plan", "-r", "{d}/hwc_symbol.yaml"], ["model.input_shape 16,16,3", "H,W,C",
                                                                         "C,H,W: 3,16,16"]),
    "plan-set-not-yaml": (["plan", "-r", "{d}/good.yaml", "--set", "train.lr=["], ["train.lr=[", "not valid YAML"]),
    "plan-no-recipe-option": (["plan"], ["--recipe", "plan --help"]),
    "finetune-nothing": (["finetune"], ["--recipe"]),
    "finetune-missing-recipe": (["finetune", "-r", "{d}/none.yaml"], ["{d}/none.yaml"]),
    "finetune-gpu-on-cpu-wheel": (["finetune", "-r", "{d}/gpu.yaml", "--runs", "{d}/runs_gpu"],
                                  ["train.ctx 'gpu:0'", "CPU-only wheel", "mxnet-cu117==1.9.1", "8.6 only"]),
    "finetune-resume-missing": (["finetune", "--resume", "{d}/nowhere"], ["--resume", "{d}/nowhere"]),
    "finetune-resume-file": (["finetune", "--resume", "{d}/garbage"], ["--resume", "{d}/garbage"]),
    "finetune-resume-no-checkpoint": (["finetune", "--resume", "{d}/run_nockpt"], ["{d}/run_nockpt", "no checkpoint"]),
    "finetune-runs-is-a-file": (["finetune", "-r", "{d}/good.yaml", "--runs", "{d}/garbage", "-q"],
                                ["{d}/garbage", "--runs"]),
    # inspect: model specs
    "inspect-missing-onnx": (["inspect", "{d}/none.onnx"], ["{d}/none.onnx", "does not exist"]),
    "inspect-missing-path": (["inspect", "{d}/none"], ["{d}/none", "does not exist"]),
    "inspect-unknown-name": (["inspect", "resnet18_v9"], ["resnet18_v9", "resnet18_v1", "zoo:NAME"]),
    "inspect-unknown-zoo": (["inspect", "zoo:resnet18_v9"], ["resnet18_v9", "Close matches"]),
    "inspect-empty-prefix": (["inspect", "onnx:"], ["onnx:", "names no model"]),
    "inspect-empty-onnx": (["inspect", "{d}/empty.onnx"], ["{d}/empty.onnx", "no ONNX graph"]),
    "inspect-garbage-onnx": (["inspect", "{d}/garbage.onnx"], ["{d}/garbage.onnx", "not a readable ONNX"]),
    "inspect-empty-file": (["inspect", "{d}/empty"], ["{d}/empty", "neither an ONNX model"]),
    "inspect-garbage-file": (["inspect", "{d}/garbage"], ["{d}/garbage", "neither an ONNX model"]),
    "inspect-jpeg": (["inspect", "{d}/photo.jpg"], ["{d}/photo.jpg", "neither an ONNX model"]),
    "inspect-params": (["inspect", "{d}/w.params"], ["{d}/w.params", "weights only"]),
    "inspect-dir": (["inspect", "{d}/adir"], ["{d}/adir", "is a directory"]),
    "inspect-garbage-symbol": (["inspect", "{d}/badsym"], ["{d}/badsym-symbol.json", "not a valid MXNet symbol"]),
    "inspect-shape-not-numbers": (["inspect", "{sym}", "--input-shape", "3,x,16"], ["--input-shape '3,x,16'"]),
    "inspect-shape-zero": (["inspect", "{sym}", "--input-shape", "0,16,16"], ["--input-shape '0,16,16'"]),
    "inspect-shape-empty-name": (["inspect", "{sym}", "--input-shape", "=1,3,16,16"], ["--input-shape '=1,3,16,16'"]),
    "inspect-shape-huge": (["inspect", "{sym}", "--input-shape", "3,60000,60000"], ["--input-shape '3,60000,60000'",
                                                                                  "1 GiB"]),
    "inspect-shape-twice": (["inspect", "{sym}", "--input-shape", "3,16,16", "--input-shape", "3,8,8"],
                            ["--input-shape", "twice"]),
    "inspect-shape-rank-onnx": (["inspect", "{onnx}", "--nodes", "--input-shape", "32,32"],
                                ["--input-shape", "'x'", "x=1,3,32,32"]),
    "inspect-shape-rank-zoo": (["inspect", "resnet18_v1", "--input-shape", "32,32"],
                               ["--input-shape", "zoo:resnet18_v1", "(1, 32, 32)", "4D"]),
    "inspect-shape-rank-symbol": (["inspect", "{sym}", "--input-shape", "16,16"], ["--input-shape", "{sym}"]),
    "inspect-shape-hwc-onnx": (["inspect", "{onnx}", "--input-shape", "32,32,3"],  # as strict as with --nodes
                               ["--input-shape 32,32,3", "'x'", "dimension 1", "C,H,W: 3,32,32"]),
    "inspect-shape-hwc-onnx-nodes": (["inspect", "{onnx}", "--nodes", "--input-shape", "32,32,3"],
                                     ["--input-shape 32,32,3", "'x'", "dimension 1", "C,H,W: 3,32,32"]),
    "inspect-shape-hwc-symbol": (["inspect", "{sym}", "--input-shape", "16,16,3"],
                                 ["--input-shape 16,16,3", "symbol:{sym}", "H,W,C", "C,H,W: 3,16,16"]),
    "inspect-shape-unknown-input": (["inspect", "{onnx}", "--input-shape", "data=1,3,32,32"],
                                    ["--input-shape", "data", "input(s) x"]),
    "inspect-symbolic-dims": (["inspect", "{dyn}", "--nodes"], ["'x'", "height (dim 2)", "width (dim 3)",
                                                                "--input-shape x=1,3,HEIGHT,WIDTH"]),
    "inspect-classes-zero": (["inspect", "resnet18_v1", "--classes", "0"], ["--classes"]),
    "inspect-classes-not-zoo": (["inspect", "{sym}", "--classes", "3"], ["symbol:{sym}", "surgery"]),
    # export
    "export-missing-onnx": (["export", "{d}/none.onnx", "--out", "{d}/out"], ["{d}/none.onnx"]),
    "export-garbage-onnx": (["export", "{d}/garbage.onnx", "--out", "{d}/out"], ["{d}/garbage.onnx"]),
    "export-jpeg": (["export", "{d}/photo.jpg", "--out", "{d}/out"], ["{d}/photo.jpg"]),
    "export-bad-format": (["export", "{sym}", "--format", "tflite"], ["--format 'tflite'", "symbol, onnx"]),
    "export-bad-checkpoint": (["export", "{run}", "--checkpoint", "../../etc"], ["--checkpoint '../../etc'"]),
    "export-out-is-a-file": (["export", "{sym}", "--input-shape", "3,16,16", "--out", "{d}/garbage"],
                             ["{d}/garbage", "--out"]),
    "export-shape-rank-onnx": (["export", "{onnx}", "--input-shape", "x=1,3,32", "--out", "{d}/out"],
                               ["--input-shape", "'x'", "x=1,3,32,32"]),
    "export-symbolic-dims": (["export", "{dyn}", "--out", "{d}/out"], ["'x'", "height (dim 2)"]),
    "export-run-with-input-shape": (["export", "{run}", "--input-shape", "3,16,16"], ["--input-shape", "{run}"]),
    "export-run-empty-dir": (["export", "{d}/run_empty"], ["{d}/run_empty", "not a run folder"]),
    "export-run-no-checkpoint": (["export", "{d}/run_nockpt"], ["{d}/run_nockpt", "'best' checkpoint"]),
    "export-run-garbage-recipe": (["export", "{d}/run_badrecipe"], ["{d}/run_badrecipe/recipe.yaml"]),
    # evaluate
    "evaluate-missing-run": (["evaluate", "{d}/nowhere"], ["{d}/nowhere", "does not exist"]),
    "evaluate-file-as-run": (["evaluate", "{d}/garbage"], ["{d}/garbage", "is a file"]),
    "evaluate-empty-dir": (["evaluate", "{d}/run_empty"], ["{d}/run_empty", "not a run folder"]),
    "evaluate-bad-checkpoint": (["evaluate", "{run}", "--checkpoint", "first"], ["--checkpoint 'first'"]),
    "evaluate-best-missing": (["evaluate", "{d}/run_lastonly"], ["{d}/run_lastonly", "--checkpoint last"]),
    "evaluate-no-data-section": (["evaluate", "{d}/run_nodata"], ["{d}/run_nodata/recipe.yaml", "data:"]),
    "evaluate-bad-split": (["evaluate", "{run}", "--split", "nosuch"], ["nosuch", "does not exist"]),
    # predict
    "predict-missing-image": (["predict", "{run}", "{d}/none.png"], ["{d}/none.png", "does not exist"]),
    "predict-garbage-image": (["predict", "{run}", "{d}/garbage.png"], ["{d}/garbage.png"]),
    "predict-empty-image": (["predict", "{run}", "{d}/empty.png"], ["{d}/empty.png"]),
    "predict-params-as-image": (["predict", "{run}", "{d}/w.params"], ["{d}/w.params"]),
    "predict-dir-as-image": (["predict", "{run}", "{d}/adir"], ["{d}/adir", "is a directory"]),
    "predict-missing-run": (["predict", "{d}/nowhere", "{d}/digit.png"], ["{d}/nowhere"]),
    "predict-no-data-section": (["predict", "{d}/run_nodata", "{d}/digit.png"], ["{d}/run_nodata/recipe.yaml"]),
    "predict-topk-zero": (["predict", "{run}", "{d}/digit.png", "--topk", "0"], ["--topk"]),
    # plot
    "plot-no-metrics": (["plot", "{d}/run_empty"], ["{d}/run_empty", "metrics.jsonl"]),
    "plot-missing-run": (["plot", "{d}/nowhere"], ["{d}/nowhere", "does not exist"]),
    "plot-file-as-run": (["plot", "{d}/garbage"], ["{d}/garbage", "is a file"]),
    "plot-binary-metrics": (["plot", "{d}/run_binmetrics"], ["{d}/run_binmetrics/metrics.jsonl"]),
    "plot-empty-metrics": (["plot", "{d}/run_emptymetrics"], ["{d}/run_emptymetrics/metrics.jsonl", "no step"]),
    "plot-wrong-metrics": (["plot", "{d}/run_wrongmetrics"], ["{d}/run_wrongmetrics/metrics.jsonl", "no step"]),
    "plot-out-in-missing-dir": (["plot", "{run}", "--out", "{d}/nowhere/c.png"], ["{d}/nowhere/c.png"]),
    "plot-out-is-a-dir": (["plot", "{run}", "--out", "{d}/adir"], ["{d}/adir"]),
    # zoo
    "zoo-no-match": (["zoo", "xyz"], ["'xyz'", "close names"]),
    "zoo-typo": (["zoo", "resnet18_v9"], ["'resnet18_v9'", "resnet18_v1"]),
}
SUBPROCESS = ["inspect-jpeg", "inspect-shape-rank-onnx", "plan-garbage-recipe", "plot-no-metrics",
              "export-bad-format", "finetune-resume-missing"]


def _fill(items, world):
    return [s.format(**world) for s in items]


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input_exits_2_with_one_paragraph(case, world, monkeypatch, capsys):
    argv, needles = CASES[case]
    monkeypatch.chdir(world["d"])  # anything a case writes by accident stays in the sandbox
    code, out, err = run_cli(capsys, *_fill(argv, world))
    assert_one_paragraph(code, out, err, _fill(needles, world))


@pytest.mark.parametrize("case", SUBPROCESS)
def test_hostile_input_subprocess(case, world):
    argv, needles = CASES[case]
    r = subprocess.run([sys.executable, "-m", "gluontl", *_fill(argv, world)], capture_output=True, text=True,
                       cwd=world["d"], env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
    assert_one_paragraph(r.returncode, r.stdout, r.stderr, _fill(needles, world))


def test_unexpected_exception_is_one_paragraph_exit_1_unless_debugging(monkeypatch, capsys):
    def broken(**kwargs):
        raise ZeroDivisionError("a bug, not bad input")

    monkeypatch.setattr(cli, "app", broken)
    monkeypatch.delenv("GLUONTL_DEBUG", raising=False)
    code, _, err = run_cli(capsys, "zoo")
    flat = " ".join(err.split())
    assert code == 1 and err.startswith("error: internal error (ZeroDivisionError: a bug, not bad input)")
    assert "GLUONTL_DEBUG=1" in flat and "report" in flat and "Traceback" not in err
    monkeypatch.setenv("GLUONTL_DEBUG", "1")
    monkeypatch.setattr(sys, "argv", ["gluontl", "zoo"])
    with pytest.raises(ZeroDivisionError):
        cli.main()


# ----------------------------------------------------------------------------- bare model forms


@pytest.mark.parametrize("text, expected", [
    ("{onnx}", "onnx:{onnx}"),
    ("{d}/none.onnx", "onnx:{d}/none.onnx"),  # a missing .onnx is still an ONNX spec: its loader says "missing"
    ("{sym}", "symbol:{sym}"),
    ("{sym}-symbol.json", "symbol:{sym}"),
    ("resnet18_v1", "zoo:resnet18_v1"),
    ("ResNet18_V1", "zoo:ResNet18_V1"),
    ("zoo:resnet18_v1", "zoo:resnet18_v1"),
    ("symbol:{d}/anything", "symbol:{d}/anything"),  # prefixed forms pass through unchecked
])
def test_resolve_source(text, expected, world):
    assert resolve_source(text.format(**world)) == expected.format(**world)
    assert ModelSpec(source=text.format(**world)).source == expected.format(**world)


def test_onnx_file_without_suffix_is_recognized_by_content(world, tmp_path):
    shutil.copy(ONNX, tmp_path / "model.bin")
    assert resolve_source(str(tmp_path / "model.bin")) == f"onnx:{tmp_path / 'model.bin'}"


def test_bare_onnx_path_inspect_and_export(world, tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(capsys, "inspect", str(ONNX))
    assert code == 0, err
    assert "inputs:" in out and "x  ['batch', 3, 32, 32]" in out
    code, out, err = run_cli(capsys, "inspect", str(ONNX), "--nodes")  # shape from the file
    assert code == 0, err
    assert out.strip().splitlines()[-1].endswith("1x10")
    code, out, err = run_cli(capsys, "export", str(ONNX), "--format", "onnx", "--out", str(tmp_path))
    assert code == 0, err
    exported = tmp_path / "resnet_legacy_op13.onnx"
    assert out.splitlines() == [f"exported {exported} (verified)"]  # as finetune says: checked in onnxruntime
    inp = onnx.load(str(exported)).graph.input[0]
    assert inp.name == "x"  # the model's own input name, no --input-shape needed
    assert [d.dim_value for d in inp.type.tensor_type.shape.dim][1:] == [3, 32, 32]
    # the original file run by onnxruntime is the reference; float32 differences from re-associated
    # sums over <= 4608 products per conv stay orders of magnitude below 1e-4 of the logit scale
    x = np.random.RandomState(3).uniform(-1, 1, (1, 3, 32, 32)).astype(np.float32)
    ref = ort_run(ONNX, x)[0]
    np.testing.assert_allclose(ort_run(exported, x)[0], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_named_input_shape_fills_symbolic_dims(world, monkeypatch, capsys):
    code, out, err = run_cli(capsys, "inspect", str(DYN), "--nodes", "--input-shape", "x=1,3,48,40")
    assert code == 0, err
    rows = out.strip().splitlines()
    assert rows[-1].endswith("1x10")
    assert any(r.endswith("x12x10") for r in rows)  # a stride-4 feature map of 48x40
    code, out, err = run_cli(capsys, "inspect", str(DYN), "--nodes", "--input-shape", "3,48,40")
    assert code == 0, err
    assert out.strip().splitlines() == rows  # C,H,W names the first input


def test_bare_zoo_name_inspect_and_export(tmp_path, monkeypatch, capsys):
    code, out, err = run_cli(capsys, "inspect", "mobilenet0.25", "--input-shape", "3,32,32", "--json")
    assert code == 0, err
    params = json.loads(out)
    assert params[-1]["name"] == "output.bias" and params[-1]["shape"] == [1000]
    code, out, err = run_cli(capsys, "export", "mobilenet0.25", "--input-shape", "3,32,32",
                             "--format", "onnx", "--out", str(tmp_path))
    assert code == 0, err
    inp = onnx.load(str(tmp_path / "mobilenet0_25.onnx")).graph.input[0]
    assert inp.name == "data" and [d.dim_value for d in inp.type.tensor_type.shape.dim][1:] == [3, 32, 32]


def test_bare_symbol_prefix_with_its_own_input_name(tmp_path, monkeypatch, capsys):
    """A symbol whose input is not 'data': the CLI finds it (the one variable the params file lacks)."""
    mx.random.seed(5)
    x = mx.sym.var("img")
    blk = mx.gluon.SymbolBlock(mx.sym.FullyConnected(mx.sym.flatten(x), num_hidden=3, name="fc"), x)
    blk.initialize(mx.init.Normal(1.0))
    blk(mx.nd.ones((1, 4, 5)))
    blk.export(str(tmp_path / "fc"))
    code, out, err = run_cli(capsys, "inspect", str(tmp_path / "fc"), "--input-shape", "4,5")
    assert code == 0, err
    assert "fc_weight" in out and "3x20" in out
    code, out, err = run_cli(capsys, "export", str(tmp_path / "fc"), "--input-shape", "img=1,4,5",
                             "--format", "onnx", "--out", str(tmp_path / "out"))
    assert code == 0, err
    exported = tmp_path / "out" / "fc.onnx"
    assert onnx.load(str(exported)).graph.input[0].name == "img"
    params = mx.nd.load(str(tmp_path / "fc-0000.params"))
    w, b = params["arg:fc_weight"].asnumpy().astype(np.float64), params["arg:fc_bias"].asnumpy().astype(np.float64)
    xs = np.random.RandomState(4).uniform(-1, 1, (1, 4, 5)).astype(np.float32)
    ref = xs.reshape(1, -1).astype(np.float64) @ w.T + b  # exact numpy reference, 20-term dot products
    np.testing.assert_allclose(ort_run(exported, xs)[0], ref, rtol=1e-5, atol=1e-5)


def test_recipe_with_bare_model_source_plans(world, monkeypatch, capsys):
    code, out, err = run_cli(capsys, "plan", "-r", f"{world['d']}/good.yaml", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert len(plan["params"]) == 4 and plan["totals"]["trainable"] == (8 * 3 * 3 * 3 + 8) + (5 * 8 + 5)
    saved = yaml.safe_load((Path(world["run"]) / "recipe.yaml").read_text())
    assert saved["model"]["source"] == f"symbol:{world['sym']}"  # runs record the resolved form


def test_recipe_with_bare_onnx_source_needs_no_input_name(tmp_path, monkeypatch, capsys):
    """The file's own input name ('x') is used when the recipe does not set model.input_name."""
    source = str(FIXTURES / "resnet_legacy_op13_nofold.onnx")  # PyTorch parameter names
    recipe = {"name": "o", "model": {"source": source, "input_shape": [3, 32, 32]},
              "rules": [{"match": "fc.*", "grad_req": "write"}, {"match": "layer1.*", "grad_req": "null"}]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    code, out, err = run_cli(capsys, "plan", "-r", str(tmp_path / "r.yaml"), "--json")
    assert code == 0, err
    params = {p["name"]: p for p in json.loads(out)["params"]}
    assert params["fc.weight"]["grad_req"] == "write" and params["layer1.0.conv1.weight"]["grad_req"] == "null"
