"""The Python API on par with the CLI: gluontl.finetune's run folder and exports, dicts wherever a
spec object goes, export_onnx's metadata, dir(gluontl), one name for the batch dimension."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import mxnet as mx
import numpy as np
import onnx
import pytest
import yaml
from tests.helpers import run_cli, tiny_recipe, tiny_symbol
from onnx import TensorProto, helper, numpy_helper

import gluontl
from gluontl.errors import DataError, ExportError, ModelSourceError, RecipeError, SurgeryError
from gluontl.recipe import HeadSpec, TransformSpec
from gluontl.surgery import apply_surgery, attach_head, cut_at


def _files(run):
    """A run folder's files, event-log names without their host and time, checkpoint names
    without their write token."""
    return sorted(re.sub(r"\.[0-9a-f]{8}\.", ".TOKEN.", str(p.relative_to(run)).split(".tfevents")[0])
                  for p in run.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One tiny recipe trained twice: by `gluontl finetune` and by gluontl.finetune(dict)."""
    d = tmp_path_factory.mktemp("parity")
    recipe = tiny_recipe(tiny_symbol(d), name="tiny", epochs=1, lr=0.1, seed=0, export=["onnx", "symbol"])
    (d / "tiny.yaml").write_text(yaml.safe_dump(recipe))
    # both in a subprocess with the same environment: bit-equal weights need the same thread count,
    # and pytest's own process may run with another one
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cli = subprocess.run([sys.executable, "-m", "gluontl", "finetune", "--recipe", str(d / "tiny.yaml"),
                          "--runs", str(d / "cli"), "--quiet"], capture_output=True, text=True, timeout=600, env=env)
    assert cli.returncode == 0, cli.stderr
    script = ("import json, sys, gluontl\n"
              "r = gluontl.finetune(json.loads(sys.argv[1]), runs_root=sys.argv[2], quiet=True)\n"
              "print(json.dumps({'run_dir': str(r.run_dir), 'exported': [str(p) for p in r.exported]}))\n")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(recipe), str(d / "api")], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    api = SimpleNamespace(run_dir=Path(out["run_dir"]), exported=[Path(p) for p in out["exported"]])
    return {"d": d, "cli": next((d / "cli").iterdir()), "api": api, "stdout": cli.stdout}


def test_finetune_writes_the_cli_run_folder_exports_included(runs):
    api = runs["api"]
    assert _files(api.run_dir) == _files(runs["cli"])
    onnx_path = api.run_dir / "export" / "tiny.onnx"
    assert sorted(api.exported) == sorted([onnx_path, api.run_dir / "export" / "tiny-symbol.json",
                                          api.run_dir / "export" / "tiny-0000.params",
                                          api.run_dir / "export" / "tiny-preprocess.json"])
    assert f"exported {runs['cli'] / 'export' / 'tiny.onnx'} (verified)" in runs["stdout"]
    theirs = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(runs["cli"] / "export" / "tiny.onnx")).graph.initializer}
    mine = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(onnx_path)).graph.initializer}
    assert theirs.keys() == mine.keys()
    for name in mine:  # same seed, same steps, same process kind: the same trained values
        np.testing.assert_array_equal(mine[name], theirs[name], err_msg=name)


def test_export_run_is_public_and_takes_an_export_dict(runs, tmp_path):
    written = gluontl.export_run(runs["api"].run_dir, tmp_path, export={"formats": ["onnx"], "input_names": ["img"]})
    assert written == [tmp_path / "tiny.onnx"]
    model = onnx.load(str(written[0]))
    assert [i.name for i in model.graph.input] == ["img"]
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["gluontl.preprocess"])["input"]["name"] == "img"  # the record names the file's input
    with pytest.raises(ExportError, match=r"unknown key 'format'.*did you mean 'formats'"):
        gluontl.export_run(runs["api"].run_dir, tmp_path / "x", export={"format": ["onnx"]})
    with pytest.raises(ExportError, match="export is a list"):
        gluontl.export_run(runs["api"].run_dir, tmp_path / "x", export=["onnx"])


def test_a_recipe_that_is_not_one_is_named():
    with pytest.raises(RecipeError, match="recipe is a int"):
        gluontl.finetune(3)
    with pytest.raises(RecipeError, match="the recipe dict"):
        gluontl.prepare({"name": "x", "model": {"sorce": "zoo:resnet18_v1"}})


# ------------------------------------------------------------------- dicts for specs

def _trunk():
    mx.random.seed(0)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, activation="relu"), mx.gluon.nn.GlobalAvgPool2D())
    net.initialize(mx.init.Xavier())
    return net


def test_attach_head_takes_a_dict_like_a_head_spec():
    x = mx.nd.array(np.random.RandomState(0).randn(2, 3, 8, 8))
    outs = []
    for spec in ({"classes": 3, "hidden": [5]}, HeadSpec(classes=3, hidden=[5])):
        mx.random.seed(1)
        block = attach_head(_trunk(), spec, (3, 8, 8))
        outs.append(block(x).asnumpy())
        assert outs[-1].shape == (2, 3)
    np.testing.assert_array_equal(outs[0], outs[1])  # same seed, same spec: the same head


@pytest.mark.parametrize("spec,needles", [
    ({"clases": 3}, ["head is invalid", "unknown key 'clases'", "did you mean 'classes'", "surgery.head"]),
    ({"classes": 0}, ["head is invalid", "'classes'", "greater than 0"]),
    (3, ["head is a int", "{'classes': 3}", "HeadSpec"]),
])
def test_a_wrong_head_dict_is_a_surgery_error_naming_the_key(spec, needles):
    with pytest.raises(SurgeryError) as e:
        attach_head(_trunk(), spec, (3, 8, 8))
    for n in needles:
        assert n in str(e.value), str(e.value)


def test_surgery_model_and_transform_dicts_are_validated_like_a_recipe(tmp_path):
    with pytest.raises(SurgeryError, match=r"unknown key 'cut'.*did you mean 'cut_at'"):
        apply_surgery(_trunk(), {"cut": "0"}, (3, 8, 8))
    with pytest.raises(ModelSourceError, match=r"model is invalid: .*unknown key 'sorce' \(did you mean 'source'"):
        gluontl.load_model({"sorce": "zoo:resnet18_v1"})
    net = gluontl.load_model({"source": f"symbol:{tiny_symbol(tmp_path)}", "input_shape": [3, 16, 16]})
    assert net(mx.nd.zeros((1, 3, 16, 16))).shape == (1, 5)
    img = np.random.RandomState(0).randint(0, 256, (20, 30, 3)).astype(np.uint8)
    np.testing.assert_array_equal(gluontl.preprocess(img, {"resize": 16}), gluontl.preprocess(img, TransformSpec(resize=16)))
    with pytest.raises(DataError, match=r"unknown key 'rezise'.*did you mean 'resize'"):
        gluontl.preprocess(img, {"rezise": 16})


# ------------------------------------------------------------------- export_onnx metadata

def _classifier():
    mx.random.seed(2)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3), mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Xavier())
    return net


def test_export_onnx_with_classes_and_preprocess_is_a_file_predict_takes(tmp_path, capsys):
    path = gluontl.export_onnx(_classifier(), tmp_path / "m.onnx", {"data": (1, 3, 16, 16)},
                               classes=["a", "b", "c"], preprocess={"resize": 20, "center_crop": 16})
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert json.loads(meta["gluontl.classes"]) == ["a", "b", "c"]
    rec = json.loads(meta["gluontl.preprocess"])
    assert rec["input"] == {"name": "data", "shape": [None, 3, 16, 16], "layout": "NCHW", "dtype": "float32"}
    assert rec["steps"] == [{"op": "resize_shorter", "size": 20}, {"op": "center_crop", "size": 16}]
    from PIL import Image
    Image.fromarray(np.random.RandomState(1).randint(0, 256, (40, 50, 3)).astype(np.uint8)).save(tmp_path / "i.png")
    code, out, err = run_cli(capsys, "predict", str(path), str(tmp_path / "i.png"), "--json")
    assert code == 0, err
    assert sorted(c for c, _ in json.loads(out)[0]["top"]) == ["a", "b", "c"]


@pytest.mark.parametrize("kwargs,needles", [
    ({"classes": ["a", "b"], "preprocess": {"resize": 16}}, ["lists 2 names", "['batch', 3]"]),
    ({"classes": ["a", "b", "c"]}, ["classes without preprocess", "predict needs both"]),
    ({"classes": ["a", "b", "c"], "preprocess": {"resize": 20}}, ["[3, 20, 20]", "[3, 16, 16]", "'resize': 16"]),
    ({"classes": "abc", "preprocess": {"resize": 16}}, ["class names in label order"]),
])
def test_metadata_that_cannot_fit_the_graph_is_refused(tmp_path, kwargs, needles):
    with pytest.raises(ExportError) as e:
        gluontl.export_onnx(_classifier(), tmp_path / "m.onnx", {"data": (1, 3, 16, 16)}, **kwargs)
    for n in needles:
        assert n in str(e.value), str(e.value)
    assert not (tmp_path / "m.onnx").exists()


# ------------------------------------------------------------------- dir(gluontl), batch name

def test_dir_lists_the_public_api_without_importing_mxnet():
    code = "import sys, gluontl; print(dir(gluontl)); print('mxnet' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    listed, imported = done.stdout.splitlines()
    for name in ("finetune", "export_run", "export_onnx", "attach_head", "preprocess", "load_model", "make_plan"):
        assert f"'{name}'" in listed
    assert imported == "False"


def _n_named_onnx(path):
    rs = np.random.RandomState(0)
    inits = [numpy_helper.from_array(rs.randn(4, 3, 3, 3).astype(np.float32), "w"),
             numpy_helper.from_array(rs.randn(5, 4).astype(np.float32), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 5])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def _batch_names(path):
    g = onnx.load(str(path)).graph
    return [v.type.tensor_type.shape.dim[0].dim_param for v in (*g.input, *g.output)]


def test_exports_call_the_batch_dimension_batch_on_inputs_and_outputs(tmp_path):
    source = _n_named_onnx(tmp_path / "n.onnx")
    block = gluontl.import_onnx(str(source))
    assert _batch_names(gluontl.export_onnx(block, tmp_path / "whole.onnx")) == ["batch", "batch"]
    headed = attach_head(cut_at(block, "c", input_shape=(3, 8, 8)), {"classes": 2}, (3, 8, 8))
    assert _batch_names(gluontl.export_onnx(headed, tmp_path / "headed.onnx")) == ["batch", "batch"]
    assert _batch_names(gluontl.export_onnx(_classifier(), tmp_path / "gluon.onnx", {"data": (1, 3, 16, 16)})) == \
        ["batch", "batch"]
