"""Segmentation formats: the VOC colormap against the devkit's published colours, palette PNGs
that round-trip, VOC and images/+masks/ readers, and masks whose values are not classes."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from gluontl.errors import DataError
from gluontl.segment.formats import IGNORE, read_mask, read_pairs, read_voc, voc_colormap, write_mask, write_voc_lists

# colours as printed in the VOC2012 devkit documentation / every VOC palette PNG
VOC_COLOURS = {0: (0, 0, 0), 1: (128, 0, 0), 2: (0, 128, 0), 3: (128, 128, 0), 4: (0, 0, 128),
               7: (128, 128, 128), 8: (64, 0, 0), 15: (192, 128, 128), 20: (0, 64, 128), 255: (224, 224, 192)}


def _devkit_labelcolormap(n):
    """The VOC devkit's MATLAB ``labelcolormap`` transcribed literally, one id at a time."""
    out = []
    for i in range(n):
        r = g = b = 0
        c = i
        for j in range(8):
            r |= ((c >> 0) & 1) << (7 - j)
            g |= ((c >> 1) & 1) << (7 - j)
            b |= ((c >> 2) & 1) << (7 - j)
            c >>= 3
        out.append((r, g, b))
    return np.array(out, np.uint8)


def test_voc_colormap_is_the_devkits():
    cmap = voc_colormap()
    assert cmap.shape == (256, 3) and cmap.dtype == np.uint8
    np.testing.assert_array_equal(cmap, _devkit_labelcolormap(256))
    for i, colour in VOC_COLOURS.items():
        assert tuple(cmap[i]) == colour, i


def test_palette_mask_round_trips_and_shows_voc_colours(tmp_path):
    rng = np.random.default_rng(0)
    mask = rng.integers(0, 21, (17, 23)).astype(np.uint8)
    mask[3:5, 4:9] = IGNORE
    path = write_mask(tmp_path / "m.png", mask)
    np.testing.assert_array_equal(read_mask(path, 21), mask)
    with Image.open(path) as im:
        assert im.mode == "P"
        rgb = np.asarray(im.convert("RGB"))
    np.testing.assert_array_equal(rgb, _devkit_labelcolormap(256)[mask])


def _voc_root(tmp_path, n=3):
    rng = np.random.default_rng(1)
    (tmp_path / "JPEGImages").mkdir()
    (tmp_path / "SegmentationClass").mkdir()
    masks = {}
    for i in range(n):
        name = f"2007_{i:06d}"
        Image.fromarray(rng.integers(0, 256, (8, 10, 3), dtype=np.uint8)).save(tmp_path / "JPEGImages" / f"{name}.jpg")
        masks[name] = rng.integers(0, 3, (8, 10)).astype(np.uint8)
        write_mask(tmp_path / "SegmentationClass" / f"{name}.png", masks[name])
    names = sorted(masks)
    write_voc_lists(tmp_path, {"train": names[:2], "val": names[2:]})
    return masks


def test_read_voc_follows_the_split_lists(tmp_path):
    masks = _voc_root(tmp_path)
    train, val = read_voc(tmp_path, "train"), read_voc(tmp_path, "val")
    assert [s.image.stem for s in train] == ["2007_000000", "2007_000001"]
    assert [s.mask.stem for s in val] == ["2007_000002"]
    for s in train + val:
        assert s.image.parent.name == "JPEGImages" and s.image.suffix == ".jpg"
        np.testing.assert_array_equal(read_mask(s.mask, 3), masks[s.mask.stem])


def test_read_voc_names_a_missing_list_and_missing_files(tmp_path):
    _voc_root(tmp_path)
    with pytest.raises(DataError, match="Segmentation/test.txt"):
        read_voc(tmp_path, "test")
    (tmp_path / "SegmentationClass" / "2007_000001.png").unlink()
    with pytest.raises(DataError, match="2007_000001.png"):
        read_voc(tmp_path, "train")


def test_read_pairs_pairs_by_stem_and_names_lone_files(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "masks").mkdir()
    for stem, suffix in (("b", ".png"), ("a", ".jpg")):
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "images" / f"{stem}{suffix}")
        Image.fromarray(np.ones((4, 4), np.uint8)).save(tmp_path / "masks" / f"{stem}.png")
    pairs = read_pairs(tmp_path)
    assert [(p.image.name, p.mask.name) for p in pairs] == [("a.jpg", "a.png"), ("b.png", "b.png")]
    np.testing.assert_array_equal(read_mask(pairs[0].mask, 2), np.ones((4, 4)))  # grey masks are ids too
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "masks" / "c.png")
    with pytest.raises(DataError, match=r"masks/c\b"):
        read_pairs(tmp_path)


def test_read_pairs_without_a_masks_folder(tmp_path):
    (tmp_path / "images").mkdir()
    with pytest.raises(DataError, match="no masks/ folder"):
        read_pairs(tmp_path)


def test_mask_values_that_are_not_classes_name_file_and_value(tmp_path):
    mask = np.zeros((5, 5), np.uint8)
    mask[0, 0], mask[1, 1], mask[2, 2] = 11, IGNORE, 10
    path = write_mask(tmp_path / "bad.png", mask)
    np.testing.assert_array_equal(read_mask(path, 12), mask)
    with pytest.raises(DataError, match=r"bad\.png' holds pixel value\(s\) 11, which .*0\.\.10 for 11 classes"):
        read_mask(path, 11)
    with pytest.raises(DataError, match=r"value\(s\) 11, 255,.*ignore label 0"):
        read_mask(path, 11, ignore=0)


def test_colour_masks_are_refused(tmp_path):
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "rgb.png")
    with pytest.raises(DataError, match="rgb.png' is a RGB image"):
        read_mask(tmp_path / "rgb.png", 3)
    (tmp_path / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match="Cannot read the mask .*broken.png"):
        read_mask(tmp_path / "broken.png", 3)
