"""VOC/COCO/YOLO readers and writers: hand-computed conversions, every refusal names its file and
object, and write -> read round-trips (exactly for VOC integer boxes and COCO, within the
documented 8-decimal rounding for YOLO)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from gluontl.detect.formats import (Annotation, check_box, image_size, read_coco, read_voc_xml, read_yolo,
                                    read_yolo_txt, voc_xml, write_coco, write_voc, write_yolo, yolo_names)
from gluontl.errors import DataError

NAMES = ["cat", "dog", "person"]


def _image(path: Path, w: int, h: int, exif_orientation: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    im = Image.new("RGB", (w, h), (90, 120, 150))
    if exif_orientation is None:
        im.save(path)
    else:
        exif = Image.Exif()
        exif[274] = exif_orientation
        im.save(path, exif=exif)
    return path


def _voc(tmp_path: Path, objects: str, size: str = "<size><width>200</width><height>100</height></size>",
         name: str = "a") -> Path:
    _image(tmp_path / "JPEGImages" / f"{name}.jpg", 200, 100)
    xml = tmp_path / "Annotations" / f"{name}.xml"
    xml.parent.mkdir(parents=True, exist_ok=True)
    xml.write_text(f"<annotation><filename>{name}.jpg</filename>{size}{objects}</annotation>")
    return xml


def _obj(name: str, x0, y0, x1, y1, difficult: str | None = None) -> str:
    d = "" if difficult is None else f"<difficult>{difficult}</difficult>"
    return (f"<object><name>{name}</name>{d}<bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin>"
            f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object>")


# ---------------------------------------------------------------- VOC

def test_voc_inclusive_pixels_become_continuous_edges_and_missing_difficult_is_0(tmp_path):
    xml = _voc(tmp_path, _obj("dog", 1, 1, 200, 100, "1") + _obj("cat", 10, 20, 10, 29))
    ann, names = read_voc_xml(xml, tmp_path / "JPEGImages")
    assert names == ["dog", "cat"]
    assert ann.size == (200, 100) and ann.image == tmp_path / "JPEGImages" / "a.jpg"
    # pixel i (1-based) covers [i - 1, i): the whole image is [0, 200]; one pixel column is 1 wide
    np.testing.assert_array_equal(ann.labels, np.array([[0, 0, 200, 100, 0, 1], [9, 19, 10, 29, 1, 0]], np.float32))
    assert ann.labels.dtype == np.float32


def test_voc_without_size_reads_it_from_the_image(tmp_path):
    xml = _voc(tmp_path, _obj("dog", 1, 1, 200, 100), size="")
    ann, _ = read_voc_xml(xml, tmp_path / "JPEGImages")
    assert ann.size == (200, 100)


@pytest.mark.parametrize("box", [(0, 1, 10, 10), (1, 1, 201, 10), (1, 1, 10, 101), (20, 1, 10, 10)])
def test_voc_box_outside_or_inverted_is_refused_naming_file_and_object(tmp_path, box):
    xml = _voc(tmp_path, _obj("dog", 1, 1, 5, 5) + _obj("cat", *box))
    with pytest.raises(DataError, match=r"a\.xml, object 1: .*1-based inclusive"):
        read_voc_xml(xml, tmp_path / "JPEGImages")


@pytest.mark.parametrize("text, match", [
    ("<annotation><object>", "Cannot read VOC annotation"),
    ("<annotation><object><name>dog</name></object></annotation>", r"object 0: needs <name> and <bndbox>"),
    ("<annotation><object><name>dog</name><bndbox><xmin>a</xmin></bndbox></object></annotation>", "numeric"),
    ("<annotation><size><width>x</width></size></annotation>", "numeric <width>"),
])
def test_voc_malformed_files_are_data_errors(tmp_path, text, match):
    xml = tmp_path / "Annotations" / "b.xml"
    xml.parent.mkdir(parents=True)
    xml.write_text(text)
    with pytest.raises(DataError, match=match) as e:
        read_voc_xml(xml, tmp_path)
    assert str(xml) in str(e.value)


def test_voc_writer_rounds_to_the_nearest_pixel_edge(tmp_path):
    ann = Annotation(tmp_path / "x.jpg", (50, 40), np.array([[2.4, 3.6, 10.5, 20.2, 1, 0],
                                                             [7.6, 5.0, 7.9, 9.0, 0, 1]], np.float32), "t")
    root = __import__("xml.etree.ElementTree").etree.ElementTree.fromstring(voc_xml(ann, NAMES))
    boxes = [[int(b.findtext(t)) for t in ("xmin", "ymin", "xmax", "ymax")] for b in root.iter("bndbox")]
    # [2.4, 3.6, 10.5, 20.2] -> continuous [2, 4, 10, 20] (round half to even: 10.5 -> 10) -> VOC [3, 5, 10, 20];
    # [7.6, 7.9] rounds to an empty column: the one pixel holding 7.6, continuous [7, 8] -> VOC 8..8
    assert boxes == [[3, 5, 10, 20], [8, 6, 8, 9]]
    assert [o.findtext("name") for o in root.iter("object")] == ["dog", "cat"]
    assert [o.findtext("difficult") for o in root.iter("object")] == ["0", "1"]


# ---------------------------------------------------------------- COCO

def _coco_file(tmp_path: Path, annotations: list, images=None) -> Path:
    _image(tmp_path / "img" / "p.png", 64, 32)
    data = {"images": images or [{"id": 7, "file_name": "p.png", "width": 64, "height": 32},
                                 {"id": 9, "file_name": "q.png", "width": 10, "height": 10}],
            "categories": [{"id": 12, "name": "person"}, {"id": 3, "name": "dog"}],
            "annotations": annotations}
    f = tmp_path / "inst.json"
    f.write_text(json.dumps(data))
    return f


def test_coco_bbox_xywh_iscrowd_and_category_order(tmp_path):
    f = _coco_file(tmp_path, [{"id": 1, "image_id": 7, "category_id": 12, "bbox": [1.5, 2, 10.25, 30]},
                              {"id": 2, "image_id": 7, "category_id": 3, "bbox": [0, 0, 64, 32], "iscrowd": 1}])
    anns, names = read_coco(f, tmp_path / "img")
    assert names == ["dog", "person"]  # categories in id order: 3, 12
    by_name = {a.image.name: a for a in anns}
    assert set(by_name) == {"p.png", "q.png"}  # q.png has no annotations: kept, empty
    np.testing.assert_array_equal(by_name["p.png"].labels,
                                  np.array([[1.5, 2, 11.75, 32, 1, 0], [0, 0, 64, 32, 0, 1]], np.float32))
    assert by_name["q.png"].labels.shape == (0, 6) and by_name["p.png"].size == (64, 32)


@pytest.mark.parametrize("ann, match", [
    ({"id": 5, "image_id": 7, "category_id": 4, "bbox": [0, 0, 1, 1]}, r"annotation 5: category_id 4 .*ids: 3, 12"),
    ({"id": 5, "image_id": 8, "category_id": 3, "bbox": [0, 0, 1, 1]}, r"annotation 5: image_id 8"),
    ({"id": 5, "image_id": 7, "category_id": 3, "bbox": [60, 0, 5, 1]}, r"annotation 5: .*outside the 64x32"),
    ({"id": 5, "image_id": 7, "category_id": 3, "bbox": [6, 0, 0, 1]}, r"annotation 5: .*empty"),
    ({"id": 5, "image_id": 7, "category_id": 3, "bbox": [6, 0, 1]}, r"annotation 5: bbox has 3 numbers"),
    ({"id": 5, "image_id": 7, "bbox": [6, 0, 1, 1]}, r"annotation 5: needs image_id, category_id"),
])
def test_coco_refusals_name_the_annotation(tmp_path, ann, match):
    f = _coco_file(tmp_path, [ann])
    with pytest.raises(DataError, match=match):
        read_coco(f, tmp_path / "img")


def test_coco_not_an_instances_file(tmp_path):
    f = tmp_path / "x.json"
    f.write_text('{"images": []}')
    with pytest.raises(DataError, match="needs lists 'images', 'annotations'"):
        read_coco(f, tmp_path)
    f.write_text("{")
    with pytest.raises(DataError, match="Cannot read COCO annotations"):
        read_coco(f, tmp_path)


# ---------------------------------------------------------------- YOLO

def test_yolo_normalized_centres_become_pixels_of_a_non_square_image(tmp_path):
    img = _image(tmp_path / "images" / "a.png", 200, 100)
    txt = tmp_path / "labels" / "a.txt"
    txt.parent.mkdir()
    txt.write_text("2 0.5 0.5 1.0 1.0\n\n1 0.25 0.75 0.1 0.2\n")
    ann = read_yolo_txt(txt, img, 3)
    np.testing.assert_allclose(ann.labels, np.array([[0, 0, 200, 100, 2, 0], [40, 65, 60, 85, 1, 0]], np.float32),
                               rtol=0, atol=1e-5)


def test_yolo_missing_label_file_is_an_image_without_objects(tmp_path):
    _image(tmp_path / "images" / "a.png", 20, 10)
    (anns,) = read_yolo(tmp_path / "images", tmp_path / "labels", 3)
    assert anns.labels.shape == (0, 6) and anns.size == (20, 10)


def test_yolo_size_follows_exif_orientation(tmp_path):
    img = _image(tmp_path / "r.jpg", 40, 20, exif_orientation=6)  # rotated 90 degrees: shown 20 wide, 40 high
    assert image_size(img) == (20, 40)
    txt = tmp_path / "r.txt"
    txt.write_text("0 0.5 0.5 1 1\n")
    np.testing.assert_allclose(read_yolo_txt(txt, img, 1).labels[0, :4], [0, 0, 20, 40])


@pytest.mark.parametrize("line, match", [
    ("3 0.5 0.5 0.1 0.1", r"line 1: class id 3 is out of range; the dataset has 3 classes"),
    ("0 0.5 0.5 0.1 0.1 0.2 0.2", r"line 1: expected 'class cx cy w h'.*Polygon"),
    ("x 0.5 0.5 0.1 0.1", r"line 1: .*integer class"),
    ("0 0.98 0.5 0.1 0.1", r"line 1: .*outside the 200x100 image"),
    ("0 0.5 0.5 0 0.1", r"line 1: .*empty"),
])
def test_yolo_refusals_name_file_and_line(tmp_path, line, match):
    img = _image(tmp_path / "a.png", 200, 100)
    txt = tmp_path / "a.txt"
    txt.write_text(line + "\n")
    with pytest.raises(DataError, match=match) as e:
        read_yolo_txt(txt, img, 3)
    assert str(txt) in str(e.value)


def test_edges_within_a_thousandth_of_a_pixel_are_rounding_and_snap_to_the_border():
    assert check_box([-4e-4, 0, 10.0004, 5], (10, 5), "w") == [0.0, 0.0, 10.0, 5.0]
    with pytest.raises(DataError, match="outside the 10x5 image"):
        check_box([-2e-3, 0, 10, 5], (10, 5), "w")


def test_yolo_class_names_from_yaml_list_dict_or_classes_txt(tmp_path):
    (tmp_path / "data.yaml").write_text("names: [a, b]\n")
    assert yolo_names(tmp_path) == ["a", "b"]
    (tmp_path / "data.yaml").write_text("names: {0: a, 1: b, 2: c}\n")
    assert yolo_names(tmp_path) == ["a", "b", "c"]
    (tmp_path / "data.yaml").write_text("names: {0: a, 2: c}\n")
    with pytest.raises(DataError, match="ids from 0 without gaps"):
        yolo_names(tmp_path)
    (tmp_path / "data.yaml").unlink()
    with pytest.raises(DataError, match="has no class names"):
        yolo_names(tmp_path)
    (tmp_path / "classes.txt").write_text("x\n\ny\n")
    assert yolo_names(tmp_path) == ["x", "y"]


# ---------------------------------------------------------------- round trips

def _random_annotations(src: Path, rng: np.random.Generator, integer: bool) -> list[Annotation]:
    anns = []
    for i in range(6):
        w, h = int(rng.integers(16, 300)), int(rng.integers(16, 300))
        img = _image(src / f"im{i}.png", w, h)
        n = int(rng.integers(0, 4))
        x0, x1 = np.sort(rng.uniform(0, w, (2, n)), axis=0)
        y0, y1 = np.sort(rng.uniform(0, h, (2, n)), axis=0)
        if integer:
            x0, y0 = np.floor(x0), np.floor(y0)
            x1, y1 = np.maximum(np.ceil(x1), x0 + 1), np.maximum(np.ceil(y1), y0 + 1)
        else:
            x1, y1 = np.maximum(x1, x0 + 0.01), np.maximum(y1, y0 + 0.01)
        labels = np.stack([x0, y0, x1, y1, rng.integers(0, 3, n), rng.integers(0, 2, n)], 1).astype(np.float32)
        anns.append(Annotation(img, (w, h), labels.reshape(-1, 6), "t"))
    return anns


def _by_name(anns):
    return {a.image.name: a for a in anns}


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_voc_round_trip_is_exact_for_integer_boxes(tmp_path_factory, seed):
    tmp = tmp_path_factory.mktemp("voc")
    anns = _random_annotations(tmp / "src", np.random.default_rng(seed), integer=True)
    write_voc(tmp / "voc", {"train": anns[:4], "val": anns[4:]}, NAMES)
    assert (tmp / "voc" / "ImageSets" / "Main" / "val.txt").read_text().split() == ["im4", "im5"]
    for a in anns:
        back, names = read_voc_xml(tmp / "voc" / "Annotations" / f"{a.image.stem}.xml", tmp / "voc" / "JPEGImages")
        assert back.size == a.size and back.image.read_bytes() == a.image.read_bytes()
        got = back.labels.copy()
        got[:, 4] = [NAMES.index(n) for n in names]
        np.testing.assert_array_equal(got, a.labels)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_coco_round_trip_is_exact_for_float_boxes(tmp_path_factory, seed):
    tmp = tmp_path_factory.mktemp("coco")
    anns = _random_annotations(tmp / "src", np.random.default_rng(seed), integer=False)
    write_coco(tmp / "coco", {"train": anns}, NAMES)
    back, names = read_coco(tmp / "coco" / "annotations" / "instances_train.json", tmp / "coco" / "train")
    assert names == NAMES
    got = _by_name(back)
    for a in anns:
        assert got[a.image.name].size == a.size
        np.testing.assert_array_equal(got[a.image.name].labels, a.labels)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1))
def test_yolo_round_trip_within_its_decimals(tmp_path_factory, seed):
    tmp = tmp_path_factory.mktemp("yolo")
    anns = _random_annotations(tmp / "src", np.random.default_rng(seed), integer=False)
    write_yolo(tmp / "yolo", {"train": anns[:3], "val": anns[3:]}, NAMES)
    assert yolo_names(tmp / "yolo") == NAMES
    for split, part in (("train", anns[:3]), ("val", anns[3:])):
        got = _by_name(read_yolo(tmp / "yolo" / "images" / split, tmp / "yolo" / "labels" / split, 3))
        assert set(got) == {a.image.name for a in part}
        for a in part:
            want = a.labels.copy()
            want[:, 5] = 0  # YOLO files have no difficult flag
            # 8 decimals of a value normalized by <= 300 px: <= 0.5e-8 * 300 * 2 px, plus float32 rounding
            # of coordinates < 300 (ulp 3e-5)
            np.testing.assert_allclose(got[a.image.name].labels, want, rtol=0, atol=1e-4)


def test_voc_image_falls_back_to_the_xml_name_when_filename_is_absent(tmp_path):
    xml = _voc(tmp_path, _obj("dog", 1, 1, 5, 5), name="a")
    xml.write_text(xml.read_text().replace("<filename>a.jpg</filename>", "<filename>a</filename>"))
    (tmp_path / "JPEGImages" / "a.jpg").rename(tmp_path / "JPEGImages" / "a.png")
    ann, _ = read_voc_xml(xml, tmp_path / "JPEGImages")
    assert ann.image == tmp_path / "JPEGImages" / "a.png"
    (tmp_path / "JPEGImages" / "a.png").unlink()
    ann, _ = read_voc_xml(xml, tmp_path / "JPEGImages")
    assert ann.image == tmp_path / "JPEGImages" / "a"  # what the file names, reported missing by the loader
