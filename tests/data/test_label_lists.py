"""Label lists (``list:`` path,label CSVs and ``labels:`` multi-label CSV/JSON) on input the label-file
fuzz target (tests/test_readers_fuzz.py::test_fuzz_label_files) found crashing a reader: each is now
one DataError naming the file (and line), or an image that does not exist, never another exception."""
from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from gluontl.data.datasets import MAX_LIST_LABEL, load_split
from gluontl.data.multilabel import MAX_LABEL_CELLS
from gluontl.errors import DataError
from gluontl.recipe import DataSpec


def _spec(source: str) -> DataSpec:
    return DataSpec(source=source, batch_size=2, val_fraction=0.25, on_bad_image="skip",
                    train_transform={"resize": 8}, val_transform={"resize": 8})


def _images(root, n=4):
    (root / "img").mkdir()
    for i in range(n):
        Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(root / "img" / f"{i}.png")


def _refused(path, body: bytes, needles) -> str:
    path.write_bytes(body)
    scheme = "list" if path.name.startswith("list") else "labels"
    with pytest.raises(DataError) as e:
        load_split(_spec(f"{scheme}:{path}"), "train")
    for needle in (str(path), *needles):
        assert needle in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("body, needles", [
    (b"\xf0ath,label\nimg/0.png,0\n", ["not UTF-8"]),  # was UnicodeDecodeError from open(encoding="utf-8")
    (b"path,label\nimg/0.png," + b"1" * 200_000 + b"\n", ["field larger"]),  # was csv.Error
])
def test_a_list_file_that_is_not_text_or_not_csv_is_one_data_error(tmp_path, body, needles):
    _refused(tmp_path / "list.csv", body, needles)


@pytest.mark.parametrize("label, needles", [
    ("\u00b2", ["line 2", "not an integer"]),  # str.isdigit says yes, int() raised ValueError
    ("\u0663", ["line 2", "not an integer"]),  # an Arabic-Indic digit: int() reads 3; a CSV label is ASCII
    ("9" * 5000, ["line 2", "out of range"]),  # int() refuses over 4300 digits (ValueError)
    (str(MAX_LIST_LABEL + 1), ["line 2", "out of range", f"0 to {MAX_LIST_LABEL}"]),  # was range(10^5+2) classes
    ("-0", ["line 2", "out of range"]),
])
def test_a_list_label_that_is_no_small_ascii_integer_names_its_line(tmp_path, label, needles):
    _images(tmp_path)
    _refused(tmp_path / "list.csv", f"path,label\nimg/0.png,{label}\nimg/1.png,0\n".encode(), needles)


def test_the_largest_list_label_is_still_read(tmp_path):
    _images(tmp_path)
    (tmp_path / "list.csv").write_text(f"img/0.png,{MAX_LIST_LABEL}\nimg/1.png,0\nimg/2.png,0\nimg/3.png,1\n")
    spec = _spec(f"list:{tmp_path / 'list.csv'}")
    assert len(load_split(spec, "train").class_names) == MAX_LIST_LABEL + 1


@pytest.mark.parametrize("name, body, where", [
    ("list.csv", b"img/0.png,0\n~nosuchuser_gluontl/1.png,1\n", "line 2"),
    ("labels.csv", b"image,labels\nimg/0.png,a\n~nosuchuser_gluontl/1.png,b\n", "line 3"),
    ("labels.json", json.dumps([{"image": "~nosuchuser_gluontl/1.png", "labels": []}]).encode(), "item 0"),
])
def test_a_home_folder_of_no_user_is_one_data_error(tmp_path, name, body, where):
    """Path.expanduser raised RuntimeError for ~user of a user the machine does not have."""
    _images(tmp_path)
    _refused(tmp_path / name, body, [where, "~nosuchuser_gluontl/1.png", "no home folder"])


@pytest.mark.parametrize("name", ["list.csv", "labels.csv", "labels.json"])
def test_an_image_name_too_long_for_the_file_system_does_not_exist(tmp_path, name):
    """Path.exists/is_file raised OSError (ENAMETOOLONG) on a listed name of 300 bytes."""
    _images(tmp_path)
    long = "x" * 300 + ".png"
    body = {"list.csv": f"{long},0\nimg/0.png,0\nimg/1.png,1\nimg/2.png,1\nimg/3.png,0\n",
            "labels.csv": f"image,labels\n{long},a\nimg/0.png,a\nimg/1.png,b\nimg/2.png,b\nimg/3.png,a\n",
            "labels.json": json.dumps({long: ["a"], **{f"img/{i}.png": ["ab"[i % 2]] for i in range(4)}})}[name]
    (tmp_path / name).write_text(body)
    scheme = "list" if name.startswith("list") else "labels"
    sets = [load_split(_spec(f"{scheme}:{tmp_path / name}"), s) for s in ("train", "val")]
    bad = [item for ds in sets for item in ds.bad.items]
    assert [(p.rsplit("/", 1)[1], why) for p, why in bad] == [(long, "file does not exist")]
    assert sum(len(ds) for ds in sets) == 4


def test_a_multi_hot_table_over_the_bound_is_refused_before_it_is_made(tmp_path):
    """One new label per line (a ',' where ';' was meant, a free-text column) made an images x labels
    matrix quadratic in the file: 8,193 lines would have been 8,193 x 8,193 cells."""
    n = int(np.sqrt(MAX_LABEL_CELLS)) + 1
    body = "image,labels\n" + "".join(f"i{k}.png,l{k}\n" for k in range(n))
    message = _refused(tmp_path / "labels.csv", body.encode(), [f"{n:,} images with {n:,} different labels",
                                                                 f"{MAX_LABEL_CELLS:,}", "';'"])
    assert "l0, l1, l10" in message
