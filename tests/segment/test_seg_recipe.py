"""The recipe's segmentation parts: the task's metrics and default selection, the segmentation:
section's defaults and its validation errors (each naming the key and what to do)."""
from __future__ import annotations

import pytest

from gluontl.errors import RecipeError
from gluontl.recipe import TASK_METRICS, parse_recipe


def _recipe(**over):
    data = {"name": "seg", "task": "segmentation", "model": {"source": "zoo:resnet18_v1", "input_shape": [3, 64, 64]},
            "data": {"source": "demo:digits_seg"}}
    data.update(over)
    return parse_recipe(data, origin="test")


def test_segmentation_picks_its_best_checkpoint_by_miou_and_has_gluoncv_defaults():
    r = _recipe()
    assert TASK_METRICS["segmentation"] == ("val_miou", "val_pixel_acc", "val_loss")
    assert r.train.select == "val_miou"
    assert r.segmentation is None  # defaults: tasks.segmentation.seg_spec
    r = _recipe(segmentation={"crop": 60, "aux": True, "taps": ["a", "b"]}, train={"select": "val_loss"})
    s = r.segmentation
    assert (s.crop, s.aux_weight, s.ignore_label, s.scale, s.arch) == ((60, 60), 0.4, 255, (0.5, 2.0), "fcn")
    assert r.train.select == "val_loss"


@pytest.mark.parametrize("over, words", [
    ({"segmentation": {"scale": [2.0, 0.5]}}, ["segmentation", "scale", "smaller factor first"]),
    ({"segmentation": {"arch": "lraspp", "taps": ["a"]}}, ["taps lists 1", "lraspp", "give 2"]),
    ({"segmentation": {"aux": True, "taps": ["a"]}}, ["taps lists 1", "aux", "give 2"]),
    ({"segmentation": {"taps": ["a", "b"]}}, ["taps lists 2", "fcn reads one map", "give 1"]),
    ({"segmentation": {"taps": ["a", "a"]}}, ["taps", "distinct"]),
    ({"segmentation": {"arch": "unet"}}, ["segmentation.arch", "fcn", "lraspp"]),
    ({"segmentation": {"ignore_label": 256}}, ["segmentation.ignore_label", "255"]),
    ({"segmentation": {"aux_weigth": 0.2}}, ["segmentation.aux_weigth", "did you mean 'aux_weight'"]),
    ({"segmentation": {"stride": 16}, "model": {"source": "zoo:resnet18_v1", "input_shape": [3, 72, 72]}},
     ["input_shape", "multiples of segmentation.stride 16", "#1173"]),
    ({"data": {"source": "folder:/x"}}, ["folder:/x", "not segmentation data", "masks:PATH"]),
    ({"data": {"source": "demo:digits_seg", "train_transform": {"resize": 64}}},
     ["data.train_transform (resize)", "segmentation.crop"]),
    ({"train": {"select": "val_top1"}}, ["val_top1", "not a segmentation metric", "val_miou"]),
    ({"train": {"label_smoothing": 0.1}}, ["label_smoothing", "classification"]),
    ({"model": {"source": "zoo:resnet18_v1", "input_shape": [3, 64, 64], "restore": {"type": "detection"}}},
     ["restore.type: detection", "segmentation or classification"]),
])
def test_bad_segmentation_recipes_are_refused_with_the_key_and_the_fix(over, words):
    with pytest.raises(RecipeError) as e:
        _recipe(**over)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


@pytest.mark.parametrize("task, source", [("classification", "masks:/x"), ("classification", "demo:digits_seg"),
                                          ("detection", "demo:digits_seg")])
def test_segmentation_data_under_another_task_is_refused(task, source):
    with pytest.raises(RecipeError, match="segmentation"):
        parse_recipe({"name": "x", "task": task, "model": {"source": "zoo:resnet18_v1"},
                      "data": {"source": source}}, origin="test")


def test_the_segmentation_section_needs_task_segmentation():
    with pytest.raises(RecipeError, match="for task: segmentation"):
        parse_recipe({"name": "x", "model": {"source": "zoo:resnet18_v1"}, "segmentation": {"arch": "fcn"}},
                     origin="test")
