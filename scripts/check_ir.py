"""An exported OpenVINO IR against the run's own MXNet network on the whole validation split (issue
38's acceptance): each float output's largest difference as a share of MXNet's range, and the task's
metric of both on the labels (classification top-1, detection mAP@0.5, segmentation mIoU plus the
share of pixels whose masks are equal). The reference is MXNet, not the ONNX file the IR came from.

Usage: python scripts/check_ir.py RUN IR [--checkpoint best] [--batch 16]
  IR: an IR folder or .xml that `gluontl export RUN --format openvino` wrote (float or int8).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import mxnet as mx
import numpy as np

from gluontl.data.card import recipe_data
from gluontl.export.openvino_ir import IRSession
from gluontl.train.runs import load_run


def _split(recipe, run: Path):
    """(tensor(i), labels, metric(mxnet outputs, IR outputs, labels), what the metric reads)."""
    data = recipe_data(recipe, run)
    if recipe.task == "detection":
        from gluontl.detect.data import load_detection_split
        from gluontl.detect.metrics import int8_metric

        ds = load_detection_split(data, data.val, recipe.model.input_shape)
        card = json.loads((run / "preprocess.json").read_text())
        return len(ds), lambda i: ds[(i, 0)][0], [ds[(i, 0)][1] for i in range(len(ds))], int8_metric(card["classes"])
    if recipe.task == "segmentation":
        from gluontl.segment.data import load_segmentation_split
        from gluontl.segment.metrics import int8_metric
        from gluontl.tasks.segmentation import seg_spec

        seg = seg_spec(recipe)
        ds = load_segmentation_split(data, seg, data.val, recipe.model.input_shape)
        labels = [ds[(i, 0)][1] for i in range(len(ds))]
        return len(ds), lambda i: ds[(i, 0)][0], labels, int8_metric(len(ds.class_names), seg.ignore_label)
    from gluontl.data.datasets import load_split
    from gluontl.export.quantize import classification_metric

    ds = load_split(data, data.val)
    return len(ds), lambda i: ds[i][0], ds.labels, classification_metric


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("ir", type=Path)
    ap.add_argument("--checkpoint", default="best")
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    recipe, net = load_run(args.run, args.checkpoint)
    n, tensor, labels, metric = _split(recipe, args.run)
    session = IRSession(args.ir)
    name = session.get_inputs()[0].name
    segment = recipe.task == "segmentation"
    ours: list[list[np.ndarray]] = []
    theirs: list[list[np.ndarray]] = []
    worst: dict[int, tuple[float, float]] = {}  # output -> (max |IR - MXNet|, MXNet's range)
    for start in range(0, n, args.batch):
        x = np.stack([tensor(i) for i in range(start, min(start + args.batch, n))]).astype(np.float32)
        with mx.autograd.predict_mode():
            want = net(mx.nd.array(x))
        want = [w.asnumpy() for w in (want if isinstance(want, (list, tuple)) else [want])]
        got = session.run(None, {name: x})
        if segment:
            want = [want[0], want[0].argmax(1)]
        for k, (g, w) in enumerate(zip(got, want)):
            if np.issubdtype(w.dtype, np.floating):
                err, span = worst.get(k, (0.0, 0.0))
                finite = np.isfinite(w)
                worst[k] = (max(err, float(np.max(np.abs(g - w)[finite], initial=0.0))),
                            max(span, float(np.ptp(w[finite])) if finite.any() else 0.0))
        keep = slice(1, 2) if segment else slice(None)  # a segmenter's metric reads its masks only
        ours.append(want[keep])
        theirs.append(got[keep])
    ours_all = [np.concatenate(p) for p in zip(*ours)]
    theirs_all = [np.concatenate(p) for p in zip(*theirs)]
    verdict = metric(ours_all, theirs_all, labels)
    for k, (err, span) in sorted(worst.items()):
        print(f"output {k}: max |IR - MXNet| {err:.3e}, {err / span if span else 0.0:.2e} of MXNet's range {span:.3g}")
    if segment:
        print(f"masks equal on {100 * float(np.mean(ours_all[0] == theirs_all[0])):.4f} % of "
              f"{ours_all[0].size} validation pixels")
    print(f"{verdict['metric']} MXNet {100 * verdict['float']:.3f}, IR {100 * verdict['int8']:.3f} "
          f"({-verdict['drop']:+.3f} points) on {verdict['images']} validation images")


if __name__ == "__main__":
    main()
