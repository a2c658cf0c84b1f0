"""Transforms a recipe leaves out come from the model's input size; sizes that cannot fit are refused."""
import json
import re
from pathlib import Path

import cv2
from tests import helpers
import mxnet as mx
import numpy as np
import pytest
import yaml

from gluontl.errors import DataError, RecipeError
from gluontl.recipe import TransformSpec, load_recipe, parse_recipe
from gluontl.tasks import transform_lines

README = Path(__file__).resolve().parents[2] / "README.md"
MINIMAL = {"name": "m", "model": {"source": "zoo:resnet18_v1", "input_shape": [3, 32, 32]},
           "surgery": {"head": {"classes": 2}}, "rules": [{"preset": "freeze_all_but_head"}],
           "data": {"source": "folder:photos"}}


def _with_data(**data):
    return {**MINIMAL, "data": {**MINIMAL["data"], **data}}


def test_no_transform_means_shorter_side_centre_crop_and_a_training_flip():
    r = parse_recipe(MINIMAL)
    assert r.data.val_transform == TransformSpec(resize=32)
    assert r.data.train_transform == TransformSpec(resize=32, flip=True)
    assert r.data.transform_default("val_transform") == "default from model.input_shape [3, 32, 32]"
    # a zoo family's own size when the recipe gives none
    r = parse_recipe({**MINIMAL, "model": {"source": "zoo:inceptionv3"}})
    assert r.data.val_transform.resize == 299


def test_a_transform_without_a_size_gets_the_size_only():
    r = parse_recipe(_with_data(train_transform={"color_jitter": 0.1, "normalize": "none"}))
    assert r.data.train_transform == TransformSpec(resize=32, color_jitter=0.1, normalize="none")  # no flip added
    assert r.data.transform_default("train_transform") == "size from model.input_shape [3, 32, 32]"


def test_given_sizes_are_kept_and_not_marked():
    r = parse_recipe(_with_data(train_transform={"random_resized_crop": 32}, val_transform={"resize": 40,
                                                                                           "center_crop": 32}))
    assert r.data.train_transform == TransformSpec(random_resized_crop=32)
    assert r.data.transform_default("train_transform") is None and r.data.transform_default("val_transform") is None


def test_cache_on_without_views_leaves_the_default_flip_out():
    r = parse_recipe({**MINIMAL, "train": {"cache_features": "on"}})
    assert r.data.train_transform == TransformSpec(resize=32)
    assert "no flip" in r.data.transform_default("train_transform")
    assert parse_recipe({**MINIMAL, "train": {"cache_features": "on", "cache_views": 2}}).data.train_transform.flip


def test_digests_of_recipes_that_give_transforms_did_not_change(monkeypatch):
    """Computed by gluontl at ae6af57, before default transforms, with this GLUONTL_HOME (two
    recipes name their model under it, and the digest holds the path)."""
    monkeypatch.setenv("GLUONTL_HOME", "/pinned/gluontl-home")
    want = {"digits_pretrain": "1e0d6a", "elpv_efficientnet_lite0": "c94a7d", "resnet18_freeze": "05723d",
            "detect_digits_ssd": "900ecb", "onnx_resnet_cut": "aea980"}
    recipes = Path(__file__).resolve().parents[2] / "recipes"
    assert {n: load_recipe(recipes / f"{n}.yaml").digest()[:6] for n in want} == want


def test_a_recipe_without_transforms_keeps_its_digest_and_loads_back_as_written():
    r = parse_recipe(MINIMAL)
    old_form = parse_recipe(_with_data(train_transform={}, val_transform={}))  # the pre-default dump
    assert r.digest() == old_form.digest()
    written = r.as_written()
    assert "train_transform" not in written["data"] and "val_transform" not in written["data"]
    again = parse_recipe(written)
    assert again.data == r.data and again.data.transform_default("train_transform") is not None


@pytest.mark.parametrize("data, sets, names", [
    ({"val_transform": {"resize": 48}}, [], "data.val_transform makes 48x48 images (resize: 48)"),
    ({"train_transform": {"resize": 40, "center_crop": 36}}, [],
     "data.train_transform makes 36x36 images (resize: 40, center_crop: 36)"),
    ({"val_transform": {"resize": 32}}, ["--set", "model.input_shape=[3, 48, 48]"],
     "data.val_transform makes 32x32 images (resize: 32)"),
])
def test_a_size_the_model_cannot_take_exits_2_from_plan(tmp_path, capsys, data, sets, names):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_with_data(**data)))
    code, out, err = helpers.run_cli(capsys, "plan", "-r", str(path), *sets)
    assert code == 2 and out == "" and "Traceback" not in err
    text = " ".join(err.split())
    shape = "[3, 48, 48]" if sets else "[3, 32, 32]"
    assert names in text and f"model.input_shape {shape} takes" in text
    assert "leave the sizes out to get the default" in text
    assert ("Invalid --set value: --set 'model.input_shape=[3, 48, 48]'" in text) == bool(sets)


def test_an_unrelated_set_is_not_blamed(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_with_data(val_transform={"resize": 48})))
    with pytest.raises(RecipeError) as e:
        load_recipe(path, ["train.epochs=2"])
    assert str(e.value).startswith(f"{path}: invalid recipe: data.val_transform makes 48x48")


def test_non_square_input_without_a_size_is_refused():
    with pytest.raises(RecipeError, match=r"gives no size, and gluontl's transforms make square images"):
        parse_recipe({**MINIMAL, "model": {"source": "zoo:resnet18_v1", "input_shape": [3, 32, 48]}})


@pytest.mark.parametrize("engine", ["mxnet", "onnxruntime"])
def test_prefix_engines_refuse_images_of_another_size(engine):
    from gluontl.data.prefix import MxEngine, OrtEngine

    prefix = mx.gluon.nn.HybridSequential()
    prefix.add(mx.gluon.nn.Conv2D(4, 3, in_channels=3))
    prefix.initialize()
    built = (3, 16, 16)
    run = MxEngine(prefix, built, mx.cpu()) if engine == "mxnet" else OrtEngine(prefix, built, mx.cpu())
    x = np.random.default_rng(0).standard_normal((2, *built)).astype(np.float32)
    assert run(x).shape == (2, 4, 14, 14)
    with pytest.raises(DataError, match=r"A batch of 3x20x20 images .* built for model.input_shape \[3, 16, 16\]"):
        run(np.zeros((2, 3, 20, 20), np.float32))


# ---------------------------------------------------------------- the README's recipe on a real folder

def _readme_recipe() -> str:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    mine = [b for b in blocks if "folder:photos" in b]
    assert len(mine) == 1 and len(mine[0].strip().splitlines()) == 5
    return mine[0]


def _photos(root: Path, rng: np.random.Generator) -> None:
    """2 classes x 10 PNGs of random sizes between 20 and 90 px (red-heavy vs blue-heavy noise)."""
    for k, name in enumerate(["blue", "red"]):
        (root / name).mkdir(parents=True)
        for i in range(10):
            h, w = rng.integers(20, 91, 2)
            rgb = rng.integers(0, 120, (h, w, 3)).astype(np.uint8)
            rgb[..., 2 * k] += 120
            cv2.imwrite(str(root / name / f"{i}.png"), rgb[..., ::-1])


def _reference_tensor(path: Path, side: int) -> np.ndarray:
    """docs/export.md's Preprocessing steps in plain cv2/numpy: shorter side to ``side`` (area when
    shrinking, bilinear when enlarging), centre crop, ImageNet normalization, CHW."""
    rgb = cv2.imread(str(path))[..., ::-1]
    h, w = rgb.shape[:2]
    nh, nw = (side, round(w * side / h)) if h <= w else (round(h * side / w), side)
    interp = cv2.INTER_AREA if nh * nw < h * w else cv2.INTER_LINEAR
    rgb = cv2.resize(np.ascontiguousarray(rgb), (nw, nh), interpolation=interp)
    y, x = (nh - side) // 2, (nw - side) // 2
    t = rgb[y:y + side, x:x + side].astype(np.float32) / np.float32(255)
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    return ((t - mean) / std).transpose(2, 0, 1)[None]


@pytest.mark.parametrize("cache", ["on", "off"])
def test_the_readme_recipe_trains_exports_and_predicts_on_photos_of_any_size(tmp_path, monkeypatch, capsys, cache):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    rng = np.random.default_rng(25)
    _photos(tmp_path / "photos", rng)
    new = tmp_path / "new.png"
    cv2.imwrite(str(new), rng.integers(0, 255, (95, 37, 3)).astype(np.uint8))
    Path("r.yaml").write_text(_readme_recipe())
    weights = helpers.resnet18_weights(tmp_path / "w.params")  # offline stand-in for pretrained: true
    sets = ["model.pretrained=false", f"model.weights={weights}", "model.restore.only=[features.*]",
            "model.input_shape=[3, 32, 32]", "train.epochs=1", f"train.cache_features={cache}"]
    args = [a for s in sets for a in ("--set", s)]

    code, plan_out, err = helpers.run_cli(capsys, "plan", "-r", "r.yaml", *args)
    assert code == 0, err
    printed = [line for line in plan_out.splitlines() if " transform: " in line]
    code, out, err = helpers.run_cli(capsys, "finetune", "-r", "r.yaml", "-q", *args)
    assert code == 0, err
    run = tmp_path / "runs" / "my_photos"
    card = json.loads((run / "preprocess.json").read_text())
    assert printed == transform_lines(card["transforms"])
    assert [line for line in (run / "plan.txt").read_text().splitlines() if " transform: " in line] == printed
    assert json.loads((run / "plan.json").read_text())["transforms"] == card["transforms"]
    flip = ", horizontal flip (p 1/2)" if cache == "off" else ""
    assert card["transforms"]["train"]["steps"] == f"shorter side to 32, centre crop 32x32{flip}, normalize imagenet"
    assert card["transforms"]["val"]["default"] == "default from model.input_shape [3, 32, 32]"
    assert json.loads((run / "plan.json").read_text())["feature_cache"]["cache"] is (cache == "on")

    onnx_file = run / "export" / "my_photos.onnx"
    code, by_run, err = helpers.run_cli(capsys, "predict", str(run), str(new), "--json")
    assert code == 0, err
    code, by_onnx, err = helpers.run_cli(capsys, "predict", str(onnx_file), str(new), "--json")
    assert code == 0, err
    (run_top,), (onnx_top,) = ([r["top"] for r in json.loads(o)] for o in (by_run, by_onnx))
    assert [n for n, _ in run_top] == [n for n, _ in onnx_top]
    np.testing.assert_allclose([p for _, p in run_top], [p for _, p in onnx_top], rtol=1e-4)
    # the exported model fed by docs/export.md's steps alone agrees with predict
    logits = helpers.ort_run(onnx_file, _reference_tensor(new, 32))[0][0]
    prob = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert onnx_top[0][0] == ["blue", "red"][int(prob.argmax())]
    np.testing.assert_allclose(onnx_top[0][1], prob.max(), rtol=1e-5)


def test_an_onnx_file_declares_the_size_when_the_recipe_gives_none():
    fixtures = Path(__file__).resolve().parents[1] / "onnx" / "fixtures"
    r = parse_recipe({**MINIMAL, "model": {"source": str(fixtures / "resnet_legacy_op13_nofold.onnx")}})
    assert r.model.input_shape == (3, 32, 32) and r.data.val_transform == TransformSpec(resize=32)
    # symbolic H, W: the default size
    dynamic = parse_recipe({**MINIMAL, "model": {"source": str(fixtures / "resnet_legacy_op13_dynhw.onnx")}})
    assert dynamic.model.input_shape == (3, 224, 224)
