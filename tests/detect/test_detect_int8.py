"""A detection run's int8 export: the convolutions go int8, box decoding and the per-class NMS
stay float, and the verdict is the change in val mAP@0.5 of the two files."""
import json

import helpers
import numpy as np
import onnx

from gluontl.detect.export import OUTPUT_NAMES
from gluontl.detect.metrics import DetectionEval, int8_metric
from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune


def test_detector_int8_quantizes_convolutions_only_and_reports_map(small_voc, tmp_path, capsys):
    recipe = parse_recipe({
        "name": "det", "task": "detection",
        "model": {"source": "zoo:ssd_300_mobilenet0.25_custom", "input_shape": [3, 128, 128]},
        "rules": [{"preset": "freeze_until_stage", "until_stage": 2}],
        "data": {"source": f"voc:{small_voc}", "classes": ["0", "1", "2", "3", "4"], "batch_size": 8},
        "train": {"epochs": 2, "lr": 0.01, "seed": 3, "guards": "off"},  # 1 epoch leaves score ties NMS orders
        "export": {"formats": ["onnx"], "quantize": {"max_drop": 100}}}, origin="test")  # either way (AVX2)
    run = finetune(recipe, runs_root=tmp_path, quiet=True).run_dir
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
