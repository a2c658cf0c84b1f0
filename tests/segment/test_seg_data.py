"""Segmentation loaders on folders made by hand with known masks: VOC layout, images/ + masks/
with the automatic hold-out and with split folders; masks with values that are not classes,
masks of the wrong size and sources that do not name their classes are errors naming the file."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from gluontl.errors import DataError
from gluontl.recipe import parse_recipe
from gluontl.segment.data import load_segmentation_split, make_segmentation_loaders
from gluontl.segment.formats import write_mask, write_voc_lists

HW = 16
CLASSES = ["background", "cat", "dog"]


def _pair(rng, k):
    """A random image and a mask of class blocks with an ignored border (VOC style)."""
    img = rng.integers(0, 256, (HW, HW, 3), dtype=np.uint8)
    mask = np.zeros((HW, HW), np.uint8)
    mask[2:9, 3:12] = 1 + k % 2
    mask[10:, :5] = 2 - k % 2
    mask[0, :] = 255
    return img, mask


def _write_image(path, img):
    Image.fromarray(img).save(path, format="PNG" if path.suffix == ".png" else "JPEG", quality=95)


def _voc(root, n_train=3, n_val=2, seed=0):
    rng = np.random.default_rng(seed)
    (root / "JPEGImages").mkdir(parents=True)
    (root / "SegmentationClass").mkdir()
    masks = {}
    for k in range(n_train + n_val):
        img, mask = _pair(rng, k)
        _write_image(root / "JPEGImages" / f"im{k}.jpg", img)
        write_mask(root / "SegmentationClass" / f"im{k}.png", mask)
        masks[f"im{k}"] = mask
    write_voc_lists(root, {"train": [f"im{k}" for k in range(n_train)],
                           "val": [f"im{k}" for k in range(n_train, n_train + n_val)]})
    return masks


def _pairs(root, n, seed=0):
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    images, masks = {}, {}
    for k in range(n):
        img, mask = _pair(rng, k)
        _write_image(root / "images" / f"p{k:02d}.png", img)
        write_mask(root / "masks" / f"p{k:02d}.png", mask)
        images[f"p{k:02d}"], masks[f"p{k:02d}"] = img, mask
    return images, masks


def _recipe(source, **data):
    return parse_recipe({"name": "seg", "task": "segmentation",
                         "model": {"source": "zoo:resnet18_v1", "input_shape": [3, HW, HW]},
                         "data": {"source": source, "batch_size": 2, "classes": CLASSES,
                                  "val_transform": {"normalize": "none"}, **data}}, origin="test")


def _split(recipe, split, **kw):
    from gluontl.tasks.segmentation import seg_spec

    return load_segmentation_split(recipe.data, seg_spec(recipe), split, recipe.model.input_shape, **kw)


def test_voc_val_batches_are_the_masks_and_images_on_disk(tmp_path):
    masks = _voc(tmp_path)
    r = _recipe(f"voc:{tmp_path}")
    from gluontl.tasks.segmentation import seg_spec

    loaders = make_segmentation_loaders(r.data, seg_spec(r), r.model.input_shape, seed=0)
    assert (loaders.train_size, loaders.val_size, loaders.class_names, loaders.split) == (3, 2, CLASSES, None)
    x, y = next(iter(loaders.val))
    assert x.shape == (2, 3, HW, HW) and y.shape == (2, HW, HW)
    np.testing.assert_array_equal(y.asnumpy(), np.stack([masks["im3"], masks["im4"]]).astype(np.float32))
    decoded = np.asarray(Image.open(tmp_path / "JPEGImages" / "im3.jpg").convert("RGB"), np.float32) / 255
    np.testing.assert_allclose(x.asnumpy()[0], decoded.transpose(2, 0, 1), rtol=0, atol=1e-6)


def test_voc_train_masks_keep_their_values_and_move_with_the_crop(tmp_path):
    _voc(tmp_path)
    r = _recipe(f"voc:{tmp_path}")
    ds = _split(r, "train", train=True, seed=1)
    for epoch in range(3):
        x, y = ds[(0, epoch)]
        assert x.shape == (3, HW, HW) and y.shape == (HW, HW)
        assert set(np.unique(y)) <= {0.0, 1.0, 2.0, 255.0}
        np.testing.assert_array_equal(ds[(0, epoch)][1], y)  # seeded per (epoch, index)


def test_masks_folder_is_split_automatically_and_recorded(tmp_path):
    _, masks = _pairs(tmp_path, 10)
    r = _recipe(f"masks:{tmp_path}", val_fraction=0.2)
    from gluontl.tasks.segmentation import seg_spec

    loaders = make_segmentation_loaders(r.data, seg_spec(r), r.model.input_shape, seed=0)
    assert (loaders.train_size, loaders.val_size) == (8, 2)
    record = loaders.split.to_json()
    train = {p.image.stem for p in loaders.train._dataset.samples}
    val = {p.image.stem for p in loaders.val._dataset.samples}
    assert not train & val and train | val == set(masks)
    assert sorted(record["val"]) == sorted(str(tmp_path / "images" / f"{s}.png") for s in val)
    assert record["counts"]["val"] == {"background": 2, "cat": 2, "dog": 2}
    again = make_segmentation_loaders(r.data, seg_spec(r), r.model.input_shape, seed=5)
    assert {p.image.stem for p in again.val._dataset.samples} == val  # the run seed does not move the split


def test_masks_folder_with_split_folders_uses_them(tmp_path):
    _pairs(tmp_path / "train", 3)
    _pairs(tmp_path / "val", 2, seed=1)
    (tmp_path / "classes.txt").write_text("background\ncat\ndog\n")
    r = parse_recipe({"name": "seg", "task": "segmentation",
                      "model": {"source": "zoo:resnet18_v1", "input_shape": [3, HW, HW]},
                      "data": {"source": f"masks:{tmp_path}", "batch_size": 2}}, origin="test")
    ds = _split(r, "val")
    assert len(ds) == 2 and ds.class_names == CLASSES and not ds.held_out


def test_a_mask_value_that_is_no_class_is_an_error_naming_file_and_value(tmp_path):
    _, masks = _pairs(tmp_path, 4)
    bad = masks["p02"].copy()
    bad[5, 5] = 7
    write_mask(tmp_path / "masks" / "p02.png", bad)
    r = _recipe(f"masks:{tmp_path}")
    with pytest.raises(DataError) as e:
        for split in ("train", "val"):
            _split(r, split)
    assert "p02.png" in str(e.value) and "7" in str(e.value) and "ignore label 255" in str(e.value)
    # a changed class count (gluon-cv #969): value 2 is no class of a 2-class recipe
    with pytest.raises(DataError, match=r"value\(s\) 2"):
        _split(_recipe(f"masks:{tmp_path}", classes=["background", "cat"]), "train")


def test_a_mask_of_another_size_than_its_image_is_an_error(tmp_path):
    _pairs(tmp_path, 3)
    write_mask(tmp_path / "masks" / "p01.png", np.zeros((HW, HW - 1), np.uint8))
    with pytest.raises(DataError, match=r"p01.png' is 15x16 .* 16x16"):
        for split in ("train", "val"):
            _split(_recipe(f"masks:{tmp_path}"), split)


def test_a_source_without_class_names_asks_for_them(tmp_path):
    _pairs(tmp_path, 3)
    r = parse_recipe({"name": "seg", "task": "segmentation",
                      "model": {"source": "zoo:resnet18_v1", "input_shape": [3, HW, HW]},
                      "data": {"source": f"masks:{tmp_path}"}}, origin="test")
    with pytest.raises(DataError, match="data.classes"):
        _split(r, "train")


def test_a_bad_image_is_skipped_under_on_bad_image_skip(tmp_path):
    _pairs(tmp_path, 5)
    (tmp_path / "images" / "p03.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match="p03.png"):
        for split in ("train", "val"):
            _split(_recipe(f"masks:{tmp_path}"), split)
    r = _recipe(f"masks:{tmp_path}", on_bad_image="skip")
    sizes = [len(_split(r, s)) for s in ("train", "val")]
    assert sum(sizes) == 4
