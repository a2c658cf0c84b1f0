"""Fuzzing the detection dataset readers (tests/fuzzing.py): VOC XML, COCO JSON, YOLO label text and
YOLO's data.yaml, each from a real file gluontl's writers made, mutated; a reader may only return or
raise DataError, within the worker's memory and time bounds, writing nothing outside its folder."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest
from hypothesis import given
from PIL import Image

from tests.fuzzing import fuzz, fuzz_settings, mutated, run_reader
from gluontl.detect.formats import Annotation, coco_json, voc_xml, yolo_txt

pytestmark = pytest.mark.fuzz
NAMES = ["cat", "dog", "person"]


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (90, 120, 150)).save(buf, format="PNG")
    return buf.getvalue()


IMAGE = _png(40, 30)
ANN = Annotation(image=__import__("pathlib").Path("a.png"), size=(40, 30), source="seed",
                 labels=np.array([[2, 3, 20, 25, 0, 0], [10, 5, 39, 29, 2, 1]], np.float32))
VOC = voc_xml(ANN, NAMES).encode()
COCO = json.dumps(coco_json([ANN], NAMES)).encode()
YOLO = yolo_txt(ANN).encode()
CARD = b"path: .\ntrain: images\nval: images\nnames:\n  0: cat\n  1: dog\n  2: person\n"


@fuzz_settings(40)
@given(mutated(VOC, (b"<object><name>cat</name><bndbox><xmin>1e999</xmin></bndbox></object>",
                     b'<!DOCTYPE a [<!ENTITY b "bbbbbbbbbbbbbbbbbbbbbbbbb">]>')))
def test_voc_xml(tmp_path_factory, data):
    fuzz("voc_xml", tmp_path_factory.getbasetemp(), {"Annotations/a.xml": data, "JPEGImages/a.png": IMAGE})


@fuzz_settings(40)
@given(mutated(COCO, (b'{"id": 1e400}', b'"width": -5', b'"bbox": "x"', b'[[[[[[[[[[[[')))
def test_coco_json(tmp_path_factory, data):
    fuzz("coco", tmp_path_factory.getbasetemp(), {"instances.json": data, "images/a.png": IMAGE})


@fuzz_settings(40)
@given(mutated(YOLO, (b"0 0.5 0.5 1e308 1e308\n", b"2 nan 0.5 0.1 0.1\n", b"-1 0.5 0.5 0.1 0.1\n")))
def test_yolo_labels(tmp_path_factory, data):
    fuzz("yolo_labels", tmp_path_factory.getbasetemp(), {"labels/a.txt": data, "images/a.png": IMAGE})


@fuzz_settings(40)
@given(mutated(CARD, (b"names: &n [a, *n]\n", b"names: {0: a, 5: b}\n", b"names: !!binary aGk=\n")))
def test_yolo_card(tmp_path_factory, data):
    fuzz("yolo_card", tmp_path_factory.getbasetemp(), {"data.yaml": data})


def test_yolo_card_alias_bomb_is_refused_in_bounded_memory(tmp_path):
    """Issue 36: a data.yaml whose names is a billion-laughs alias bomb grew the process to 6.2 GB on
    main (here: killed by the 1 GiB cap or the 30 s bound). Now a DataError naming the file."""
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    levels += [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi")]
    (tmp_path / "data.yaml").write_text("\n".join(levels) + "\nnames: *i\n")
    result = run_reader("yolo_card", tmp_path)
    assert result["outcome"] == "input_error", result
    assert str(tmp_path / "data.yaml") in result["message"] and "aliases" in result["message"]


def test_voc_xml_entity_bomb_is_refused_in_bounded_memory(tmp_path):
    """XML's billion laughs: expat (>= 2.4) stops the expansion; a DataError naming the file."""
    ents = '<!ENTITY a0 "' + "x" * 10 + '">' + "".join(
        f'<!ENTITY a{i} "{f"&a{i - 1};" * 10}">' for i in range(1, 10))
    xml = tmp_path / "Annotations" / "a.xml"
    xml.parent.mkdir()
    xml.write_text(f'<?xml version="1.0"?><!DOCTYPE annotation [{ents}]><annotation><filename>&a9;</filename>'
                   f'</annotation>')
    result = run_reader("voc_xml", tmp_path)
    assert result["outcome"] == "input_error" and str(xml) in result["message"], result
