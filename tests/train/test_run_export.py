"""A run of an imported model whose recipe leaves model.input_name out exports under the model's own input name."""
import onnx
import yaml
from tests import helpers

from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune
from gluontl.train.runs import export_run

FIXTURE = "tests/onnx/fixtures/resnet_legacy_op13_nofold.onnx"  # its graph input is "x", not "data"


def test_onnx_run_without_input_name_records_and_exports_the_files_input(tmp_path):
    assert [i.name for i in onnx.load(FIXTURE).graph.input] == ["x"]
    recipe = parse_recipe({
        "name": "noname", "model": {"source": f"onnx:{FIXTURE}", "input_shape": [3, 32, 32]},
        "surgery": {"cut_at": "/layer2/layer2.1/Relu_1", "head": {"classes": 5}},
        "rules": [{"match": "*", "grad_req": "null"}, {"type": "BatchNorm", "bn": "frozen"},
                  {"match": "head.*", "grad_req": "write"}],
        "data": {**helpers.DIGITS_5_9, "train_transform": {"resize": 32}, "val_transform": {"resize": 32}},
        "train": {"epochs": 1, "lr": 0.01, "guards": "off"}, "export": {"formats": ["onnx"]}})
    assert "input_name" not in recipe.model.model_fields_set
    res = finetune(recipe, runs_root=tmp_path, quiet=True)
    saved = yaml.safe_load((res.run_dir / "recipe.yaml").read_text())
    assert saved["model"]["input_name"] == "x"
    # unset fields are left out: a bare `grad_req: null` would be refused when the run is reloaded
    assert saved["rules"][1] == {"type": ["BatchNorm"], "bn": "frozen", "optional": False, "from_epoch": 0}
    [path] = export_run(res.run_dir, tmp_path / "out", formats=["onnx"])
    assert [i.name for i in onnx.load(str(path)).graph.input] == ["x"]
