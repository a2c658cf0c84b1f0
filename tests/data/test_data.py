"""Datasets, bad-image policy, transforms and deterministic loading."""
from __future__ import annotations

import gluoncv.data  # noqa: F401  (switches PIL LOAD_TRUNCATED_IMAGES on globally; we must not care)
import io
import multiprocessing.pool
from pathlib import Path

import cv2
import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from gluontl.errors import DataError
from gluontl.recipe import DataSpec, TransformSpec
from gluontl.data.datasets import load_split, make_loaders, stratified_holdout
from gluontl.data.sampler import EpochSampler
from gluontl.data.transforms import IMAGENET_MEAN, IMAGENET_STD, build, load_image, sample_rng

RAW = TransformSpec(normalize="none")


def _rgb(seed: int, h: int = 12, w: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _png(path: Path, rgb: np.ndarray) -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rgb).save(path, format="PNG")
    return rgb


def _tree(root: Path, classes: dict[str, int], split: str = "train", seed: int = 0) -> dict[str, np.ndarray]:
    """``root/split/<class>/<i>.png`` with random pixels; returns path -> pixels."""
    out = {}
    for ci, (c, n) in enumerate(classes.items()):
        for i in range(n):
            p = root / split / c / f"{i:02d}.png"
            out[str(p)] = _png(p, _rgb(seed * 1000 + ci * 100 + i))
    return out


def _batches(loader) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.asnumpy(), y.asnumpy()) for x, y in loader]


def _same(a, b) -> bool:
    return len(a) == len(b) and all((xa == xb).all() and (ya == yb).all() for (xa, ya), (xb, yb) in zip(a, b))


# ---------------------------------------------------------------- folder:

def test_folder_class_subset_sets_label_order_and_reads_exact_pixels(tmp_path):
    pixels = _tree(tmp_path, {"cat": 3, "dog": 2, "eel": 4})
    ds = load_split(DataSpec(source=f"folder:{tmp_path}", classes=["eel", "cat"], val_transform=RAW), "train")
    assert ds.class_names == ["eel", "cat"] and len(ds) == 7
    assert [int(v) for v in ds.labels] == [0, 0, 0, 0, 1, 1, 1]
    for i in range(len(ds)):
        assert Path(ds.name(i)).parent.name == ds.class_names[ds.labels[i]]
        assert (ds.image(i) == pixels[ds.name(i)]).all()
        x, y = ds[i]
        assert x.dtype == np.float32 and x.shape == (3, 12, 16) and y == ds.labels[i]
        assert np.allclose(x * 255, pixels[ds.name(i)].transpose(2, 0, 1), atol=1e-3)


def test_folder_default_classes_are_sorted_and_val_uses_train_labels(tmp_path):
    _tree(tmp_path, {"b": 1, "a": 1, "c": 1})
    _tree(tmp_path, {"c": 2, "a": 1}, split="val")
    spec = DataSpec(source=f"folder:{tmp_path}", on_bad_image="skip")
    assert load_split(spec, "train").class_names == ["a", "b", "c"]
    val = load_split(spec, "val")
    assert val.class_names == ["a", "b", "c"] and sorted(val.labels.tolist()) == [0, 2, 2]
    assert [p for p, _ in val.bad.items] == [str(tmp_path / "val" / "b")]  # no val folder for b
    with pytest.raises(DataError, match=r"val/b.*no usable images"):
        load_split(DataSpec(source=f"folder:{tmp_path}"), "val")


def test_folder_errors_name_the_problem(tmp_path):
    _tree(tmp_path, {"cat": 1, "dog": 1})
    with pytest.raises(DataError, match=r"bird.*Valid class folder names: cat, dog"):
        load_split(DataSpec(source=f"folder:{tmp_path}", classes=["cat", "bird"]), "train")
    with pytest.raises(DataError, match=r"val' does not exist.*found under.*train"):
        load_split(DataSpec(source=f"folder:{tmp_path}"), "val")
    _tree(tmp_path, {"cat": 1, "dog": 1, "fox": 1}, split="val")
    with pytest.raises(DataError, match=r"class folders fox"):
        load_split(DataSpec(source=f"folder:{tmp_path}"), "val")


def test_plain_class_folders_get_a_stratified_split_that_ignores_seeds_and_class_subsets(tmp_path):
    pixels = _tree(tmp_path, {"a": 10, "b": 7, "c": 5}, split=".")
    spec = DataSpec(source=f"folder:{tmp_path}", val_fraction=0.3, batch_size=2, val_transform=RAW)
    train, val = load_split(spec, "train"), load_split(spec, "val")
    assert train.class_names == val.class_names == ["a", "b", "c"]
    # round(0.3 * n) per class: 3.0 -> 3, 2.1 -> 2, 1.5 -> 2 (round half to even)
    assert [int(np.sum(val.labels == i)) for i in range(3)] == [3, 2, 2]
    assert sorted(train.items + val.items) == sorted(pixels) and not set(train.items) & set(val.items)
    for ds in (train, val):
        assert all(Path(ds.name(i)).parent.name == ds.class_names[ds.labels[i]] for i in range(len(ds)))
    a, b = make_loaders(spec, seed=0), make_loaders(spec, seed=7)
    assert a.split.to_json() == b.split.to_json()
    assert a.split.val == val.items and a.split.seed == 20240607 and a.split.val_fraction == 0.3
    assert a.split.counts == {"train": {"a": 7, "b": 5, "c": 3}, "val": {"a": 3, "b": 2, "c": 2}}
    sub = DataSpec(source=f"folder:{tmp_path}", val_fraction=0.3, classes=["c", "a"])
    sub_val = load_split(sub, "val")
    assert sub_val.class_names == ["c", "a"]
    assert sorted(sub_val.items) == sorted(p for p in val.items if Path(p).parent.name in ("a", "c"))
    with pytest.raises(DataError, match=r"no split 'test'.*PATH/test/<class>/<image>"):
        load_split(spec, "test")
    split_folders = tmp_path / "split"
    _tree(split_folders, {"a": 2})
    _tree(split_folders, {"a": 1}, split="val")
    assert make_loaders(DataSpec(source=f"folder:{split_folders}", batch_size=1), seed=0).split is None


def test_unclear_folder_layouts_are_refused_with_the_expected_trees(tmp_path):
    trees = r"PATH/<class>/<image>.*PATH/train/<class>/<image> and PATH/val/<class>/<image>"
    _tree(tmp_path / "mixed", {"cat": 2, "dog": 2})
    _tree(tmp_path / "mixed", {"cat": 2, "dog": 2}, split=".")
    with pytest.raises(DataError, match=rf"mixes split folders \(train\) with class folders holding images "
                                        rf"\(cat, dog\).*{trees}"):
        load_split(DataSpec(source=f"folder:{tmp_path / 'mixed'}"), "train")
    _png(tmp_path / "loose" / "0.png", _rgb(0))
    with pytest.raises(DataError, match=rf"no sub-folders \(1 loose file\(s\)\).*{trees}"):
        load_split(DataSpec(source=f"folder:{tmp_path / 'loose'}"), "train")
    with pytest.raises(DataError, match=rf"'{tmp_path / 'nowhere'}' does not exist.*{trees}"):
        load_split(DataSpec(source=f"folder:{tmp_path / 'nowhere'}"), "train")
    _tree(tmp_path / "tiny", {"cat": 3, "dog": 1}, split=".")
    with pytest.raises(DataError, match=r"dog \(1\).*fewer than 2 images"):
        load_split(DataSpec(source=f"folder:{tmp_path / 'tiny'}"), "train")
    # a third split folder (no loose images) is not a class folder
    _tree(tmp_path / "three", {"cat": 1})
    _tree(tmp_path / "three", {"cat": 1}, split="val")
    _tree(tmp_path / "three", {"cat": 1}, split="test")
    assert len(load_split(DataSpec(source=f"folder:{tmp_path / 'three'}"), "test")) == 1


def test_empty_class_folder_errors_or_is_reported(tmp_path):
    _tree(tmp_path, {"cat": 2})
    (tmp_path / "train" / "dog").mkdir()
    with pytest.raises(DataError, match=r"train/dog have no usable images"):
        load_split(DataSpec(source=f"folder:{tmp_path}"), "train")
    ds = load_split(DataSpec(source=f"folder:{tmp_path}", on_bad_image="skip"), "train")
    assert ds.class_names == ["cat", "dog"] and len(ds) == 2
    assert ds.bad.items == [(str(tmp_path / "train" / "dog"), "class has no usable images")]


# ---------------------------------------------------------------- bad images and modes

def _bad_files(d: Path) -> dict[str, Path]:
    d.mkdir(parents=True, exist_ok=True)
    jpeg = io.BytesIO()
    Image.fromarray(_rgb(1, 64, 64)).save(jpeg, format="JPEG")
    files = {
        "zero": (d / "zero.jpg", b""),
        "corrupt": (d / "corrupt.jpg", np.random.default_rng(0).bytes(500)),
        "text": (d / "notes.txt", b"not an image\n"),
        "truncated": (d / "cut.jpg", jpeg.getvalue()[: len(jpeg.getvalue()) // 2]),
    }
    for path, data in files.values():
        path.write_bytes(data)
    return {k: p for k, (p, _) in files.items()}


@pytest.mark.parametrize("kind", ["zero", "corrupt", "text", "truncated"])
def test_bad_file_under_error_policy_names_the_path(tmp_path, kind):
    _tree(tmp_path / "data", {"a": 2})
    bad = _bad_files(tmp_path / "x")[kind]
    bad.rename(tmp_path / "data" / "train" / "a" / bad.name)
    with pytest.raises(DataError, match=rf"Bad image '.*train/a/{bad.name}'.*on_bad_image: skip"):
        load_split(DataSpec(source=f"folder:{tmp_path / 'data'}"), "train")
    with pytest.raises(DataError, match=bad.name):
        load_image(tmp_path / "data" / "train" / "a" / bad.name)


def test_bad_files_under_skip_policy_are_excluded_and_reported(tmp_path):
    pixels = _tree(tmp_path, {"a": 2, "b": 1})
    bad = _bad_files(tmp_path / "train" / "b")
    spec = DataSpec(source=f"folder:{tmp_path}", on_bad_image="skip", batch_size=3, val_transform=RAW)
    ds = load_split(spec, "train")
    assert sorted(ds.items) == sorted(pixels)
    reasons = dict(ds.bad.items)
    assert sorted(reasons) == sorted(str(p) for p in bad.values())
    assert reasons[str(bad["zero"])] == "empty file (0 bytes)"
    assert reasons[str(bad["text"])].startswith("not an image")
    assert reasons[str(bad["truncated"])].startswith("corrupt or truncated")
    loaders = make_loaders(spec, seed=0, which=["train"])
    assert loaders.train_size == 3 and len(loaders.bad) == 4 and loaders.val is None
    assert loaders.bad.summary().startswith("skipped 4 bad item(s): ") and "and 1 more" in loaders.bad.summary()
    (x, y), = _batches(loaders.train)
    assert sorted(y.tolist()) == [0, 0, 1]


def test_other_modes_become_rgb_uint8(tmp_path):
    d = tmp_path / "modes" / "x"
    d.mkdir(parents=True)
    gray = np.array([[0, 50], [128, 255]], np.uint8)
    Image.fromarray(gray, "L").save(d / "gray.png")
    sixteen = np.array([[0, 257 * 100], [65535, 1000]], np.uint16)
    cv2.imwrite(str(d / "deep.png"), sixteen)
    assert Image.open(d / "deep.png").mode.startswith("I")
    deep_rgb = np.zeros((1, 2, 3), np.uint16)
    deep_rgb[0, 1] = [1000, 30000, 50000]  # BGR for cv2
    cv2.imwrite(str(d / "deep_rgb.png"), deep_rgb)
    Image.new("CMYK", (2, 1)).save(d / "cmyk.tif")
    cmyk = Image.open(d / "cmyk.tif")
    cmyk.putpixel((0, 0), (255, 0, 0, 0))  # cyan
    cmyk.putpixel((1, 0), (0, 0, 0, 255))  # black
    cmyk.save(d / "cmyk.tif")
    rgba = np.dstack([_rgb(3, 2, 2), np.full((2, 2), 7, np.uint8)])
    Image.fromarray(rgba, "RGBA").save(d / "rgba.png")
    pal = Image.new("P", (2, 1))
    pal.putpalette([10, 20, 30, 200, 100, 0] + [0] * 762)
    pal.putpixel((1, 0), 1)
    pal.save(d / "pal.png")

    expect = {
        "gray.png": np.repeat(gray[:, :, None], 3, 2),
        "deep.png": np.repeat(np.array([[0, 100], [255, 4]], np.uint8)[:, :, None], 3, 2),
        "deep_rgb.png": np.array([[[0, 0, 0], [195, 117, 3]]], np.uint8),  # high byte of each channel
        "cmyk.tif": np.array([[[0, 255, 255], [0, 0, 0]]], np.uint8),
        "rgba.png": rgba[..., :3],
        "pal.png": np.array([[[10, 20, 30], [200, 100, 0]]], np.uint8),
    }
    for name, want in expect.items():
        got = load_image(d / name)
        assert got.dtype == np.uint8 and got.shape == want.shape, name
        assert (got == want).all(), name
    for policy in ("error", "skip"):  # odd modes are good images under either policy
        ds = load_split(DataSpec(source=f"folder:{tmp_path}", train="modes", on_bad_image=policy), "modes")
        assert len(ds) == len(expect) and len(ds.bad) == 0 and ds.class_names == ["x"]


# ---------------------------------------------------------------- rec: and list:

def _pack(rec: Path, images: list[np.ndarray], labels: list[float], payloads: dict[int, bytes] | None = None) -> None:
    writer = mx.recordio.MXIndexedRecordIO(str(rec.with_suffix(".idx")), str(rec), "w")
    for i, (img, label) in enumerate(zip(images, labels)):
        header = mx.recordio.IRHeader(0, label, i, 0)
        if payloads and i in payloads:
            writer.write_idx(i, mx.recordio.pack(header, payloads[i]))
        else:  # cv2 encodes BGR arrays, so the file holds the true RGB colours
            writer.write_idx(i, mx.recordio.pack_img(header, img[:, :, ::-1], quality=3, img_fmt=".png"))
    writer.close()


def test_recordio_round_trip_reads_exact_pixels_and_labels(tmp_path):
    images = [_rgb(i, 10, 14) for i in range(6)]
    labels = [2, 0, 1, 2, 1, 0]
    _pack(tmp_path / "train.rec", images, labels)
    spec = DataSpec(source=f"rec:{tmp_path}", batch_size=6, val_transform=RAW, train_transform=RAW)
    ds = load_split(spec, "train")
    assert ds.class_names == ["0", "1", "2"] and ds.labels.tolist() == labels
    for i in range(6):
        assert (ds.image(i) == images[i]).all() and ds.name(i) == f"{tmp_path / 'train.rec'}#{i}"
    loaders = make_loaders(spec, seed=0, shuffle_train=False, which=["train"])
    (x, y), = _batches(loaders.train)
    assert y.tolist() == labels
    assert np.allclose(x * 255, np.stack(images).transpose(0, 3, 1, 2), atol=1e-3)

    picked = load_split(DataSpec(source=f"rec:{tmp_path}/{{split}}.rec", classes=["2", "1"]), "train")
    assert picked.class_names == ["2", "1"] and picked.labels.tolist() == [0, 1, 0, 1]
    assert picked.items == [0, 2, 3, 4]


def test_recordio_bad_record_and_bad_label(tmp_path):
    images = [_rgb(i, 8, 8) for i in range(4)]
    _pack(tmp_path / "train.rec", images, [0, 1, 0, 1], payloads={2: b"garbage bytes"})
    with pytest.raises(DataError, match=r"train.rec#2"):
        load_split(DataSpec(source=f"rec:{tmp_path / 'train.rec'}"), "train")
    ds = load_split(DataSpec(source=f"rec:{tmp_path}", on_bad_image="skip"), "train")
    assert ds.items == [0, 1, 3] and ds.bad.items[0][0].endswith("train.rec#2")
    _pack(tmp_path / "val.rec", images, [0, 1.5, 0, 1])
    with pytest.raises(DataError, match=r"val.rec: record 1 has label \[1.5\]"):
        load_split(DataSpec(source=f"rec:{tmp_path}"), "val")
    (tmp_path / "val.idx").unlink()
    with pytest.raises(DataError, match=r"needs its index"):
        load_split(DataSpec(source=f"rec:{tmp_path}"), "val")


def test_list_file_resolves_relative_paths_and_labels(tmp_path):
    imgs = {n: _png(tmp_path / "imgs" / f"{n}.png", _rgb(ord(n))) for n in "abcd"}
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "train.csv").write_text(
        f"path,label\n../imgs/a.png,1\n\n# a comment\n{tmp_path / 'imgs' / 'b.png'},0\n../imgs/c.png,3\n")
    ds = load_split(DataSpec(source=f"list:{lists}/{{split}}.csv"), "train")
    assert ds.class_names == ["0", "1", "2", "3"] and ds.labels.tolist() == [1, 0, 3]
    assert (ds.image(0) == imgs["a"]).all() and (ds.image(2) == imgs["c"]).all()
    sub = load_split(DataSpec(source=f"list:{lists}/{{split}}.csv", classes=[3, 1], on_bad_image="skip"), "train")
    assert sub.class_names == ["3", "1"] and sub.labels.tolist() == [1, 0]

    (lists / "val.csv").write_text("../imgs/a.png,0\n../imgs/b.png,cat\n")
    with pytest.raises(DataError, match=r"val.csv, line 2: label 'cat' is not an integer"):
        load_split(DataSpec(source=f"list:{lists}/{{split}}.csv"), "val")
    (lists / "val.csv").write_text("../imgs/a.png,0\n../imgs/d.png,-1\n")
    with pytest.raises(DataError, match=r"val.csv, line 2: label -1 is out of range"):
        load_split(DataSpec(source=f"list:{lists}/{{split}}.csv"), "val")
    (lists / "val.csv").write_text("../imgs/a.png,0\n../imgs/missing.png,0\n")
    with pytest.raises(DataError, match=r"missing.png'.*file does not exist"):
        load_split(DataSpec(source=f"list:{lists}/{{split}}.csv"), "val")


def test_single_list_file_is_split_by_val_fraction(tmp_path):
    rows = []
    for i in range(20):
        _png(tmp_path / f"{i}.png", _rgb(i, 4, 4))
        rows.append(f"{i}.png,{i % 2}")
    (tmp_path / "all.csv").write_text("\n".join(rows))
    spec = DataSpec(source=f"list:{tmp_path / 'all.csv'}", val_fraction=0.3)
    train, val = load_split(spec, "train"), load_split(spec, "val")
    assert len(val) == 6 and len(train) == 14 and not set(train.items) & set(val.items)
    assert sorted(val.labels.tolist()) == [0, 0, 0, 1, 1, 1]
    mask = stratified_holdout(np.arange(20) % 2, 0.3)
    assert sorted(val.items) == sorted(str(tmp_path / f"{i}.png") for i in np.flatnonzero(mask))
    record = make_loaders(spec.model_copy(update={"batch_size": 2}), seed=3).split
    assert record.val == val.items and record.counts == {"train": {"0": 7, "1": 7}, "val": {"0": 3, "1": 3}}


# ---------------------------------------------------------------- transforms

def test_transform_geometry_and_normalisation():
    img = _rgb(5, 40, 60)
    out = build(TransformSpec(resize=20), train=False)(img)
    assert out.shape == (3, 20, 20)
    ref = cv2.resize(img, (30, 20), interpolation=cv2.INTER_AREA)[:, 5:25]
    assert np.allclose(out, ((ref / 255.0 - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1), atol=1e-5)
    crop = build(TransformSpec(center_crop=10, normalize=((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))), False)(img)
    assert np.allclose(crop, ((img[15:25, 25:35] / 255.0 - 0.5) / 0.25).transpose(2, 0, 1), atol=1e-5)
    assert build(TransformSpec(random_resized_crop=16), False)(img).shape == (3, 16, 16)


def test_random_transforms_follow_the_sample_rng():
    img = _rgb(6, 30, 30)
    t = build(TransformSpec(random_resized_crop=24, flip=True, color_jitter=0.4, normalize="none"), True)
    a, b = t(img, sample_rng(1, 0, 5)), t(img, sample_rng(1, 0, 5))
    assert (a == b).all() and a.shape == (3, 24, 24) and 0 <= a.min() and a.max() <= 1
    assert not np.array_equal(a, t(img, sample_rng(1, 1, 5)))
    assert not np.array_equal(a, t(img, sample_rng(2, 0, 5)))
    with pytest.raises(ValueError, match="sample_rng"):
        t(img)
    flip = build(TransformSpec(flip=True, normalize="none"), True)
    plain = img.transpose(2, 0, 1) / 255.0
    outs = [flip(img, sample_rng(0, 0, i)) for i in range(16)]
    mirrored = [np.allclose(o, plain[:, :, ::-1]) for o in outs]
    assert all(m or np.allclose(o, plain) for o, m in zip(outs, mirrored)) and 0 < sum(mirrored) < 16


def test_mixed_sizes_without_resize_is_a_data_error(tmp_path):
    _png(tmp_path / "train" / "a" / "0.png", _rgb(0, 8, 8))
    _png(tmp_path / "train" / "a" / "1.png", _rgb(1, 9, 8))
    loaders = make_loaders(DataSpec(source=f"folder:{tmp_path}", batch_size=2), seed=0, which=["train"])
    with pytest.raises(DataError, match=r"different sizes.*resize"):
        _batches(loaders.train)
    few = make_loaders(DataSpec(source=f"folder:{tmp_path}", batch_size=3), seed=0, which=["train"])
    assert few.train_sampler.last_batch == "keep" and few.train_sampler.batches_per_epoch() == 1  # one batch of 2


def test_a_split_smaller_than_one_batch_trains_as_one_smaller_batch(tmp_path):
    """A first folder of a few photos trains with the default batch size: its epoch is one batch of
    every image (not none); a split of at least one batch keeps data.last_batch's whole batches."""
    for i in range(5):
        _png(tmp_path / "train" / "a" / f"{i}.png", _rgb(i, 8, 8))
    few = make_loaders(DataSpec(source=f"folder:{tmp_path}", batch_size=8), seed=0, which=["train"])
    few.train_sampler.set_epoch(0)
    assert [sorted(i for i, _ in b) for b in few.train_sampler] == [[0, 1, 2, 3, 4]]
    assert few.train_sampler.left_out() == 0
    whole = make_loaders(DataSpec(source=f"folder:{tmp_path}", batch_size=2), seed=0, which=["train"])
    assert whole.train_sampler.last_batch == "discard" and whole.train_sampler.batches_per_epoch() == 2
    assert whole.train_sampler.left_out() == 1


# ---------------------------------------------------------------- determinism

@pytest.fixture(scope="module")
def digits_like(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("det")
    _tree(root, {"a": 9, "b": 8, "c": 7})
    _tree(root, {"a": 3, "b": 3, "c": 3}, split="val", seed=1)
    return f"folder:{root}"


def _spec(source: str, workers: int = 0) -> DataSpec:
    aug = TransformSpec(random_resized_crop=10, flip=True, color_jitter=0.3)
    return DataSpec(source=source, batch_size=5, workers=workers, train_transform=aug)


def test_same_seed_same_batches_other_seed_other_batches(digits_like):
    a, b, c = (make_loaders(_spec(digits_like), seed=s, which=["train"]) for s in (7, 7, 8))
    assert len(a.train) == 4  # 24 images, last partial batch dropped
    for epoch in (0, 1):
        for lo in (a, b, c):
            lo.train_sampler.set_epoch(epoch)
        ea, eb, ec = _batches(a.train), _batches(b.train), _batches(c.train)
        assert _same(ea, eb) and not _same(ea, ec)
    a.train_sampler.set_epoch(0)
    e0 = _batches(a.train)
    assert not _same(e0, ea)  # a new epoch reshuffles and redraws augmentations
    order = a.train_sampler.order(0)
    assert sorted(order.tolist()) == list(range(24))
    labels = load_split(_spec(digits_like), "train").labels
    assert np.concatenate([y for _, y in e0]).tolist() == labels[order[:20]].tolist()


def test_skip_resumes_with_the_tail_of_the_epoch(digits_like):
    full = make_loaders(_spec(digits_like), seed=3, which=["train"])
    full.train_sampler.set_epoch(2)
    want = _batches(full.train)
    resumed = make_loaders(_spec(digits_like), seed=3, which=["train"])
    assert len(resumed.train_epoch(2, skip_batches=3)) == 1
    assert _same(_batches(resumed.train), want[3:])
    assert len(resumed.train) == 4  # the skip applies to one iteration only
    assert _same(_batches(resumed.train_epoch(2)), want)


def test_two_workers_give_the_same_batches_as_none(digits_like):
    base = make_loaders(_spec(digits_like), seed=5)
    multi = make_loaders(_spec(digits_like, workers=2), seed=5)
    assert isinstance(multi.train._worker_pool, multiprocessing.pool.Pool)  # processes, not threads
    for lo in (base, multi):
        lo.train_sampler.set_epoch(1)
    assert _same(_batches(base.train), _batches(multi.train))
    assert base.val is not None and _same(_batches(base.val), _batches(multi.val))


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_two_workers_under_spawn_and_forkserver_give_the_same_batches_as_none(digits_like, method):
    """Python 3.14 (Linux) and macOS start workers by forkserver/spawn: the workers import gluontl
    and mxnet afresh and get the dataset (transforms, seed) by pickle, and MXNet's pool takes the
    process's default start method, which this test sets."""
    base = make_loaders(_spec(digits_like), seed=5, which=["train"])
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(method, force=True)
    try:
        multi = make_loaders(_spec(digits_like, workers=2), seed=5, which=["train"])
        pool = multi.train._worker_pool
        assert isinstance(pool, multiprocessing.pool.Pool) and pool._ctx.get_start_method() == method
        for lo in (base, multi):
            lo.train_sampler.set_epoch(1)
        got = _batches(multi.train)
    finally:
        multiprocessing.set_start_method(before, force=True)
    assert len(got) == 4 and _same(_batches(base.train), got)


def test_epoch_sampler_keep_and_discard():
    keep = EpochSampler(7, 3, seed=0, shuffle=False, last_batch="keep")
    assert [[i for i, _ in b] for b in keep] == [[0, 1, 2], [3, 4, 5], [6]]
    discard = EpochSampler(7, 3, seed=0, last_batch="discard")
    discard.set_epoch(4)
    got = list(discard)
    assert len(got) == 2 and all(e == 4 for b in got for _, e in b)
    assert [i for b in got for i, _ in b] == discard.order(4)[:6].tolist()


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=60), st.floats(0.05, 0.95))
def test_stratified_holdout_takes_the_fraction_of_every_class(labels, fraction):
    labels = np.array(labels)
    mask = stratified_holdout(labels, fraction)
    assert (mask == stratified_holdout(labels.copy(), fraction)).all()
    for c in np.unique(labels):
        n = int(np.sum(labels == c))
        assert int(np.sum(mask[labels == c])) == min(max(round(fraction * n), 1), n - 1)


# ---------------------------------------------------------------- training from plain class folders

COLOURS = {"blue": [2], "green": [1], "red": [0], "cyan": [1, 2], "yellow": [0, 1]}


def _colour_classes(root: Path, names: list[str], n: int = 12) -> None:
    """Classes of 16x16 noise with bright colour channels: a tiny net separates them."""
    for k, name in enumerate(names):
        for i in range(n):
            rgb = np.random.default_rng(100 * k + i).integers(0, 90, (16, 16, 3)).astype(np.uint8)
            rgb[..., COLOURS[name]] += 150
            _png(root / name / f"{i:02d}.png", rgb)


def _tiny_recipe(prefix: str, source: str, surgery: dict | None = None, **train):
    from gluontl.recipe import parse_recipe

    return parse_recipe({"name": "plain", "model": {"source": f"symbol:{prefix}", "input_shape": [3, 16, 16]},
                         **({"surgery": surgery} if surgery else {}),
                         "data": {"source": source, "batch_size": 6, "val_fraction": 0.25,
                                  "train_transform": {"normalize": "none"}, "val_transform": {"normalize": "none"}},
                         "train": {"log_every": 1, "hybridize": False, **train}})


def test_finetune_from_plain_class_folders_records_a_stratified_seed_free_split(tmp_path):
    import json

    from tests import helpers
    from gluontl.train.loop import finetune

    _colour_classes(tmp_path / "data", ["blue", "green", "red"])
    prefix = helpers.tiny_symbol(tmp_path)
    head = {"drop_last": 1, "head": {"classes": 3}}
    runs = [finetune(_tiny_recipe(prefix, f"folder:{tmp_path / 'data'}", head, epochs=6, lr=0.1, seed=s),
                     runs_root=tmp_path / "runs", quiet=True) for s in (0, 1)]
    records = [json.loads((r.run_dir / "split.json").read_text()) for r in runs]
    assert records[0] == records[1]  # the run seed does not move the split
    rec = records[0]
    assert rec["seed"] == 20240607 and rec["val_fraction"] == 0.25 and rec["method"] == "stratified_holdout"
    assert rec["counts"] == {"train": {"blue": 9, "green": 9, "red": 9}, "val": {"blue": 3, "green": 3, "red": 3}}
    val = {Path(p) for p in rec["val"]}
    every = set((tmp_path / "data").rglob("*.png"))
    assert len(val) == 9 and val <= every
    spec = runs[0].run_dir / "recipe.yaml"
    from gluontl.recipe import load_recipe

    train = load_split(load_recipe(spec).data, "train")
    assert {Path(p) for p in train.items} == every - val  # disjoint, and together every image
    last = runs[0].metrics[-1]
    assert last["epoch"] == 6 and 0 <= last["train_acc"] <= 1
    assert max(r["val_top1"] for r in runs[0].metrics if "epoch" in r) == 1.0  # the colours are learnt


def _template_symbol(folder: Path, weight: np.ndarray) -> str:
    """GlobalAvgPool -> Dense with a given weight (no bias), as a symbol checkpoint."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(len(weight), use_bias=False, in_units=3))
    net.initialize()
    net[1].weight.set_data(mx.nd.array(weight))
    net.hybridize()
    net(mx.nd.zeros((1, 3, 16, 16)))
    net.export(str(folder / "template"))
    return str(folder / "template")


def test_train_acc_is_the_top1_of_the_training_batches(tmp_path):
    """One epoch, one full batch, one step: train_acc is the initial net's accuracy on the
    training split, counted here in numpy. The colour templates as weights score a two-channel
    class above its one-channel neighbours, so some classes are right and some wrong."""
    from tests import helpers
    from gluontl.train.loop import finetune

    names = sorted(COLOURS)
    _colour_classes(tmp_path / "data", names)
    weight = np.zeros((5, 3), np.float32)
    for k, name in enumerate(names):
        weight[k, COLOURS[name]] = 1
    prefix = _template_symbol(tmp_path, weight)
    recipe = _tiny_recipe(prefix, f"folder:{tmp_path / 'data'}", epochs=1, lr=0.1)
    recipe = recipe.model_copy(update={"data": recipe.data.model_copy(update={"batch_size": 45})})
    result = finetune(recipe, runs_root=tmp_path / "runs", quiet=True)
    (row,) = [r for r in result.metrics if "epoch" in r]
    train = load_split(recipe.data, "train")
    assert len(train) == 45
    x = np.stack([np.asarray(Image.open(p), np.float64).transpose(2, 0, 1) / 255 for p in train.items])
    scores = x.mean(axis=(2, 3)) @ weight.T.astype(np.float64)
    labels = np.array([names.index(Path(p).parent.name) for p in train.items])
    top2 = np.sort(scores, axis=1)[:, -2:]
    close = top2[:, 1] - top2[:, 0] < helpers.f32_tol(2.0, 16 * 16 * 3)  # float32 may order these either way
    sure_hits = int(np.sum((scores.argmax(axis=1) == labels) & ~close))
    hits = row["train_acc"] * 45
    assert hits == round(hits) and sure_hits <= hits <= sure_hits + int(close.sum())
    assert 0 < sure_hits < 45 - close.sum()  # neither all right nor all wrong: the count is informative


def test_plot_draws_train_accuracy_in_the_accuracy_panel(tmp_path):
    import json

    from gluontl.train.runs import plot

    rows = [{"step": s, "epoch_f": s / 2, "loss": 1.0 / s, "lr": 0.1, "img_per_s": 10.0} for s in range(1, 7)]
    rows += [{"step": 2 * e, "epoch": e, "train_loss": 1.0 / e, "train_acc": 0.2 * e, "val_loss": 1.2 / e,
              "val_top1": 0.9 - 0.1 * e} for e in (1, 2, 3)]
    pngs = {}
    for name, keep in (("with", rows), ("without", [{k: v for k, v in r.items() if k != "train_acc"} for r in rows])):
        run = tmp_path / name / "run"  # same name: the figure title is the run's name
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keep))
        pngs[name] = np.asarray(Image.open(plot(run, tmp_path / f"{name}.png")).convert("RGB"), np.int16)
    assert pngs["with"].shape == pngs["without"].shape
    cols = np.flatnonzero(np.abs(pngs["with"] - pngs["without"]).sum(axis=(0, 2)))
    width = pngs["with"].shape[1]
    assert len(cols) > 0 and width / 3 < cols.min() and cols.max() < 2 * width / 3  # only the middle panel


def test_plan_and_finetune_print_the_automatic_splits_counts(tmp_path, capsys):
    """Per class round(0.25 n), at least one: 12 -> 3, 7 -> 2 (1.75), 5 -> 1 (1.25) held out."""
    import json

    from tests import helpers
    import yaml

    for name, n in (("blue", 12), ("green", 7), ("red", 5)):
        _colour_classes(tmp_path / "data", [name], n)
    prefix = helpers.tiny_symbol(tmp_path)
    recipe = _tiny_recipe(prefix, f"folder:{tmp_path / 'data'}", {"drop_last": 1, "head": {"classes": 3}}, epochs=1)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json", exclude_none=True)))
    line = (f"automatic split of folder:{tmp_path / 'data'} (data.val_fraction 0.25, seed 20240607): train 18 "
            f"images, val 6; images per class (train/val): blue 9/3, green 5/2, red 4/1")
    code, out, err = helpers.run_cli(capsys, "plan", "--recipe", str(tmp_path / "r.yaml"))
    assert code == 0, err
    assert f"{line} (as listed: finetune leaves out bad images)" in out.splitlines()
    code, out, err = helpers.run_cli(capsys, "plan", "--recipe", str(tmp_path / "r.yaml"), "--json")
    assert code == 0, err
    assert json.loads(out)["split"]["counts"] == {"train": {"blue": 9, "green": 5, "red": 4},
                                                  "val": {"blue": 3, "green": 2, "red": 1}}
    code, out, err = helpers.run_cli(capsys, "finetune", "--recipe", str(tmp_path / "r.yaml"),
                                     "--runs", str(tmp_path / "runs"))
    assert code == 0, err
    assert line in out.splitlines()
