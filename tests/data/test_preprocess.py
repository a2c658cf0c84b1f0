"""gluontl.preprocess and its JSON record: hand-computed tensors, round trips, refused records."""
import copy
import json

import numpy as np
import pytest
from PIL import Image

import gluontl
from gluontl.errors import DataError, ModelSourceError
from gluontl.recipe import TransformSpec
from gluontl.data.transforms import Preprocess, load_preprocess, model_card, onnx_props


def record(steps, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0)):
    return Preprocess(tuple(steps), tuple(mean), tuple(std)).to_json("data", (None, 3, 2, 2))


def test_enlarge_is_bilinear_then_centre_crop_by_hand():
    # A 1x2 image [0, 200] scaled so its shorter side is 2 becomes 2x4. OpenCV's INTER_LINEAR
    # samples at (x + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 (clamped at the borders):
    # 0, 0.75*0 + 0.25*200 = 50, 150, 200 -- exact in its fixed point. Centre crop 2: columns 1, 2.
    img = np.array([[[0, 0, 0], [200, 100, 20]]], np.uint8)
    spec = record([("resize_shorter", 2), ("center_crop", 2)], mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 2.0))
    got = gluontl.preprocess(img, spec)
    cols = np.array([[50.0, 150.0], [25.0, 75.0], [5.0, 15.0]])  # per channel: 0.25 / 0.75 of the second pixel
    want = (cols[:, None, :].repeat(2, axis=1) / 255.0 - np.array([0.5, 0.25, 0.0])[:, None, None]) \
        / np.array([0.5, 0.25, 2.0])[:, None, None]
    assert got.dtype == np.float32 and got.shape == (3, 2, 2)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)  # |want| <= 4: a few float32 ulps


def test_shrink_is_area_average_and_gray_is_replicated_by_hand():
    # 2x4 gray -> shorter side 1: 1x2, each pixel the mean of a 2x2 block (INTER_AREA at an integer
    # factor); centre crop 1 keeps column (2 - 1) // 2 = 0.
    gray = np.array([[10, 20, 100, 100], [30, 40, 100, 100]], np.uint8)
    got = gluontl.preprocess(gray, record([("resize_shorter", 1), ("center_crop", 1)]))
    np.testing.assert_array_equal(got, np.full((3, 1, 1), np.float32(25.0) / np.float32(255.0)))


def test_file_bytes_and_array_give_the_same_tensor(tmp_path):
    rs = np.random.RandomState(0)
    img = rs.randint(0, 256, (13, 21, 3)).astype(np.uint8)
    Image.fromarray(img).save(tmp_path / "a.png")
    spec = TransformSpec(resize=8, center_crop=6)
    a = gluontl.preprocess(tmp_path / "a.png", spec)
    b = gluontl.preprocess((tmp_path / "a.png").read_bytes(), spec)
    c = gluontl.preprocess(img, spec)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    assert a.shape == (3, 6, 6)


@pytest.mark.parametrize("spec", [
    TransformSpec(resize=40, center_crop=32),
    TransformSpec(resize=24),
    TransformSpec(random_resized_crop=28, flip=True, color_jitter=0.3, normalize="none"),
    TransformSpec(center_crop=16, normalize=((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))),
])
def test_record_round_trips_through_json(spec, tmp_path):
    card = model_card(spec, ["cat", "dog"], "data", (3, 32, 32))
    text = json.dumps(card)
    pre, classes = load_preprocess(json.loads(text))
    assert pre == Preprocess.from_spec(spec) and classes == ["cat", "dog"]
    (tmp_path / "preprocess.json").write_text(text)
    assert load_preprocess(tmp_path) == (pre, classes)  # a run folder
    assert load_preprocess(tmp_path / "preprocess.json") == (pre, classes)
    props = onnx_props(card)
    assert json.loads(props["gluontl.classes"]) == ["cat", "dog"]
    assert Preprocess.from_json(json.loads(props["gluontl.preprocess"]), "x") == pre
    # the record states the evaluation steps only: no random op ever reaches it
    assert {s["op"] for s in card["preprocess"]["steps"]} <= {"resize_shorter", "center_crop"}
    assert card["preprocess"]["input"] == {"name": "data", "shape": [None, 3, 32, 32], "layout": "NCHW",
                                           "dtype": "float32"}


def test_eval_form_of_random_resized_crop_is_resize_then_crop():
    pre = Preprocess.from_spec(TransformSpec(random_resized_crop=28))
    assert pre.steps == (("resize_shorter", 28), ("center_crop", 28))
    assert pre.mean == (0.485, 0.456, 0.406) and pre.std == (0.229, 0.224, 0.225)


GOOD = record([("resize_shorter", 4), ("center_crop", 2)])


def edited(**changes):
    r = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if value is None:
            del r[key]
        else:
            r[key] = value
    return r


@pytest.mark.parametrize("bad, words", [
    (edited(steps=[{"op": "rotate", "size": 2}]), ["'rotate'", "resize_shorter with a size > 0, resize_cover "
                                                   "with [H, W], center_crop with a size or [H, W]"]),
    (edited(steps=[{"op": "resize_cover", "size": 48}]), ["'resize_cover', 'size': 48"]),
    (edited(steps=[{"op": "resize_shorter", "size": [48, 192]}]), ["'resize_shorter', 'size': [48, 192]"]),
    (edited(steps=[{"op": "center_crop", "size": [48, 0]}]), ["'size': [48, 0]"]),
    (edited(steps=[{"op": "center_crop", "size": [48, 192, 3]}]), ["'size': [48, 192, 3]"]),
    (edited(steps=[{"op": "random_resized_crop", "size": 2}]), ["random_resized_crop"]),
    (edited(steps=[{"op": "center_crop", "size": 0}]), ["'size': 0"]),
    (edited(steps=[{"op": "center_crop", "size": True}]), ["'size': True"]),
    (edited(steps=[{"op": "center_crop", "size": 2.0}]), ["'size': 2.0"]),
    (edited(version=2), ["version 2"]),
    (edited(version=None), ["version None"]),
    (edited(format="other"), ["not a gluontl preprocessing record"]),
    (edited(std=[0.2, 0.0, 0.2]), ["std [0.2, 0.0, 0.2]", "> 0"]),
    (edited(std=[0.2, -1, 0.2]), ["std [0.2, -1, 0.2]"]),
    (edited(std=[0.2, 0.2]), ["std [0.2, 0.2]", "three numbers"]),
    (edited(mean=["0", 0, 0]), ["mean ['0', 0, 0]"]),
    (edited(color="BGR"), ["color 'BGR'"]),
    (edited(scale=1.0), ["scale 1.0"]),
    (edited(interpolation={"library": "pil", "shrink": "BICUBIC", "enlarge": "BICUBIC"}), ["interpolation"]),
])
def test_records_this_version_cannot_reproduce_are_refused(bad, words):
    with pytest.raises(ModelSourceError) as e:
        gluontl.preprocess(np.zeros((4, 4, 3), np.uint8), bad)
    msg = str(e.value)
    assert all(w in msg for w in words), msg
    assert "Preprocessing" in msg  # says where the steps are described


def test_bad_inputs_name_what_to_pass(tmp_path):
    with pytest.raises(DataError, match=r"float64 \(4, 4, 3\)"):
        gluontl.preprocess(np.zeros((4, 4, 3)), GOOD)
    with pytest.raises(ModelSourceError, match="does not exist"):
        gluontl.preprocess(np.zeros((4, 4), np.uint8), tmp_path / "nothing.json")
    (tmp_path / "x.json").write_text(json.dumps({"classes": ["a"]}))
    with pytest.raises(ModelSourceError, match="no \"preprocess\" entry"):
        load_preprocess(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{not json")
    with pytest.raises(ModelSourceError, match="not valid JSON"):
        load_preprocess(tmp_path / "y.json")
    with pytest.raises(ModelSourceError, match="class list"):
        load_preprocess({"preprocess": GOOD, "classes": "cat"})


def test_a_resizing_models_card_gives_its_normalization_classes_and_input_size():
    """Detectors and segmenters read their card through ``resized_input`` (run folder and ONNX alike)."""
    from gluontl.data.card import resized_input

    card = model_card(TransformSpec(normalize=((0.5, 0.4, 0.3), (0.2, 0.25, 0.5))), ["bg", "cat"], "data", (3, 40, 60))
    prep, names, hw = resized_input(json.loads(json.dumps(card)), "'x.onnx'", "segmenter", "segmentation")
    assert hw == (40, 60) and names == ["bg", "cat"] and prep.steps == ()
    assert list(prep.mean) == [0.5, 0.4, 0.3] and list(prep.std) == [0.2, 0.25, 0.5]


@pytest.mark.parametrize("model, task", [("detector", "detection"), ("segmenter", "segmentation")])
@pytest.mark.parametrize("change, words", [
    ("steps", ["steps [('resize_shorter', 36), ('center_crop', 32)]"]),
    ("no size", ["input shape [None, 3, None, None]"]),
    ("no classes", ["classes None"]),
])
def test_a_card_of_a_model_that_does_not_resize_is_refused_naming_the_file_and_the_task(model, task, change, words):
    from gluontl.data.card import resized_input

    spec = TransformSpec(resize=36, center_crop=32) if change == "steps" else TransformSpec()
    card = model_card(spec, ["bg", "cat"], "data", (3, 32, 32))
    if change == "no size":
        card["preprocess"]["input"]["shape"] = [None, 3, None, None]
    if change == "no classes":
        del card["classes"]
    with pytest.raises(ModelSourceError) as e:
        resized_input(card, "'runs/r/preprocess.json'", model, task)
    msg = str(e.value)
    assert msg.startswith(f"The preprocessing record of 'runs/r/preprocess.json' is not a {model}'s"), msg
    assert all(w in msg for w in words) and msg.endswith(f"Export the {task} run again."), msg
