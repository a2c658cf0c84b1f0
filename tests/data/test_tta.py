"""Test-time augmentation: each view against a hand computation (numpy slicing, OpenCV's own resize),
a classifier's --tta against hand-averaged softmax, its baked flip against onnxruntime on the
unbaked file, and bad --tta values (exit 2)."""
from __future__ import annotations

import cv2
import mxnet as mx
import numpy as np
import onnx
import pytest
import yaml

from gluontl.data.tta import CROP, average, views
from gluontl.errors import DataError
from tests import helpers


def _x(n=2, c=3, h=16, w=20):
    return np.random.default_rng(0).normal(0, 1, (n, c, h, w)).astype(np.float32)


def _cv(im: np.ndarray, h: int, w: int) -> np.ndarray:
    return cv2.resize(im.transpose(1, 2, 0).copy(), (w, h), interpolation=cv2.INTER_LINEAR).transpose(2, 0, 1)


def test_flip_is_the_mirror_image_and_the_identity():
    x = _x()
    a, b = (v(x) for v in views("flip"))
    np.testing.assert_array_equal(a, x)
    np.testing.assert_array_equal(b, x[:, :, :, ::-1])


def test_five_and_ten_crop_are_the_corner_and_centre_crops_resized_back():
    x = _x()
    ch, cw = round(16 * CROP), round(20 * CROP)  # 14 x 18
    boxes = [(0, 0), (0, 20 - cw), (16 - ch, 0), (16 - ch, 20 - cw), (1, 1)]
    five, ten = views("five_crop"), views("ten_crop")
    assert len(five) == 5 and len(ten) == 10
    for k, (y0, x0) in enumerate(boxes):
        want = np.stack([_cv(im[:, y0:y0 + ch, x0:x0 + cw], 16, 20) for im in x])
        np.testing.assert_array_equal(five[k](x), want)
        np.testing.assert_array_equal(ten[k](x), want)
        np.testing.assert_array_equal(ten[5 + k](x), want[..., ::-1])


def test_scales_zoom_about_the_centre():
    x = _x(h=16, w=16)
    up, one, down = views("scales=2,1,0.5")
    np.testing.assert_array_equal(up(x), np.stack([_cv(im[:, 4:12, 4:12], 16, 16) for im in x]))
    np.testing.assert_array_equal(one(x), x)
    want = np.zeros_like(x)
    want[:, :, 4:12, 4:12] = np.stack([_cv(im, 8, 8) for im in x])
    np.testing.assert_array_equal(down(x), want)


@pytest.mark.parametrize("bad", ["mirror", "scales=", "scales=a,b", "scales=0"])
def test_a_bad_tta_value_names_itself(bad):
    with pytest.raises(DataError, match="--tta"):
        views(bad)


def test_average_is_the_mean_of_the_views():
    x = _x()
    got = average(lambda v: v.astype(np.float64).sum(axis=(1, 2, 3))[:, None], x, "ten_crop")
    want = np.mean([v(x).astype(np.float64).sum(axis=(1, 2, 3)) for v in views("ten_crop")], axis=0)
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-12)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from gluontl.recipe import parse_recipe
    from gluontl.train.loop import finetune

    root = tmp_path_factory.mktemp("tta")
    recipe = helpers.tiny_recipe(helpers.tiny_symbol(root), epochs=1, lr=0.05, seed=0, export=["onnx"])
    recipe["data"]["val_transform"] = {"resize": 16, "normalize": "none"}
    return finetune(parse_recipe(recipe), runs_root=root / "runs", quiet=True).run_dir


def _softmax(net, x):
    with mx.autograd.predict_mode():
        return mx.nd.softmax(net(mx.nd.array(x))).asnumpy().astype(np.float64)


def test_classifier_evaluate_and_predict_tta_flip_average_the_softmax_of_both_views(run):
    from gluontl.data.datasets import load_split
    from gluontl.tasks.classification import balanced_accuracy
    from gluontl.train.runs import evaluate, load_run, predict

    recipe, net = load_run(run)
    ds = load_split(recipe.data, "val")
    x = np.stack([ds[i][0] for i in range(len(ds))])
    mean = (_softmax(net, x) + _softmax(net, x[..., ::-1])) / 2
    got = evaluate(run, tta="flip")
    labels = ds.labels
    assert got["val_top1"] == pytest.approx(np.mean(mean.argmax(1) == labels))
    assert got["val_loss"] == pytest.approx(np.mean(-np.log(mean[np.arange(len(labels)), labels])), rel=1e-5)
    conf = np.zeros((5, 5), np.int64)
    np.add.at(conf, (labels, mean.argmax(1)), 1)
    assert got["val_balanced_acc"] == pytest.approx(balanced_accuracy(conf))
    rows = predict(run, [ds.name(0), ds.name(1)], topk=5, tta="flip")
    for row, want in zip(rows, mean[:2]):
        got_p = dict(row["top"])
        helpers.assert_f32_close([got_p[n] for n in ds.class_names], want, scale=1.0, terms=50)


def test_export_tta_flip_bakes_the_average_for_a_classifier_and_bad_values_exit_2(run, tmp_path, capsys):
    from gluontl.train.runs import export_run

    export_run(run, tmp_path / "plain")
    recipe = yaml.safe_load((run / "recipe.yaml").read_text())
    recipe["export"]["tta"] = "flip"
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    try:
        export_run(run, tmp_path / "flip")
    finally:
        recipe["export"]["tta"] = "none"
        (run / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    x = np.random.default_rng(3).random((2, 3, 16, 16)).astype(np.float32)
    plain = onnx.load(str(tmp_path / "plain" / "t.onnx")).SerializeToString()
    flip = onnx.load(str(tmp_path / "flip" / "t.onnx"))
    name = flip.graph.input[0].name

    def soft(z):
        e = np.exp(z - z.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    mirror = x[..., ::-1].copy()
    want = (soft(helpers.ort_run(plain, {name: x})[0]) + soft(helpers.ort_run(plain, {name: mirror})[0])) / 2
    got = np.exp(helpers.ort_run(flip.SerializeToString(), {name: x})[0])
    helpers.assert_f32_close(got, want, scale=1.0, terms=8)
    code, out, err = helpers.run_cli(capsys, "evaluate", str(run), "--tta", "mirror")
    helpers.assert_one_paragraph(code, out, err, ["--tta 'mirror'", "flip, five_crop, ten_crop"])
    code, out, err = helpers.run_cli(capsys, "predict", str(tmp_path / "flip" / "t.onnx"), str(run / "recipe.yaml"),
                                     "--tta", "scales=x")
    helpers.assert_one_paragraph(code, out, err, ["--tta 'scales=x'"])
