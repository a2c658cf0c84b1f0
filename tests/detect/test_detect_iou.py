"""Edges of the detection metrics: iou_matrix against exact rational arithmetic, ties, class-id
refusals and their message, empty evaluations, COCO details (maxDets 100, IoU .75, degenerate
boxes) and the PR plot's layout. References are hand computations and pycocotools' own rules."""
import math
import re
import warnings
from fractions import Fraction

import numpy as np
import pytest

from gluontl.detect.metrics import DetectionEval, iou_matrix, plot_pr, pr_figure, table
from gluontl.errors import DataError
from tests.detect.test_detect_metrics import _boxes, _single


def _exact_iou(a, b):
    """IoU in exact rationals of the float values given (no +1, empty intersection 0)."""
    a, b = [Fraction(float(v)) for v in a], [Fraction(float(v)) for v in b]
    w = max(min(a[2], b[2]) - max(a[0], b[0]), 0)
    h = max(min(a[3], b[3]) - max(a[1], b[1]), 0)
    inter = w * h
    union = max(a[2] - a[0], 0) * max(a[3] - a[1], 0) + max(b[2] - b[0], 0) * max(b[3] - b[1], 0) - inter
    return inter / union if union > 0 else Fraction(0)


@pytest.mark.parametrize("a, b, iou", [
    ([0, 0, 10, 10], [10.5, 0, 20, 10], 0),           # disjoint by half a pixel
    ([0, 0, 10, 10], [10, 0, 20, 10], 0),             # touching edges
    ([0, 0, 10, 10], [5, 0, 15, 10], Fraction(1, 3)),  # 50 / 150
    ([0, 0, 0.5, 0.5], [0, 0, 0.5, 0.25], Fraction(1, 2)),  # sub-pixel boxes: .125 / .25
    ([0, 0, 0.5, 0.5], [0.25, 0.25, 0.75, 0.75], Fraction(1, 7)),  # union .4375 < 1
    ([5, 5, 5, 5], [5, 5, 5, 5], 0),                  # zero area: union 0 -> 0, not nan
    ([10, 0, 0, 10], [0, 0, 10, 10], 0),              # inverted
])
def test_iou_of_hand_computed_pairs(a, b, iou):
    got = iou_matrix(np.array([a], np.float32), np.array([b], np.float32))
    assert got.dtype == np.float64 and got.shape == (1, 1)
    assert got[0, 0] == float(iou) == float(_exact_iou(a, b))


def test_iou_is_float64_on_float32_boxes():
    """Float32 boxes with unround coordinates: computed in float64 the error is ~1e-16; a float32
    area would be off by ~1e-7."""
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 50, (6, 2)).astype(np.float32)
    a = np.c_[a, a + rng.uniform(1, 40, (6, 2)).astype(np.float32)]
    b = (a + rng.normal(0, 4, a.shape)).astype(np.float32)
    got = iou_matrix(a, b)
    assert got.dtype == np.float64
    ref = np.array([[float(_exact_iou(x, y)) for y in b] for x in a])
    assert (ref > 0).sum() >= 6
    np.testing.assert_allclose(got, ref, rtol=1e-14, atol=1e-15)
    for one, other in [(a.astype(np.float64), b), (a, b.astype(np.float64))]:
        np.testing.assert_array_equal(iou_matrix(one, other), got)


def test_iou_of_diverging_boxes_raises_no_floating_point_error():
    """A diverging net's inf/huge boxes give IoU 0 or nan quietly, under np.errstate(all="raise")."""
    a = np.array([[-np.inf, -np.inf, np.inf, np.inf], [0, 0, 1e200, 1e200], [0, 0, 0, 0]])
    with np.errstate(all="raise"):
        got = iou_matrix(a, a)
    assert got[2, 2] == 0.0 and got.dtype == np.float64


def test_a_tie_keeps_the_order_of_arrival_within_an_image():
    """20 objects; 40 detections of equal score in one image, the 20 hits first: AP 1. numpy's
    default (introsort) reorders 40 equal keys, which would interleave misses."""
    gt = _boxes(*[[i * 20, 0, i * 20 + 10, 10, 0, 0] for i in range(20)])
    det = _boxes(*[[0, 0.5, i * 20, 0, i * 20 + 10, 10] for i in range(20)],
                 *[[0, 0.5, i * 20, 500, i * 20 + 10, 510] for i in range(20)])
    assert _single(det, gt).voc()["map50"] == 1.0
    # misses first: precision k/(20+k) rises with recall, the interpolated precision is 20/40 throughout
    assert _single(np.r_[det[20:], det[:20]], gt).voc()["map50"] == 0.5


def test_a_tie_across_images_keeps_the_order_of_arrival():
    """10 images of one hit then one miss, all scores equal: the global ranking must keep
    arrival order (T F T F ...): precision k/(2k-1) at recall k/10, AP = mean of those."""
    ev = DetectionEval(["a"])
    for _ in range(10):
        ev.update(_boxes([0, 0.5, 0, 0, 10, 10], [0, 0.5, 50, 50, 60, 60]), _boxes([0, 0, 10, 10, 0, 0]))
    assert ev.voc()["map50"] == pytest.approx(sum(k / (2 * k - 1) for k in range(1, 11)) / 10, abs=1e-15)


def test_class_id_equal_to_the_number_of_classes_is_refused():
    with pytest.raises(DataError, match="^A detection row has class id 2, but there are 2 class names"):
        DetectionEval(["a", "b"]).update(_boxes([2, 0.9, 0, 0, 10, 10]), _boxes([0, 0, 10, 10, 0, 0]))
    with pytest.raises(DataError, match="^A ground-truth row has class id 2, but there are 2 class names"):
        DetectionEval(["a", "b"]).update(_boxes([1, 0.9, 0, 0, 10, 10]), _boxes([0, 0, 10, 10, 2, 0]))


@pytest.mark.parametrize("n, listed", [
    (5, "(c0, c1, c2, c3, c4)"),
    (6, "(c0, c1, c2, c3, c4, ...)"),
    (7, "(c0, c1, c2, c3, c4, ...)"),
])
def test_the_refusal_lists_at_most_five_class_names(n, listed):
    with pytest.raises(DataError) as e:
        DetectionEval([f"c{i}" for i in range(n)]).update(_boxes([9, 0.9, 0, 0, 10, 10]), _boxes())
    assert str(e.value) == (f"A detection row has class id 9, but there are {n} class names {listed}. The model's "
                            f"classes and the class list must be the same.")


@pytest.mark.parametrize("det, gt", [
    (np.zeros((1, 6)), np.zeros((1, 5))),
    (np.zeros((2, 1, 6)), np.zeros((1, 6))),
])
def test_arrays_of_the_wrong_shape_are_refused_with_their_shapes(det, gt):
    with pytest.raises(DataError, match=re.escape(f"got {det.shape} and {gt.shape}.")):
        DetectionEval(["a"]).update(det, gt)


def test_padding_is_decided_by_the_class_column_only():
    """A detection with a negative score is real; a ground-truth row with class -1 is padding
    whatever its difficult flag."""
    det = _boxes([0, -0.5, 0, 0, 10, 10])
    gt = _boxes([0, 0, 10, 10, 0, 0], [0, 0, 0, 0, -1, 0])
    voc = _single(det, gt).voc()
    assert voc["map50"] == 1.0 and voc["n_gt"] == {"a": 1}


def test_a_class_without_objects_before_one_with_objects():
    ev = _single(_boxes([1, 0.9, 0, 0, 10, 10]), _boxes([0, 0, 10, 10, 1, 0]), ["none", "b"])
    voc = ev.voc()
    assert math.isnan(voc["per_class"]["none"]) and voc["per_class"]["b"] == 1.0 and voc["map50"] == 1.0
    assert voc["method"] == "area" and list(voc["pr"]) == ["b"]


def test_an_empty_evaluation_is_nan_without_warnings():
    ev = DetectionEval(["a", "b"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        voc, coco = ev.voc(), ev.coco()
    assert math.isnan(voc["map50"]) and all(math.isnan(v) for v in voc["per_class"].values())
    assert voc["n_gt"] == {"a": 0, "b": 0} and voc["pr"] == {}
    assert math.isnan(coco["map"]) and math.isnan(coco["map50"]) and math.isnan(coco["map75"])


def test_detections_without_any_object_are_nan_without_warnings():
    ev = _single(_boxes([0, 0.9, 0, 0, 10, 10]), _boxes(), ["a", "b"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        voc, coco = ev.voc(), ev.coco()
    assert math.isnan(voc["map50"]) and math.isnan(coco["map"]) and math.isnan(coco["per_class"]["a"])


def test_coco_keeps_100_detections_per_image_not_10():
    """12 objects in one image, all found: recall 1 with 100 detections (AP 1); with 10 it would
    be 10/12."""
    gt = _boxes(*[[i * 20, 0, i * 20 + 10, 10, 0, 0] for i in range(12)])
    det = _boxes(*[[0, 0.9 - i / 100, i * 20, 0, i * 20 + 10, 10] for i in range(12)])
    assert _single(det, gt).coco()["map"] == pytest.approx(1.0, abs=1e-12)


def test_coco_map75_is_the_075_threshold():
    """IoU .77: a hit at .50-.75 (6 of 10 thresholds), a miss at .80."""
    coco = _single(_boxes([0, 0.9, 0, 0, 100, 77]), _boxes([0, 0, 100, 100, 0, 0])).coco()
    assert coco["map75"] == pytest.approx(1.0, abs=1e-12) and coco["map"] == pytest.approx(0.6, abs=1e-12)


def test_coco_counts_objects_at_negative_coordinates_and_thin_boxes():
    """pycocotools drops ground truth whose area is outside [0, 1e10] and keeps the detection's
    width/height as given: a box at negative coordinates and boxes half a pixel thin, each found
    exactly, give AP 1 at every threshold."""
    gt = _boxes([-100, -100, -50, -50, 0, 0], [0, 0, 0.5, 100, 1, 0], [200, 200, 300, 200.5, 2, 0])
    det = _boxes([0, 0.9, -100, -100, -50, -50], [1, 0.9, 0, 0, 0.5, 100], [2, 0.9, 200, 200, 300, 200.5])
    coco = _single(det, gt, ["a", "b", "c"]).coco()
    assert coco["per_class"] == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0}, abs=1e-12)


def test_coco_takes_a_zero_height_object():
    """A degenerate object (area 0) is a ground truth nothing can match: AP 0, no crash."""
    coco = _single(_boxes([0, 0.9, 0, 0, 10, 10]), _boxes([0, 5, 10, 5, 0, 0])).coco()
    assert coco["map"] == 0.0


def test_table_without_coco_has_no_coco_column():
    ev = _single(_boxes([0, 0.9, 0, 0, 10, 10]), _boxes([0, 0, 10, 10, 0, 0]))
    assert table(ev.voc()).splitlines() == ["class  objects     AP50", "a            1    1.000",
                                            "all          1    1.000"]


def test_pr_figure_layout_and_png_size(tmp_path):
    import matplotlib
    import matplotlib.pyplot as plt
    from matplotlib.font_manager import FontProperties
    from PIL import Image

    ev = _single(_boxes([0, 0.9, 0, 0, 10, 10]), _boxes([0, 0, 10, 10, 0, 0]))
    voc = ev.voc()
    fig = pr_figure(voc)
    ax = fig.axes[0]
    assert matplotlib.get_backend().lower() == "agg"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("recall", "precision")
    assert ax.get_xlim() == (0, 1.01) and ax.get_ylim() == (0, 1.02)
    assert ax.get_title() == "precision-recall at IoU 0.5 (area AP)"
    assert tuple(fig.get_size_inches()) == (7.5, 5)
    assert [line.get_linewidth() for line in ax.get_lines()] == [1.2]
    assert ax.xaxis.get_gridlines()[0].get_alpha() == 0.3 and ax.xaxis.get_gridlines()[0].get_visible()
    legend = ax.get_legend()
    assert legend._loc == 6  # "center left"
    assert tuple(legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted()).p0) == pytest.approx((1.01, 0.5))
    assert legend.get_texts()[0].get_fontsize() == FontProperties(size="small").get_size_in_points()
    plt.close(fig)
    path = plot_pr(voc, tmp_path / "pr.png")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == (675, 450)  # 7.5 x 5 in at 90 dpi
