"""A detection run's int8 export: the convolutions go int8, box decoding and the per-class NMS
stay float, and the verdict is the change in val mAP@0.5 of the two files."""
import json
import shutil

from tests import helpers
import numpy as np
import onnx
import pytest
import yaml

from gluontl.detect.export import OUTPUT_NAMES
from gluontl.detect.metrics import DetectionEval, int8_metric
from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune


@pytest.fixture(scope="module")
def det_run(small_voc, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("det_int8")
    recipe = parse_recipe({
        "name": "det", "task": "detection",
        "model": {"source": "zoo:ssd_300_mobilenet0.25_custom", "input_shape": [3, 128, 128]},
        "rules": [{"preset": "freeze_until_stage", "until_stage": 2}],
        "data": {"source": f"voc:{small_voc}", "classes": ["0", "1", "2", "3", "4"], "batch_size": 8},
        "train": {"epochs": 2, "lr": 0.01, "seed": 3, "guards": "off"},  # 1 epoch leaves score ties NMS orders
        "export": {"formats": ["onnx"], "quantize": {"max_drop": 100}}}, origin="test")  # either way (AVX2)
    return tmp_path, finetune(recipe, runs_root=tmp_path, quiet=True).run_dir


def test_detector_int8_quantizes_convolutions_only_and_reports_map(det_run, capsys):
    tmp_path, run = det_run
    code, out, err = helpers.run_cli(capsys, "export", str(run), "--out", str(tmp_path / "out"), "--format", "onnx")
    assert code == 0, err
    q = onnx.load(str(tmp_path / "out" / "det.int8.onnx"))
    produced_by = {o: n for n in q.graph.node for o in n.output}
    convs = [n for n in q.graph.node if n.op_type == "Conv"]
    assert convs and all(produced_by[n.input[0]].op_type == "DequantizeLinear" for n in convs)
    # what gets quantized: the convolutions' inputs and outputs (the image, convs, activations
    # between them), never a box decoding or NMS tensor
    sources = {produced_by[n.input[0]].op_type if n.input[0] in produced_by else n.input[0]
               for n in q.graph.node if n.op_type == "QuantizeLinear"}
    assert sources <= {"Conv", "Relu", "Clip", "data"} and "Conv" in sources, sources
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in q.graph.node
                   if n.name.startswith("gluontl_nms/"))
    assert [o.name for o in q.graph.output] == list(OUTPUT_NAMES)
    report = json.loads((run / "det.int8.json").read_text())["verification"]
    assert report["metric"] == "mAP@0.5" and report["images"] == 24


def test_detector_int8_symbol_quantizes_convolutions_only_and_keeps_nms_float(det_run, capsys):
    """MXNet's oneDNN path on the same run: only the (fused) convolutions carry int8 ranges;
    box decoding and GluonCV's per-class box_nms run in float on dequantized scores and boxes."""
    tmp_path, run = det_run
    code, out, err = helpers.run_cli(capsys, "export", str(run), "--out", str(tmp_path / "sym"), "--format", "symbol",
                                     "--int8")
    assert code == 0, err
    nodes = json.loads((tmp_path / "sym" / "det-int8-symbol.json").read_text())["nodes"]
    quantized = [n for n in nodes if n.get("attrs", {}).get("quantized") == "true"]
    assert quantized and all(n["op"] == "_sg_mkldnn_conv" for n in quantized)
    assert not any(n["op"].startswith("_contrib_quantized") for n in nodes), "only convolutions are int8"
    assert any(n["op"] == "_contrib_box_nms" for n in nodes)
    report = json.loads((run / "det-int8-symbol.report.json").read_text())
    assert report["verification"]["metric"] == "mAP@0.5" and report["verification"]["images"] == 24
    assert "_contrib_box_nms" in report["float_operators"]


def test_int8_metric_is_the_map_change_in_points():
    gts = [np.array([[10, 10, 50, 50, 0, 0]], np.float32), np.array([[20, 20, 60, 60, 1, 0]], np.float32)]
    hit = [np.array([[[0]], [[1]]], np.float32), np.array([[[0.9]], [[0.8]]], np.float32),
           np.array([[[10, 10, 50, 50]], [[20, 20, 60, 60]]], np.float32)]
    miss = [hit[0], hit[1], np.array([[[10, 10, 50, 50]], [[100, 100, 120, 120]]], np.float32)]  # image 2 missed
    report = int8_metric(["a", "b"])(hit, miss, gts)
    assert report["float"] == 1.0 and report["int8"] == 0.5  # class b's only object not found: AP 0
    assert report["drop"] == 50.0
    ev = DetectionEval(["a", "b"])
    for d, g in zip(np.concatenate(miss, axis=-1), gts):
        ev.update(d, g)
    assert ev.voc()["map50"] == report["int8"]


def test_int8_metric_agreement_is_the_map_of_int8_against_the_confident_float_detections():
    gts = [np.array([[10, 10, 50, 50, 0, 0]], np.float32), np.array([[20, 20, 60, 60, 1, 0]], np.float32)]
    ids, boxes = np.array([[[0]], [[1]]], np.float32), np.array([[[10, 10, 50, 50]], [[20, 20, 60, 60]]], np.float32)
    moved = np.array([[[12, 10, 50, 50]], [[100, 100, 120, 120]]], np.float32)  # IoU 0.95 with image 1's; image 2 off
    confident = [ids, np.array([[[0.9]], [[0.8]]], np.float32), boxes]
    # both float detections are truth: int8 finds class a's (IoU >= 0.5), misses class b's -> (1 + 0) / 2
    assert int8_metric(["a", "b"])(confident, [ids, confident[1], moved], gts)["agreement"] == 0.5
    assert int8_metric(["a", "b"])(confident, confident, gts)["agreement"] == 1.0
    # a float detection scoring below 0.5 is no truth: class b has none and is left out of the mean
    unsure = [ids, np.array([[[0.9]], [[0.3]]], np.float32), boxes]
    assert int8_metric(["a", "b"])(unsure, [ids, unsure[1], moved], gts)["agreement"] == 1.0


def test_every_node_of_a_detector_export_is_named_so_exclude_keeps_a_conv_float(det_run, capsys, tmp_path):
    """mx.onnx leaves nodes nameless; the export names each after its first output, so an
    ``export.quantize.exclude`` glob can keep the stem convolution float (and only it)."""
    _, trained = det_run
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    code, _, err = helpers.run_cli(capsys, "export", str(run), "--out", str(tmp_path / "float"), "--format", "onnx")
    assert code == 0, err
    names = [n.name for n in onnx.load(str(tmp_path / "float" / "det.onnx")).graph.node]
    assert all(names) and len(set(names)) == len(names)
    stem = next(n for n in onnx.load(str(tmp_path / "float" / "det.onnx")).graph.node if n.op_type == "Conv").name
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe["export"]["quantize"]["exclude"] = [stem]
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    code, _, err = helpers.run_cli(capsys, "export", str(run), "--out", str(tmp_path / "int8"), "--format", "onnx",
                                   "--int8")
    assert code == 0, err
    q = onnx.load(str(tmp_path / "int8" / "det.int8.onnx"))
    produced_by = {o: n for n in q.graph.node for o in n.output}
    fed_by = {n.name: produced_by[n.input[1]].op_type if n.input[1] in produced_by else "initializer"
              for n in q.graph.node if n.op_type == "Conv"}
    assert fed_by[stem] == "initializer"  # float weights, no DequantizeLinear in front
    assert sum(v == "DequantizeLinear" for v in fed_by.values()) == len(fed_by) - 1
