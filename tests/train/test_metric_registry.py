"""The metric registry: directions, labels, epoch lines and train.select read from it."""
import pytest

from gluontl.metrics import Metric, better, find_metric, register_metric, task_metrics, unregister_metric
from gluontl.recipe import parse_recipe, selectable
from gluontl.train.logs import epoch_line


def test_segmentation_epoch_lines_show_miou_and_pixel_accuracy():
    row = {"step": 40, "epoch": 2, "train_loss": 0.51234, "val_loss": 0.6, "val_miou": 0.53812,
           "val_pixel_acc": 0.91, "lr": 0.001, "seconds": 12.34}
    assert epoch_line(row, 7) == ("epoch 2/7 train_loss 0.5123 val_loss 0.6000 val_miou 0.5381 "
                                  "val_pixel_acc 0.9100 lr 0.001 time 12.3s")


def test_classification_lines_keep_val_acc_and_ema_twins():
    row = {"epoch": 1, "train_loss": 0.5, "train_acc": 0.8, "val_loss": 0.4, "val_top1": 0.83,
           "val_balanced_acc": 0.73, "ema_val_top1": 0.81, "lr": 0.000963}
    assert epoch_line(row, 8) == ("epoch 1/8 train_loss 0.5000 train_acc 0.8000 val_loss 0.4000 val_acc 0.8300 "
                                  "val_balanced_acc 0.7300 ema_val_acc 0.8100 lr 0.000963")


def test_directions_are_declared_not_guessed():
    assert find_metric("val_loss").direction == "min" and find_metric("ema_val_loss").direction == "min"
    assert find_metric("val_miou").direction == "max" and find_metric("ema_val_top1").label == "ema_val_acc"
    assert better({"val_loss": 0.3}, {"val_loss": 0.4}, "val_loss")
    assert not better({"val_map": 0.3}, {"val_map": 0.4}, "val_map")
    assert not better({"val_top1": 0.4}, {"val_top1": 0.4}, "val_top1")  # a tie keeps the earlier
    register_metric(Metric("val_error_rate", "min", task="classification"))  # a name the old rule misread
    try:
        assert better({"val_error_rate": 0.1}, {"val_error_rate": 0.2}, "val_error_rate")
        assert "val_error_rate" in selectable("classification") and "val_error_rate" not in selectable("detection")
    finally:
        unregister_metric("val_error_rate")
    assert [m.key for m in task_metrics("segmentation", selectable=True)] == ["val_loss", "val_miou", "val_pixel_acc"]


def test_a_select_of_another_task_is_refused_naming_the_choices():
    base = {"name": "x", "task": "segmentation", "model": {"source": "zoo:resnet18_v1"},
            "train": {"select": "val_map50"}}
    with pytest.raises(Exception) as e:
        parse_recipe(base)
    assert "val_map50 is not a segmentation metric (it is a detection metric)" in str(e.value) and "val_miou, val_pixel_acc, val_loss" in str(e.value)


def test_bad_metrics_are_refused():
    with pytest.raises(ValueError, match="direction"):
        Metric("val_x", "up")
    with pytest.raises(ValueError, match="ema_"):
        register_metric(Metric("ema_val_x", "max"))
    with pytest.raises(ValueError, match="val_"):
        register_metric(Metric("f1", "max", fn=lambda o, l: 0.0))


def test_plot_legends_are_the_registered_titles(tmp_path):
    """plot names no metric: a curve's legend is its metric's registered title, so retitling
    val_top1 changes the validation panel and nothing else of the figure."""
    import json

    import numpy as np
    from PIL import Image

    from gluontl import metrics
    from gluontl.train.runs import plot

    assert find_metric("val_top1").title == "val top-1" and find_metric("val_map50").title == "val mAP@0.5"
    rows = [{"step": s, "epoch_f": s / 2, "loss": 1.0 / s, "lr": 0.1} for s in range(1, 7)]
    rows += [{"step": 2 * e, "epoch": e, "val_loss": 1.2 / e, "val_top1": 0.5 + 0.1 * e} for e in (1, 2, 3)]
    pngs = {}
    saved = dict(metrics._REGISTRY)
    try:
        for name, title in (("built-in", None), ("retitled", "top-1 on the held-out images")):
            if title:
                register_metric(Metric("val_top1", "max", label="val_acc", task="classification", title=title))
            run = tmp_path / name / "run"  # same name: the figure title is the run's name
            run.mkdir(parents=True)
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            pngs[name] = np.asarray(Image.open(plot(run, tmp_path / f"{name}.png")).convert("RGB"), np.int16)
    finally:
        metrics._REGISTRY.clear()
        metrics._REGISTRY.update(saved)
    assert find_metric("val_top1").title == "val top-1"
    cols = np.flatnonzero(np.abs(pngs["built-in"] - pngs["retitled"]).sum(axis=(0, 2)))
    width = pngs["built-in"].shape[1]
    assert len(cols) > 0 and width / 3 < cols.min() and cols.max() < 2 * width / 3  # only the validation legend
