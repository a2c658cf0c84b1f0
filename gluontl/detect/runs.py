"""A finished detection run: reload, evaluate (per-class AP table, PR curves), predict (images with
boxes + detections.json, from the run in MXNet or from its ONNX export in onnxruntime), export
(symbol + ONNX with per-class NMS, verified on val images)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd

from ..errors import ExportError, TrainError, short_reason
from ..mxinternals import clear_cached_op
from ..recipe import Recipe
from ..runfolder import RunFolder
from ..tasks import split as split_batch


def load_detector(run: Path, recipe: Recipe, tag: str, ctx=None):
    """The run's detector for the classes it was trained on (its preprocess.json), ``tag`` loaded."""
    from ..rules import attach_adapters
    from ..data import checkpoint
    from ..data.card import stored_card
    from .models import build_detector

    classes = stored_card(run, recipe)["classes"]
    bare = recipe.model_copy(update={"model": recipe.model.model_copy(
        update={"weights": None, "restore": recipe.model.restore.model_copy(update={"type": None, "reuse": {}})})})
    net, _ = build_detector(bare, classes, ctx or mx.cpu())
    net = attach_adapters(net, recipe.rules, input_shape=(1, *recipe.model.input_shape))
    checkpoint.restore_into(RunFolder(run).checkpoints_dir, tag, net, None, ctx)
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def _dataset(recipe: Recipe, run: Path, split: str):
    from ..data.card import recipe_data
    from .data import load_detection_split

    return load_detection_split(recipe_data(recipe, run), split, recipe.model.input_shape)


def evaluate(run_dir: str | Path, recipe: Recipe, net, split: str = "val") -> dict[str, Any]:
    """VOC mAP@0.5 per class and COCO mAP@[.5:.95] on ``split``; writes ``pr_curves.png`` into the run."""
    from .metrics import DetectionEval, plot_pr, table

    from ..data.card import stored_card

    run = Path(run_dir)
    ds = _dataset(recipe, run, split)
    trained = stored_card(run, recipe)["classes"]
    if list(ds.class_names) != list(trained):  # class ids would mean other classes
        raise TrainError(f"The {split} split of {recipe.data.source} now has the classes {ds.class_names}, but "
                         f"{run} was trained on {trained} (its {RunFolder.CARD}). Set data.classes in "
                         f"{RunFolder(run).recipe_path} to {trained} to evaluate on those classes.")
    batch = recipe.data.batch_size
    batches = (_stack([ds[(i, 0)] for i in range(s, min(s + batch, len(ds)))]) for s in range(0, len(ds), batch))
    dets, gts = predict_batches(net, batches, [mx.cpu()])
    ev = DetectionEval(ds.class_names)
    for d, g in zip(dets, gts):
        ev.update(d, g)
    voc, coco = ev.voc(), ev.coco()
    curves = plot_pr(voc, RunFolder(run).pr_curves_path(split))
    return {"task": "detection", "val_map50": voc["map50"], "val_map": coco["map"], "val_map75": coco.get("map75"),
            "per_class_ap50": voc["per_class"], "class_names": ds.class_names, "images": len(ds),
            "objects": int(sum(len(g) for g in gts)), "pr_curves": str(curves), "table": table(voc, coco)}


def predict_batches(net, batches, ctxs) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per image: detections ``(K, 6)`` [class, score, x1, y1, x2, y2] and ground truth ``(N, 6)``
    (padding rows removed), both in network-input pixels."""
    clear_cached_op(net)
    dets, gts = [], []
    try:
        with autograd.predict_mode():
            for x, y in batches:
                for xi, yi in zip(split_batch(x, ctxs), split_batch(y, ctxs)):
                    ids, scores, boxes = net(xi)
                    out = mx.nd.concat(ids, scores, boxes, dim=-1).asnumpy()
                    for d, g in zip(out, yi.asnumpy()):
                        dets.append(d[d[:, 0] >= 0])
                        gts.append(g[g[:, 4] >= 0])
    finally:
        clear_cached_op(net)
    return dets, gts


def _stack(samples) -> tuple[mx.nd.NDArray, mx.nd.NDArray]:
    from .data import _stack as stack

    x, y = stack(samples)
    return mx.nd.array(x), mx.nd.array(y)


def input_transform(card: dict[str, Any], where: str) -> tuple[Any, list[str], tuple[int, int]]:
    """The evaluation transform a detection card describes (a run's ``preprocess.json`` or an
    export's metadata), its class names and the network input (H, W): the same
    :class:`DetectionTransform` evaluation uses (plain resize to H, W + the recorded normalization)."""
    from ..data.card import resized_input
    from ..recipe import TransformSpec
    from .augment import DetectionTransform

    prep, names, hw = resized_input(card, where, "detector", "detection")
    spec = TransformSpec(normalize=(prep.mean, prep.std))
    return DetectionTransform(spec, hw, False, where=where), names, hw


def _detections(transform, image: np.ndarray, run) -> np.ndarray:
    """``(K, 6)`` detections in network-input pixels of one image; ``run(x)`` returns the
    network's ids, scores and boxes for a batch of one."""
    x, _ = transform(image, np.zeros((0, 6), np.float32))
    return np.concatenate([np.asarray(a, np.float32) for a in run(x[None])], axis=-1)[0]


def _write(out: Path, items, names: list[str], hw: tuple[int, int], score_thresh: float
           ) -> tuple[list[dict[str, Any]], Path]:
    import json

    from .draw import write_predictions

    report = write_predictions(out, items, names, hw, score_thresh)
    return json.loads(Path(report).read_text(encoding="utf-8"))["images"], Path(report)


def predict(run_dir: str | Path, recipe: Recipe, net, images: list[str], out_dir: str | Path | None,
            score_thresh: float = 0.5) -> tuple[list[dict[str, Any]], Path]:
    """Detections per image in the image's own pixels; images with drawn boxes and
    ``detections.json`` go to ``out_dir`` (default RUN/predictions)."""
    from ..data.card import stored_card
    from ..data.transforms import load_images

    decoded = load_images(images)
    transform, names, hw = input_transform(stored_card(run_dir, recipe), str(RunFolder(run_dir).card_path))

    def run(x: np.ndarray) -> list[np.ndarray]:
        return [a.asnumpy() for a in net(mx.nd.array(x))]

    with mx.autograd.predict_mode():
        items = [(path, image, _detections(transform, image, run)) for path, image in zip(images, decoded)]
    return _write(Path(out_dir) if out_dir else RunFolder(run_dir).predictions_dir, items, names, hw, score_thresh)


def predict_onnx(onnx_path: str | Path, images: list[str], out_dir: str | Path | None,
                 score_thresh: float = 0.5) -> tuple[list[dict[str, Any]], Path]:
    """:func:`predict` with a detector's ONNX export in onnxruntime, preprocessing and class
    names from the file's metadata alone (what a deployment has); outputs go to ``out_dir``
    (default NAME-predictions beside the file)."""
    from ..export.openvino_ir import deployed_card, deployed_session
    from ..data.transforms import load_images
    from .export import OUTPUT_NAMES

    path = Path(onnx_path)
    card = deployed_card(path)  # no metadata: refused before any work (an OpenVINO IR: its runtime info)
    transform, names, hw = input_transform(card, f"'{path}'")
    decoded = load_images(images)
    session = deployed_session(path)  # an OpenVINO IR folder runs behind the same calls
    inputs, outputs = session.get_inputs(), [o.name for o in session.get_outputs()]
    want = card["preprocess"]["input"]["shape"][1:]  # checked by input_transform
    if len(inputs) != 1 or len(inputs[0].shape) != 4 or sorted(outputs) != sorted(OUTPUT_NAMES) or any(
            isinstance(d, int) and d != w for d, w in zip(inputs[0].shape[1:], want)):
        raise ExportError(f"'{path}' takes inputs {[(i.name, i.shape) for i in inputs]} and gives {outputs}, but its "
                          f"metadata describes a detector fed N x {' x '.join(map(str, want))} images giving "
                          f"{list(OUTPUT_NAMES)}; the metadata does not belong to this graph. Export the run again.")

    def run(x: np.ndarray) -> list[np.ndarray]:
        try:
            return session.run(list(OUTPUT_NAMES), {inputs[0].name: x})
        except Exception as err:  # onnxruntime's errors share no base class
            raise ExportError(f"onnxruntime cannot run '{path}' ({short_reason(err)}); export the run "
                              f"again.") from None

    items = [(name, image, _detections(transform, image, run)) for name, image in zip(images, decoded)]
    return _write(Path(out_dir) if out_dir else path.with_name(f"{path.stem}-predictions"), items, names, hw,
                  score_thresh)


def export(run_dir: str | Path, recipe: Recipe, net, out_dir: str | Path | None, formats: list[str],
           force: bool, quantize: Any = None, echo: Any = None) -> list[Path]:
    """Symbol/params and ONNX (per-class NMS), verified against MXNet on up to 8 val images;
    with ``quantize`` (a QuantizeSpec) also NAME.int8.onnx: the convolutions int8, box decoding
    and NMS float, kept if val mAP@0.5 drops by at most ``max_drop`` points."""
    from ..data.card import export_input_name, recipe_data, stored_card
    from .export import export_detector

    run = Path(run_dir)
    card = stored_card(run, recipe)
    sample = None
    if recipe.data is not None:
        ds = _dataset(recipe, run, recipe.data.val)
        sample = np.stack([ds[(i, 0)][0] for i in range(min(8, len(ds)))]).astype(np.float32)
    if not card.get("classes"):
        raise TrainError(f"{RunFolder(run).card_path} lists no classes; it was edited. Delete it to have it "
                         f"computed from the recipe and the training data.")
    judge = None
    if "openvino" in formats and (recipe.data is not None or quantize is not None):
        from ..export.openvino_ir import Judge
        from ..export.quantize import calibration_indices
        from .metrics import int8_metric

        data = recipe_data(recipe, run)
        val = _dataset(recipe, run, data.val)
        calib = val if quantize is None or quantize.calibration == "val" else _dataset(recipe, run, data.train)
        judge = Judge(val, [val[(i, 0)][1] for i in range(len(val))], int8_metric(card["classes"]),
                      lambda _, ds: lambda i: ds[(i, 0)][0], lambda q: calibration_indices(q.calibration, calib, val))

    def write(folder: Path) -> list[Path]:
        return export_detector(net, folder, recipe.name, tuple(recipe.model.input_shape),
                               class_names=card["classes"], card=card, sample=sample, formats=formats,
                               input_name=export_input_name(recipe), rtol=recipe.export.rtol, force=force,
                               judge=judge, int8=quantize, echo=echo or print)

    out = Path(out_dir or RunFolder(run).export_dir)
    if quantize is None:
        return write(out)
    from ..export.quantize import export_with_int8
    from .metrics import int8_metric

    data = recipe_data(recipe, run)  # int8 calibrates and judges on the run's images: no data is refused by name
    val = _dataset(recipe, run, data.val)
    train = val if quantize.calibration == "val" else _dataset(recipe, run, data.train)
    gts = [val[(i, 0)][1] for i in range(len(val))]
    return export_with_int8(write, out, recipe.name, quantize, train, val, gts, int8_metric(card["classes"]),
                            force=force, report_dir=run, echo=echo or print, op_types=["Conv"],
                            tensors=lambda _, ds: lambda i: ds[(i, 0)][0])
