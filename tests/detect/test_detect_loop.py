"""Detection through the one training loop: run folder, metrics, best checkpoint, resume, frozen
parameters and BatchNorm statistics, and the run commands (evaluate, predict, plot, export)."""
import json
from pathlib import Path

from tests import helpers
import mxnet as mx
import numpy as np
import pytest

from gluontl.recipe import parse_recipe
from gluontl.sources.restore import snapshot
from gluontl.train.loop import finetune

SSD = "zoo:ssd_300_mobilenet0.25_custom"
YOLO = "zoo:yolo3_mobilenet0.25_custom"


def _recipe(voc: Path, model: str = SSD, **train):
    return parse_recipe({
        "name": "det", "task": "detection",
        "model": {"source": model, "input_shape": [3, 128, 128]},
        "rules": [{"preset": "freeze_until_stage", "until_stage": 2}],
        "data": {"source": f"voc:{voc}", "classes": ["0", "1", "2", "3", "4"], "batch_size": 8,
                 "train_transform": {"flip": True, "color_jitter": 0.2}},
        "train": {"epochs": 2, "lr": 0.01, "seed": 3, "log_every": 1, "guards": "off", **train}}, origin="test")


def test_a_detection_run_has_the_run_folder_of_a_classification_run(small_voc, tmp_path):
    res = finetune(_recipe(small_voc), runs_root=tmp_path, quiet=True)
    epochs = [m for m in res.metrics if "epoch" in m]
    assert [m["epoch"] for m in epochs] == [1, 2]
    for m in epochs:
        assert 0.0 <= m["val_map"] <= m["val_map50"] <= 1.0 and np.isfinite(m["train_loss"])
        assert "train_acc" not in m and "val_top1" not in m
    assert res.best["select"] == "val_map50" and set(res.best) == {"epoch", "select", "val_map50", "val_map"}
    assert res.best["val_map50"] == max(m["val_map50"] for m in epochs)
    card = json.loads((res.run_dir / "preprocess.json").read_text())
    assert card["classes"] == ["0", "1", "2", "3", "4"] and card["task"] == "detection"
    plan = (res.run_dir / "plan.txt").read_text()
    assert "neck" in plan and "head" in plan
    assert (res.run_dir / "checkpoints" / "best.params").is_file()
    assert json.loads((res.run_dir / "summary.json").read_text())["best"]["epoch"] == res.best["epoch"]


@pytest.mark.parametrize("model", [SSD, YOLO])
def test_frozen_parameters_and_bn_statistics_are_bit_identical_after_training(small_voc, tmp_path, model):
    from gluontl.detect.models import build_detector
    from gluontl.rules import make_plan

    recipe = _recipe(small_voc, model, epochs=1)
    start = tmp_path / "start.params"
    net, _ = build_detector(recipe, ["0", "1", "2", "3", "4"], mx.cpu())
    net.save_parameters(str(start))
    before = snapshot(net)
    plan = make_plan(net, recipe.rules, epoch=0, input_shape=(1, 3, 128, 128))
    frozen = {r.name for r in plan.rows if not r.trainable and (not r.aux or r.bn == "frozen")}
    recipe = recipe.model_copy(update={"model": recipe.model.model_copy(update={"weights": str(start)})})
    res = finetune(recipe, runs_root=tmp_path, quiet=True, stop_after_steps=2)
    assert res.stopped_early
    after = snapshot(_load(res.run_dir, "last", model))
    bn_stats = {n for n in frozen if n.endswith(("running_mean", "running_var", "moving_mean", "moving_var"))}
    assert bn_stats, "the frozen stages hold BatchNorm statistics"
    for n in frozen:
        np.testing.assert_array_equal(after[n], before[n], err_msg=n)
    trained = [n for n in before if n not in frozen and not np.array_equal(after[n], before[n])]
    assert any(".predictor." in n or ".prediction." in n for n in trained), "the heads trained"


def _load(run_dir: Path, tag: str, model: str):
    from gluontl.train.runs import load_run

    _, net = load_run(run_dir, tag)
    return net


def test_a_resumed_detection_run_matches_an_uninterrupted_one(small_voc, tmp_path):
    full = finetune(_recipe(small_voc), runs_root=tmp_path / "a", quiet=True)
    part = finetune(_recipe(small_voc), runs_root=tmp_path / "b", quiet=True, stop_after_steps=4)
    assert part.stopped_early
    resumed = finetune(_recipe(small_voc), runs_root=tmp_path / "b", quiet=True, resume=part.run_dir)
    a, b = snapshot(_load(full.run_dir, "last", SSD)), snapshot(_load(resumed.run_dir, "last", SSD))
    for n in a:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    assert [m["val_map50"] for m in full.metrics if "epoch" in m] == \
           [m["val_map50"] for m in resumed.metrics if "epoch" in m]


def test_run_commands_on_a_detection_run(small_voc, tmp_path, capsys):
    import yaml

    recipe = tmp_path / "det.yaml"
    data = _recipe(small_voc).model_dump(mode="json", exclude_none=True)
    data["train"]["epochs"] = 1
    data["export"] = {"formats": ["symbol", "onnx"]}
    recipe.write_text(yaml.safe_dump(data))
    code, out, err = helpers.run_cli(capsys, "finetune", "--recipe", str(recipe), "--runs", str(tmp_path / "runs"), "-q")
    assert code == 0, err
    run = tmp_path / "runs" / "det"
    assert (run / "export" / "det.onnx").is_file() and (run / "export" / "det-symbol.json").is_file()
    code, out, err = helpers.run_cli(capsys, "evaluate", str(run))
    assert code == 0, err
    assert "VOC mAP@0.5" in out and "AP50:95" in out and (run / "pr_curves-val.png").is_file()
    image = sorted((small_voc / "JPEGImages").iterdir())[0]
    code, out, err = helpers.run_cli(capsys, "predict", str(run), str(image), "--score", "0.0", "--out",
                                     str(tmp_path / "pred"), "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert rows[0]["file"] == str(image) and (tmp_path / "pred" / f"{image.stem}.jpg").is_file()
    doc = json.loads((tmp_path / "pred" / "detections.json").read_text())
    assert doc["images"][0]["detections"] == rows[0]["detections"]
    code, out, err = helpers.run_cli(capsys, "plot", str(run))
    assert code == 0, err
    assert (run / "curves.png").is_file()
    edited = yaml.safe_load((run / "recipe.yaml").read_text())
    edited["data"]["classes"] = ["4", "3", "2", "1", "0"]  # the data's class ids now mean other classes
    (run / "recipe.yaml").write_text(yaml.safe_dump(edited))
    code, out, err = helpers.run_cli(capsys, "evaluate", str(run))
    assert code == 2 and "was trained on ['0', '1', '2', '3', '4']" in " ".join(err.split()) and "Traceback" not in err
