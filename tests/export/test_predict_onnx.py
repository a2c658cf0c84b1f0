"""An exported ONNX file reproduces `gluontl predict` from its own metadata: preprocessing written
here from the recorded steps alone (PIL decode, cv2.resize, numpy), run in onnxruntime."""
import json

import cv2
import mxnet as mx
import numpy as np
import onnx
import pytest
from tests import helpers
from onnx import TensorProto, helper
from PIL import Image, ImageOps

import gluontl
from gluontl.recipe import parse_recipe
from gluontl.data.datasets import load_split
from gluontl.train.loop import finetune
from gluontl.train.runs import export_run
from gluontl.data.transforms import load_preprocess, onnx_props

DATA = {**helpers.DIGITS_5_9, "val_transform": {"resize": 20, "center_crop": 16}}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The tiny net as an MXNet symbol checkpoint and as a bare ONNX file (no gluontl metadata)."""
    d = tmp_path_factory.mktemp("src")
    prefix = helpers.tiny_symbol(d)
    net = mx.gluon.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"], f"{prefix}-0000.params")
    bare = gluontl.export_onnx(net, d / "bare.onnx", {"data": (1, 3, 16, 16)})
    return {"symbol": f"symbol:{prefix}", "onnx": f"onnx:{bare}", "bare": bare}


@pytest.fixture(scope="module", params=["symbol", "onnx"])
def world(request, sources, tmp_path_factory):
    """A trained run of the tiny net (from a symbol checkpoint: mx.onnx export path; from an ONNX
    file: patched-graph path), its exports, and images of every awkward kind."""
    d = tmp_path_factory.mktemp(request.param)
    r = parse_recipe({"name": "t", "model": {"source": sources[request.param], "input_shape": [3, 16, 16]},
                      "data": DATA, "train": {"epochs": 2, "lr": 0.1, "seed": 0}})
    run = finetune(r, runs_root=d / "runs", quiet=True).run_dir
    paths = export_run(run, d / "out", formats=["onnx", "symbol"])
    ds = load_split(r.data, "val")
    rs = np.random.RandomState(7)
    digit = np.asarray(Image.open(ds.name(0)).convert("RGB"))
    images = [ds.name(0), ds.name(len(ds) - 1)]
    wide = np.asarray(Image.fromarray(digit).resize((41, 24), Image.BILINEAR))
    Image.fromarray(wide).save(d / "wide.png")
    Image.fromarray(rs.randint(0, 256, (37, 29), np.uint8), "L").save(d / "gray.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: decoders must rotate it upright (30 wide, 20 high)
    Image.fromarray(np.asarray(Image.fromarray(digit).resize((20, 30)))).save(d / "rotated.jpg", exif=exif)
    Image.fromarray(rs.randint(0, 256, (7, 9, 3), np.uint8)).save(d / "tiny.png")  # enlarged to 20
    images += [str(d / n) for n in ("wide.png", "gray.png", "rotated.jpg", "tiny.png")]
    return {"d": d, "run": run, "onnx": next(p for p in paths if p.suffix == ".onnx"),
            "card": d / "out" / "t-preprocess.json", "images": images}


# -------------------------------------------------- the reference, from docs/export.md (Preprocessing)

def shorter_side(img, size):
    h, w = img.shape[:2]
    new = (round(w * size / h), size) if h <= w else (size, round(h * size / w))  # (width, height)
    interp = cv2.INTER_AREA if size < min(h, w) else cv2.INTER_LINEAR
    return cv2.resize(img, new, interpolation=interp)


def reference_input(path, rec):
    """The model input for ``path`` from the ``gluontl.preprocess`` record alone."""
    with Image.open(path) as im:
        img = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    for step in rec["steps"]:
        size = step["size"]
        if step["op"] == "resize_shorter" or min(img.shape[:2]) < size:
            img = shorter_side(img, size)
        if step["op"] == "center_crop":
            h, w = img.shape[:2]
            y, x = (h - size) // 2, (w - size) // 2
            img = img[y:y + size, x:x + size]
    x = img.astype(np.float32).transpose(2, 0, 1) / np.float32(rec["scale"])
    mean, std = (np.array(rec[k], np.float32).reshape(3, 1, 1) for k in ("mean", "std"))
    return (x - mean) / std


def reference_predictions(onnx_path, images):
    """(class names, logits per image) using nothing but the file."""
    meta = {p.key: p.value for p in onnx.load(str(onnx_path)).metadata_props}
    rec, classes = json.loads(meta["gluontl.preprocess"]), json.loads(meta["gluontl.classes"])
    session = helpers.ort_session(onnx_path)
    assert session.get_inputs()[0].name == rec["input"]["name"]
    logits = [session.run(None, {rec["input"]["name"]: reference_input(p, rec)[None]})[0][0] for p in images]
    return classes, np.array(logits, np.float64)


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_onnx_metadata_alone_reproduces_gluontl_predict(world, capsys):
    classes, logits = reference_predictions(world["onnx"], world["images"])
    assert classes == ["5", "6", "7", "8", "9"]
    want = softmax(logits)
    # Logits of MXNet and onnxruntime differ by float32 summation order (conv 8x3x3 the widest
    # sum, four layers deep); a softmax moves each probability by at most twice the largest
    # logit difference; float32 softmax adds a few ulps.
    tol = 2 * helpers.f32_tol(np.abs(logits).max(), 8 * 9, depth=4) + 4 * helpers.EPS32
    for model in (world["run"], world["onnx"]):
        code, out, err = helpers.run_cli(capsys, "predict", str(model), *world["images"], "--topk", "5", "--json")
        assert code == 0, err
        got = json.loads(out)
        assert [g["image"] for g in got] == world["images"]
        for g, w in zip(got, want):
            probs = dict(g["top"])
            assert set(probs) == set(classes)
            np.testing.assert_allclose([probs[c] for c in classes], w, rtol=0, atol=tol, err_msg=f"{model} {g['image']}")
            ranked = [c for c, _ in g["top"]]
            order = np.argsort(-w, kind="stable")
            for a, b in zip(order, order[1:]):  # every order the numbers can decide
                if w[a] - w[b] > 2 * tol:
                    assert ranked.index(classes[a]) < ranked.index(classes[b]), (g, w)
    assert len({tuple(np.argsort(-w)) for w in want}) > 1  # the images do not all look alike to the model


def test_preprocess_from_the_file_matches_the_reference(world):
    rec = json.loads({p.key: p.value for p in onnx.load(str(world["onnx"])).metadata_props}["gluontl.preprocess"])
    for path in world["images"]:
        ref = reference_input(path, rec)
        for spec in (world["onnx"], world["card"], world["run"]):
            got = gluontl.preprocess(path, spec)
            assert got.shape == (3, 16, 16) and got.dtype == np.float32
            np.testing.assert_allclose(got, ref, rtol=0, atol=4 * helpers.EPS32 * np.abs(ref).max(), err_msg=path)


def test_run_folder_symbol_card_and_onnx_metadata_agree(world):
    stored = json.loads((world["run"] / "preprocess.json").read_text())
    assert json.loads(world["card"].read_text()) == stored  # NAME-preprocess.json beside t-symbol.json
    assert (world["d"] / "out" / "t-symbol.json").is_file()
    meta = {p.key: p.value for p in onnx.load(str(world["onnx"])).metadata_props}
    assert json.loads(meta["gluontl.classes"]) == stored["classes"] == ["5", "6", "7", "8", "9"]
    assert json.loads(meta["gluontl.preprocess"]) == stored["preprocess"]
    assert meta["gluontl.task"] == stored["task"] == "classification"  # what predict FILE.onnx dispatches on
    assert sum(p.key.startswith("gluontl.") for p in onnx.load(str(world["onnx"])).metadata_props) == 3
    rec = stored["preprocess"]
    assert rec["steps"] == [{"op": "resize_shorter", "size": 20}, {"op": "center_crop", "size": 16}]
    assert rec["input"] == {"name": "data", "shape": [None, 3, 16, 16], "layout": "NCHW", "dtype": "float32"}
    assert load_preprocess(world["card"]) == load_preprocess(world["onnx"]) == load_preprocess(world["run"])


def test_export_of_an_old_run_without_preprocess_json_computes_the_same(world, tmp_path):
    stored = (world["run"] / "preprocess.json").read_text()
    (world["run"] / "preprocess.json").unlink()
    try:
        onnx_path = next(p for p in export_run(world["run"], tmp_path, formats=["onnx"]))
    finally:
        (world["run"] / "preprocess.json").write_text(stored)
    meta = {p.key: p.value for p in onnx.load(str(onnx_path)).metadata_props}
    assert json.loads(meta["gluontl.preprocess"]) == json.loads(stored)["preprocess"]


def one_paragraph_error(capsys, *args):
    code, out, err = helpers.run_cli(capsys, *args)
    assert code == 2 and out == "" and err.startswith("error: ") and "Traceback" not in err, (code, out, err)
    return " ".join(err.split())


def test_onnx_without_metadata_is_refused_clearly(world, sources, tmp_path, capsys):
    img = world["images"][0]
    msg = one_paragraph_error(capsys, "predict", str(sources["bare"]), img)
    assert str(sources["bare"]) in msg and "no gluontl.classes and no gluontl.preprocess metadata" in msg
    assert "gluontl export runs/NAME" in msg
    # Re-exporting a run's file as a bare model drops the run's class names and preprocessing:
    # after import it could have had surgery, and stale class names would be silently wrong.
    # Other keys (a converted file's provenance) stay.
    model = onnx.load(str(world["onnx"]))
    model.metadata_props.add(key="gluontl.converted", value="from somewhere")
    onnx.save(model, str(tmp_path / "src.onnx"))
    code, _, err = helpers.run_cli(capsys, "export", str(tmp_path / "src.onnx"), "--format", "onnx", "--out",
                           str(tmp_path / "out"))
    assert code == 0, err
    again = tmp_path / "out" / "src.onnx"
    assert {p.key: p.value for p in onnx.load(str(again)).metadata_props} == {"gluontl.converted": "from somewhere"}
    assert "gluontl.classes" in one_paragraph_error(capsys, "predict", str(again), img)


def test_predict_on_onnx_names_bad_images_and_bad_graphs(world, tmp_path, capsys):
    garbage = tmp_path / "garbage.png"
    garbage.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(200)))
    msg = one_paragraph_error(capsys, "predict", str(world["onnx"]), world["images"][0], str(garbage))
    assert str(garbage) in msg and "Cannot read image" in msg
    msg = one_paragraph_error(capsys, "predict", str(tmp_path / "nowhere.onnx"), world["images"][0])
    assert str(tmp_path / "nowhere.onnx") in msg and "does not exist" in msg
    # A flat-vector graph carrying a run's metadata: the wrong input rank is named.
    card = json.loads(world["card"].read_text())
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"])], "flat",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 768])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        [helper.make_tensor("w", TensorProto.FLOAT, [768, 5], np.zeros(768 * 5, np.float32))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    for k, v in onnx_props(card).items():
        model.metadata_props.add(key=k, value=v)
    flat = tmp_path / "flat.onnx"
    onnx.save(model, str(flat))
    msg = one_paragraph_error(capsys, "predict", str(flat), world["images"][0])
    assert str(flat) in msg and "('x', [1, 768])" in msg and "N x C x H x W" in msg
    # A record whose crop does not fit the graph's input: the metadata belongs to another model.
    card["preprocess"]["steps"] = [{"op": "resize_shorter", "size": 12}, {"op": "center_crop", "size": 12}]
    other = onnx.load(str(world["onnx"]))
    for p in other.metadata_props:
        if p.key == "gluontl.preprocess":
            p.value = json.dumps(card["preprocess"])
    onnx.save(other, str(tmp_path / "other.onnx"))
    msg = one_paragraph_error(capsys, "predict", str(tmp_path / "other.onnx"), world["images"][0])
    assert "[1, 3, 12, 12]" in msg and "does not belong" in msg
    # Class names that do not fit the output; a graph onnxruntime cannot feed one image to.
    other = onnx.load(str(world["onnx"]))
    for p in other.metadata_props:
        if p.key == "gluontl.classes":
            p.value = json.dumps(["a", "b", "c"])
    onnx.save(other, str(tmp_path / "three.onnx"))
    msg = one_paragraph_error(capsys, "predict", str(tmp_path / "three.onnx"), world["images"][0])
    assert "3 classes" in msg and "[1, 5]" in msg
    graph = helper.make_graph(
        [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
         helper.make_node("Gemm", ["f", "w"], ["y"])], "pairs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [helper.make_tensor("w", TensorProto.FLOAT, [3, 5], np.zeros(15, np.float32))])
    pairs = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    for k, v in onnx_props(json.loads(world["card"].read_text())).items():
        pairs.metadata_props.add(key=k, value=v)
    onnx.save(pairs, str(tmp_path / "pairs.onnx"))
    msg = one_paragraph_error(capsys, "predict", str(tmp_path / "pairs.onnx"), world["images"][0])
    assert "onnxruntime cannot run" in msg and world["images"][0] in msg


def test_an_edited_run_card_is_refused_not_trusted(world, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(world["run"], run, ignore=shutil.ignore_patterns("feature_cache"))
    card = json.loads((run / "preprocess.json").read_text())
    del card["classes"]
    (run / "preprocess.json").write_text(json.dumps(card))
    msg = one_paragraph_error(capsys, "predict", str(run), world["images"][0])
    assert str(run / "preprocess.json") in msg and "classes" in msg
    card["classes"], card["preprocess"]["version"] = ["5", "6", "7", "8", "9"], 99
    (run / "preprocess.json").write_text(json.dumps(card))
    msg = one_paragraph_error(capsys, "predict", str(run), world["images"][0])
    assert str(run / "preprocess.json") in msg and "version 99" in msg


def test_a_checkpoint_choice_for_an_exported_file_is_refused(capsys):
    code, _, err = helpers.run_cli(capsys, "predict", "tests/onnx/fixtures/resnet_legacy_op13.onnx",
                                   "tests/onnx/fixtures/MANIFEST.json", "--checkpoint", "last")
    assert code == 2 and "--checkpoint last picks a run folder's checkpoint" in " ".join(err.split())
