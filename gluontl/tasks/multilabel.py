"""Multi-label classification: one sigmoid per class, binary cross-entropy (optional ``pos_weight``),
average precision per class (macro and micro mAP), and per-class thresholds chosen on validation.

A classifier in all but its output: the model, rules, feature cache, run card and load are
:class:`Classification`'s; labels are multi-hot rows (``gluontl.data.multilabel``). AP follows
scikit-learn's ``average_precision_score`` (the step sum ``Σ (R_k − R_{k−1}) P_k`` over distinct
scores, no interpolation); a class without a positive in the split has no AP and is left out of
the macro mean. Each class's threshold maximizes its F1 on the validation split (predicting
``p >= t``; ``val_macro_f1`` is the macro F1 at those thresholds, an optimistic number on the split
that chose them); predict and the ONNX metadata use them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import mxnet as mx
import numpy as np
from mxnet import autograd

from ..data import multilabel as sources  # noqa: F401 -- registers labels: and demo:elpv_multilabel with load_split
from ..errors import ExportError, TrainError
from ..recipe import QuantizeSpec, Recipe
from ..runfolder import RunFolder
from . import PredictOptions, Report, split
from .classification import Classification

META_THRESHOLDS = "gluontl.thresholds"  # a multi-label export's per-class thresholds, JSON, in class order


# ---------------------------------------------------------------- metrics

def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """AP of one class (scikit-learn's definition); nan without a positive."""
    labels = np.asarray(labels, np.float64)
    positives = labels.sum()
    if positives == 0:
        return float("nan")
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    s, y = np.asarray(scores, np.float64)[order], labels[order]
    last = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]  # the last row of each distinct score
    tp = np.cumsum(y)[last]
    precision, recall = tp / (last + 1), tp / positives
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def ranking_metrics(probs: np.ndarray, labels: np.ndarray) -> dict[str, Any]:
    """Per-class AP, macro/micro mAP, max-F1 thresholds and the macro F1 at them."""
    ap = np.array([average_precision(probs[:, c], labels[:, c]) for c in range(labels.shape[1])])
    thresholds, f1 = zip(*(best_threshold(probs[:, c], labels[:, c]) for c in range(labels.shape[1])))
    present = ~np.isnan(ap)
    return {"val_macro_map": float(ap[present].mean()) if present.any() else 0.0,
            "val_micro_map": float(np.nan_to_num(average_precision(probs.ravel(), labels.ravel()))),
            "val_macro_f1": float(np.mean(f1)), "ap": ap.tolist(), "thresholds": [float(t) for t in thresholds],
            "f1": [float(f) for f in f1], "support": labels.sum(axis=0).astype(int).tolist()}


def best_threshold(scores: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """(t, F1 of ``scores >= t``) with the largest F1 over the distinct scores (ties: the higher t);
    no positive: (1.0, 0.0) — a class never seen positive is never predicted."""
    positives = float(np.sum(labels))
    if positives == 0:
        return 1.0, 0.0
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    s, y = np.asarray(scores, np.float64)[order], np.asarray(labels, np.float64)[order]
    last = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]
    tp = np.cumsum(y)[last]
    f1 = 2 * tp / (last + 1 + positives)  # 2TP / (predicted + actual positives)
    k = int(np.argmax(f1))
    return float(s[last[k]]), float(f1[k])


def f1_at(probs: np.ndarray, labels: np.ndarray, thresholds) -> np.ndarray:
    """Per-class F1 of ``probs >= thresholds``."""
    pred = probs >= np.asarray(thresholds)[None]
    tp = (pred & (labels > 0)).sum(axis=0)
    denom = pred.sum(axis=0) + (labels > 0).sum(axis=0)
    return np.where(denom > 0, 2 * tp / np.maximum(denom, 1), 0.0)


# ---------------------------------------------------------------- loss

def bce_loss(pos_weight: np.ndarray | None) -> Callable:
    """Per-image BCE with logits, averaged over classes; ``pos_weight`` scales each class's positive
    term (PyTorch's ``BCEWithLogitsLoss(pos_weight=...)``), computed stably from the logits."""
    def loss(z, y):
        w = 1.0 if pos_weight is None else 1 + (mx.nd.array(pos_weight, ctx=z.context).reshape((1, -1)) - 1) * y
        softplus_neg = mx.nd.relu(-z) + mx.nd.log1p(mx.nd.exp(-mx.nd.abs(z)))  # -log sigmoid(z)
        return ((1 - y) * z + w * softplus_neg).mean(axis=1)
    return loss


def pos_weights(spec, labels: np.ndarray) -> np.ndarray | None:
    """The recipe's ``multilabel.pos_weight`` as one number per class (None: all 1)."""
    pw = "none" if spec is None else spec.pos_weight
    if isinstance(pw, list):
        if len(pw) != labels.shape[1]:
            raise TrainError(f"multilabel.pos_weight lists {len(pw)} numbers but the data has {labels.shape[1]} "
                             f"classes; give one per class, in class order, or use balanced.")
        return np.asarray(pw, np.float32)
    if pw == "balanced":
        pos = labels.sum(axis=0)
        neg = len(labels) - pos
        return np.where((pos > 0) & (neg > 0), neg / np.maximum(pos, 1), 1.0).astype(np.float32)  # one-sided: 1
    return None


def bce_of_probs(probs: np.ndarray, labels: np.ndarray) -> float:
    """Mean over images of the class-mean BCE of probabilities (float64, clipped at 1e-12)."""
    p = np.clip(np.asarray(probs, np.float64), 1e-12, 1 - 1e-12)
    return float(np.mean(-(labels * np.log(p) + (1 - labels) * np.log1p(-p)).mean(axis=1))) if len(p) else 0.0


def collect(net, batches, ctxs, probs_of: Callable) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, labels) over ``batches``: ``probs_of(net(x))`` per context, in order."""
    probs, labels = [], []
    for x, y in batches:
        for xi, yi in zip(split(x, ctxs), split(y, ctxs)):
            probs.append(probs_of(net(xi)))
            labels.append(yi.asnumpy())
    return np.concatenate(probs), np.concatenate(labels)


def _sigmoid(out) -> np.ndarray:
    return mx.nd.sigmoid(out).asnumpy()


def _probs(out) -> np.ndarray:
    return out.asnumpy()


# ---------------------------------------------------------------- the task

class MultiLabel(Classification):
    def plan_notes(self, recipe: Recipe, prep) -> tuple[str, list[str], dict[str, Any]]:
        from ..data.cache import preview
        from .classification import split_notes

        return preview(recipe, prep.block, prep.plan), *split_notes(recipe)

    def setup(self, recipe: Recipe, ctx: mx.Context, *, seed: int):
        from ..data.datasets import make_loaders
        from ..mxinternals.loaders import loader_dataset
        from ..pipeline import prepare

        prep = prepare(recipe, ctx=ctx)
        loaders = make_loaders(recipe.data, seed=seed)
        head = recipe.surgery.head
        if head is not None and head.classes != loaders.num_classes:
            raise TrainError(f"surgery.head.classes is {head.classes} but the data has {loaders.num_classes} "
                             f"labels ({', '.join(loaders.class_names[:10])}). Make them equal.")
        self.loss_fn = bce_loss(pos_weights(recipe.multilabel, loader_dataset(loaders.train).labels))
        self.num_classes = loaders.num_classes
        return prep, loaders

    def forward(self, net, xs, ys):
        outs = [net(x) for x in xs]
        return [self.loss_fn(o, y) for o, y in zip(outs, ys)], None

    def evaluate(self, net, batches, ctxs) -> dict[str, Any]:
        probs, labels = collect(net, batches, ctxs, _sigmoid)
        return {"val_loss": bce_of_probs(probs, labels), **ranking_metrics(probs, labels)}

    def first_epoch(self, batch_losses: list[float], steps: int, loaders) -> list:
        return []  # the stuck-at-ln(K) guard is softmax's; a BCE has no such plateau

    def card(self, recipe: Recipe, loaders) -> dict[str, Any]:
        return {**super().card(recipe, loaders), "task": "multilabel"}

    def scores(self, run: Path, recipe: Recipe, net, split_name: str, tta: str | None
               ) -> tuple[np.ndarray, np.ndarray, list[str], bool]:
        """(probabilities, labels, class names, from the feature cache) of a split."""
        from ..data.cache import feature_batches, stored_val
        from ..data.card import recipe_data
        from ..data.datasets import load_split
        from ..data.tta import TTANet
        from ..rules import make_plan

        data = recipe_data(recipe, run)
        ds = load_split(data, split_name)
        cached = None
        if split_name == data.val and tta is None:
            plan = make_plan(net, recipe.rules, epoch=recipe.train.epochs - 1, input_shape=recipe.model.input_shape)
            cached = stored_val(run, recipe, net, plan, ds, mx.cpu())
        with autograd.predict_mode():
            if cached is not None:
                probs, labels = collect(cached[0], feature_batches(cached[1], ds.labels, data.batch_size),
                                        [mx.cpu()], _sigmoid)
            else:
                loader = mx.gluon.data.DataLoader(ds, batch_size=data.batch_size, shuffle=False)
                probs, labels = collect(TTANet(net, tta, "sigmoid") if tta else net, loader, [mx.cpu()],
                                        _probs if tta else _sigmoid)
        return probs, labels, ds.class_names, cached is not None

    def evaluate_run(self, run: Path, recipe: Recipe, net, split: str, tag: str, tta: str | None = None) -> Report:
        probs, labels, names, cached = self.scores(run, recipe, net, split, tta)
        out = {"val_loss": bce_of_probs(probs, labels), **ranking_metrics(probs, labels), "class_names": names,
               "images": len(labels), "probs": probs, "labels": labels, "from_feature_cache": cached, "tta": tta}
        width = max(9, *(len(n) for n in names))
        lines = [f"{run} [{tag}] on {split} ({len(labels)} images{', tta ' + tta if tta else ''}): loss "
                 f"{out['val_loss']:.4f} macro mAP {out['val_macro_map']:.4f} micro mAP {out['val_micro_map']:.4f} "
                 f"F1 {out['val_macro_f1']:.4f} (macro, at the per-class thresholds)",
                 f"{'class':<{width}} {'AP':>7} {'threshold':>9} {'F1':>7} {'support':>7}"]
        lines += [f"{n:<{width}} {'n/a' if np.isnan(a) else f'{a:.4f}':>7} {t:>9.4f} {f:>7.4f} {s:>7}"
                  for n, a, t, f, s in zip(names, out["ap"], out["thresholds"], out["f1"], out["support"])]
        if cached:
            lines.append(f"(the frozen prefix's {split} features finetune computed, "
                         f"{RunFolder(run).feature_cache_dir()}, through the trained rest)")
        return Report(out, lines)

    def thresholds(self, run: Path, recipe: Recipe, net) -> list[float]:
        """The per-class max-F1 thresholds on the run's validation split."""
        return ranking_metrics(*self.scores(run, recipe, net, recipe_val(recipe, run), None)[:2])["thresholds"]

    def predict_run(self, run: Path, recipe: Recipe, net, images: list[str], opts: PredictOptions) -> Report:
        from ..data.card import stored_card
        from ..data.transforms import load_images, load_preprocess
        from ..data.tta import average

        prep, names = load_preprocess(stored_card(run, recipe))
        thresholds = self.thresholds(run, recipe, net)
        rows = []
        with autograd.predict_mode():
            for path, image in zip(images, load_images(images)):
                prob = average(lambda v: _sigmoid(net(mx.nd.array(v))), prep(image)[None], opts.tta)[0]
                rows.append(_labelled(path, prob, names, thresholds))
        return _report(rows)

    def predict_onnx(self, path: Path, images: list[str], opts: PredictOptions) -> Report:
        from ..data.transforms import load_images
        from ..data.tta import average
        from ..export.openvino_ir import deployed_metadata, deployed_preprocess, deployed_session

        prep, names = deployed_preprocess(path)
        raw = deployed_metadata(path).get(META_THRESHOLDS)
        try:
            thresholds = [float(t) for t in json.loads(raw)]
        except (TypeError, ValueError):
            thresholds = []
        if len(thresholds) != len(names):
            raise ExportError(f"'{path}' has no valid {META_THRESHOLDS} metadata ({len(names)} numbers, one per "
                              f"class); it was not written by a gluontl multilabel export. Export the run again.")
        session = deployed_session(path)
        name, out = session.get_inputs()[0].name, session.get_outputs()[0].name
        rows = []
        for image_name, image in zip(images, load_images(images)):
            prob = average(lambda v: np.asarray(session.run([out], {name: v.astype(np.float32)})[0]),
                           prep(image)[None], opts.tta)[0]
            rows.append(_labelled(image_name, prob, names, thresholds))
        return _report(rows)

    def export_run(self, run: Path, recipe: Recipe, net, out_dir: Path, formats: list[str], force: bool,
                   quantize: QuantizeSpec | None, echo: Callable[[str], None]):
        from ..data.card import export_input_name, recipe_data, stored_card
        from ..data.datasets import load_split
        from ..data.tta import average
        from ..export.exporters import BlockGraph, export_block
        from ..export.verify import FIXED_RTOL

        spec = recipe.export
        if quantize is not None and spec.tta != "none":
            raise ExportError("export.tta bakes a flip into the float ONNX file; with export.quantize the int8 symbol "
                              "files would not have it. Export without quantize for the flip, or set export.tta: none.")
        name = export_input_name(recipe)
        card = stored_card(run, recipe)
        card = {**card, "preprocess": {**card["preprocess"], "input": {**card["preprocess"]["input"], "name": name}}}
        thresholds = self.thresholds(run, recipe, net)
        card["thresholds"] = thresholds
        data = recipe_data(recipe, run)
        val = load_split(data, data.val)
        x = np.stack([val[i][0] for i in range(min(8, len(val)))]).astype(np.float32)
        flip = spec.tta == "flip"

        def reference(batch: np.ndarray) -> np.ndarray:
            with autograd.predict_mode():
                return average(lambda v: _sigmoid(net(mx.nd.array(v))), batch, "flip" if flip else None)

        shapes = {name: (1, *recipe.model.input_shape)}
        logits = BlockGraph(net, recipe.name, shapes, opset=spec.opset, rtol=spec.rtol, lean=spec.lean,
                            sample={name: x}, output_names=spec.output_names, card=card)
        graph = ProbabilityGraph(logits, reference, flip, {META_THRESHOLDS: json.dumps(thresholds),
                                                           "gluontl.output": "probabilities", "gluontl.tta": spec.tta})
        metric = int8_metric(thresholds)
        judge = None
        if "openvino" in formats:  # the IR is judged by macro mAP on the validation split, like top-1 for one label
            from ..export.openvino_ir import Judge
            from ..export.quantize import calibration_indices, file_tensors

            calib = val if quantize is None or quantize.calibration == "val" else load_split(data, data.train,
                                                                                              check=False)
            judge = Judge(val, val.labels, metric, file_tensors,
                          lambda q: calibration_indices(q.calibration, calib, val))

        def write(folder: Path):
            return export_block(net, folder, recipe.name, shapes, formats=formats, opset=spec.opset, rtol=spec.rtol,
                                lean=spec.lean, force=force, sample={name: x}, output_names=spec.output_names,
                                card=card, judge=judge, int8=quantize, echo=echo, graph=graph)

        if quantize is None:
            written = write(out_dir)
        else:
            from ..export.quantize import export_with_int8

            train = load_split(data, data.train, check=False) if quantize.calibration != "val" else val
            written = export_with_int8(write, out_dir, recipe.name, quantize, train, val, val.labels, metric,
                                       force=force, report_dir=run, echo=echo,
                                       symbol_outputs=lambda outs: [_logistic(o) for o in outs])
        if graph.error is not None:
            mirror = " averaged with the mirror image" if flip else ""
            echo(f"{recipe.name}: the ONNX graph outputs per-class probabilities{mirror}; onnxruntime vs MXNet max "
                 f"error {graph.error:.2e} (<= {FIXED_RTOL if spec.rtol is None else spec.rtol:g}); thresholds {', '.join(f'{n} {t:.4f}' for n, t in zip(card['classes'], thresholds))} in its metadata")
        return written


class ProbabilityGraph:
    """A ``registry.GraphFinisher``: the block's verified logits graph (``logits``, a ``BlockGraph``)
    with a ``Sigmoid`` appended (and with export.tta: flip the mirror average), verified again
    against MXNet's probabilities (``reference``), the thresholds in its metadata. It is the ONNX
    file, and the one OpenVINO converts, so the IR answers probabilities and carries the same keys
    in its runtime info."""

    compare = None  # OpenVINO's outputs against this file's: within rtol of their range

    def __init__(self, logits: Any, reference: Callable[[np.ndarray], np.ndarray], flip: bool,
                 metadata: dict[str, str]) -> None:
        self.logits, self.reference, self.flip, self.metadata = logits, reference, flip, metadata
        self.note, self.error = "", None

    def write_onnx(self, folder: Path, overwrite: bool) -> Path:
        from ..export.finish import finish_onnx

        path = self.logits.write_onnx(folder, overwrite)
        self.error = finish_onnx(path, "sigmoid", self.flip, dict(self.metadata), self.reference,
                                 next(iter(self.logits.sample.values())), self.logits.rtol)
        self.note = f"; per-class probabilities within {self.error:.1e} of MXNet's sigmoid"
        return path

    def batches(self) -> list[tuple[str, Any]]:
        return self.logits.batches()


def _logistic(z: np.ndarray) -> np.ndarray:
    """The sigmoid of logits without overflow (a symbol export's outputs are logits)."""
    return 0.5 * (1 + np.tanh(0.5 * np.asarray(z, np.float64)))


def int8_metric(thresholds) -> Callable[[list, list, Any], dict[str, Any]]:
    """quantize's ``Metric`` for a multi-label export: macro mAP of the reference's and the
    candidate's probabilities on the validation labels, the drop in points (what
    ``export.quantize.max_drop`` bounds), and how often the two decide a label alike at the run's
    thresholds."""
    t = np.asarray(thresholds, np.float64)[None]

    def metric(float_out: list, int8_out: list, labels: Any) -> dict[str, Any]:
        labels = np.asarray(labels)
        f, q = (np.asarray(o[0], np.float64) for o in (float_out, int8_out))
        map_f, map_q = (ranking_metrics(p, labels)["val_macro_map"] for p in (f, q))
        agree = float(np.mean((f >= t) == (q >= t)))
        change = 100 * (map_q - map_f)
        return {"metric": "macro mAP", "images": int(len(labels)), "float": map_f, "int8": map_q, "drop": -change,
                "agreement": agree,
                "summary": f"macro mAP {100 * map_f:.2f} % float, {100 * map_q:.2f} % int8 ({change:+.2f} points), "
                           f"label agreement {100 * agree:.2f} % at the run's thresholds on {len(labels)} validation "
                           f"images"}
    return metric


def recipe_val(recipe: Recipe, run: Path) -> str:
    from ..data.card import recipe_data

    return recipe_data(recipe, run).val


def _labelled(image: str, prob: np.ndarray, names: list[str], thresholds: list[float]) -> dict[str, Any]:
    return {"image": str(image), "labels": [n for n, p, t in zip(names, prob, thresholds) if p >= t],
            "probs": {n: float(p) for n, p in zip(names, prob)}, "thresholds": dict(zip(names, thresholds))}


def _report(rows: list[dict[str, Any]]) -> Report:
    return Report({"rows": rows}, [f"{r['image']}: {', '.join(r['labels']) or '(no label above its threshold)'}  ["
                                   + ", ".join(f"{n} {p:.3f}" for n, p in r["probs"].items()) + "]" for r in rows])
