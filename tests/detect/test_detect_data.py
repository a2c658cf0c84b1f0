"""Box-aware augmentation and the detection loaders: boxes stay on their pixels through every
geometric step, augmentation is a function of (seed, epoch, index), batches follow the contract
(plain cpu, padded with -1, one M), class selection, bad images and the automatic hold-out."""
from __future__ import annotations

from pathlib import Path

import cv2
import mxnet as mx
import numpy as np
import pydantic
import pytest
from PIL import Image

from gluontl.detect.augment import DetectionTransform, crop_boxes, hflip, ssd_crop
from gluontl.detect.data import load_detection_split, make_detection_loaders
from gluontl.detect.formats import Annotation, write_coco, write_voc, write_yolo
from gluontl.errors import DataError
from gluontl.recipe import DataSpec, TransformSpec
from gluontl.data.transforms import sample_rng

NAMES = ["cat", "dog", "person"]
BOXES = np.array([[20, 30, 70, 90, 0, 0], [100, 10, 150, 50, 1, 1]], np.float32)


def _painted(w: int = 160, h: int = 120, boxes: np.ndarray = BOXES) -> np.ndarray:
    img = np.full((h, w, 3), 60, np.uint8)
    for x0, y0, x1, y1 in boxes[:, :4].astype(int):
        img[y0:y1, x0:x1] = 255
    return img


def _hwc(x: np.ndarray) -> np.ndarray:
    return x.transpose(1, 2, 0) * 255  # normalize: none


# ---------------------------------------------------------------- augmentation

@pytest.mark.parametrize("expand", [1.0, 2.5])
def test_boxes_cover_the_same_pixels_after_crop_zoom_resize_and_flip(expand):
    t = DetectionTransform(TransformSpec(flip=True, normalize="none"), (64, 160), True, expand=expand)
    flipped = dropped = 0
    for index in range(40):
        x, out = t(_painted(), BOXES, sample_rng(7, 0, index))
        img = _hwc(x).min(axis=2)
        assert img.shape == (64, 160) and len(out) >= 1
        assert set(out[:, 4].tolist()) <= {0.0, 1.0} and (out[:, 5] == out[:, 4]).all()  # class/difficult ride along
        near = np.zeros(img.shape, bool)
        for x0, y0, x1, y1 in out[:, :4]:
            assert 0 <= x0 < x1 <= 160 and 0 <= y0 < y1 <= 64
            # interior (1 px in from the box edges) is the painted patch; resizing blurs one pixel
            inner = img[int(np.ceil(y0)) + 1:int(y1) - 1, int(np.ceil(x0)) + 1:int(x1) - 1]
            assert inner.size == 0 or inner.min() > 250, index
            near[max(0, int(y0) - 1):int(np.ceil(y1)) + 1, max(0, int(x0) - 1):int(np.ceil(x1)) + 1] = True
        if len(out) == len(BOXES):  # a box whose centre left the crop is dropped, its pixels may remain
            assert img[~near].max(initial=0) < 100, index  # no patch pixel outside its (1 px wider) box
        flipped += bool(out[0, 4] == 0 and out[0, 0] > 80)  # the left patch ended up on the right
        dropped += len(out) < len(BOXES)
    assert flipped and 0 < dropped < 30  # both random steps happened in these 40 samples


def test_augmentation_is_a_function_of_seed_epoch_and_index():
    t = DetectionTransform(TransformSpec(flip=True, color_jitter=0.3), (64, 64), True, expand=2.0)
    a = t(_painted(), BOXES, sample_rng(3, 1, 5))
    b = t(_painted(), BOXES, sample_rng(3, 1, 5))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    others = [t(_painted(), BOXES, sample_rng(3, e, 5)) for e in (2, 3, 4)]
    assert any(not np.array_equal(a[0], o[0]) for o in others)
    with pytest.raises(ValueError, match="pass rng"):
        t(_painted(), BOXES)


def test_val_transform_only_resizes_with_boxes_scaled():
    spec = TransformSpec(flip=True, color_jitter=0.5, normalize="none")
    t = DetectionTransform(spec, (60, 80), False)
    assert not t.random
    x, out = t(_painted(), BOXES)
    np.testing.assert_array_equal(out, BOXES * np.array([0.5, 0.5, 0.5, 0.5, 1, 1], np.float32))
    want = cv2.resize(_painted().astype(np.float32), (80, 60), interpolation=cv2.INTER_AREA)
    np.testing.assert_allclose(_hwc(x), want, rtol=0, atol=1e-3)


def test_size_settings_are_refused_for_detection():
    with pytest.raises(DataError, match=r"data.train_transform sets resize, center_crop.*input_shape \(64, 64\)"):
        DetectionTransform(TransformSpec(resize=70, center_crop=64), (64, 64), True)


def test_crop_drops_boxes_whose_centre_leaves_and_clips_the_rest():
    labels = np.array([[0, 0, 10, 10, 0, 0], [8, 8, 30, 30, 1, 0], [40, 40, 50, 50, 2, 0]], np.float32)
    out = crop_boxes(labels, (5, 5, 30, 30))  # the crop spans [5, 35): centres 5 (kept), 19 (kept), 45 (dropped)
    np.testing.assert_array_equal(out, [[0, 0, 5, 5, 0, 0], [3, 3, 25, 25, 1, 0]])


def test_hflip_mirrors_boxes_and_twice_is_identity():
    img = _painted()
    f_img, f_boxes = hflip(img, BOXES)
    np.testing.assert_array_equal(f_boxes[:, :4], [[90, 30, 140, 90], [10, 10, 60, 50]])
    np.testing.assert_array_equal(f_img, img[:, ::-1])
    np.testing.assert_array_equal(hflip(f_img, f_boxes)[1], BOXES)


def test_ssd_crop_keeps_a_box_and_handles_images_without_objects():
    for i in range(30):
        img, out = ssd_crop(_painted(), BOXES, np.random.default_rng(i))
        assert len(out) >= 1 and (out[:, 2] <= img.shape[1]).all() and (out[:, 3] <= img.shape[0]).all()
        img, out = ssd_crop(_painted(), np.zeros((0, 6), np.float32), np.random.default_rng(i))
        assert out.shape == (0, 6) and img.size > 0


# ---------------------------------------------------------------- datasets

def _image(path: Path, rgb: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(path)
    return path


def _anns(src: Path, n: int = 10) -> list[Annotation]:
    """n images of different sizes with 0-3 painted boxes; image 1 has no objects."""
    rng = np.random.default_rng(0)
    anns = []
    for i in range(n):
        w, h = int(rng.integers(60, 160)), int(rng.integers(60, 160))
        k = 0 if i == 1 else 1 + i % 3
        x0, y0 = rng.integers(0, w // 2, k), rng.integers(0, h // 2, k)
        labels = np.stack([x0, y0, x0 + rng.integers(5, w // 2, k), y0 + rng.integers(5, h // 2, k),
                           np.arange(k) % 3, np.zeros(k)], 1).astype(np.float32).reshape(-1, 6)
        anns.append(Annotation(_image(src / f"i{i}.png", _painted(w, h, labels)), (w, h), labels, "t"))
    return anns


def _spec(source: str, **kw) -> DataSpec:
    return DataSpec(source=source, batch_size=kw.pop("batch_size", 2),
                    val_transform=TransformSpec(normalize="none"), **kw)


@pytest.fixture
def voc(tmp_path) -> tuple[Path, list[Annotation]]:
    anns = _anns(tmp_path / "src")
    write_voc(tmp_path / "voc", {"train": anns[:6], "val": anns[6:]}, NAMES)
    return tmp_path / "voc", anns


@pytest.mark.parametrize("workers", [0, 1])
def test_batches_are_plain_cpu_padded_with_minus_one_and_scaled(voc, workers):
    root, anns = voc
    loaders = make_detection_loaders(_spec(f"voc:{root}", workers=workers), (3, 48, 64), seed=0)
    assert loaders.class_names == ["cat", "dog", "person"] and (loaders.train_size, loaders.val_size) == (6, 4)
    seen = 0
    for x, y in loaders.val:
        assert x.context == mx.cpu() and y.context == mx.cpu()  # not cpu_shared
        assert x.dtype == np.float32 and y.dtype == np.float32
        assert x.shape[1:] == (3, 48, 64) and y.shape[1:] == (3, 6)  # M = the most objects of any image
        for row in y.asnumpy():
            a = anns[6 + seen]
            want = a.labels * np.array([64 / a.size[0], 48 / a.size[1], 64 / a.size[0], 48 / a.size[1], 1, 1],
                                       np.float32)
            np.testing.assert_allclose(row[:len(want)], want, rtol=1e-6)
            assert (row[len(want):] == -1).all()
            seen += 1
    assert seen == 4
    net = mx.gluon.nn.Conv2D(2, 3, in_channels=3)
    net.initialize()
    net.hybridize(static_alloc=True, static_shape=True)
    x, y = next(iter(loaders.train_epoch(0)))
    assert net(x).shape == (2, 2, 46, 62)  # a hybridized net takes the batch as it comes


def test_train_batches_do_not_depend_on_the_worker_count(voc):
    root, _ = voc
    spec = dict(train_transform=TransformSpec(flip=True, color_jitter=0.2))
    a = make_detection_loaders(_spec(f"voc:{root}", workers=0, **spec), (3, 32, 32), seed=5, which=("train",))
    b = make_detection_loaders(_spec(f"voc:{root}", workers=1, **spec), (3, 32, 32), seed=5, which=("train",))
    assert a.val is None
    for (xa, ya), (xb, yb) in zip(a.train_epoch(2), b.train_epoch(2)):
        np.testing.assert_array_equal(xa.asnumpy(), xb.asnumpy())
        np.testing.assert_array_equal(ya.asnumpy(), yb.asnumpy())


def test_the_three_formats_load_the_same_batches(voc, tmp_path):
    root, anns = voc
    write_coco(tmp_path / "coco", {"train": anns[:6], "val": anns[6:]}, NAMES)
    write_yolo(tmp_path / "yolo", {"train": anns[:6], "val": anns[6:]}, NAMES)
    got = {}
    for fmt, path in (("voc", root), ("coco", tmp_path / "coco"), ("yolo", tmp_path / "yolo")):
        ds = load_detection_split(_spec(f"{fmt}:{path}"), "val", (3, 40, 40))
        got[fmt] = [ds[i] for i in range(len(ds))]
        assert ds.class_names == NAMES
    for fmt in ("coco", "yolo"):
        for (xa, ya), (xb, yb) in zip(got["voc"], got[fmt]):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_allclose(ya[:, :4], yb[:, :4], rtol=0, atol=1e-4)
            np.testing.assert_array_equal(ya[:, 4], yb[:, 4])


def test_data_classes_drop_other_boxes_and_images_left_without_any(voc):
    root, anns = voc
    ds = load_detection_split(_spec(f"voc:{root}", classes=["person", "cat"]), "train", (3, 32, 32))
    names = [Path(a.image).stem for a in ds.annotations]
    # i0: cat; i1: no objects (a negative, kept); i2: cat dog person; i3: cat; i4: cat dog; i5: cat dog person
    assert names == ["i0", "i1", "i2", "i3", "i4", "i5"]
    kept = {Path(a.image).stem: a.labels for a in ds.annotations}
    np.testing.assert_array_equal(kept["i2"][:, 4], [1, 0])  # cat -> 1, person -> 0, dog dropped
    np.testing.assert_array_equal(kept["i2"][:, :4], anns[2].labels[[0, 2], :4])
    assert kept["i1"].shape == (0, 6)
    ds = load_detection_split(_spec(f"voc:{root}", classes=["person"]), "train", (3, 32, 32))
    assert [Path(a.image).stem for a in ds.annotations] == ["i1", "i2", "i5"]


def test_unknown_class_name_suggests_the_close_one(voc):
    root, _ = voc
    with pytest.raises(DataError, match=r"class 'dgo' .*did you mean 'dog'\? valid: cat, dog, person"):
        load_detection_split(_spec(f"voc:{root}", classes=["dgo"]), "train", (3, 32, 32))


def test_voc_val_class_missing_from_train_is_an_error(voc):
    root, _ = voc
    xml = root / "Annotations" / "i7.xml"
    xml.write_text(xml.read_text().replace("<name>dog</name>", "<name>dogs</name>"))
    with pytest.raises(DataError, match=r"i7\.xml: class 'dogs' does not occur in the train split 'train' "
                                        r"\(did you mean 'dog'\? valid: cat, dog, person\)"):
        load_detection_split(_spec(f"voc:{root}"), "val", (3, 32, 32))
    assert len(load_detection_split(_spec(f"voc:{root}", classes=["cat"]), "val", (3, 32, 32))) == 4


def test_bad_images_error_or_are_skipped_and_reported(voc):
    root, _ = voc
    (root / "JPEGImages" / "i3.png").unlink()
    Image.new("RGB", (10, 10)).save(root / "JPEGImages" / "i4.png")  # its XML says another size
    with pytest.raises(DataError, match=r"Bad image '.*i3\.png'.*file does not exist.*on_bad_image: skip"):
        make_detection_loaders(_spec(f"voc:{root}"), (3, 32, 32), seed=0)
    loaders = make_detection_loaders(_spec(f"voc:{root}", on_bad_image="skip"), (3, 32, 32), seed=0)
    assert loaders.train_size == 4
    reasons = dict(loaders.bad.items)
    assert reasons[str(root / "JPEGImages" / "i3.png")] == "file does not exist"
    assert reasons[str(root / "JPEGImages" / "i4.png")].startswith("the image is 10x10 but ")


def test_voc_without_imagesets_is_held_out_the_same_whatever_the_classes(voc):
    root, anns = voc
    for f in (root / "ImageSets" / "Main").iterdir():
        f.unlink()
    (root / "ImageSets" / "Main").rmdir()
    spec = _spec(f"voc:{root}", val_fraction=0.3)
    loaders = make_detection_loaders(spec, (3, 32, 32), seed=0)
    train = {a.image.name for a in loaders.train._dataset.annotations}
    val = {a.image.name for a in loaders.val._dataset.annotations}
    assert not train & val and train | val == {a.image.name for a in anns}
    assert loaders.split is not None and sorted(Path(p).name for p in loaders.split.val) == sorted(val)
    assert loaders.split.counts["val"]["cat"] == sum(bool((a.labels[:, 4] == 0).any()) for a in anns
                                                     if a.image.name in val)
    sub = load_detection_split(_spec(f"voc:{root}", val_fraction=0.3, classes=["dog"]), "val", (3, 32, 32))
    assert {a.image.name for a in sub.annotations} <= val
    with pytest.raises(DataError, match="no split 'test'"):
        load_detection_split(spec, "test", (3, 32, 32))


def test_one_coco_json_is_held_out_and_images_sit_beside_it(voc, tmp_path):
    _, anns = voc
    write_coco(tmp_path / "c", {"all": anns}, NAMES)
    single = tmp_path / "c" / "all" / "_annotations.coco.json"
    (tmp_path / "c" / "annotations" / "instances_all.json").rename(single)
    loaders = make_detection_loaders(_spec(f"coco:{single}"), (3, 32, 32), seed=0)
    assert loaders.train_size + loaders.val_size == len(anns) and loaders.split is not None


def test_missing_splits_and_sources_say_what_exists(voc, tmp_path):
    root, _ = voc
    with pytest.raises(DataError, match=r"no split file .*test\.txt'; split files found: train, val"):
        load_detection_split(_spec(f"voc:{root}"), "test", (3, 32, 32))
    with pytest.raises(DataError, match=r"no '.*instances_val\.json' \(found: none\)"):
        load_detection_split(_spec(f"coco:{tmp_path}"), "val", (3, 32, 32))
    with pytest.raises(DataError, match="does not exist"):
        load_detection_split(_spec(f"yolo:{tmp_path / 'nope'}"), "val", (3, 32, 32))
    with pytest.raises(DataError, match="Available: demo:digits_det"):
        load_detection_split(_spec("demo:digits"), "val", (3, 32, 32))


def test_recipe_accepts_detection_sources_and_lists_every_form():
    assert DataSpec(source="yolo:/data/x").source == "yolo:/data/x"
    with pytest.raises(pydantic.ValidationError, match="voc:PATH, coco:PATH, yolo:PATH or demo:digits_det"):
        DataSpec(source="vox:/data/x")


def test_splits_declaring_different_classes_are_refused(voc, tmp_path):
    _, anns = voc
    write_coco(tmp_path / "c", {"train": anns[:6]}, NAMES)
    write_coco(tmp_path / "c", {"val": anns[6:]}, ["cat", "dog", "horse"])
    with pytest.raises(DataError, match="declare different classes.*train: cat, dog, person; val: cat, dog, horse"):
        make_detection_loaders(_spec(f"coco:{tmp_path / 'c'}"), (3, 32, 32), seed=0)
    loaders = make_detection_loaders(_spec(f"coco:{tmp_path / 'c'}", classes=["dog", "cat"]), (3, 32, 32), seed=0)
    assert loaders.class_names == ["dog", "cat"]
