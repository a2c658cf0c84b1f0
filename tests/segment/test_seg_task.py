"""The segmentation task through the seam: its loss on a batch against numpy, the pitfalls
(crops that are not multiples of the stride, a changed class count, images whose pixels are all
ignored), and a tiny run through gluontl.finetune that is then evaluated, predicted from and
exported by the task's own methods (ONNX masks = MXNet masks)."""
from __future__ import annotations

import json

from tests import helpers
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd
from PIL import Image

import gluontl
from gluontl.recipe import parse_recipe
from gluontl.segment.formats import read_mask, write_mask
from gluontl.tasks import PredictOptions, get_task

HW = 32
CLASSES = ["background", "square", "bar"]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """images/ + masks/: a bright square (class 1) and a dark bar (class 2) on noise, ignored borders."""
    root = tmp_path_factory.mktemp("pairs")
    (root / "images").mkdir()
    (root / "masks").mkdir()
    rng = np.random.default_rng(0)
    for k in range(20):
        img = rng.integers(60, 160, (HW, HW, 3)).astype(np.uint8)
        mask = np.zeros((HW, HW), np.uint8)
        y, x = rng.integers(0, HW - 12, 2)
        img[y:y + 10, x:x + 10] = 250
        mask[y:y + 10, x:x + 10] = 1
        c = int(rng.integers(0, HW - 4))
        img[:, c:c + 3] = 5
        mask[:, c:c + 3] = 2
        mask[-1, :] = 255
        Image.fromarray(img).save(root / "images" / f"s{k:02d}.png")
        write_mask(root / "masks" / f"s{k:02d}.png", mask)
    return root


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return helpers.tiny_symbol(tmp_path_factory.mktemp("tiny"))


def _recipe(pairs, backbone, seg=None, **train):
    return parse_recipe({
        "name": "seg", "task": "segmentation",
        "model": {"source": f"symbol:{backbone}", "input_shape": [3, HW, HW]},
        "segmentation": {"head_channels": 8, "scale": [0.75, 1.25], **(seg or {})},
        "data": {"source": f"masks:{pairs}", "classes": CLASSES, "batch_size": 4, "val_fraction": 0.25},
        "train": {"epochs": 2, "optimizer": "adam", "lr": 0.01, "seed": 0, "log_every": 1, "guards": "off",
                  **train}}, origin="test")


def _log_softmax_ce(logits: np.ndarray, label: np.ndarray, ignore: int = 255) -> np.ndarray:
    """Per image: mean over labelled pixels of -log softmax, computed in float64."""
    z = logits.astype(np.float64)
    z = z - z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    out = []
    for lp, lab in zip(logp, label.astype(np.int64)):
        keep = lab != ignore
        picked = np.take_along_axis(lp, np.where(keep, lab, 0)[None], 0)[0]
        out.append(-picked[keep].sum() / max(keep.sum(), 1))
    return np.array(out)


@pytest.mark.parametrize("aux", [False, True])
def test_the_loss_of_a_one_image_batch_is_softmax_cross_entropy_over_labelled_pixels(pairs, backbone, aux):
    mx.random.seed(0)
    recipe = _recipe(pairs, backbone, {"aux": aux})
    task = get_task(recipe)
    prep, loaders = task.setup(recipe, mx.cpu(), seed=0)
    x, y = next(iter(loaders.val))
    x, y = x[:1], y[:1]
    assert 0 < (y.asnumpy() == 255).sum() < y.size  # the batch has ignored and labelled pixels
    with autograd.record():  # the same dropout mask in both forwards
        mx.random.seed(1)
        losses, correct = task.forward(prep.block, [x], [y])
        mx.random.seed(1)
        outs = prep.block(x)
    assert correct is None and losses[0].shape == (1,)
    outs = outs if aux else (outs,)
    want = _log_softmax_ce(outs[0].asnumpy(), y.asnumpy())
    if aux:
        want = want + 0.4 * _log_softmax_ce(outs[1].asnumpy(), y.asnumpy())
    helpers.assert_f32_close(losses[0].asnumpy(), want, terms=HW * HW * len(CLASSES))


def test_an_image_whose_pixels_are_all_ignored_gives_a_finite_loss_and_no_nan_gradient(pairs, backbone):
    mx.random.seed(0)
    recipe = _recipe(pairs, backbone, {"aux": True})
    task = get_task(recipe)
    prep, loaders = task.setup(recipe, mx.cpu(), seed=0)
    net = prep.block
    x, y = next(iter(loaders.val))
    y[0] = 255
    with autograd.record():
        losses, _ = task.forward(net, [x], [y])
        total = losses[0].sum()
    total.backward()
    got = losses[0].asnumpy()
    assert np.all(np.isfinite(got)) and got[0] == 0 and np.all(got[1:] > 0)
    grads = [p.grad().asnumpy() for p in net.collect_params().values() if p.grad_req != "null"]
    assert grads and all(np.all(np.isfinite(g)) for g in grads)
    with autograd.record():  # the image alone: no gradient at all
        alone, _ = task.forward(net, [x[:1]], [y[:1]])
    alone[0].backward()
    assert all(not np.any(p.grad().asnumpy()) for p in net.collect_params().values() if p.grad_req != "null")


def test_a_crop_that_is_no_multiple_of_the_stride_is_padded_and_lines_up_with_the_logits(pairs, backbone):
    recipe = _recipe(pairs, backbone, {"crop": 30, "stride": 8})
    task = get_task(recipe)
    prep, loaders = task.setup(recipe, mx.cpu(), seed=0)
    x, y = next(iter(loaders.train_epoch(0)))
    assert x.shape[2:] == (32, 32) and y.shape[1:] == (32, 32)
    assert np.all(y.asnumpy()[:, 30:, :] == 255) and np.all(y.asnumpy()[:, :, 30:] == 255)  # padding is ignored
    with autograd.record():
        losses, _ = task.forward(prep.block, [x], [y])
        logits = prep.block(x)
    assert logits.shape == (x.shape[0], len(CLASSES), 32, 32)
    assert np.all(np.isfinite(losses[0].asnumpy()))


@pytest.fixture(scope="module")
def run(pairs, backbone, tmp_path_factory):
    mx.random.seed(0)
    res = gluontl.finetune(_recipe(pairs, backbone, {"aux": True}), runs_root=tmp_path_factory.mktemp("runs"),
                           quiet=True, export=False)
    return res


def test_a_tiny_run_writes_a_segmentation_run_folder(run):
    card = json.loads((run.run_dir / "preprocess.json").read_text())
    assert card["task"] == "segmentation" and card["classes"] == CLASSES and card["ignore_label"] == 255
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in rows if "val_miou" in r]
    assert len(epochs) == 2 and all(0 <= r["val_miou"] <= 1 and np.isfinite(r["val_loss"]) for r in epochs)
    assert json.loads((run.run_dir / "split.json").read_text())["val_fraction"] == 0.25


def test_evaluate_run_reproduces_the_best_epochs_metrics_and_prints_the_iou_table(run):
    from gluontl.recipe import load_recipe

    recipe = load_recipe(run.run_dir / "recipe.yaml")
    task = get_task(recipe)
    net = task.load(run.run_dir, recipe, "best")
    report = task.evaluate_run(run.run_dir, recipe, net, "val", "best")
    rows = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
    best = max((r for r in rows if "val_miou" in r), key=lambda r: r["val_miou"])
    assert report.values["val_miou"] == pytest.approx(best["val_miou"], abs=1e-6)
    assert report.values["val_pixel_acc"] == pytest.approx(best["val_pixel_acc"], abs=1e-6)
    assert set(report.values["per_class_iou"]) == set(CLASSES) and report.values["images"] == 5
    assert report.lines[1].split() == ["class", "IoU", "pixels"] and len(report.lines) == 2 + len(CLASSES)


def test_predict_and_export_from_a_run_agree_with_onnxruntime(run, pairs, tmp_path):
    from gluontl.recipe import load_recipe

    recipe = load_recipe(run.run_dir / "recipe.yaml")
    task = get_task(recipe)
    net = task.load(run.run_dir, recipe, "best")
    images = [str(pairs / "images" / f"s{k:02d}.png") for k in range(3)]
    got = task.predict_run(run.run_dir, recipe, net, images, PredictOptions(out=tmp_path / "mx"))
    rows = got.values["rows"]
    assert [r["image"] for r in rows] == images
    for r in rows:
        mask = read_mask(r["mask"], len(CLASSES))
        assert mask.shape == (HW, HW)
        assert sum(r["fractions"].values()) == pytest.approx(1.0, abs=1e-5)
        assert np.asarray(Image.open(r["overlay"])).shape == (HW, HW, 3)
    # the mask is the arg-max of the network's logits on the val-transformed image
    x = np.asarray(Image.open(images[0]).convert("RGB"), np.float32) / 255
    x = ((x - (0.485, 0.456, 0.406)) / (0.229, 0.224, 0.225)).transpose(2, 0, 1)[None].astype(np.float32)
    with autograd.predict_mode():
        want = net(mx.nd.array(x)).asnumpy().argmax(1)[0]
    np.testing.assert_array_equal(read_mask(rows[0]["mask"], len(CLASSES)), want)

    files = task.export_run(run.run_dir, recipe, net, tmp_path / "export", ["onnx"], False, None, print)
    onnx_file = next(f for f in files if f.suffix == ".onnx")
    from gluontl.data.transforms import onnx_metadata

    assert onnx_metadata(onnx_file).get("gluontl.task") == "segmentation"
    ort = task.predict_onnx(onnx_file, images, PredictOptions(out=tmp_path / "ort"))
    for a, b in zip(rows, ort.values["rows"]):
        same = np.mean(read_mask(a["mask"], len(CLASSES)) == read_mask(b["mask"], len(CLASSES)))
        assert same >= 0.999, (a["image"], same)


def test_a_changed_class_count_restores_from_the_run_with_new_class_rows(run, pairs, backbone):
    recipe = parse_recipe({**_recipe(pairs, backbone, {"aux": True}).as_written(),
                           "data": {"source": f"masks:{pairs}", "batch_size": 4, "val_fraction": 0.25,
                                    "classes": ["background", "square", "bar", "extra"]},
                           "model": {"source": f"symbol:{backbone}", "input_shape": [3, HW, HW],
                                     "weights": str(run.run_dir), "restore": {"type": "segmentation",
                                                                             "reuse": {**{c: c for c in CLASSES},
                                                                                       "extra": "bar"}}}},
                          origin="test")
    task = get_task(recipe)
    prep, loaders = task.setup(recipe, mx.cpu(), seed=0)
    x, y = next(iter(loaders.train_epoch(0)))
    with autograd.train_mode():
        logits, aux = prep.block(x)
    assert logits.shape[1] == 4 and aux.shape[1] == 4
    old = task.load(run.run_dir, parse_recipe(_recipe(pairs, backbone, {"aux": True}).as_written(),
                                               origin="test"), "best")
    with autograd.predict_mode():
        before, after = old(x).asnumpy(), prep.block(x).asnumpy()
    helpers.assert_f32_close(after[:, :3], before, terms=64, depth=4)  # the old classes, restored
    helpers.assert_f32_close(after[:, 3], before[:, 2], terms=64, depth=4)  # extra starts as bar


def test_an_adapter_rule_on_a_segmenter_trains_the_factors_and_leaves_the_base_bit_identical(pairs, backbone, tmp_path):
    """The seam's one set-up path attaches adapters for every task (on a graph backbone, a symbol
    here, they go on the Gluon head: a graph inside a block is refused by name)."""
    from mxnet import autograd

    from gluontl.naming import named_params
    from gluontl.rules import trainable_params

    data = _recipe(pairs, backbone).model_dump(mode="json", exclude_none=True)
    data["rules"] = [{"match": "*", "grad_req": "null"},
                     {"match": "head.*", "type": ["Conv"], "adapter": {"rank": 2, "alpha": 4}}]
    recipe = parse_recipe(data, origin="test")
    task = get_task(recipe)
    prep, loaders = task.setup(recipe, mx.cpu(), seed=0)
    net, params = prep.block, named_params(prep.block)
    factors = sorted(n for n in params if ".lora_" in n)
    assert factors and sorted(trainable_params(net)) == factors  # the plan trains the factors only
    adapted = {n: params[n].param.data().asnumpy().copy() for n in params
               if n.startswith("head.") and n.endswith("weight") and ".lora_" not in n}
    b0 = {n: params[n].param.data().asnumpy().copy() for n in factors if "lora_b" in n}
    assert adapted and all(not v.any() for v in b0.values())  # B starts at zero
    trainer = mx.gluon.Trainer(trainable_params(net), "adam", {"learning_rate": 0.01})
    feed = task.feed(net, prep.plan, recipe, loaders, mx.cpu(), tmp_path, True, None)
    for i, (x, y) in zip(range(3), feed.train_batches(0, 0)):
        with autograd.record():
            losses, _ = task.forward(net, [x], [y])
        autograd.backward(losses)
        trainer.step(x.shape[0])
    assert [n for n, v in adapted.items() if not np.array_equal(params[n].param.data().asnumpy(), v)] == []
    assert all(params[n].param.data().asnumpy().any() for n in b0)  # the factors learned


def test_the_guards_count_a_segmenters_new_head_as_fresh(pairs, backbone):
    """Only the backbone came with the source: a head left frozen at its random init is flagged."""
    from gluontl.data.guards import weights_of

    recipe = _recipe(pairs, backbone)
    w = weights_of(recipe, get_task(recipe).prepare(recipe, apply=False))
    assert w.fresh and all(n.startswith(("head.", "aux.")) for n in w.fresh)
    assert w.loaded and all(n.startswith("backbone.") for n in w.loaded)


def test_an_int8_export_of_a_segmenter_quantizes_its_convolutions_and_is_judged_by_miou(run, tmp_path):
    """The network int8, the arg-max float; the report's mIoU of each file is the judge's own
    (SegmentationMetric over the masks onnxruntime gives, recomputed here)."""
    import onnx

    from gluontl.recipe import QuantizeSpec, load_recipe
    from gluontl.segment.data import load_segmentation_split
    from gluontl.segment.metrics import SegmentationMetric
    from gluontl.tasks.segmentation import seg_spec

    recipe = load_recipe(run.run_dir / "recipe.yaml")
    task = get_task(recipe)
    net = task.load(run.run_dir, recipe, "best")
    files = task.export_run(run.run_dir, recipe, net, tmp_path / "x", ["onnx"], False,
                            QuantizeSpec(calibration="val", max_drop=100.0), lambda line: None)
    int8 = next(f for f in files if f.name.endswith(".int8.onnx"))
    model = onnx.load(str(int8))
    ops = {n.op_type for n in model.graph.node}
    assert "QuantizeLinear" in ops and "ArgMax" in ops
    assert {p.key: p.value for p in model.metadata_props}["gluontl.task"] == "segmentation"
    report = json.loads((run.run_dir / "seg.int8.json").read_text())
    assert report["verification"]["metric"] == "mIoU"
    val = load_segmentation_split(recipe.data, seg_spec(recipe), recipe.data.val, recipe.model.input_shape)
    x = np.stack([val[(i, 0)][0] for i in range(len(val))])
    y = np.stack([val[(i, 0)][1] for i in range(len(val))])
    for path, key in ((int8.with_name("seg.onnx"), "float"), (int8, "int8")):
        # every rewrite (QDQ pairs as integer kernels), as the report's verification ran both (deploy_session)
        masks = helpers.ort_session(path, optimization="all").run(["mask"], {"data": x})[0]
        m = SegmentationMetric(len(CLASSES))
        m.update(y, masks.reshape(y.shape))
        # a pixel whose top two logits tie may go either way between batchings: 1 of 5·32·32 moves mIoU < 0.01
        assert report["verification"][key] == pytest.approx(m.get()[1], abs=0.01), key


def test_an_int8_symbol_export_of_a_segmenter_is_judged_by_the_miou_of_its_logits_arg_max(run, tmp_path):
    """MXNet's oneDNN path: the symbol gives logits, the judge takes their arg-max (float) per
    batch; the report's mIoU of each pair is recomputed here from the written files."""
    from gluontl.export.quantize_mx import load_symbol
    from gluontl.recipe import QuantizeSpec, load_recipe
    from gluontl.segment.data import load_segmentation_split
    from gluontl.segment.metrics import SegmentationMetric
    from gluontl.tasks.segmentation import seg_spec

    recipe = load_recipe(run.run_dir / "recipe.yaml")
    task = get_task(recipe)
    net = task.load(run.run_dir, recipe, "best")
    task.export_run(run.run_dir, recipe, net, tmp_path / "x", ["symbol"], False,
                    QuantizeSpec(calibration="val", max_drop=100.0), lambda line: None)
    nodes = json.loads((tmp_path / "x" / "seg-int8-symbol.json").read_text())["nodes"]
    assert any(n.get("attrs", {}).get("quantized") == "true" for n in nodes)
    report = json.loads((run.run_dir / "seg-int8-symbol.report.json").read_text())
    assert report["verification"]["metric"] == "mIoU"
    val = load_segmentation_split(recipe.data, seg_spec(recipe), recipe.data.val, recipe.model.input_shape)
    x = mx.nd.array(np.stack([val[(i, 0)][0] for i in range(len(val))]))
    y = np.stack([val[(i, 0)][1] for i in range(len(val))])
    for prefix, key in (("seg", "float"), ("seg-int8", "int8")):
        block = load_symbol(tmp_path / "x" / f"{prefix}-symbol.json", tmp_path / "x" / f"{prefix}-0000.params", "data")
        m = SegmentationMetric(len(CLASSES))
        m.update(y, block(x).asnumpy().argmax(axis=1).reshape(y.shape))
        assert report["verification"][key] == pytest.approx(m.get()[1], abs=0.01), key


def test_balanced_class_weights_are_median_frequency_over_the_training_masks(pairs, backbone):
    recipe = _recipe(pairs, backbone, {"class_weights": "balanced"})
    task = get_task(recipe)
    _, loaders = task.setup(recipe, mx.cpu(), seed=0)
    held = {p.rsplit("/", 1)[-1] for p in loaders.split.val}  # the held-out images
    masks = [read_mask(m, len(CLASSES), 255) for m in sorted((pairs / "masks").glob("*.png")) if m.name not in held]
    assert len(masks) == loaders.train_size
    pixels = np.array([[(m == c).sum() for c in range(len(CLASSES))] for m in masks], np.float64)
    freq = pixels.sum(0) / np.array([pixels[pixels[:, c] > 0].sum() for c in range(len(CLASSES))])
    np.testing.assert_allclose(task.loss.class_weights, np.median(freq) / freq, rtol=1e-12)
    assert task.loss.class_weights[0] < 1 < max(task.loss.class_weights)  # the background is the frequent class


def test_class_weights_of_the_wrong_length_exit_2_naming_the_key(pairs, backbone, tmp_path, monkeypatch, capsys):
    import sys

    import yaml

    from gluontl import cli

    recipe = _recipe(pairs, backbone, {"class_weights": [1.0, 2.0]}).model_dump(mode="json", exclude_unset=True)
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    monkeypatch.setattr(sys, "argv", ["gluontl", "finetune", "--recipe", str(tmp_path / "r.yaml"), "--runs",
                                      str(tmp_path / "runs")])
    with pytest.raises(SystemExit) as e:
        cli.main()
    err = " ".join(capsys.readouterr().err.split())
    assert e.value.code == 2 and "Traceback" not in err
    assert "segmentation.class_weights lists 2 weights but the data has 3 classes" in err
