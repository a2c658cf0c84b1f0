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


def test_non_square_input_gets_a_cover_and_centre_crop_of_its_own_shape():
    r = parse_recipe({**MINIMAL, "model": {"source": "zoo:resnet18_v1", "input_shape": [3, 32, 48]}})
    assert r.data.val_transform == TransformSpec(resize=(32, 48))
    assert r.data.train_transform == TransformSpec(resize=(32, 48), flip=True)
    assert transform_lines({"val": {"steps": __import__("gluontl.data.transforms", fromlist=["describe"]).describe(
        r.data.val_transform, False), "default": None}}) == [
        "val transform: scaled to cover 32x48, centre crop 32x48, normalize imagenet"]
    assert parse_recipe(r.as_written()).digest() == r.digest()
    given = parse_recipe(_with_data(val_transform={"resize": [40, 60], "center_crop": [32, 48]},
                                    train_transform={"random_resized_crop": [32, 48]})
                         | {"model": {"source": "zoo:resnet18_v1", "input_shape": [3, 32, 48]}})
    assert given.data.val_transform.out_size() == (32, 48) and given.data.transform_default("val_transform") is None
    with pytest.raises(RecipeError, match=r"data.val_transform makes 48x48 images \(resize: 48\).* Give "
                                          r"data.val_transform the size \[32, 48\] \(resize: \[32, 48\]"):
        parse_recipe(_with_data(val_transform={"resize": 48}) | {"model": {"source": "zoo:resnet18_v1",
                                                                              "input_shape": [3, 32, 48]}})
    assert TransformSpec(resize=[32, 32]) == TransformSpec(resize=32)  # square recipes read as before


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

def _readme_recipe(offline: bool = False) -> str:
    """The README's shortest recipe (zoo weights, downloaded), or the offline one beside it."""
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    mine = [b for b in blocks if "folder:photos" in b and ("pretrained: true" in b) != offline]
    assert len(mine) == 1 and len(mine[0].strip().splitlines()) == 5
    return mine[0]


def test_the_readmes_offline_recipe_plans_without_a_download(lite0, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GLUONTL_HOME", str(lite0.parent.parent))  # where gluontl made the EfficientNet-Lite0
    _photos(tmp_path / "photos", np.random.default_rng(5))
    Path("r.yaml").write_text(_readme_recipe(offline=True))
    code, out, err = helpers.run_cli(capsys, "plan", "-r", "r.yaml", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["totals"]["trainable"] == 1280 * 2 + 2  # the new head only
    assert plan["transforms"]["val"]["default"].endswith("normalize from model file metadata gluontl.preprocess")


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


@pytest.fixture(scope="module")
def lite0(tmp_path_factory):
    from gluontl.convert.efficientnet_lite import ensure_imagenet_onnx

    return ensure_imagenet_onnx(tmp_path_factory.mktemp("home"))


def test_an_onnx_files_own_normalization_is_the_default_and_the_plan_says_so(lite0, capsys, tmp_path):
    """The EfficientNet-Lite0 gluontl writes declares (x - 127) / 128 in gluontl.preprocess; a minimal
    recipe on it normalizes so, not with ImageNet's mean/std, and says where that came from."""
    minimal = {"name": "m", "model": {"source": str(lite0)}, "surgery": {"cut_at": "flatten", "head": {"classes": 10}},
               "rules": [{"preset": "freeze_all_but_head"}], "data": {"source": "demo:digits"}}
    file_norm = ((127 / 255,) * 3, (128 / 255,) * 3)
    r = parse_recipe(minimal)
    for key in ("train_transform", "val_transform"):
        assert getattr(r.data, key).normalize == file_norm
        assert r.data.transform_default(key) == ("default from model.input_shape [3, 224, 224], normalize from "
                                                 "model file metadata gluontl.preprocess")
    # a transform given without normalize gets the file's too; a given normalize is the recipe's own
    r = parse_recipe({**minimal, "data": {"source": "demo:digits", "train_transform": {"resize": 224},
                                          "val_transform": {"resize": 224, "normalize": "imagenet"}}})
    assert r.data.train_transform.normalize == file_norm and r.data.val_transform.normalize == "imagenet"
    assert r.data.transform_default("train_transform") == "normalize from model file metadata gluontl.preprocess"
    assert r.data.transform_default("val_transform") is None
    # what the tensors are: (pixel - 127) / 128, independently of gluontl's normalize code
    from gluontl.data.transforms import build

    img = np.random.RandomState(0).randint(0, 256, (224, 224, 3), dtype=np.uint8)
    got = build(parse_recipe(minimal).data.val_transform, False)(img)
    want = (img.transpose(2, 0, 1).astype(np.float64) - 127) / 128
    np.testing.assert_allclose(got, want, rtol=0, atol=helpers.f32_tol(2.0, terms=3))
    # the run folder's recipe.yaml leaves it out and loading derives it again (same digest, same tensors)
    again = parse_recipe(r.as_written())
    assert again.data.train_transform == r.data.train_transform and again.digest() == r.digest()
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(minimal))
    code, out, err = helpers.run_cli(capsys, "plan", "--recipe", str(path))
    assert code == 0, err
    lines = [line for line in out.splitlines() if line.startswith(("train transform", "val transform"))]
    assert len(lines) == 2 and all("normalize from model file metadata gluontl.preprocess" in line for line in lines)
    assert all("normalize mean [0.498, 0.498, 0.498] std [0.502, 0.502, 0.502] = (pixel - 127) / 128" in line
               for line in lines)


def test_an_onnx_file_that_declares_no_normalization_says_imagenet_is_the_default(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("GlobalAveragePool", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 1, 1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "m.onnx"))
    r = parse_recipe({**MINIMAL, "model": {"source": str(tmp_path / "m.onnx")}})
    assert r.data.val_transform.normalize == "imagenet"
    assert r.data.transform_default("val_transform") == ("default from model.input_shape [3, 32, 32], normalize "
                                                         "ImageNet default (the model file declares none)")
