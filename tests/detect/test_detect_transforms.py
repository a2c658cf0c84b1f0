"""A detection recipe's transforms: its own size rule, shown by the plan as the run card records it."""
import json

from tests import helpers
import yaml

from gluontl.recipe import parse_recipe
from gluontl.tasks import transform_lines


def _recipe(voc):
    return {"name": "det", "task": "detection", "model": {"source": "zoo:ssd_300_mobilenet0.25_custom",
                                                          "input_shape": [3, 128, 96]},
            "rules": [{"preset": "freeze_until_stage", "until_stage": 2}],
            "data": {"source": f"voc:{voc}", "classes": ["0", "1", "2", "3", "4"], "batch_size": 8,
                     "train_transform": {"flip": True, "color_jitter": 0.2}},
            "train": {"epochs": 1, "guards": "off"}, "export": {"formats": []}}


def test_detection_transforms_are_the_ones_the_plan_prints_and_the_card_records(small_voc, tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_recipe(small_voc)))
    code, out, err = helpers.run_cli(capsys, "plan", "-r", str(path))
    assert code == 0, err
    printed = [line for line in out.splitlines() if " transform: " in line]
    assert printed == [
        "train transform: colour jitter 0.2, SSD IoU-constrained random crop, resize to 128x96 (H x W, aspect not "
        "kept), horizontal flip (p 1/2), normalize imagenet",
        "val transform: resize to 128x96 (H x W, aspect not kept), normalize imagenet  [default: the detector's "
        "own rule]"]
    assert parse_recipe(_recipe(small_voc)).data.val_transform.out_size() is None  # no size is filled in
    code, out, err = helpers.run_cli(capsys, "finetune", "-r", str(path), "-q", "--runs", str(tmp_path / "runs"),
                                     "--stop-after-steps", "1")
    assert code == 0, err
    run = tmp_path / "runs" / "det"
    card = json.loads((run / "preprocess.json").read_text())
    assert transform_lines(card["transforms"]) == printed
    assert [line for line in (run / "plan.txt").read_text().splitlines() if " transform: " in line] == printed


def test_a_detection_transform_with_a_size_is_refused_by_plan(small_voc, tmp_path, capsys):
    r = _recipe(small_voc)
    r["data"]["val_transform"] = {"resize": 128}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(r))
    code, out, err = helpers.run_cli(capsys, "plan", "-r", str(path))
    text = " ".join(err.split())
    assert code == 2 and out == ""
    assert "data.val_transform (resize: 128) sets a size, which detection does not use" in text
    assert "H x W (128, 96)" in text and "remove resize / center_crop / random_resized_crop" in text
