"""Fuzzing the readers of recipes, images, class folders, label lists and export metadata (tests/fuzzing.py):
each from real files (the repo's recipes, images and cards gluontl writes), mutated; a reader may
only return or raise gluontl's input error, within the worker's memory and time bounds, writing
nothing outside its scratch folder. Detection formats: tests/detect/test_fuzz_formats.py; masks:
tests/segment/test_fuzz_masks.py; run folders: tests/train/test_run_records.py; hosts files:
tests/dist/test_fuzz_hosts.py."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from PIL import Image

from tests.fuzzing import NAMES, fuzz, fuzz_settings, mutated
from gluontl.data.transforms import model_card, onnx_props
from gluontl.recipe import TransformSpec

pytestmark = pytest.mark.fuzz
RECIPES = sorted((Path(__file__).resolve().parents[1] / "recipes").glob("*.yaml"))


def _encoded(fmt: str, size=(20, 14), mode="RGB") -> bytes:
    buf = io.BytesIO()
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3)).astype(np.uint8)).convert(mode).save(buf, format=fmt)
    return buf.getvalue()


PNG, JPEG, GREY16 = _encoded("PNG"), _encoded("JPEG"), _encoded("PNG", mode="I;16")


@fuzz_settings(50)
@given(data=st.data())
def test_fuzz_recipe(tmp_path_factory, data):
    seed = data.draw(st.sampled_from(RECIPES)).read_bytes()
    text = data.draw(mutated(seed, (b"epochs: 1e400\n", b"rules: &r [*r]\n", b"lr: !!float nan\n",
                                    b"model: {source: [[[[[]]]]]}\n", b"classes: " + b"x, " * 50)))
    fuzz("recipe", tmp_path_factory.getbasetemp(), {"recipe.yaml": text})


@fuzz_settings(50)
@given(data=st.data())
def test_fuzz_image(tmp_path_factory, data):
    seed = data.draw(st.sampled_from([PNG, JPEG, GREY16]))
    fuzz("image", tmp_path_factory.getbasetemp(), {"image.png": data.draw(mutated(seed, (b"IHDR\x7f\xff\xff\xff",)))})


@fuzz_settings(20)
@given(data=st.data())
def test_fuzz_class_folder(tmp_path_factory, data):
    """Class and file names of any unicode or bytes, images real or mutated."""
    files = {}
    for c in data.draw(st.lists(NAMES, min_size=1, max_size=3, unique=True)):
        for name in data.draw(st.lists(NAMES, min_size=1, max_size=3, unique=True)):
            body = data.draw(st.one_of(st.just(PNG), mutated(PNG)))
            files[f"data/{c}/{name}{data.draw(st.sampled_from(['.png', '.jpg', '']))}"] = body
    fuzz("class_folder", tmp_path_factory.getbasetemp(), files)


def _exported(card: dict) -> bytes:
    """An ONNX file carrying a run card in its metadata, as a gluontl export writes it."""
    graph = helper.make_graph([helper.make_node("Identity", ["data"], ["logits"])], "g",
                              [helper.make_tensor_value_info("data", TensorProto.FLOAT, [None, 3, 8, 8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [None, 3, 8, 8])])
    model = helper.make_model(graph)
    for key, value in onnx_props(card).items():
        model.metadata_props.add(key=key, value=value)
    return model.SerializeToString()


CARD = dict(model_card(TransformSpec(resize=8), ["cat", "dog"], "data", (3, 8, 8)), task="classification")


@fuzz_settings(40)
@given(data=st.data())
def test_fuzz_export_metadata(tmp_path_factory, data):
    """The metadata strings and NAME-preprocess.json mutated (the ONNX bytes are fuzzed elsewhere)."""
    preprocess = json.dumps(CARD["preprocess"]).encode()
    classes = json.dumps(CARD["classes"]).encode()
    extra = (b'{"format": 1e999}', b'"steps": [{"op": "resize_shorter", "size": -1}]', b'[[[[[[[[')
    model = onnx.load_from_string(_exported(CARD))
    for p in model.metadata_props:  # protobuf strings are UTF-8: a bad byte becomes U+FFFD
        if p.key.endswith(("preprocess", "classes")):
            seed = preprocess if p.key.endswith("preprocess") else classes
            p.value = data.draw(mutated(seed, extra)).decode("utf-8", "replace")
    side = data.draw(mutated(json.dumps(CARD).encode(), extra))
    fuzz("export_meta", tmp_path_factory.getbasetemp(), {"model.onnx": model.SerializeToString(),
                                                         "model-preprocess.json": side})


IMAGES = {f"img/{i:02d}.png": PNG for i in range(6)}
LABEL_FILES = {
    "labels.csv": b"image,labels\nimg/00.png,red;green\nimg/01.png,green\nimg/02.png,\nimg/03.png,blue;red\n"
                  b"# a comment\nimg/04.png,red\n\"img/05.png\",\"green;blue\"\n",
    "labels.json": json.dumps([{"image": "img/00.png", "labels": ["red", "green"]},
                               {"image": "img/01.png", "labels": []},
                               {"image": "img/02.png", "labels": ["blue"]}, {"image": "img/03.png", "labels": ["red"]},
                               {"image": "img/04.png", "labels": ["green", "blue"]}]).encode(),
    "labels-map.json": json.dumps({"img/00.png": ["red"], "img/01.png": ["green", "red"], "img/02.png": [],
                                   "img/03.png": ["blue"]}).encode(),
    "list.csv": b"path,label\nimg/00.png,0\nimg/01.png,1\nimg/02.png,0\n# a comment\nimg/03.png,1\nimg/04.png,2\n"
                b"img/05.png,2\n",
}


@fuzz_settings(40)
@given(data=st.data())
def test_fuzz_label_files(tmp_path_factory, data):
    """Multi-label CSV and JSON label lists (``labels:``) and single-label lists (``list:``), with their
    images beside them: parsed, or one DataError naming the file."""
    name = data.draw(st.sampled_from(sorted(LABEL_FILES)))
    text = data.draw(mutated(LABEL_FILES[name], (b"~nosuchuser/x.png", b";" * 40, b"," * 40, b'"', b"img/00.png",
                                                 b"\xc2\xb2", b"\xd9\xa3", b"99999999999", b"-0", b'{"image": 1}',
                                                 b'"labels": "red"', b'"labels": [1, null]')))
    file = name.replace("-map", "")
    result = fuzz("label_file", tmp_path_factory.getbasetemp(), {**IMAGES, file: text}, file)
    if result["outcome"] == "input_error":
        assert file in result["message"], result["message"]
