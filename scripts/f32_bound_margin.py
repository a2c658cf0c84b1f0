"""How far inside export verification's float32 bound (gluontl/export/errorbound.py) real models sit.

For each model: import it, run MXNet and onnxruntime on the same random batch of 2, and print the
largest |difference|, the bound and their ratio (the ratio must stay well below 1; a ratio near
1 on some CPU would mean the bound is too tight), plus the old fixed tolerance (1e-4 of the
range) for comparison. Models: the test fixtures (tests/onnx/fixtures, PyTorch legacy and dynamo
exports) and, when rapidocr-onnxruntime is installed, PaddleOCR's det/cls/rec models.

    python scripts/f32_bound_margin.py [--limit N]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402

from gluontl.export.errorbound import bound, output_budgets  # noqa: E402
from gluontl.export.verify import saturating_scales  # noqa: E402
from gluontl.onnx import import_model  # noqa: E402
from tests.helpers import ort_run  # noqa: E402


def cases(limit: int | None):
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is not None and spec.submodule_search_locations:
        ocr = Path(list(spec.submodule_search_locations)[0]) / "models"
        yield from [(ocr / "ch_ppocr_mobile_v2.0_cls_infer.onnx", "x", (3, 48, 192)),
                    (ocr / "ch_PP-OCRv4_det_infer.onnx", "x", (3, 96, 128)),
                    (ocr / "ch_PP-OCRv4_rec_infer.onnx", "x", (3, 48, 160))]
    fixtures = ROOT / "tests" / "onnx" / "fixtures"
    entries = json.loads((fixtures / "MANIFEST.json").read_text())["fixtures"][:limit]
    for e in entries:
        yield fixtures / e["file"], e["input"], tuple(e["test_shapes"][-1][1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=None, help="the first N fixtures only")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    worst, n = 0.0, 0
    for path, inp, shape in cases(args.limit):
        block = import_model(str(path), input_shapes={inp: (None, *shape)})
        model = onnx.load(str(path))
        budgets, floors = output_budgets(model), saturating_scales(model)
        x = np.random.RandomState(0).randn(2, *shape).astype(np.float32)
        got = block(mx.nd.array(x))
        got = got if isinstance(got, (list, tuple)) else [got]
        for out, g, r in zip(model.graph.output, got, ort_run(str(path), {inp: x})):
            g, r = g.asnumpy().astype(np.float64), np.asarray(r, np.float64)
            scale = max(float(np.abs(r).max()), floors.get(out.name, 0.0))
            err, tol = float(np.abs(g - r).max()), bound(budgets[out.name], scale)
            span = max(float(r.max() - r.min()), 1e-30)
            worst, n = max(worst, err / tol), n + 1
            print(f"{path.name:42s} {out.name[:14]:14s} |diff| {err:.2e} bound {tol:.2e} ratio {err / tol:.3f} "
                  f"bound/range {tol / span:.1e} (old 1e-4) D {budgets[out.name].depth:.0f}", flush=True)
    print(f"{n} outputs; largest |diff| / bound: {worst:.3f}")


if __name__ == "__main__":
    main()
