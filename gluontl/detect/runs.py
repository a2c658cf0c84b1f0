"""A finished detection run: reload, evaluate (per-class AP table, PR curves), predict (images with
boxes + detections.json), export (symbol + ONNX with per-class NMS, verified on val images)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np

from ..errors import TrainError
from ..recipe import Recipe


def load_detector(run: Path, recipe: Recipe, tag: str, ctx=None):
    """The run's detector for the classes it was trained on (its preprocess.json), ``tag`` loaded."""
    from ..train import checkpoint
    from ..train.runs import stored_card
    from .models import build_detector

    classes = stored_card(run, recipe)["classes"]
    bare = recipe.model_copy(update={"model": recipe.model.model_copy(
        update={"weights": None, "restore": recipe.model.restore.model_copy(update={"type": None, "reuse": {}})})})
    net, _ = build_detector(bare, classes, ctx or mx.cpu())
    checkpoint.restore_into(run / "checkpoints", tag, net, None, ctx)
    net.hybridize(static_alloc=True, static_shape=True)
    return net


def _dataset(recipe: Recipe, run: Path, split: str):
    from ..train.runs import _data
    from .data import load_detection_split

    return load_detection_split(_data(recipe, run), split, recipe.model.input_shape)


def evaluate(run_dir: str | Path, recipe: Recipe, net, split: str = "val") -> dict[str, Any]:
    """VOC mAP@0.5 per class and COCO mAP@[.5:.95] on ``split``; writes ``pr_curves.png`` into the run."""
    from ..tasks.detection import predict_batches
    from .metrics import DetectionEval, plot_pr, table

    run = Path(run_dir)
    ds = _dataset(recipe, run, split)
    batch = recipe.data.batch_size
    batches = (_stack([ds[(i, 0)] for i in range(s, min(s + batch, len(ds)))]) for s in range(0, len(ds), batch))
    dets, gts = predict_batches(net, batches, [mx.cpu()])
    ev = DetectionEval(ds.class_names)
    for d, g in zip(dets, gts):
        ev.update(d, g)
    voc, coco = ev.voc(), ev.coco()
    curves = plot_pr(voc, run / f"pr_curves-{split}.png")
    return {"task": "detection", "val_map50": voc["map50"], "val_map": coco["map"], "val_map75": coco.get("map75"),
            "per_class_ap50": voc["per_class"], "class_names": ds.class_names, "images": len(ds),
            "objects": int(sum(len(g) for g in gts)), "pr_curves": str(curves), "table": table(voc, coco)}


def _stack(samples) -> tuple[mx.nd.NDArray, mx.nd.NDArray]:
    from .data import _stack as stack

    x, y = stack(samples)
    return mx.nd.array(x), mx.nd.array(y)


def predict(run_dir: str | Path, recipe: Recipe, net, images: list[str], out_dir: str | Path | None,
            score_thresh: float = 0.5) -> tuple[list[dict[str, Any]], Path]:
    """Detections per image in the image's own pixels; images with drawn boxes and
    ``detections.json`` go to ``out_dir`` (default RUN/predictions)."""
    import json

    from ..train.runs import _images, stored_card
    from .augment import DetectionTransform
    from .draw import write_predictions

    decoded = _images(images)
    names = stored_card(run_dir, recipe)["classes"]
    hw = tuple(recipe.model.input_shape[-2:])
    prep = DetectionTransform(recipe.data.val_transform, hw, False, where="data.val_transform")
    items = []
    with mx.autograd.predict_mode():
        for path, image in zip(images, decoded):
            x, _ = prep(image, np.zeros((0, 6), np.float32))
            ids, scores, boxes = net(mx.nd.array(x[None]))
            dets = mx.nd.concat(ids, scores, boxes, dim=-1).asnumpy()[0]
            items.append((path, image, dets))
    out = Path(out_dir) if out_dir else Path(run_dir) / "predictions"
    report = write_predictions(out, items, names, hw, score_thresh)
    rows = json.loads(Path(report).read_text(encoding="utf-8"))["images"]
    return rows, Path(report)


def export(run_dir: str | Path, recipe: Recipe, net, out_dir: str | Path | None, formats: list[str],
           force: bool) -> list[Path]:
    """Symbol/params and ONNX (per-class NMS), verified against MXNet on up to 8 val images."""
    from ..train.runs import _export_input_name, stored_card
    from .export import export_detector

    run = Path(run_dir)
    card = stored_card(run, recipe)
    sample = None
    if recipe.data is not None:
        ds = _dataset(recipe, run, recipe.data.val)
        sample = np.stack([ds[(i, 0)][0] for i in range(min(8, len(ds)))]).astype(np.float32)
    if not card.get("classes"):
        raise TrainError(f"{run / 'preprocess.json'} lists no classes; it was edited. Delete it to have it "
                         f"computed from the recipe and the training data.")
    return export_detector(net, out_dir or run / "export", recipe.name, tuple(recipe.model.input_shape),
                           class_names=card["classes"], card=card, sample=sample, formats=formats,
                           input_name=_export_input_name(recipe), rtol=recipe.export.rtol, force=force)
