"""gluontl/deploy_preprocess.py, the copyable numpy + Pillow reference, against gluontl's own
pipeline (OpenCV) bit for bit, and deployed alone with onnxruntime against `gluontl predict`."""
import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from tests.helpers import WITHOUT_GLUONTL, run_cli
from PIL import Image

import gluontl
from gluontl import deploy_preprocess as ref
from gluontl.recipe import TransformSpec
from gluontl.data.transforms import Preprocess

ELPV_NORM = [[0.498, 0.498, 0.498], [0.502, 0.502, 0.502]]


def record(size=None, crop=None, normalize="imagenet"):
    spec = TransformSpec(resize=size, center_crop=crop, normalize=normalize)
    side = crop or size
    return Preprocess.from_spec(spec).to_json("data", (None, 3, side, side))


# (height, width) of the image and the record's resize / center_crop: shrinking by integer
# ratios (2x2 blocks round half up in OpenCV, 3x3 and 4x4 multiply by a float 1/9, 1/16) and
# non-integer ones (ELPV's 300 -> 224), enlarging (fixed-point bilinear), one-pixel sides,
# non-square both ways, a crop that enlarges first.
FIXED = [((300, 300), 224, None), ((64, 64), 32, None), ((96, 96), 32, None), ((128, 256), 32, None),
         ((96, 48), 16, None), ((300, 200), 224, None), ((200, 300), 224, None), ((17, 23), 32, None),
         ((5, 7), 64, None), ((1, 1), 8, None), ((1, 40), 4, None), ((40, 1), 4, None), ((224, 224), 224, None),
         ((480, 640), 256, 224), ((100, 151), 50, None), ((99, 101), 98, None), ((30, 20), None, 24),
         ((250, 333), None, 224), ((50, 1000), 49, None)]
rs = np.random.RandomState(19)
RANDOM = [((int(rs.randint(1, 360)), int(rs.randint(1, 360))), int(rs.randint(1, 300)), None) for _ in range(40)]


@pytest.mark.parametrize("hw,size,crop", FIXED + RANDOM)
@pytest.mark.parametrize("gray", [False, True])
def test_reference_is_gluontl_preprocess_bit_for_bit(hw, size, crop, gray):
    rng = np.random.default_rng([hw[0], hw[1], size or 0, gray])
    img = rng.integers(0, 256, hw if gray else (*hw, 3), dtype=np.uint8)
    rec = record(size, crop, ELPV_NORM if gray else "imagenet")
    want = gluontl.preprocess(img, rec)
    got = ref.preprocess(img, rec)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got, want), f"{(got != want).sum()} of {got.size} values differ"


# non-square models ([H, W] sizes): images of other shapes, square, exact fit, a resize before an H x W crop
NON_SQUARE = [((40, 170), (48, 192), None), ((100, 100), (48, 192), None), ((300, 90), (48, 192), None),
              ((48, 192), (48, 192), None), ((20, 500), (32, 64), None), ((60, 300), None, (48, 192)),
              ((480, 640), 256, (224, 160)), ((7, 9), (12, 40), None)]


@pytest.mark.parametrize("hw,size,crop", NON_SQUARE)
def test_non_square_records_are_reproduced_bit_for_bit(hw, size, crop):
    spec = TransformSpec(resize=size, center_crop=crop)
    rec = Preprocess.from_spec(spec).to_json("data", (None, 3, *spec.out_size()))
    img = np.random.default_rng([hw[0], hw[1]]).integers(0, 256, (*hw, 3), dtype=np.uint8)
    want, got = gluontl.preprocess(img, rec), ref.preprocess(img, rec)
    assert want.shape == (3, *spec.out_size()) and np.array_equal(got, want), (got != want).sum()
    assert Preprocess.from_json(json.loads(json.dumps(rec)), "r") == Preprocess.from_spec(spec)


def test_a_non_square_resize_covers_the_model_size_then_takes_its_centre():
    """By hand: 40x170 to cover 48x192 binds the height (48/40 > 192/170): 48 x round(170 * 1.2) = 204,
    then columns 6..197; OpenCV enlarges bilinearly."""
    import cv2

    img = np.random.default_rng(3).integers(0, 256, (40, 170, 3), dtype=np.uint8)
    want = cv2.resize(img, (204, 48), interpolation=cv2.INTER_LINEAR)[:, 6:198].astype(np.float32) / 255
    mean, std = np.float32([0.485, 0.456, 0.406]), np.float32([0.229, 0.224, 0.225])
    got = gluontl.preprocess(img, {"resize": [48, 192]})
    np.testing.assert_array_equal(got, ((want - mean) / std).transpose(2, 0, 1))


def test_opencv_without_its_cpu_specific_code_gives_the_same_pixels():
    """The reference must not match one CPU's SIMD path only: OpenCV's generic code agrees."""
    import cv2

    rng, before = np.random.default_rng(8), cv2.useOptimized()
    try:
        cv2.setUseOptimized(False)
        for hw, size, crop in FIXED:
            img = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
            rec = record(size, crop)
            assert np.array_equal(ref.preprocess(img, rec), gluontl.preprocess(img, rec)), hw
    finally:
        cv2.setUseOptimized(before)


def _exif(orientation):
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


def test_reference_decodes_every_kind_of_file_like_gluontl(tmp_path):
    rng = np.random.default_rng(3)
    rgb = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    files = {"gray.png": Image.fromarray(rgb[:, :, 0], "L"),
             "sixteen.png": Image.fromarray(rng.integers(0, 65536, (37, 53)).astype(np.uint16)),
             "palette.png": Image.fromarray(rgb).convert("P"),
             "rgba.png": Image.fromarray(np.dstack([rgb, rgb[:, :, :1]]), "RGBA"),
             "cmyk.jpg": Image.fromarray(rgb).convert("CMYK"), "plain.jpg": Image.fromarray(rgb)}
    for name, im in files.items():
        im.save(tmp_path / name)
    for o in (3, 6, 8):
        Image.fromarray(rgb).save(tmp_path / f"exif{o}.jpg", exif=_exif(o))
    rec = record(32, None, ELPV_NORM)
    for path in sorted(tmp_path.iterdir()):
        assert np.array_equal(ref.preprocess(path, rec), gluontl.preprocess(path, rec)), path.name
        assert np.array_equal(ref.preprocess(path.read_bytes(), rec), gluontl.preprocess(path, rec)), path.name


def test_decoding_gives_the_pixels_written_into_each_kind_of_file(tmp_path):
    """Files whose pixels are chosen here, so the expected RGB is known without decoding: a palette
    looked up by hand, 16-bit gray / 257 rounded to nearest, alpha dropped (not blended), CMYK with
    only C or only K inked (255 - C, 255 - K under any of Pillow's conversions)."""
    palette = np.array([[10, 20, 30], [200, 100, 50], [0, 255, 128]], np.uint8)
    index = np.array([[0, 1, 2], [2, 2, 1]], np.uint8)
    pal = Image.fromarray(index, "P")
    pal.putpalette(palette.ravel().tolist())
    sixteen = np.array([[0, 128, 129, 257], [385, 386, 65534, 65535]], np.uint16)
    gray, alpha = np.array([[0, 77, 255]], np.uint8), np.array([[255, 0, 9]], np.uint8)
    rgb = np.array([[[1, 2, 3], [250, 128, 0]]], np.uint8)
    c, k = np.array([[0, 40, 255, 0]], np.uint8), np.array([[0, 0, 0, 90]], np.uint8)
    zero = np.zeros_like(c)
    cases = {"palette.png": (pal, palette[index]),
             "sixteen.png": (Image.fromarray(sixteen), np.array([[0, 0, 1, 1], [1, 2, 255, 255]], np.uint8)),
             "la.png": (Image.fromarray(np.dstack([gray, alpha]), "LA"), gray),
             "rgba.png": (Image.fromarray(np.dstack([rgb, np.array([[0, 128]], np.uint8)]), "RGBA"), rgb),
             "cmyk.tif": (Image.fromarray(np.dstack([c, zero, zero, k]), "CMYK"),
                          np.dstack([255 - c - k, 255 - k, 255 - k]))}
    for name, (im, want) in cases.items():
        im.save(tmp_path / name)
        if want.ndim == 2:
            want = np.repeat(want[:, :, None], 3, axis=2)
        assert np.array_equal(ref.decode(tmp_path / name), want), name


@pytest.mark.parametrize("orientation,turn", [(3, 2), (6, -1), (8, 1)])
def test_exif_orientation_turns_the_stored_pixels_upright(tmp_path, orientation, turn):
    """By hand: orientation 6 is stored turned left (display turns it clockwise), 8 the other
    way, 3 upside down; lossless PNG so the pixels compare exactly."""
    stored = np.random.default_rng(orientation).integers(0, 256, (7, 12, 3), dtype=np.uint8)
    path = tmp_path / "turned.png"
    Image.fromarray(stored).save(path, exif=_exif(orientation))
    assert np.array_equal(ref.decode(path), np.rot90(stored, turn))


def test_reference_imports_numpy_and_pillow_only():
    tree = ast.parse(Path(ref.__file__).read_text())
    roots = {(n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
             for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    assert roots <= {"__future__", "io", "os", "typing", "numpy", "PIL"}, roots


# ------------------------------------------------------------------- deployed alone

DEPLOY = WITHOUT_GLUONTL + r'''
import json

import numpy as np
import onnxruntime as ort
from deploy_preprocess import preprocess

options = ort.SessionOptions()
options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
meta = session.get_modelmeta().custom_metadata_map
record, classes = json.loads(meta["gluontl.preprocess"]), json.loads(meta["gluontl.classes"])
out = []
for image in sys.argv[2:]:
    logits = session.run(None, {record["input"]["name"]: preprocess(image, record)[None]})[0][0].astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    out.append({"image": image, "top": [[classes[i], float(p[i])] for i in np.argsort(-p, kind="stable")]})
print(json.dumps(out))
'''


def elpv_like_images(folder):
    """300x300 gray cells with bus bars and dark cracks, a cut-off one, a photographed one
    stored sideways (EXIF), a small one (enlarged) and an RGB one at an integer ratio."""
    rng = np.random.default_rng(0)
    paths = []
    for i in range(8):
        cell = rng.normal(150, 25, (300, 300)).clip(0, 255)
        cell[:, [75 + 8 * i, 150, 225]] = 40
        y = int(rng.integers(20, 280))
        cell[y:y + 3 + i, int(rng.integers(0, 150)):] *= 0.3
        paths.append(folder / f"cell{i}.png")
        Image.fromarray(cell.astype(np.uint8), "L").save(paths[-1])
    wide = rng.integers(0, 256, (200, 300), dtype=np.uint8)
    Image.fromarray(wide, "L").save(folder / "wide.png")
    Image.fromarray(wide.T.copy(), "L").save(folder / "sideways.jpg", exif=_exif(6))
    Image.fromarray(rng.integers(0, 256, (150, 190, 3), dtype=np.uint8)).save(folder / "photo.jpg", exif=_exif(8))
    Image.fromarray(rng.integers(0, 256, (90, 70), dtype=np.uint8), "L").save(folder / "small.png")
    Image.fromarray(rng.integers(0, 256, (448, 448, 3), dtype=np.uint8)).save(folder / "rgb.png")
    return [str(p) for p in paths] + [str(folder / n) for n in ("wide.png", "sideways.jpg", "photo.jpg",
                                                                   "small.png", "rgb.png")]


def test_onnxruntime_and_the_copied_reference_alone_match_gluontl_predict(tmp_path, capsys):
    mx.random.seed(5)
    net = mx.gluon.nn.HybridSequential()  # a block trained in research code (untrained here)
    net.add(mx.gluon.nn.Conv2D(6, 5, strides=4, activation="relu"), mx.gluon.nn.Conv2D(8, 3, strides=2),
            mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(2))
    net.initialize(mx.init.Xavier())
    model = gluontl.export_onnx(net, tmp_path / "elpv.onnx", {"data": (1, 3, 224, 224)},
                                classes=["functional", "defective"],
                                preprocess={"resize": 224, "normalize": ELPV_NORM})
    images = elpv_like_images(tmp_path)
    code, out, err = run_cli(capsys, "predict", str(model), *images, "--topk", "2", "--json")
    assert code == 0, err
    want = json.loads(out)
    copied = tmp_path / "deployment"
    copied.mkdir()
    shutil.copy(ref.__file__, copied / "deploy_preprocess.py")
    # run as a script in the deployment folder: Python puts that folder, with the copied reference, on the path
    (copied / "deploy.py").write_text(DEPLOY)
    done = subprocess.run([sys.executable, str(copied / "deploy.py"), str(model), *images],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert [g["image"] for g in got] == images
    for g, w in zip(got, want):  # the same tensor in the same session: the same numbers
        assert g["top"] == w["top"], g["image"]
    assert len({w["top"][0][0] for w in want}) == 2  # both classes occur: top-1 is not a constant here
