"""The GluonCV 0.10.5 / MXNet 1.9.1 detection pitfalls issue 12 lists, each pinned as an upstream
fact next to what gluontl does instead (the restore/BN/num_class/reset_class ones are in
tests/detect/test_models.py, the NMS export one in tests/detect/test_detect_export.py)."""
import ast
import configparser
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd

from gluontl.detect.formats import read_voc_xml
from gluontl.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[2]
XML = """<annotation><filename>{id}.jpg</filename><size><width>64</width><height>48</height><depth>3</depth></size>
<object><name>{name}</name><bndbox><xmin>5</xmin><ymin>6</ymin><xmax>30</xmax><ymax>40</ymax></bndbox></object>
</annotation>"""


def _voc2007(root: Path, name: str = "dog") -> Path:
    from PIL import Image

    base = root / "VOC2007"
    for sub in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (base / sub).mkdir(parents=True)
    (base / "Annotations" / "000001.xml").write_text(XML.format(id="000001", name=name))
    Image.new("RGB", (64, 48)).save(base / "JPEGImages" / "000001.jpg")
    (base / "ImageSets" / "Main" / "train.txt").write_text("000001\n")
    return base


def test_gluoncv_voc_detection_crashes_on_a_missing_difficult_tag_and_ours_reads_it_as_zero(tmp_path):
    from gluoncv.data import VOCDetection

    base = _voc2007(tmp_path)
    with pytest.raises(AttributeError):  # int(obj.find('difficult').text): None has no .text
        VOCDetection(root=str(tmp_path), splits=((2007, "train"),))
    ann, names = read_voc_xml(base / "Annotations" / "000001.xml", base / "JPEGImages")
    assert names == ["dog"]
    np.testing.assert_array_equal(ann.labels, [[4, 5, 30, 40, 0, 0]])  # VOC's 1-based xmin/ymin - 1, difficult 0


def test_gluoncv_custom_voc_generate_classes_is_ineffective(tmp_path):
    from gluoncv.data import VOCDetection
    from gluoncv.data.pascal_voc.detection import CustomVOCDetection

    base = _voc2007(tmp_path, "zebra")
    (base / "Annotations" / "000001.xml").write_text(
        XML.format(id="000001", name="zebra").replace("</bndbox>", "</bndbox><difficult>0</difficult>"))
    ds = CustomVOCDetection(generate_classes=True, root=str(tmp_path), splits=((2007, "train"),))
    assert ds.classes == VOCDetection.CLASSES  # the `classes` property reads the class attribute
    assert len(ds[0][1]) == 0  # and the zebra, not a VOC class, was dropped while loading


def test_gluontl_never_uses_gluoncvs_dataset_classes_and_declares_pycocotools():
    """GluonCV's COCODetection calls try_import_pycocotools(), which pip-installs at run time;
    gluontl parses COCO itself and imports pycocotools (a declared dependency) directly."""
    import gluoncv.data.mscoco.utils as coco_utils

    assert "import_try_install('pycocotools')" in Path(coco_utils.__file__).read_text()
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    assert any(r.strip().startswith("pycocotools") for r in cfg["options"]["install_requires"].splitlines())
    banned = {"VOCDetection", "CustomVOCDetection", "COCODetection", "try_import_pycocotools"}
    for path in (ROOT / "gluontl").rglob("*.py"):
        names = {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(ast.parse(path.read_text()))
                 if isinstance(n, (ast.Name, ast.Attribute))}
        names |= {a.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.ImportFrom)
                  for a in n.names}
        assert not names & banned, path


def test_gluoncv_stack_batchify_gives_cpu_shared_arrays_which_a_hybridized_net_refuses():
    from gluoncv.data.batchify import Stack

    from gluontl.detect.data import _stack

    samples = [np.zeros((3, 8, 8), np.float32), np.ones((3, 8, 8), np.float32)]
    shared = Stack()(samples)
    assert shared.context == mx.Context("cpu_shared", 0)
    net = mx.gluon.nn.Conv2D(2, 3)
    net.initialize()
    net.hybridize(static_alloc=True, static_shape=True)
    net(mx.nd.zeros((2, 3, 8, 8)))
    with pytest.raises(Exception):  # the cached graph's arrays live on cpu(0)
        net(shared).wait_to_read()
    x, y = _stack([(s, np.full((1, 6), -1, np.float32)) for s in samples])
    out = net(mx.nd.array(x))  # what the detection loaders hand the loop
    assert out.context == mx.cpu(0) and out.shape == (2, 2, 6, 6)


def test_a_hybridized_detector_keeps_its_training_graph_until_the_cache_is_dropped():
    """After a hybridized training step GluonCV's SSD keeps answering with the training outputs
    (class and box predictions, anchors) in predict mode; gluontl's evaluation drops the cached
    graph before and after, so it gets detections and training gets its graph back."""
    from gluontl.detect.runs import predict_batches
    from gluontl.tasks.detection import prepare

    recipe = parse_recipe({"name": "t", "task": "detection",
                           "model": {"source": "zoo:ssd_300_mobilenet0.25_custom", "input_shape": [3, 64, 64]}},
                          origin="test")
    net = prepare(recipe, ["a", "b"]).block
    net.hybridize(static_alloc=True, static_shape=True)
    x = mx.nd.array(np.random.default_rng(0).standard_normal((2, 3, 64, 64)).astype(np.float32))
    with autograd.record():
        train_out = net(x)
    anchors = train_out[2].shape[1]
    with autograd.predict_mode():
        stale = net(x)
    assert stale[2].shape == (1, anchors, 4)  # anchors, not boxes: the training graph answered
    y = mx.nd.array(np.full((2, 1, 6), -1, np.float32))
    dets, gts = predict_batches(net, [(x, y)], [mx.cpu()])
    assert len(dets) == 2 and all(d.shape[1] == 6 for d in dets) and all(len(g) == 0 for g in gts)
    with autograd.record():
        again = net(x)
    assert [a.shape for a in again] == [a.shape for a in train_out]
