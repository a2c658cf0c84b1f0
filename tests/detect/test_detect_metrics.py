"""VOC and COCO detection metrics against GluonCV's VOC metrics (an independent numpy
implementation), pycocotools' own matching, and APs computed by hand.

(Named test_detect_metrics: tests/tasks/test_metrics.py holds the basename test_metrics and the
test folders are not packages.)
"""
import math
import sys

import mxnet as mx
import numpy as np
import pytest
from gluoncv.utils.metrics.voc_detection import VOC07MApMetric, VOCMApMetric

from gluontl.detect.metrics import DetectionEval
from gluontl.errors import DataError, GluontlError

NAMES = ["cat", "dog", "bird", "car", "boat", "tree"]


def _random_split(seed, n_images=80, difficult_rate=0.15, separated=False):
    """Ground truth and noisy detections (jittered ground truth, wrong classes, random boxes).
    ``separated``: ground-truth boxes of one image never overlap, so no detection reaches
    IoU 0.5 with two of them."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(n_images):
        n = int(rng.integers(0, 7))
        if separated:  # one box per cell of a 3x3 grid of 100-px cells
            cells = rng.choice(9, size=n, replace=False)
            xy = np.c_[cells % 3, cells // 3] * 100 + rng.uniform(0, 30, (n, 2))
            wh = rng.uniform(20, 70, (n, 2))
        else:
            xy, wh = rng.uniform(0, 250, (n, 2)), rng.uniform(8, 90, (n, 2))
        gt = np.c_[xy, xy + wh, rng.integers(0, len(NAMES), n), rng.random(n) < difficult_rate].astype(np.float32)
        k = int(rng.integers(0, 12))
        src = rng.integers(0, max(n, 1), k)
        boxes = gt[src, :4] + rng.normal(0, 7, (k, 4)) if n else rng.uniform(0, 250, (k, 4))
        junk = rng.random(k) < 0.2
        boxes[junk, :2] = rng.uniform(0, 250, (junk.sum(), 2))
        boxes[junk, 2:] = boxes[junk, :2] + rng.uniform(5, 120, (junk.sum(), 2))
        boxes[:, 2:] = np.maximum(boxes[:, 2:], boxes[:, :2] + 2)
        cls = np.where(rng.random(k) < 0.85, gt[src, 4] if n else 0, rng.integers(0, len(NAMES), k))
        images.append((np.c_[cls, rng.random(k), boxes].astype(np.float32), gt))
    return images


def _ours(images, **kw):
    ev = DetectionEval(NAMES)
    for det, gt in images:
        ev.update(det, gt)
    return ev


def _gluoncv(metric, images):
    """GluonCV's VOC metric adds 1 to xmax/ymax (inclusive integer pixels); our boxes are
    continuous, so it gets xmax-1/ymax-1 and sees the same IoU."""
    m = metric(class_names=NAMES)
    for det, gt in images:
        m.update(det[None, :, 2:] - [0, 0, 1, 1], det[None, :, 0], det[None, :, 1],
                 gt[None, :, :4] - [0, 0, 1, 1], gt[None, :, 4], gt[None, :, 5])
    names, values = m.get()
    return dict(zip(names, values))


def _assert_same(ours, ref):
    for name in NAMES:
        a, b = ours["per_class"][name], ref[name]
        assert (math.isnan(a) and math.isnan(b)) or abs(a - b) < 1e-12, (name, a, b)
    assert abs(ours["map50"] - ref["mAP"]) < 1e-12


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_voc_area_equals_gluoncv(seed):
    images = _random_split(seed)
    ours = _ours(images).voc()
    assert 0.05 < ours["map50"] < 0.95  # a discriminating case, not all-or-nothing
    _assert_same(ours, _gluoncv(VOCMApMetric, images))


def test_voc07_equals_gluoncv_where_its_thresholds_are_exact():
    """GluonCV's 11 points come from np.arange(0, 1.1, 0.1): 0.3, 0.6 and 0.7 are a hair high,
    which matters only when a recall is exactly 3/10, 6/10 or 7/10, i.e. a class's ground-truth
    count is a multiple of 5. Seed 3's counts avoid that (checked), so both must agree exactly."""
    images = _random_split(3)
    ours = _ours(images).voc(eleven_point=True)
    assert all(n % 5 for n in ours["n_gt"].values()), ours["n_gt"]
    assert ours["method"] == "11-point"
    _assert_same(ours, _gluoncv(VOC07MApMetric, images))


def _boxes(*rows):
    return np.array(rows, np.float32).reshape(-1, 6)


def _single(det, gt, names=("a",)):
    """An evaluation of one image."""
    ev = DetectionEval(names)
    ev.update(det, gt)
    return ev


def test_voc07_samples_recall_exactly_at_tenths():
    """10 objects, 3 found first with precision 1, then only false positives: recall 0.3 is
    reached, so points 0, .1, .2, .3 see precision 1: AP = 4/11 (GluonCV's 0.30000000000000004
    misses the fourth point: 3/11)."""
    gt = _boxes(*[[i * 20, 0, i * 20 + 10, 10, 0, 0] for i in range(10)])
    det = _boxes(*[[0, 0.9 - i / 100, i * 20, 0, i * 20 + 10, 10] for i in range(3)],
                 *[[0, 0.5 - i / 100, 500, 500, 510, 510] for i in range(5)])
    ev = _single(det, gt)
    assert ev.voc(eleven_point=True)["map50"] == pytest.approx(4 / 11, abs=1e-15)
    m = VOC07MApMetric(class_names=["a"])
    m.update(det[None, :, 2:] - [0, 0, 1, 1], det[None, :, 0], det[None, :, 1],
             gt[None, :, :4] - [0, 0, 1, 1], gt[None, :, 4])
    assert m.get()[1][0] == pytest.approx(3 / 11, abs=1e-15)


@pytest.mark.parametrize("second", [[50, 50, 60, 60], [0.5, 0.5, 10.5, 10.5]], ids=["miss", "duplicate"])
def test_hand_computed_two_boxes_with_a_false_positive_between(second):
    """2 objects; ranked: hit A (P=1, R=.5), a miss or a second hit on A, which is a false
    positive too (P=1/2, R=.5), hit B (P=2/3, R=1). Area: .5 * 1 + .5 * 2/3 = 5/6.
    11-point: recall points 0-.5 see 1, .6-1 see 2/3: (6 + 5*2/3)/11."""
    ev = _single(_boxes([0, 0.9, 0, 0, 10, 10], [0, 0.8, *second], [0, 0.7, 20, 20, 30, 30]),
                 _boxes([0, 0, 10, 10, 0, 0], [20, 20, 30, 30, 0, 0]))
    area = ev.voc()
    assert area["map50"] == pytest.approx(5 / 6, abs=1e-15)
    precision, recall = area["pr"]["a"]
    np.testing.assert_allclose(precision, [1, 1 / 2, 2 / 3], rtol=0, atol=1e-15)
    np.testing.assert_allclose(recall, [0.5, 0.5, 1], rtol=0, atol=1e-15)
    assert ev.voc(eleven_point=True)["map50"] == pytest.approx((6 + 5 * 2 / 3) / 11, abs=1e-15)


@pytest.mark.parametrize("height, ap", [(49, 0.0), (50, 1.0), (51, 1.0)])
def test_iou_threshold_is_inclusive_at_one_half(height, ap):
    """Box (0,0,100,100) vs (0,0,100,h): IoU = h/100 exactly: 0.49 misses, 0.50 and 0.51 hit;
    COCO's mAP@0.5 agrees (its thresholds are inclusive too)."""
    ev = _single(_boxes([0, 0.9, 0, 0, 100, height]), _boxes([0, 0, 100, 100, 0, 0]))
    assert ev.voc()["map50"] == ap
    assert ev.coco()["map50"] == pytest.approx(ap, abs=1e-12)


@pytest.mark.parametrize("order, ap", [("TTFF", 1.0), ("TFFT", 0.75), ("FTFT", 0.5), ("FFTT", 0.5)])
def test_ranking_decides_ap(order, ap):
    """2 objects, 2 hits and 2 misses, scores in the given order. E.g. TFFT: P = 1, 1/2, 1/3, 1/2
    at R = .5, .5, .5, 1: .5 * 1 + .5 * 1/2 = .75; FFTT: P = 0, 0, 1/3, 1/2, envelope 1/2: .5."""
    gt = _boxes([0, 0, 10, 10, 0, 0], [20, 20, 30, 30, 0, 0])
    hits, misses = iter([[0, 0, 10, 10], [20, 20, 30, 30]]), iter([[50, 50, 60, 60], [70, 70, 80, 80]])
    det = _boxes(*[[0, 1 - i / 10, *next(hits if c == "T" else misses)] for i, c in enumerate(order)])
    ev = _single(det[np.random.default_rng(0).permutation(4)], gt)  # the rows' order does not matter, the scores do
    assert ev.voc()["map50"] == pytest.approx(ap, abs=1e-15)


def test_ground_truth_as_detections_scores_one_everywhere():
    images = _random_split(4, difficult_rate=0.2)
    rng = np.random.default_rng(4)
    perfect = [(np.c_[gt[:, 4], rng.random(len(gt)), gt[:, :4]].astype(np.float32), gt) for _, gt in images]
    ev = _ours(perfect)
    voc = ev.voc()
    assert voc["map50"] == 1.0 and ev.voc(eleven_point=True)["map50"] == 1.0
    assert all(ap == 1.0 for ap in voc["per_class"].values())
    coco = ev.coco()
    assert coco["map"] == coco["map50"] == coco["map75"] == pytest.approx(1.0, abs=1e-12)


def test_shifting_the_boxes_drops_ap_as_iou_predicts():
    """Ground truth 100x100 boxes; detections shifted right by s px: IoU = (100-s)/(100+s).
    s=33 gives 67/133 = .504 (hit), s=34 gives 66/134 = .493 (miss)."""
    gt = _boxes(*[[i * 300, 0, i * 300 + 100, 100, 0, 0] for i in range(4)])
    for shift, ap in ((33, 1.0), (34, 0.0)):
        det = _boxes(*[[0, 0.9 - i / 10, i * 300 + shift, 0, i * 300 + 100 + shift, 100] for i in range(4)])
        assert _single(det, gt).voc()["map50"] == ap
    # half of them shifted out of reach, the best-scored ones: P = 0, 0, 1/3, 1/2 at R = 0, 0, .25, .5 -> .5 * .5
    det = _boxes(*[[0, 0.9 - i / 10, i * 300 + (34 if i < 2 else 0), 0, i * 300 + 100 + (34 if i < 2 else 0), 100]
                   for i in range(4)])
    ev = _single(det, gt)
    assert ev.voc()["map50"] == pytest.approx(0.25, abs=1e-15)


@pytest.mark.parametrize("found", [True, False], ids=["detected", "missed"])
def test_difficult_objects_count_neither_way(found):
    """Difficult object A, normal object B. A's detection ranked first would make AP 1/2 as a
    false positive; missing A would make recall 1/2 if A counted. Ignored, AP is 1 either way,
    in VOC and in COCO (where A is iscrowd)."""
    gt = _boxes([0, 0, 10, 10, 0, 1], [20, 20, 30, 30, 0, 0])
    det = _boxes(*[[0, 0.9, 0, 0, 10, 10]] * found, [0, 0.8, 20, 20, 30, 30])
    ev = _single(det, gt)
    result = ev.voc()
    assert result["map50"] == 1.0 and result["n_gt"] == {"a": 1}
    np.testing.assert_array_equal(result["pr"]["a"][0], [1.0])
    assert ev.coco()["map"] == pytest.approx(1.0, abs=1e-12)


def test_a_class_without_ground_truth_is_nan_and_left_out_of_the_mean():
    gt = _boxes([0, 0, 10, 10, 0, 0], [20, 20, 30, 30, 1, 0])
    det = _boxes([0, 0.9, 0, 0, 10, 10], [2, 0.8, 50, 50, 60, 60], [1, 0.7, 70, 70, 80, 80])
    ev = _single(det, gt, ["a", "b", "c"])
    voc, coco = ev.voc(), ev.coco()
    assert voc["per_class"]["a"] == 1.0 and voc["per_class"]["b"] == 0.0 and math.isnan(voc["per_class"]["c"])
    assert voc["map50"] == 0.5 and "c" not in voc["pr"]
    assert math.isnan(coco["per_class"]["c"]) and coco["map50"] == pytest.approx(0.5, abs=1e-12)


def test_no_detections_at_all():
    ev = _single(np.full((5, 6), -1, np.float32), _boxes([0, 0, 10, 10, 0, 0]), ["a", "b"])
    assert ev.voc()["map50"] == 0.0
    coco = ev.coco()
    assert coco["map"] == 0.0 and math.isnan(coco["per_class"]["b"])


def test_batches_with_padding_equal_images_one_by_one():
    images = _random_split(5, n_images=12)
    k = max(len(d) for d, _ in images) + 2
    m = max(len(g) for _, g in images) + 1
    dets = np.full((len(images), k, 6), -1, np.float32)
    gts = np.full((len(images), m, 6), -1, np.float32)
    for i, (d, g) in enumerate(images):
        dets[i, :len(d)], gts[i, :len(g)] = d, g
    batched = DetectionEval(NAMES)
    batched.update(dets[:5], gts[:5])
    batched.update(dets[5:], gts[5:])
    assert len(batched) == len(images)
    one_by_one = _ours(images)
    np.testing.assert_equal(batched.voc(), one_by_one.voc())  # nan == nan here
    np.testing.assert_equal(batched.coco(), one_by_one.coco())
    as_ndarrays = DetectionEval(NAMES)
    as_ndarrays.update(mx.nd.array(dets), mx.nd.array(gts))  # what a detector returns
    np.testing.assert_equal(as_ndarrays.voc(), one_by_one.voc())


def test_coco_hand_case_iou_072():
    """IoU .72 is a hit at thresholds .50-.70 (5 of 10) and a miss above: mAP .5, mAP50 1, mAP75 0."""
    ev = _single(_boxes([0, 0.9, 0, 0, 100, 72]), _boxes([0, 0, 100, 100, 0, 0]))
    coco = ev.coco()
    assert coco["map"] == pytest.approx(0.5, abs=1e-12)
    assert coco["map50"] == pytest.approx(1.0, abs=1e-12) and coco["map75"] == 0.0


def test_coco_and_voc_agree_when_the_interpolated_precision_is_flat():
    """3 objects, a miss ranked first then the 3 hits: P = 0, 1/2, 2/3, 3/4; the interpolated
    precision is 3/4 at every recall, so 101-point sampling and the area give the same 0.75."""
    gt = _boxes(*[[i * 20, 0, i * 20 + 10, 10, 0, 0] for i in range(3)])
    det = _boxes([0, 0.9, 500, 500, 510, 510], *[[0, 0.8 - i / 10, i * 20, 0, i * 20 + 10, 10] for i in range(3)])
    ev = _single(det, gt)
    assert ev.voc()["map50"] == pytest.approx(0.75, abs=1e-15)
    assert ev.coco()["map50"] == pytest.approx(0.75, abs=1e-12)


@pytest.mark.parametrize("seed", [6, 7])
def test_coco_map50_within_one_hundredth_of_voc_area(seed):
    """With disjoint ground-truth boxes each detection has at most one ground truth at IoU >= .5,
    so COCO's matching (best free ground truth) and VOC's (best ground truth, else a miss) give
    the same hits, and the per-class APs integrate the same non-increasing interpolated precision
    f: VOC by its area I, COCO as S/101 with S = f(0) + f(.01) + ... + f(1). Riemann sums of a
    non-increasing f give (S - f(0))/100 <= I <= (S - f(1))/100, so S/101 - I lies between
    -(S - 101 f(1))/10100 and (101 f(0) - S)/10100, both within [-.01, .01] as 0 <= f <= 1.
    Per class |COCO - VOC| <= .01, hence for the means too."""
    images = _random_split(seed, n_images=120, difficult_rate=0.0, separated=True)
    ev = _ours(images)
    voc, coco = ev.voc(), ev.coco()
    assert 0.2 < voc["map50"] < 0.9
    assert abs(coco["map50"] - voc["map50"]) <= 0.01 + 1e-12
    assert coco["map50"] != voc["map50"]  # they do differ: the bound is not vacuous equality
    assert coco["map"] < coco["map50"]


def test_an_inverted_box_is_a_false_positive_in_both_metrics():
    """(10, 0, 0, 10), inverted in x, ranked before a hit: P = 0, 1/2 at R = 0, 1, AP 1/2. Given
    w = -10, pycocotools would compute a negative area, put the box outside every area range and
    ignore it (AP 1)."""
    ev = _single(_boxes([0, 0.9, 10, 0, 0, 10], [0, 0.8, 0, 0, 10, 10]), _boxes([0, 0, 10, 10, 0, 0]))
    assert ev.voc()["map50"] == 0.5 and ev.coco()["map50"] == pytest.approx(0.5, abs=1e-12)


def test_coco_prints_nothing(capsys):
    _ours(_random_split(8, n_images=5)).coco()
    assert capsys.readouterr().out == ""


def test_without_pycocotools_coco_asks_for_a_reinstall(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycocotools", None)
    monkeypatch.setitem(sys.modules, "pycocotools.coco", None)
    ev = _single(_boxes([0, 0.9, 0, 0, 10, 10]), _boxes([0, 0, 10, 10, 0, 0]))
    with pytest.raises(GluontlError, match=r"pip install -e \."):
        ev.coco()


@pytest.mark.parametrize("det, gt, match", [
    (np.zeros((2, 5)), np.zeros((1, 6)), r"\(K, 6\)"),
    (_boxes([3, 0.9, 0, 0, 10, 10]), _boxes([0, 0, 10, 10, 0, 0]), "class id 3, but there are 2 class names"),
    (_boxes([0, 0.9, 0, 0, 10, 10]), _boxes([0, 0, 10, 10, 0.5, 0]), "class id 0.5"),
])
def test_bad_arrays_are_refused(det, gt, match):
    with pytest.raises(DataError, match=match):
        DetectionEval(["a", "b"]).update(det, gt)


def test_pr_plot_draws_the_metric_arrays_into_a_png(tmp_path):
    import matplotlib.pyplot as plt
    from PIL import Image

    from gluontl.detect.metrics import plot_pr, pr_figure

    voc = _ours(_random_split(9, n_images=30)).voc()
    fig = pr_figure(voc)
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == [f"{n} {voc['per_class'][n]:.3f}" for n in voc["pr"]]
    for line, (precision, recall) in zip(lines, voc["pr"].values()):
        np.testing.assert_array_equal(line.get_xdata(), recall)
        np.testing.assert_array_equal(line.get_ydata(), precision)
    assert fig.axes[0].get_legend().get_title().get_text() == f"mAP@0.5 {voc['map50']:.3f}"
    plt.close(fig)
    path = plot_pr(voc, tmp_path / "pr.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] > 300
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pr.png"]  # no temp file left


def test_table_lists_objects_and_aps_per_class_with_a_dash_for_no_objects():
    gt = _boxes([0, 0, 10, 10, 0, 0], [20, 20, 30, 30, 1, 0], [40, 40, 50, 50, 1, 1])
    det = _boxes([0, 0.9, 0, 0, 10, 7.2], [1, 0.8, 50, 50, 60, 60])
    ev = _single(det, gt, ["a", "bb", "c"])
    from gluontl.detect.metrics import table

    assert table(ev.voc(), ev.coco()).splitlines() == [
        "class  objects     AP50  AP50:95",
        "a            1    1.000    0.500",
        "bb           1    0.000    0.000",
        "c            0        -        -",
        "all          2    0.500    0.250"]
    assert table(ev.voc()).splitlines()[-1] == "all          2    0.500"
