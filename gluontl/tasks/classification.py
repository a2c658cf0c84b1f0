"""Classification: softmax cross-entropy, top-1/top-5, balanced accuracy, confusion matrix."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from ..errors import ExportError, TrainError, short_reason
from ..pipeline import Prepared, prepare
from ..recipe import QuantizeSpec, Recipe
from ..runfolder import RunFolder
from . import PredictOptions, Report, split, transform_record


class Classification:
    def prepare(self, recipe: Recipe, ctx=None, *, apply: bool = True) -> Prepared:
        return prepare(recipe, ctx=ctx, apply=apply)

    def plan_notes(self, recipe: Recipe, prep: Prepared) -> tuple[str, list[str], dict[str, Any]]:
        from ..data.cache import preview
        from ..data.datasets import require_two_classes

        if recipe.data is not None:
            require_two_classes(recipe.data)
        from ..data.balance import plan_notes
        from ..data.datasets import load_split

        weights = plan_notes(recipe, lambda: load_split(recipe.data, recipe.data.train, check=False))
        notes, record = split_notes(recipe)
        return preview(recipe, prep.block, prep.plan), [*notes, *weights], record

    def setup(self, recipe: Recipe, ctx: mx.Context, *, seed: int):
        from ..data.datasets import make_loaders, require_two_classes

        prep = prepare(recipe, ctx=ctx)
        loaders = make_loaders(recipe.data, seed=seed)
        require_two_classes(recipe.data, loaders.class_names)
        head = recipe.surgery.head
        if head is not None and head.classes != loaders.num_classes:
            raise TrainError(f"surgery.head.classes is {head.classes} but the data has {loaders.num_classes} "
                             f"classes ({', '.join(loaders.class_names[:10])}). Make them equal.")
        if head is None:
            _check_outputs(prep.block, recipe, loaders.num_classes, loaders.class_names, ctx)
        self.loss_fn = loss_fn(recipe, loaders.num_classes, loaders)
        self.num_classes = loaders.num_classes
        return prep, loaders

    def check(self, recipe: Recipe, prep, loaders, ctx: mx.Context, guards) -> None:
        from ..data.guards import check_features, check_weights

        guards.handle(check_weights(recipe, prep))
        guards.handle(check_features(recipe, prep.block, prep.plan, loaders, ctx))

    def feed(self, net, plan, recipe: Recipe, loaders, ctx, folder: Path, quiet: bool, previous):
        from ..data.cache import build_feed
        from ..data.mixup import MixedFeed

        feed = build_feed(net, plan, recipe, loaders, ctx, folder, quiet, previous)
        if recipe.train.mixup is None or feed is previous:
            return feed
        return MixedFeed(feed, recipe.train.mixup, loaders.num_classes, recipe.train.label_smoothing, recipe.train.seed)

    def forward(self, net, xs, ys):
        if ys and ys[0].ndim == 2:  # mixed soft targets (train.mixup), label smoothing already in them
            return classify(net, xs, ys, _SOFT_CE)
        return classify(net, xs, ys, self.loss_fn)

    def evaluate(self, net, batches, ctxs) -> dict[str, Any]:
        return evaluate_loader(net, batches, ctxs, self.num_classes, self.loss_fn)

    def first_epoch(self, batch_losses: list[float], steps: int, loaders) -> list:
        from ..data.guards import check_first_epoch

        return check_first_epoch(batch_losses, steps, loaders.num_classes)

    def card(self, recipe: Recipe, loaders) -> dict[str, Any]:
        from ..data.card import run_card

        return {**run_card(recipe, recipe.data, loaders.class_names), "task": "classification",
                "transforms": self.transforms(recipe)}

    def transforms(self, recipe: Recipe) -> dict[str, dict[str, str | None]]:
        from ..data.transforms import describe

        return transform_record(recipe, describe)


    def load(self, run: Path, recipe: Recipe, tag: str, ctx=None):
        from ..data.checkpoint import restore_into

        # The checkpoint holds every parameter: skip the recipe's weights file (it may be gone).
        bare = recipe.model_copy(update={"model": recipe.model.model_copy(update={"weights": None})})
        block = prepare(bare, ctx=ctx, apply=False).block
        restore_into(RunFolder(run).checkpoints_dir, tag, block, None, ctx)
        block.hybridize(static_alloc=True, static_shape=True)  # the same numbers, ~1.2x less CPU (EfficientNet-Lite0)
        return block

    def evaluate_run(self, run: Path, recipe: Recipe, net, split: str, tag: str, tta: str | None = None) -> Report:
        from ..data.cache import feature_batches, stored_val
        from ..data.card import recipe_data
        from ..data.datasets import load_split
        from ..rules import make_plan

        data = recipe_data(recipe, run)
        ds = load_split(data, split)
        cached = None
        if split == data.val and tta is None:  # the features of the run's last cut (its last epoch's plan)
            plan = make_plan(net, recipe.rules, epoch=recipe.train.epochs - 1, input_shape=recipe.model.input_shape)
            cached = stored_val(run, recipe, net, plan, ds, mx.cpu())
        if cached is None:
            from ..data.tta import TTANet

            net_ = TTANet(net, tta, "softmax") if tta else net  # log of the view-averaged probabilities
            batches = mx.gluon.data.DataLoader(ds, batch_size=data.batch_size, shuffle=False)
        else:
            net_, batches = cached[0], feature_batches(cached[1], ds.labels, data.batch_size)
        with mx.autograd.predict_mode():
            out = evaluate_loader(net_, batches, [mx.cpu()], len(ds.class_names),
                                  gluon.loss.SoftmaxCrossEntropyLoss())
        out["class_names"] = names = ds.class_names
        out["images"] = len(ds)
        out["tta"] = tta
        support = out["confusion"].sum(axis=1)
        width = max(5, *(len(n) for n in names))
        lines = [f"{run} [{tag}] on {split} ({out['images']} images{', tta ' + tta if tta else ''}): "
                 f"loss {out['val_loss']:.4f} top-1 "
                 f"{out['val_top1']:.4f}" + (f" top-5 {out['val_top5']:.4f}" if "val_top5" in out else ""),
                 f"balanced accuracy {out['val_balanced_acc']:.4f} (mean recall over classes); majority-class "
                 f"rate {support.max() / max(support.sum(), 1):.4f} (always answering "
                 f"'{names[int(support.argmax())]}')",
                 "confusion (rows: true, columns: predicted)",
                 " " * width + " " + " ".join(f"{n:>{width}}" for n in names)]
        lines += [f"{n:>{width}} " + " ".join(f"{v:>{width}}" for v in row) for n, row in zip(names, out["confusion"])]
        out["from_feature_cache"] = cached is not None
        if cached is not None:
            lines.append(f"(the frozen prefix's {split} features finetune computed, "
                         f"{RunFolder(run).feature_cache_dir()}, through "
                         f"the trained rest: the numbers of finetune's own validation)")
        return Report(out, lines)

    def predict_run(self, run: Path, recipe: Recipe, net, images: list[str], opts: PredictOptions) -> Report:
        from ..data.card import stored_card
        from ..data.transforms import load_images, load_preprocess
        from ..data.tta import average

        prep, names = load_preprocess(stored_card(run, recipe))
        rows = []
        for path, image in zip(images, load_images(images)):
            with mx.autograd.predict_mode():
                prob = average(lambda v: mx.nd.softmax(net(mx.nd.array(v))).asnumpy(), prep(image)[None], opts.tta)[0]
            rows.append(_ranked(path, prob, names, opts.topk))
        return _report(rows)

    def predict_onnx(self, path: Path, images: list[str], opts: PredictOptions) -> Report:
        from ..export.openvino_ir import deployed_preprocess, deployed_session
        from ..data.transforms import load_images
        from ..data.tta import average

        prep, names = deployed_preprocess(path)  # no metadata: refused before any work
        decoded = load_images(images)
        session = deployed_session(path)  # an OpenVINO IR folder runs behind the same calls
        inputs, outputs = session.get_inputs(), session.get_outputs()
        if len(inputs) != 1 or len(inputs[0].shape) != 4:
            raise ExportError(f"'{path}' takes inputs {[(i.name, i.shape) for i in inputs]}; predict feeds one "
                              f"N x C x H x W image batch. Predict with the run folder, or export the run again.")
        rows = []
        for name, image in zip(images, decoded):
            x = prep(image)[None]
            want = inputs[0].shape[1:]
            if any(isinstance(w, int) and w != d for w, d in zip(want, x.shape[1:])):
                raise ExportError(f"'{path}' takes {inputs[0].name} of shape {inputs[0].shape} but its recorded "
                                  f"preprocessing makes {list(x.shape)} from '{name}'; the metadata does not belong "
                                  f"to this graph. Export the run again.")
            def run(v: np.ndarray) -> np.ndarray:
                return np.asarray(session.run([outputs[0].name], {inputs[0].name: v})[0], np.float64)

            try:  # with --tta: the log of the view-averaged probabilities, whose softmax is that average
                logits = run(x) if opts.tta is None else np.log(average(lambda v: _softmax(run(v)), x, opts.tta))
            except Exception as err:  # onnxruntime's errors share no base class
                raise ExportError(f"onnxruntime cannot run '{path}' on '{name}' ({short_reason(err)}); predict feeds "
                                  f"one float32 image at a time. Predict with the run folder, or export the run "
                                  f"again.") from None
            if logits.shape != (1, len(names)):
                raise ExportError(f"'{path}' outputs {outputs[0].name} of shape {list(logits.shape)}, but its "
                                  f"metadata lists {len(names)} classes; export the run again.")
            prob = np.exp(logits[0] - logits[0].max())
            rows.append(_ranked(name, prob / prob.sum(), names, opts.topk))
        return _report(rows)

    def export_run(self, run: Path, recipe: Recipe, net, out_dir: Path, formats: list[str], force: bool,
                   quantize: QuantizeSpec | None, echo: Callable[[str], None]) -> list[Path]:
        from ..export.exporters import export_block
        from ..data.card import export_input_name, recipe_data, stored_card
        from ..data.datasets import load_split

        spec = recipe.export
        name = export_input_name(recipe)
        card = stored_card(run, recipe)
        card = {**card, "preprocess": {**card["preprocess"], "input": {**card["preprocess"]["input"], "name": name}}}
        sample = None
        if recipe.data is not None:
            ds = load_split(recipe.data, recipe.data.val)
            sample = {name: np.stack([ds[i][0] for i in range(min(8, len(ds)))]).astype(np.float32)}

        judge = None
        if "openvino" in formats and (recipe.data is not None or quantize is not None):
            from ..export.openvino_ir import Judge
            from ..export.quantize import calibration_indices, classification_metric, file_tensors

            data = recipe_data(recipe, run)
            val = load_split(data, data.val)
            calib = val if quantize is None or quantize.calibration == "val" else load_split(data, data.train,
                                                                                              check=False)
            judge = Judge(val, val.labels, classification_metric, file_tensors,
                          lambda q: calibration_indices(q.calibration, calib, val))

        def write(folder: Path) -> list[Path]:
            return export_block(net, folder, recipe.name, {name: (1, *recipe.model.input_shape)}, formats=formats,
                                opset=spec.opset, rtol=spec.rtol, lean=spec.lean, force=force, sample=sample,
                                output_names=spec.output_names, card=card, judge=judge, int8=quantize, echo=echo)

        if quantize is None:
            written = write(out_dir)
            if spec.tta == "flip" and "onnx" in formats:
                _bake_flip(net, Path(out_dir) / f"{recipe.name}.onnx", sample, spec.rtol, echo)
            return written
        if spec.tta != "none":
            raise ExportError("export.tta bakes a flip into the float ONNX file; with export.quantize the int8 file "
                              "would not have it. Export without quantize for the flip, or set export.tta: none.")
        from ..export.quantize import classification_metric, export_with_int8

        data = recipe_data(recipe, run)
        val = load_split(data, data.val)
        train = load_split(data, data.train, check=False) if quantize.calibration != "val" else val
        return export_with_int8(write, out_dir, recipe.name, quantize, train, val, val.labels, classification_metric,
                                force=force, report_dir=run, echo=echo)


def split_notes(recipe: Recipe) -> tuple[list[str], dict[str, Any]]:
    """``plan``'s line and plan.json record of an automatic split, as listed (none: ``([], {})``)."""
    from ..data.datasets import split_preview

    split = split_preview(recipe.data) if recipe.data is not None else None
    if not split:
        return [], {}
    return ([split[0].summary(*split[1:]) + " (as listed: finetune leaves out bad images)"],
            {"split": {k: v for k, v in split[0].to_json().items() if k != "val"}})


def _bake_flip(net, path: Path, sample: dict[str, np.ndarray] | None, rtol: float | None,
               echo: Callable[[str], None]) -> None:
    """export.tta: flip — the verified file rewritten to answer the log of its probabilities averaged
    with the mirror image's (``gluontl.export.finish``), checked against MXNet's average."""
    from ..data.tta import average
    from ..export.finish import finish_onnx
    from ..export.verify import FIXED_RTOL

    if sample is None:
        raise ExportError("export.tta: flip is verified on the run's validation images; the recipe has no data: "
                          "section. Add it, or set export.tta: none.")

    def reference(x: np.ndarray) -> np.ndarray:
        with mx.autograd.predict_mode():
            return np.log(average(lambda v: mx.nd.softmax(net(mx.nd.array(v))).asnumpy(), x, "flip"))

    err = finish_onnx(path, "softmax", True, {"gluontl.tta": "flip"}, reference, next(iter(sample.values())), rtol)
    echo(f"{path}: answers the log of its softmax averaged with the mirror image's (export.tta: flip); "
         f"onnxruntime vs MXNet max probability error {err:.2e} (<= {FIXED_RTOL if rtol is None else rtol:g})")


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _ranked(image: str, prob: np.ndarray, names: list[str], topk: int) -> dict[str, Any]:
    order = np.argsort(-prob, kind="stable")[: min(topk, len(prob))]
    return {"image": str(image), "top": [(names[i], float(prob[i])) for i in order]}


def _report(rows: list[dict[str, Any]]) -> Report:
    return Report({"rows": rows}, [f"{r['image']}: " + ", ".join(f"{n} {p:.3f}" for n, p in r["top"]) for r in rows])


def classify(net, xs, ys, loss: Callable) -> tuple[list[mx.nd.NDArray], list[mx.nd.NDArray]]:
    outs = [net(x) for x in xs]
    losses = [loss(o, y) for o, y in zip(outs, ys)]
    with autograd.pause():  # read after backward is queued, so counting does not stall the step
        # soft targets (mixup): a hit is the class with the larger share
        hits = [(o.argmax(axis=1) == (y.argmax(axis=1) if y.ndim == 2 else y)).sum() for o, y in zip(outs, ys)]
    return losses, hits


def evaluate_loader(net, loader, ctxs, num_classes: int, loss_fn) -> dict[str, Any]:
    """Loss, top-1/top-5 and the confusion matrix over a loader, in inference mode."""
    total_loss, n = 0.0, 0
    conf = np.zeros((num_classes, num_classes), dtype=np.int64)
    top5_hits = 0
    for x, y in loader:
        xs = split(x, ctxs)
        ys = split(y, ctxs)
        for xi, yi in zip(xs, ys):
            out = net(xi)
            total_loss += float(loss_fn(out, yi).sum().asscalar())
            scores = out.asnumpy()
            labels = yi.asnumpy().astype(np.int64)
            pred = scores.argmax(axis=1)
            np.add.at(conf, (labels, pred), 1)
            k = min(5, num_classes)
            top = np.argsort(-scores, axis=1)[:, :k]
            top5_hits += int((top == labels[:, None]).any(axis=1).sum())
            n += len(labels)
    n = max(n, 1)
    out = {"val_loss": total_loss / n, "val_top1": float(np.trace(conf)) / n,
           "val_balanced_acc": balanced_accuracy(conf), "confusion": conf}
    if num_classes > 5:
        out["val_top5"] = top5_hits / n
    return out


def balanced_accuracy(conf: np.ndarray) -> float:
    """Mean recall over the classes present (rows: true labels): on imbalanced data top-1 can
    look good for a model that always answers the majority class; this cannot."""
    support = conf.sum(axis=1)
    present = support > 0
    return float(np.mean(np.diag(conf)[present] / support[present])) if present.any() else 0.0


_SOFT_CE = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)


def loss_fn(recipe: Recipe, num_classes: int, loaders=None) -> Callable:
    eps = recipe.train.label_smoothing
    if recipe.train.loss is not None:
        from .class_loss import imbalance_loss

        custom = imbalance_loss(recipe, num_classes, loaders)
        if custom is not None:
            return custom
    if eps == 0:
        return gluon.loss.SoftmaxCrossEntropyLoss()
    ce = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)

    def smoothed(out, label):
        target = mx.nd.one_hot(label, num_classes) * (1 - eps) + eps / num_classes
        return ce(out, target.as_in_context(out.context))

    return smoothed


def _check_outputs(net, recipe: Recipe, classes: int, names: list[str], ctx) -> None:
    """Without a new head the model's own output must score the data's classes, one per column."""
    with autograd.predict_mode():
        out = net(mx.nd.zeros((1, *recipe.model.input_shape), ctx=ctx))
    shape = tuple(out.shape) if isinstance(out, mx.nd.NDArray) else tuple(tuple(o.shape) for o in out)
    if len(shape) != 2 or shape[1] != classes:
        raise TrainError(f"The model's output has shape {shape} for one image, but the data has {classes} classes "
                         f"({', '.join(names[:10])}): a classifier needs (1, {classes}). Attach a new head with "
                         f"surgery.head: {{classes: {classes}}} (zoo models rebuild their own classifier), or cut "
                         f"the model (surgery.cut_at / drop_last) and attach one there.")
