"""The offline digits demo: cache layout, pixels, split, idempotence and atomic writes."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from tests import helpers
from PIL import Image
from sklearn.datasets import load_digits

from gluontl.errors import DataError
from gluontl.recipe import DataSpec, TransformSpec
from gluontl.data import demo
from gluontl.data.datasets import load_split, make_loaders

DIGITS = load_digits()


def _bilinear_x4(a: np.ndarray) -> np.ndarray:
    """Independent reference for the documented upscale: half-pixel centres, clamped edges."""
    n = a.shape[0]
    s = np.clip((np.arange(4 * n) + 0.5) / 4 - 0.5, 0, n - 1)
    i0 = np.floor(s).astype(int)
    i1 = np.minimum(i0 + 1, n - 1)
    w = s - i0
    rows = a[i0] * (1 - w)[:, None] + a[i1] * w[:, None]
    return rows[:, i0] * (1 - w)[None, :] + rows[:, i1] * w[None, :]


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("gluontl_home")


@pytest.fixture(scope="module")
def cache(home) -> Path:
    return demo.digits_folder(0.2, home)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.png"))


def test_counts_per_class_follow_the_stratified_fraction(cache):
    assert cache.name == "v1-val0.2" and cache.parent == cache.parent.parent / "digits"
    for digit in range(10):
        n = int(np.sum(DIGITS.target == digit))
        n_val = len(list((cache / "val" / str(digit)).glob("*.png")))
        n_train = len(list((cache / "train" / str(digit)).glob("*.png")))
        assert n_val == round(0.2 * n) and n_train + n_val == n
    rows = sorted(int(p.stem) for p in _files(cache))
    assert rows == list(range(1797))  # every scan exactly once, train and val disjoint


def test_file_labels_and_pixels_match_sklearn(cache):
    files = _files(cache)
    for p in files[::97]:
        row = int(p.stem)
        assert int(p.parent.name) == DIGITS.target[row]
        img = np.asarray(Image.open(p))
        assert img.shape == (32, 32, 3) and img.dtype == np.uint8
        assert (img[..., 0] == img[..., 1]).all() and (img[..., 0] == img[..., 2]).all()
        ref = np.rint(_bilinear_x4(DIGITS.images[row] * 255 / 16))
        assert np.abs(img[..., 0].astype(int) - ref).max() <= 1
    # the corners are the corner source pixels, exactly
    row = int(files[0].stem)
    img = np.asarray(Image.open(files[0]))
    assert img[0, 0, 0] == round(DIGITS.images[row][0, 0] * 255 / 16)


def test_second_call_reuses_the_cache(cache, home):
    before = {p: p.stat().st_mtime_ns for p in _files(cache)}
    assert demo.digits_folder(0.2, home) == cache
    assert {p: p.stat().st_mtime_ns for p in _files(cache)} == before
    assert not [p for p in cache.parent.iterdir() if p.name.startswith(".tmp-")]


def test_interrupted_write_leaves_no_cache(tmp_path, monkeypatch):
    written = []
    real = demo._write_png

    def dies_after_100(path, rgb):
        if len(written) == 100:
            raise OSError(28, "No space left on device")
        written.append(path)
        real(path, rgb)

    monkeypatch.setattr(demo, "_write_png", dies_after_100)
    with pytest.raises(DataError, match="No space left"):
        demo.digits_folder(0.3, tmp_path)
    parent = tmp_path / "datasets" / "digits"
    assert list(parent.iterdir()) == []  # neither a final folder nor a temp folder left
    monkeypatch.setattr(demo, "_write_png", real)
    root = demo.digits_folder(0.3, tmp_path)
    assert len(_files(root)) == 1797
    assert len(_files(root / "val")) == sum(round(0.3 * np.sum(DIGITS.target == d)) for d in range(10))


def test_target_task_subset_and_split_independent_of_run_seed(cache, home, monkeypatch):
    monkeypatch.setenv("GLUONTL_HOME", str(home))
    spec = DataSpec(source="demo:digits", classes=["5", "6", "7", "8", "9"], batch_size=50,
                    val_transform=TransformSpec(normalize="none"))
    a = make_loaders(spec, seed=1)
    b = make_loaders(spec, seed=2)
    assert a.class_names == ["5", "6", "7", "8", "9"] and a.num_classes == 5
    assert a.train_size + a.val_size == int(np.sum(DIGITS.target >= 5))
    assert a.val_size == b.val_size
    val = load_split(spec, "val")
    for i in range(0, len(val), 41):
        name = Path(val.name(i))
        assert int(name.parent.name) == val.labels[i] + 5 == DIGITS.target[int(name.stem)]
    batches_a = [(x.asnumpy(), y.asnumpy()) for x, y in a.val]
    batches_b = [(x.asnumpy(), y.asnumpy()) for x, y in b.val]
    assert all((xa == xb).all() and (ya == yb).all() for (xa, ya), (xb, yb) in zip(batches_a, batches_b))
    x0 = batches_a[0][0][0]
    row = int(Path(val.name(0)).stem)
    assert np.allclose(x0[0] * 255, np.asarray(Image.open(val.name(0)))[..., 0], atol=1e-3)
    assert x0.shape == (3, 32, 32) and DIGITS.target[row] >= 5


def test_unknown_demo_is_a_data_error():
    with pytest.raises(DataError, match="demo:digits"):
        load_split(DataSpec(source="demo:cifar"), "train")


# ---------------------------------------------------------------- demo:elpv

def _elpv_rows() -> list[tuple[str, float, str]]:
    """labels.csv read here, independently of gluontl: (file name, probability, cell type)."""
    import importlib.util

    labels = Path(importlib.util.find_spec("elpv_dataset").origin).parent / "data" / "labels.csv"
    rows = []
    for line in labels.read_text().splitlines():
        if line.strip():
            path, prob, kind = line.split()
            rows.append((Path(path).name, float(prob), kind))
    return rows


@pytest.fixture(scope="module")
def elpv(home) -> Path:
    return demo.elpv_folder(0.2, home)


def test_elpv_split_is_stratified_on_level_and_cell_type(elpv):
    rows = _elpv_rows()
    assert len(rows) == 2624
    where = {p.name: p for p in elpv.rglob("*.png")}
    assert len(where) == 2624 and len(list(elpv.rglob("*.png"))) == 2624  # each once: disjoint splits
    strata: dict[tuple[float, str], list[str]] = {}
    for name, prob, kind in rows:
        strata.setdefault((prob, kind), []).append(where[name].parent.parent.name)
        assert where[name].parent.name == ("defective" if prob >= 0.5 else "functional")
    assert len(strata) == 8  # 4 probability levels x mono/poly
    for key, splits in strata.items():
        assert splits.count("val") == round(0.2 * len(splits)), key
    counts = {(s, c): len(list((elpv / s / c).glob("*.png")))
              for s in ("train", "val") for c in ("functional", "defective")}
    # from labels.csv: 1508 functional with p = 0, 295 at p = 1/3; 106 at 2/3, 715 at 1
    assert counts[("train", "functional")] + counts[("val", "functional")] == 1508 + 295
    assert counts[("train", "defective")] + counts[("val", "defective")] == 106 + 715


def test_elpv_files_are_the_original_bytes(elpv):
    import importlib.util

    data = Path(importlib.util.find_spec("elpv_dataset").origin).parent / "data" / "images"
    for p in sorted(elpv.rglob("*.png"))[::131]:
        assert p.read_bytes() == (data / p.name).read_bytes()


def test_elpv_loads_as_rgb_and_split_ignores_the_run_seed(elpv, home, monkeypatch):
    monkeypatch.setenv("GLUONTL_HOME", str(home))
    spec = DataSpec(source="demo:elpv", batch_size=8, val_transform=TransformSpec(normalize="none"))
    a, b = load_split(spec, "val", seed=1), load_split(spec, "val", seed=2)
    assert a.class_names == ["defective", "functional"]  # folder order unless data.classes says otherwise
    assert a.items == b.items and len(a) == sum(1 for _ in (elpv / "val").rglob("*.png"))
    x, y = a[0]
    gray = np.asarray(Image.open(a.name(0)))
    assert gray.shape == (300, 300) and x.shape == (3, 300, 300)
    assert np.allclose(x * 255, gray[None].astype(np.float32), atol=1e-3)
    assert a.class_names[int(y)] == Path(a.name(0)).parent.name


def test_elpv_without_the_package_says_how_to_install(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "elpv_dataset", None)  # what Python does for a blocked import
    with pytest.raises(DataError, match="pip install elpv-dataset==1.0.0.post1"):
        demo.elpv_folder(0.2, tmp_path)
    assert list((tmp_path / "datasets" / "elpv").iterdir()) == []


def test_elpv_cache_links_on_one_file_system_and_copies_across(elpv, tmp_path, monkeypatch):
    import importlib.util
    import os

    data = Path(importlib.util.find_spec("elpv_dataset").origin).parent / "data" / "images"
    one = next(elpv.rglob("*.png"))
    assert os.path.samefile(one, data / one.name) == (os.stat(elpv).st_dev == os.stat(data).st_dev)
    home = helpers.other_file_system(data, monkeypatch)
    try:
        root = demo.elpv_folder(0.5, home)
        files = sorted(root.rglob("*.png"))
        assert len(files) == 2624 and not os.path.samefile(files[0], data / files[0].name)
        assert files[0].read_bytes() == (data / files[0].name).read_bytes()
    finally:
        shutil.rmtree(home)
