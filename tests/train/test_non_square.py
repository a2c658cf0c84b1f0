"""A non-square model (PP-OCR's 48x192 text-direction classifier, shipped in rapidocr-onnxruntime):
default transforms, the feature cache, training, export and predict at H != W."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from tests import helpers
from tests.helpers import run_cli
from PIL import Image

import gluontl
from gluontl import deploy_preprocess


def _cls_model() -> Path | None:
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "models" / "ch_ppocr_mobile_v2.0_cls_infer.onnx"
    return path if path.is_file() else None


def _text_lines(folder: Path, n: int, seed: int = 0) -> None:
    """Light text-like lines of several sizes and aspects around 4:1 (class up) and the same lines
    turned 180 degrees (class down)."""
    rs = np.random.RandomState(seed)
    for cls in ("up", "down"):
        (folder / cls).mkdir(parents=True)
    for i in range(n):
        h = rs.randint(36, 64)
        w = int(h * rs.uniform(3.0, 5.0))
        img = np.full((h, w, 3), rs.uniform(200, 250))
        for col in range(rs.randint(4, 12), rs.randint(w // 2, w - 4), 6):
            top = h // 4 + (0 if rs.rand() < 0.7 else h // 4)
            img[top:top + rs.randint(h // 4, h // 2), col:col + 4] = rs.uniform(0, 60)
        img = img.astype(np.uint8)
        Image.fromarray(img).save(folder / "up" / f"{i}.png")
        Image.fromarray(np.ascontiguousarray(img[::-1, ::-1])).save(folder / "down" / f"{i}.png")


@pytest.mark.skipif(_cls_model() is None, reason="pip install --no-deps rapidocr-onnxruntime==1.4.4 ships the model")
def test_a_48x192_model_fine_tunes_exports_and_predicts(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _text_lines(tmp_path / "lines", 16)
    recipe = {"name": "ocr_cls", "model": {"source": str(_cls_model()), "input_shape": [3, 48, 192]},
              "surgery": {"cut_at": "reshape2_0.tmp_0", "head": {"classes": 2}},
              "rules": [{"match": "*", "grad_req": "null"}, {"type": ["BatchNorm"], "bn": "frozen"},
                        {"match": "head.*", "grad_req": "write"}],
              "data": {"source": "folder:lines", "batch_size": 8, "val_fraction": 0.25},
              "train": {"epochs": 2, "lr": 0.02, "optimizer": "adam", "seed": 0, "cache_features": "on",
                        "cache_views": 2},
              "export": {"formats": ["onnx", "symbol"]}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    code, out, err = run_cli(capsys, "plan", "--recipe", "r.yaml")
    assert code == 0, err
    assert "train transform: scaled to cover 48x192, centre crop 48x192, horizontal flip" in out
    assert "feature cache: on" in out  # 2 augmented 48x192 views of each image through the frozen prefix
    code, out, err = run_cli(capsys, "finetune", "--recipe", "r.yaml", "--quiet")
    assert code == 0, err
    run = tmp_path / "runs" / "ocr_cls"
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["epoch"] for m in metrics if "val_top1" in m][-1:] == [2]
    exported = run / "export" / "ocr_cls.onnx"
    model = onnx.load(str(exported))
    # the source graph's own input (its H and W are free, as PaddleOCR exported them); the record says 48x192
    record = json.loads({p.key: p.value for p in model.metadata_props}["gluontl.preprocess"])
    assert record["steps"] == [{"op": "resize_cover", "size": [48, 192]}, {"op": "center_crop", "size": [48, 192]}]
    assert record["input"]["shape"] == [None, 3, 48, 192]
    images = [str(tmp_path / "lines" / c / "3.png") for c in ("up", "down")] + [str(tmp_path / "square.png")]
    Image.fromarray(np.random.RandomState(1).randint(0, 256, (64, 64, 3), dtype=np.uint8)).save(images[-1])
    rows = {}
    for target in (str(run), str(exported)):
        code, out, err = run_cli(capsys, "predict", target, *images, "--json")
        assert code == 0, err
        rows[target] = json.loads(out)
    by_run, by_file = (rows[t] for t in (str(run), str(exported)))
    assert len(by_run) == len(by_file) == 3
    import onnxruntime as ort

    logits = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"]).run(
        None, {record["input"]["name"]: np.stack([gluontl.preprocess(i, record) for i in images])})[0]
    # MXNet (run) against onnxruntime (file): softmax moves at most half the largest logit change; the
    # graph's widest contraction sums 200 terms (a 1x1 conv over 200 channels), 53 convolutions and the head deep
    tol = 0.5 * helpers.f32_tol(np.abs(logits).max(), 200, depth=54)
    for a, b in zip(by_run, by_file):
        assert [c for c, _ in a["top"]] == [c for c, _ in b["top"]]
        np.testing.assert_allclose([p for _, p in a["top"]], [p for _, p in b["top"]], rtol=0, atol=tol)
    # the copyable reference feeds the file the tensor gluontl feeds it
    x = gluontl.preprocess(images[0], record)
    assert x.shape == (3, 48, 192) and np.array_equal(deploy_preprocess.preprocess(images[0], record), x)
