"""Using a finished run folder: reload its model, evaluate, predict (also with its ONNX export),
plot, export."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import mxnet as mx
import numpy as np

from ..errors import ExportError, GluontlError, TrainError, short_reason
from ..pipeline import prepare
from ..recipe import ExportSpec, Recipe, as_spec, load_recipe
from ..runfolder import run_weights
from . import checkpoint
from .card import export_input_name, recipe_data, stored_card


def load_run(run_dir: str | Path, tag: str = "best", ctx=None) -> tuple[Recipe, Any]:
    """The run's recipe and its model with the ``tag`` checkpoint loaded, in inference setup."""
    run = Path(run_dir)
    if not run.is_dir():
        raise TrainError(f"Run folder '{run}' {'is a file' if run.exists() else 'does not exist'}; pass the "
                         f"runs/NAME folder of a gluontl finetune run.")
    if not (run / "recipe.yaml").is_file():
        raise TrainError(f"'{run}' is not a run folder (no recipe.yaml); pass runs/NAME.")
    recipe = load_recipe(run / "recipe.yaml")
    ckpts = run / "checkpoints"
    if not (ckpts / f"{tag}.json").is_file():
        other = " or use --checkpoint last" if tag != "last" and (ckpts / "last.json").is_file() else ""
        raise TrainError(f"Run '{run}' has no '{tag}' checkpoint ({ckpts / tag}.json is missing): it stopped before "
                         f"finishing an epoch. Continue it with `gluontl finetune --resume {run}`{other}.")
    checkpoint.load(ckpts, tag)
    if recipe.task == "detection":
        from ..detect.runs import load_detector

        return recipe, load_detector(run, recipe, tag, ctx)
    # The checkpoint holds every parameter: skip the recipe's weights file (it may be gone).
    bare = recipe.model_copy(update={"model": recipe.model.model_copy(update={"weights": None})})
    prep = prepare(bare, ctx=ctx, apply=False)
    checkpoint.restore_into(run / "checkpoints", tag, prep.block, None, ctx)
    prep.block.hybridize(static_alloc=True, static_shape=True)  # the same numbers, ~1.2x less CPU (EfficientNet-Lite0)
    return recipe, prep.block


def finetune_recipe(recipe: Path | None, set_: list[str] | None, resume: Path | None,
                    start: Path | None) -> Recipe:
    """The recipe ``finetune`` trains with these options (``gluontl launch`` reads it too, to make
    the recipe's pretrained weights once before it starts the workers); ``start`` is --init-from."""
    if resume is not None and not (resume / "recipe.yaml").is_file():
        raise GluontlError(f"--resume {resume}: not a run folder (no recipe.yaml). Pass runs/NAME of an earlier run.")
    if resume is not None and not (resume / "checkpoints" / "last.json").is_file():
        raise GluontlError(f"--resume {resume}: the run has no checkpoint (checkpoints/last.json) to continue "
                           f"from; start it again with --recipe {resume / 'recipe.yaml'}.")
    if recipe is None and resume is None:
        raise GluontlError("finetune needs --recipe FILE (or --resume runs/NAME to continue a run).")
    if start is not None and resume is not None:
        raise GluontlError(f"--init-from starts a new run and --resume continues one; to continue {resume} drop "
                           f"--init-from, to start from it use --init-from {resume} without --resume.")
    r = load_recipe(resume / "recipe.yaml" if resume is not None and recipe is None else recipe, set_)
    return init_from(r, start) if start is not None else r


def init_from(recipe: Recipe, run: str | Path) -> Recipe:
    """``recipe`` starting from another run's checkpoint (``RUN``, ``RUN/best``, ``RUN/last``):
    a new run, every parameter restored from it by name (``model.restore.only`` and
    ``prefix_map`` were for the original weights file, so they are cleared), a fresh optimizer."""
    from ..recipe import parse_recipe

    if run_weights(run) is None:
        raise TrainError(f"--init-from {run}: not a run folder (no recipe.yaml). Pass runs/NAME (its best "
                         f"checkpoint), runs/NAME/best or runs/NAME/last.")
    data = recipe.as_written()
    data["model"].update(weights=str(Path(run).resolve()), weights_from=None, pretrained=False, random_init=False)
    data["model"]["restore"].update(only=[], prefix_map={})
    return parse_recipe(data, origin=f"--init-from {run}")


def evaluate(run_dir: str | Path, split: str = "val", tag: str = "best") -> dict[str, Any]:
    from .data import load_split
    from ..tasks.classification import evaluate_loader

    recipe, net = load_run(run_dir, tag)
    if recipe.task == "detection":
        from ..detect import runs as detect_runs

        return detect_runs.evaluate(run_dir, recipe, net, split)
    ds = load_split(recipe_data(recipe, run_dir), split)
    loader = mx.gluon.data.DataLoader(ds, batch_size=recipe.data.batch_size, shuffle=False)
    with mx.autograd.predict_mode():
        out = evaluate_loader(net, loader, [mx.cpu()], len(ds.class_names), mx.gluon.loss.SoftmaxCrossEntropyLoss())
    out["class_names"] = ds.class_names
    out["images"] = len(ds)
    return out


def predict(run_dir: str | Path, images: list[str], topk: int = 5, tag: str = "best") -> list[dict[str, Any]]:
    """Top-``topk`` (class, probability) per image with the run's ``tag`` checkpoint."""
    from .transforms import load_images, load_preprocess

    decoded = load_images(images)  # a bad image fails before the model loads
    recipe, net = load_run(run_dir, tag)
    prep, names = load_preprocess(stored_card(run_dir, recipe))
    results = []
    for path, image in zip(images, decoded):
        with mx.autograd.predict_mode():
            prob = mx.nd.softmax(net(mx.nd.array(prep(image)[None]))).asnumpy()[0]
        results.append(_ranked(path, prob, names, topk))
    return results


def predict_detections(run_dir: str | Path, images: list[str], out_dir: str | Path | None = None,
                       score_thresh: float = 0.5, tag: str = "best") -> tuple[list[dict[str, Any]], Path]:
    """A detection run's detections per image (original pixels), drawn into images beside a
    detections.json in ``out_dir`` (default RUN/predictions)."""
    from ..detect import runs as detect_runs
    from .transforms import load_images

    load_images(images)  # a bad image fails before the model loads
    recipe, net = load_run(run_dir, tag)
    return detect_runs.predict(run_dir, recipe, net, images, out_dir, score_thresh)


def predict_onnx(onnx_path: str | Path, images: list[str], topk: int = 5) -> list[dict[str, Any]]:
    """:func:`predict` with an exported ONNX file in onnxruntime, preprocessing and class names
    from the file's metadata alone (what a deployment has)."""
    from ..export.verify import ort_session
    from .transforms import load_images, onnx_preprocess

    path = Path(onnx_path)
    prep, names = onnx_preprocess(path)  # no metadata: refused before any work
    decoded = load_images(images)
    session = ort_session(path, f"'{path}'")
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if len(inputs) != 1 or len(inputs[0].shape) != 4:
        raise ExportError(f"'{path}' takes inputs {[(i.name, i.shape) for i in inputs]}; predict feeds one "
                          f"N x C x H x W image batch. Predict with the run folder, or export the run again.")
    results = []
    for name, image in zip(images, decoded):
        x = prep(image)[None]
        want = inputs[0].shape[1:]
        if any(isinstance(w, int) and w != d for w, d in zip(want, x.shape[1:])):
            raise ExportError(f"'{path}' takes {inputs[0].name} of shape {inputs[0].shape} but its recorded "
                              f"preprocessing makes {list(x.shape)} from '{name}'; the metadata does not belong "
                              f"to this graph. Export the run again.")
        try:
            logits = np.asarray(session.run([outputs[0].name], {inputs[0].name: x})[0], np.float64)
        except Exception as err:  # onnxruntime's errors share no base class
            raise ExportError(f"onnxruntime cannot run '{path}' on '{name}' ({short_reason(err)}); predict feeds "
                              f"one float32 image at a time. Predict with the run folder, or export the run "
                              f"again.") from None
        if logits.shape != (1, len(names)):
            raise ExportError(f"'{path}' outputs {outputs[0].name} of shape {list(logits.shape)}, but its "
                              f"metadata lists {len(names)} classes; export the run again.")
        prob = np.exp(logits[0] - logits[0].max())
        results.append(_ranked(name, prob / prob.sum(), names, topk))
    return results


def _ranked(image: str, prob: np.ndarray, names: list[str], topk: int) -> dict[str, Any]:
    order = np.argsort(-prob, kind="stable")[: min(topk, len(prob))]
    return {"image": str(image), "top": [(names[i], float(prob[i])) for i in order]}


def plot(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """PNG of loss, train/validation accuracy and learning-rate curves from metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..atomic import atomic_write
    from .logs import read_metrics

    run = Path(run_dir)
    path = run / "metrics.jsonl"
    if not path.is_file():
        what = "has no metrics.jsonl" if run.is_dir() else "is a file" if run.exists() else "does not exist"
        raise TrainError(f"'{run}' {what}; plot reads the metrics.jsonl gluontl finetune writes into a run "
                         f"folder: pass runs/NAME.")
    try:
        rows = read_metrics(path)
    except (OSError, UnicodeDecodeError) as e:
        raise TrainError(f"'{path}' is not a readable metrics log ({e}).") from None
    steps = _numeric_rows(rows, "step", "loss", "lr")
    detection = bool(_numeric_rows(rows, "val_map50"))
    epochs = _numeric_rows(rows, "step", "epoch", *(("val_map50",) if detection else ("val_loss", "val_top1")))
    if not steps and not epochs:
        raise TrainError(f"'{path}' has no step or epoch rows yet; plot after the run has logged some steps.")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=0.8, label="train (step)")
    if not detection:
        axes[0].plot([r["step"] for r in epochs], [r["val_loss"] for r in epochs], "o-", label="val")
    axes[0].set(title="loss", xlabel="step")
    axes[0].legend()
    shown = (("val_map50", "val mAP@0.5"), ("val_map", "val mAP@[.5:.95]")) if detection else (("val_top1", "val top-1"),)
    for key, label in shown:
        axes[1].plot([r["epoch"] for r in epochs], [r[key] for r in epochs], "o-", label=label)
    if epochs and "val_top5" in epochs[0]:
        axes[1].plot([r["epoch"] for r in epochs], [r["val_top5"] for r in epochs], "o-", label="val top-5")
    trained = _numeric_rows(epochs, "train_acc")  # runs from before train_acc have none
    if trained:
        axes[1].plot([r["epoch"] for r in trained], [r["train_acc"] for r in trained], "o--", label="train top-1")
    axes[1].set(title="mAP" if detection else "accuracy", xlabel="epoch", ylim=(0, 1.02))
    axes[1].legend()
    axes[2].plot([r["step"] for r in steps], [r["lr"] for r in steps])
    axes[2].set(title="learning rate", xlabel="step")
    fig.suptitle(run.name)
    fig.tight_layout()
    target = Path(out) if out else run / "curves.png"
    atomic_write(target, lambda tmp: fig.savefig(tmp, format="png", dpi=90), TrainError)
    plt.close(fig)
    if detection and (run / "checkpoints" / "best.json").is_file():
        evaluate(run)  # per-class precision/recall curves of the best checkpoint: RUN/pr_curves-val.png
    return target


def _numeric_rows(rows: list[Any], *keys: str) -> list[dict[str, Any]]:
    return [r for r in rows if isinstance(r, dict) and all(isinstance(r.get(k), (int, float)) for k in keys)]


def export_run(run_dir: str | Path, out_dir: str | Path | None = None, *, formats: list[str] | None = None,
               tag: str = "best", force: bool = False, export: ExportSpec | Mapping[str, Any] | None = None
               ) -> list[Path]:
    """Export a run's checkpoint as the recipe's ``export:`` section says (or ``export``, an
    ``ExportSpec`` or a dict of its keys, in its place), verified on real val images; into
    ``RUN/export/`` unless ``out_dir`` says where."""
    from ..export.exporters import export_block
    from .data import load_split

    recipe, net = load_run(run_dir, tag)
    if export is not None:
        spec = as_spec(export, ExportSpec, "export", ExportError, "{'formats': ['onnx'], 'opset': 13}",
                       "It takes the keys of a recipe's export section (see docs/export.md).")
        recipe = recipe.model_copy(update={"export": spec})
    if recipe.task == "detection":
        from ..detect import runs as detect_runs

        return detect_runs.export(run_dir, recipe, net, out_dir, formats or list(recipe.export.formats), force)
    spec = recipe.export
    name = export_input_name(recipe)
    card = stored_card(run_dir, recipe)
    card = {**card, "preprocess": {**card["preprocess"], "input": {**card["preprocess"]["input"], "name": name}}}
    sample = None
    if recipe.data is not None:
        ds = load_split(recipe.data, recipe.data.val)
        sample = {name: np.stack([ds[i][0] for i in range(min(8, len(ds)))]).astype(np.float32)}
    return export_block(net, out_dir or Path(run_dir) / "export", recipe.name, {name: (1, *recipe.model.input_shape)},
                        formats=formats or list(spec.formats), opset=spec.opset, rtol=spec.rtol, lean=spec.lean,
                        force=force, sample=sample, output_names=spec.output_names, card=card)
