"""Using a finished run folder: reload its model, evaluate, predict, plot."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np

from ..errors import TrainError
from ..pipeline import prepare
from ..recipe import Recipe, load_recipe
from . import checkpoint


def load_run(run_dir: str | Path, tag: str = "best", ctx=None) -> tuple[Recipe, Any]:
    """The run's recipe and its model with the ``tag`` checkpoint loaded, in inference setup."""
    run = Path(run_dir)
    if not (run / "recipe.yaml").is_file():
        raise TrainError(f"'{run}' is not a run folder (no recipe.yaml); pass runs/NAME.")
    recipe = load_recipe(run / "recipe.yaml")
    checkpoint.load(run / "checkpoints", tag)
    # The checkpoint holds every parameter: skip the recipe's weights file (it may be gone).
    bare = recipe.model_copy(update={"model": recipe.model.model_copy(update={"weights": None})})
    prep = prepare(bare, ctx=ctx, apply=False)
    checkpoint.restore_into(run / "checkpoints", tag, prep.block, None, ctx)
    prep.block.hybridize(static_alloc=True)
    return recipe, prep.block


def evaluate(run_dir: str | Path, split: str = "val", tag: str = "best") -> dict[str, Any]:
    from .data import load_split
    from .loop import evaluate_loader

    recipe, net = load_run(run_dir, tag)
    ds = load_split(recipe.data, split)
    loader = mx.gluon.data.DataLoader(ds, batch_size=recipe.data.batch_size, shuffle=False)
    with mx.autograd.predict_mode():
        out = evaluate_loader(net, loader, [mx.cpu()], len(ds.class_names), mx.gluon.loss.SoftmaxCrossEntropyLoss())
    out["class_names"] = ds.class_names
    out["images"] = len(ds)
    return out


def predict(run_dir: str | Path, images: list[str], topk: int = 5, tag: str = "best") -> list[dict[str, Any]]:
    from .data import load_split  # noqa: F401  (class names come from the training split)
    from .transforms import build, load_image

    recipe, net = load_run(run_dir, tag)
    names = load_split(recipe.data, recipe.data.train).class_names
    transform = build(recipe.data.val_transform, False)
    results = []
    for path in images:
        x = mx.nd.array(transform(load_image(path))[None])
        with mx.autograd.predict_mode():
            prob = mx.nd.softmax(net(x)).asnumpy()[0]
        order = np.argsort(-prob)[: min(topk, len(prob))]
        results.append({"image": str(path), "top": [(names[i], float(prob[i])) for i in order]})
    return results


def plot(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """PNG of loss, validation accuracy and learning-rate curves from metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..atomic import atomic_write

    run = Path(run_dir)
    rows = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l.strip()]
    steps = [r for r in rows if "loss" in r]
    epochs = [r for r in rows if "epoch" in r]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=0.8, label="train (step)")
    axes[0].plot([r["step"] for r in epochs], [r["val_loss"] for r in epochs], "o-", label="val")
    axes[0].set(title="loss", xlabel="step")
    axes[0].legend()
    axes[1].plot([r["epoch"] for r in epochs], [r["val_top1"] for r in epochs], "o-", label="val top-1")
    if epochs and "val_top5" in epochs[0]:
        axes[1].plot([r["epoch"] for r in epochs], [r["val_top5"] for r in epochs], "o-", label="val top-5")
    axes[1].set(title="accuracy", xlabel="epoch", ylim=(0, 1.02))
    axes[1].legend()
    axes[2].plot([r["step"] for r in steps], [r["lr"] for r in steps])
    axes[2].set(title="learning rate", xlabel="step")
    fig.suptitle(run.name)
    fig.tight_layout()
    target = Path(out) if out else run / "curves.png"
    atomic_write(target, lambda tmp: fig.savefig(tmp, format="png", dpi=90), TrainError)
    plt.close(fig)
    return target


def export_block(block, out_dir: str | Path, name: str, input_shape: tuple[int, ...], *, formats: list[str],
                 input_name: str = "data", opset: int = 13, rtol: float = 1e-4, lean: bool = True,
                 force: bool = False, sample: np.ndarray | None = None) -> list[Path]:
    """Export to symbol/params and/or ONNX (verified against onnxruntime, on ``sample`` too)."""
    from ..export import export_onnx, export_symbol

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shapes = {input_name: (1, *input_shape)}
    written: list[Path] = []
    if "symbol" in formats:
        written += list(export_symbol(block, out / name, shapes, force=force))
    if "onnx" in formats:
        written.append(export_onnx(block, out / f"{name}.onnx", shapes, opset=opset, rtol=rtol, lean=lean,
                                   force=force, sample=None if sample is None else {input_name: sample}))
    return written


def export_run(run_dir: str | Path, out_dir: str | Path | None = None, *, formats: list[str] | None = None,
               tag: str = "best", force: bool = False) -> list[Path]:
    """Export a run's checkpoint as the recipe's ``export:`` section says, verified on real val images."""
    from .data import load_split

    recipe, net = load_run(run_dir, tag)
    spec = recipe.export
    sample = None
    if recipe.data is not None:
        ds = load_split(recipe.data, recipe.data.val)
        sample = np.stack([ds[i][0] for i in range(min(8, len(ds)))]).astype(np.float32)
    return export_block(net, out_dir or Path(run_dir) / "export", recipe.name, recipe.model.input_shape,
                        formats=formats or list(spec.formats), input_name=spec.input_names[0], opset=spec.opset,
                        rtol=spec.rtol, lean=spec.lean, force=force, sample=sample)
