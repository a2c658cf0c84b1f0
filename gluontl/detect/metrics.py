"""Detection metrics: VOC mAP@0.5 (our numpy) and COCO mAP@[.5:.95] (pycocotools), from the
same accumulated arrays, plus the PR-curve plot.

Conventions, chosen so both metrics see the same IoU:

- Boxes are continuous pixel coordinates and IoU has no "+1". GluonCV's ``VOCMApMetric`` adds 1
  to xmax/ymax because its ``VOCDetection`` subtracts 1 from all four VOC coordinates (inclusive
  integers); our box contract subtracts 1 from xmin/ymin only, so widths, hence IoU, equal the VOC
  devkit's on VOC data, and COCO (x, y, w, h, no +1) agrees on the same arrays.
- A detection matches at IoU >= 0.5 (GluonCV, pycocotools; the MATLAB devkit uses >).
- VOC matching is the devkit's: per image and class, in descending score, a detection goes to the
  ground truth it overlaps most; if that one is already taken it is a false positive (no fall-back
  to the second best); if it is ``difficult`` the detection is ignored. Equal scores keep the
  order of arrival (stable sort), so results never depend on the sort algorithm.
- A class without non-difficult ground truth has AP ``nan`` and is left out of the mean
  (GluonCV's ``nanmean``, pycocotools' -1).
- VOC07 11-point AP samples recall at exactly k/10 (integer comparison); the Python ports'
  ``np.arange(0, 1.1, 0.1)`` holds 0.30000000000000004, 0.6000000000000001 and 0.7000000000000001,
  so a recall of exactly 3/10, 6/10 or 7/10 misses its point there.
- For COCO, ``difficult`` boxes become ``iscrowd=1``, COCO's only way to ignore a ground truth
  (its IoU with a crowd box is intersection over the detection's area, a little more lenient),
  and COCO keeps at most 100 detections per image and class.
"""
from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..errors import DataError, GluontlError

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` (n, 4) with every box of ``b`` (m, 4), xyxy, float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # inf boxes of a diverging net (0/0, inf-inf, inf*0)
        lt = np.maximum(a[:, None, :2], b[None, :, :2])
        rb = np.minimum(a[:, None, 2:4], b[None, :, 2:4])
        inter = np.prod(np.clip(rb - lt, 0, None), axis=2)
        area_a = np.prod(np.clip(a[:, 2:4] - a[:, :2], 0, None), axis=1)
        area_b = np.prod(np.clip(b[:, 2:4] - b[:, :2], 0, None), axis=1)
        union = area_a[:, None] + area_b[None, :] - inter
        return np.where(union > 0, inter / union, 0.0)


class DetectionEval:
    """Accumulates one split's detections and ground truth, image by image.

    ``update`` takes one image's arrays (detections ``(K, 6)`` ``[class, score, x1, y1, x2, y2]``,
    ground truth ``(N, 6)`` ``[x1, y1, x2, y2, class, difficult]``) or a batch of them
    (``(B, K, 6)``, ``(B, M, 6)``); rows with class -1 are padding. Both metrics are computed
    from everything accumulated, so ``voc()`` and ``coco()`` can be called in any order.
    """

    def __init__(self, class_names: Sequence[str]) -> None:
        self.class_names = list(class_names)
        self._images: list[tuple[np.ndarray, np.ndarray]] = []

    def update(self, dets: Any, gts: Any) -> None:
        d, g = _numpy(dets), _numpy(gts)
        if d.ndim == 3 and g.ndim == 3 and len(d) == len(g):
            for di, gi in zip(d, g):
                self._add(di, gi)
        else:
            self._add(d, g)

    def __len__(self) -> int:
        return len(self._images)

    def _add(self, det: np.ndarray, gt: np.ndarray) -> None:
        if det.ndim != 2 or det.shape[1] != 6 or gt.ndim != 2 or gt.shape[1] != 6:
            raise DataError(f"Detection metrics take one image's detections as (K, 6) [class, score, x1, y1, x2, y2] "
                            f"and its ground truth as (N, 6) [x1, y1, x2, y2, class, difficult] (or batches of "
                            f"both); got {det.shape} and {gt.shape}.")
        det = det[det[:, 0] >= 0].astype(np.float64)
        gt = gt[gt[:, 4] >= 0].astype(np.float64)
        check_class_ids(det[:, 0], self.class_names, "detection")
        check_class_ids(gt[:, 4], self.class_names, "ground-truth")
        self._images.append((det, gt))

    def voc(self, eleven_point: bool = False) -> dict[str, Any]:
        """VOC mAP@0.5: the area under the interpolated PR curve (VOC2010+), or the VOC2007
        11-point mean with ``eleven_point``. ``pr`` holds each class's raw precision/recall
        arrays in descending score (classes without ground truth have none)."""
        n = len(self.class_names)
        rows = [_match(det, gt) for det, gt in self._images]  # (class, score, match) per detection
        cls, score, match = (np.concatenate([r[i] for r in rows]) if rows else np.zeros(0) for i in range(3))
        order = np.argsort(-score, kind="stable")
        cls, match = cls[order], match[order]
        real = [gt[gt[:, 5] <= 0, 4].astype(int) for _, gt in self._images]
        n_pos = np.bincount(np.concatenate(real) if real else np.zeros(0, int), minlength=n)
        per_class: dict[str, float] = {}
        pr: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for c, name in enumerate(self.class_names):
            if n_pos[c] == 0:
                per_class[name] = math.nan
                continue
            m = match[(cls == c) & (match >= 0)]  # detections of difficult objects count neither way
            tp = np.cumsum(m == 1)
            precision = tp / np.arange(1, len(m) + 1)
            recall = tp / n_pos[c]
            ap = _ap_11(precision, tp, int(n_pos[c])) if eleven_point else _ap_area(precision, recall)
            per_class[name] = float(ap)
            pr[name] = (precision, recall)
        return {"map50": _nanmean(list(per_class.values())), "per_class": per_class, "pr": pr,
                "n_gt": {name: int(k) for name, k in zip(self.class_names, n_pos)},
                "method": "11-point" if eleven_point else "area"}

    def coco(self) -> dict[str, Any]:
        """COCO mAP@[.5:.95], mAP@0.5 and mAP@0.75 (area "all", 100 detections) from pycocotools,
        and each class's mAP@[.5:.95]."""
        try:
            from pycocotools.coco import COCO
            from pycocotools.cocoeval import COCOeval
        except ImportError as e:
            raise GluontlError(f"COCO mAP needs pycocotools, a dependency of gluontl that does not import here ({e}). "
                               f"Reinstall gluontl into this environment (pip install -e . in the gluontl checkout); "
                               f"gluontl never installs packages while it runs.") from None
        n = len(self.class_names)
        images, anns, results = [], [], []
        for i, (det, gt) in enumerate(self._images, 1):
            images.append({"id": i})
            for x1, y1, x2, y2, c, difficult in gt.tolist():
                anns.append({"id": len(anns) + 1, "image_id": i, "category_id": int(c),
                             "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1),
                             "iscrowd": int(difficult > 0)})
            for c, score, x1, y1, x2, y2 in det.tolist():
                # an inverted box (IoU 0) would get a negative area: pycocotools ignores it instead of counting a miss
                results.append({"image_id": i, "category_id": int(c), "score": score,
                                "bbox": [x1, y1, max(x2 - x1, 0.0), max(y2 - y1, 0.0)]})
        n_pos = np.bincount([a["category_id"] for a in anns if not a["iscrowd"]], minlength=n)
        # precision[t, r, k]: IoU threshold .5:.05:.95, recall .00:.01:1, class; -1 = class without ground truth
        precision = np.where(n_pos > 0, 0.0, -1.0) * np.ones((10, 101, 1))
        if results:  # loadRes fails on an empty list; without detections every AP is 0
            with contextlib.redirect_stdout(io.StringIO()):
                gt_api = COCO()
                gt_api.dataset = {"images": images, "annotations": anns,
                                  "categories": [{"id": c, "name": name} for c, name in enumerate(self.class_names)]}
                gt_api.createIndex()
                ev = COCOeval(gt_api, gt_api.loadRes(results), "bbox")
                ev.evaluate()
                ev.accumulate()
            precision = ev.eval["precision"][:, :, :, 0, -1]
        return {"map": _coco_mean(precision), "map50": _coco_mean(precision[0]), "map75": _coco_mean(precision[5]),
                "per_class": {name: _coco_mean(precision[:, :, c]) for c, name in enumerate(self.class_names)}}


def int8_metric(class_names: Sequence[str]):
    """The int8 verifier's judge for a detector's ONNX export (outputs ids, scores, bboxes):
    VOC mAP@0.5 of the float and the int8 file on the same images, against ``gts`` (one
    ``(N, 6)`` ground-truth array per image); ``drop`` in points."""
    def metric(float_out: list[np.ndarray], int8_out: list[np.ndarray], gts: Sequence[np.ndarray]) -> dict[str, Any]:
        dets = [np.concatenate(out[:3], axis=-1) for out in (float_out, int8_out)]
        maps = []
        for found in dets:
            ev = DetectionEval(class_names)
            for det, gt in zip(found, gts):
                ev.update(det, gt)
            maps.append(ev.voc()["map50"])
        ev = DetectionEval(class_names)  # agreement: the float file's confident detections as the truth
        for det, truth in zip(dets[1], dets[0]):
            ev.update(det, _as_truth(truth, AGREEMENT_SCORE))
        agree = ev.voc()["map50"]
        agree = None if math.isnan(agree) else agree
        change = 100 * (maps[1] - maps[0])
        return {"metric": "mAP@0.5", "images": len(gts), "float": maps[0], "int8": maps[1], "drop": -change,
                "agreement": agree, "agreement_measure": f"mAP@0.5 of the int8 detections against the float "
                                                         f"ones scoring >= {AGREEMENT_SCORE}",
                "summary": f"mAP@0.5 {100 * maps[0]:.2f} float, {100 * maps[1]:.2f} int8 ({change:+.2f} points), "
                           + (f"agreement {100 * agree:.2f} (mAP@0.5 of int8 against the float detections "
                              f"scoring >= {AGREEMENT_SCORE}) " if agree is not None else "")
                           + f"on {len(gts)} validation images"}
    return metric


AGREEMENT_SCORE = 0.5


def _as_truth(det: np.ndarray, score: float) -> np.ndarray:
    """Detections ``(N, 6)`` [class, score, box] scoring at least ``score`` as ground truth rows
    [box, class, difficult=0] (padding rows, class -1, dropped)."""
    keep = det[(det[:, 0] >= 0) & (det[:, 1] >= score)]
    return np.concatenate([keep[:, 2:6], keep[:, :1], np.zeros((len(keep), 1), keep.dtype)], axis=1)


def table(voc: dict[str, Any], coco: dict[str, Any] | None = None) -> str:
    """The per-class report ``evaluate`` prints: objects (non-difficult), VOC AP@0.5 and, with
    ``coco``, COCO AP@[.5:.95]; "-" for a class without objects (left out of the means)."""
    def cells(count: int, ap50: float, ap: Any) -> str:
        values = [ap50] if coco is None else [ap50, ap]
        return f"{count:>8}" + "".join(f" {'-' if math.isnan(v) else f'{v:.3f}':>8}" for v in values)

    names = list(voc["per_class"])
    width = max(len("class"), *map(len, names))
    lines = [f"{'class':<{width}} {'objects':>8} {'AP50':>8}" + ("" if coco is None else f" {'AP50:95':>8}")]
    for n in names:
        lines.append(f"{n:<{width}} " + cells(voc["n_gt"][n], voc["per_class"][n], coco and coco["per_class"][n]))
    lines.append(f"{'all':<{width}} " + cells(sum(voc["n_gt"].values()), voc["map50"], coco and coco["map"]))
    return "\n".join(lines)


def check_class_ids(ids: np.ndarray, class_names: Sequence[str], what: str) -> None:
    """Refuse class ids that name no class: a model and a class list that do not belong together."""
    bad = ids[(ids != np.round(ids)) | (ids >= len(class_names))]
    if bad.size:
        raise DataError(f"A {what} row has class id {bad[0]:g}, but there are {len(class_names)} class names "
                        f"({', '.join(class_names[:5])}{', ...' if len(class_names) > 5 else ''}). The model's "
                        f"classes and the class list must be the same.")


def pr_figure(voc: dict[str, Any]) -> "Figure":
    """A matplotlib Figure of ``DetectionEval.voc()``'s raw PR curves, one line per class
    (AP in its label, mAP as the legend title); drawn with the Agg backend, no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for name, (precision, recall) in voc["pr"].items():
        ax.plot(recall, precision, lw=1.2, label=f"{name} {voc['per_class'][name]:.3f}")
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1.01), ylim=(0, 1.02),
           title=f"precision-recall at IoU 0.5 ({voc['method']} AP)")
    ax.grid(alpha=0.3)
    ax.legend(title=f"mAP@0.5 {voc['map50']:.3f}", fontsize="small", loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    return fig


def plot_pr(voc: dict[str, Any], path: str | Path) -> Path:
    """Write ``pr_figure(voc)`` as a PNG, atomically."""
    import matplotlib.pyplot as plt

    from ..atomic import atomic_write

    fig = pr_figure(voc)
    try:
        return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=90))
    finally:
        plt.close(fig)


def _match(det: np.ndarray, gt: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image's detections in descending score as (class, score, match), match 1 for a true
    positive, 0 a false positive, -1 ignored. All classes at once: pairs of different classes get
    IoU -1, so a detection only ever reaches ground truth of its own class."""
    det = det[np.argsort(-det[:, 1], kind="stable")]
    out = np.zeros(len(det), np.int8)
    if len(det) and len(gt):
        iou = np.where(det[:, None, 0] == gt[None, :, 4], iou_matrix(det[:, 2:6], gt[:, :4]), -1.0)
        best = iou.argmax(axis=1)
        hit = iou[np.arange(len(best)), best] >= 0.5
        difficult = gt[best, 5] > 0
        out[hit & difficult] = -1
        candidates = np.flatnonzero(hit & ~difficult)
        _, first = np.unique(best[candidates], return_index=True)  # a ground truth's first claimant wins
        out[candidates[first]] = 1
    return det[:, 0], det[:, 1], out


def _ap_area(precision: np.ndarray, recall: np.ndarray) -> float:
    mrec = np.concatenate(([0.0], recall, [1.0]))
    mpre = np.maximum.accumulate(np.concatenate(([0.0], precision, [0.0]))[::-1])[::-1]
    i = np.flatnonzero(mrec[1:] != mrec[:-1])
    return float(np.sum((mrec[i + 1] - mrec[i]) * mpre[i + 1]))


def _ap_11(precision: np.ndarray, tp: np.ndarray, n_pos: int) -> float:
    points = [precision[tp * 10 >= k * n_pos] for k in range(11)]  # recall >= k/10, exactly
    return float(sum(p.max() if p.size else 0.0 for p in points) / 11)


def _nanmean(values: list[float]) -> float:
    real = [v for v in values if not math.isnan(v)]
    return float(np.mean(real)) if real else math.nan


def _coco_mean(p: np.ndarray) -> float:
    real = p[p > -1]
    return float(real.mean()) if real.size else math.nan


def _numpy(a: Any) -> np.ndarray:
    return a.asnumpy() if hasattr(a, "asnumpy") else np.asarray(a)
