"""Using a finished run folder, whatever its task: reload its model, evaluate, predict (also with
its ONNX export), plot, export. What differs between tasks is behind ``gluontl.tasks``."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import ExportError, GluontlError, TrainError
from ..metrics import find_metric
from ..recipe import ExportSpec, QuantizeSpec, Recipe, as_spec, load_recipe
from ..runfolder import RunFolder, run_weights
from ..tasks import PredictOptions, Report, every_curve, get_task, onnx_task
from ..data import checkpoint


def load_run(run_dir: str | Path, tag: str = "best", ctx=None) -> tuple[Recipe, Any]:
    """The run's recipe and its model with the ``tag`` checkpoint loaded, in inference setup."""
    run, rf = Path(run_dir), RunFolder(run_dir)
    if not run.is_dir():
        raise TrainError(f"Run folder '{run}' {'is a file' if run.exists() else 'does not exist'}; pass the "
                         f"runs/NAME folder of a gluontl finetune run.")
    if not rf.is_run():
        raise TrainError(f"'{run}' is not a run folder (no {rf.RECIPE}); pass runs/NAME.")
    recipe = load_recipe(rf.recipe_path)
    if not rf.has_checkpoint(tag):
        other = " or use --checkpoint last" if tag != "last" and rf.has_checkpoint("last") else ""
        raise TrainError(f"Run '{run}' has no '{tag}' checkpoint ({rf.checkpoint(tag)} is missing): it stopped before "
                         f"finishing an epoch. Continue it with `gluontl finetune --resume {run}`{other}.")
    checkpoint.load(rf.checkpoints_dir, tag)
    return recipe, get_task(recipe).load(run, recipe, tag, ctx)


def finetune_recipe(recipe: Path | None, set_: list[str] | None, resume: Path | None,
                    start: Path | None) -> Recipe:
    """The recipe ``finetune`` trains with these options (``gluontl launch`` reads it too, to make
    the recipe's pretrained weights once before it starts the workers); ``start`` is --init-from."""
    rf = RunFolder(resume) if resume is not None else None
    if rf is not None and not rf.is_run():
        raise GluontlError(f"--resume {resume}: not a run folder (no {rf.RECIPE}). Pass runs/NAME of an earlier run.")
    if rf is not None and not rf.has_checkpoint("last"):
        raise GluontlError(f"--resume {resume}: the run has no checkpoint "
                           f"({rf.checkpoint('last').relative_to(rf.path)}) to continue "
                           f"from; start it again with --recipe {rf.recipe_path}.")
    if recipe is None and resume is None:
        raise GluontlError("finetune needs --recipe FILE (or --resume runs/NAME to continue a run).")
    if start is not None and resume is not None:
        raise GluontlError(f"--init-from starts a new run and --resume continues one; to continue {resume} drop "
                           f"--init-from, to start from it use --init-from {resume} without --resume.")
    r = load_recipe(rf.recipe_path if rf is not None and recipe is None else recipe, set_)
    return init_from(r, start) if start is not None else r


def init_from(recipe: Recipe, run: str | Path) -> Recipe:
    """``recipe`` starting from another run's checkpoint (``RUN``, ``RUN/best``, ``RUN/last``):
    a new run, every parameter restored from it by name (``model.restore.only`` and
    ``prefix_map`` were for the original weights file, so they are cleared), a fresh optimizer."""
    from ..recipe import parse_recipe

    if run_weights(run) is None:
        raise TrainError(f"--init-from {run}: not a run folder (no {RunFolder.RECIPE}). Pass runs/NAME (its best "
                         f"checkpoint), runs/NAME/best or runs/NAME/last.")
    data = recipe.as_written()
    data["model"].update(weights=str(Path(run).resolve()), weights_from=None, pretrained=False, random_init=False)
    data["model"]["restore"].update(only=[], prefix_map={}, type=None, reuse={})  # the run's own classes, whole
    return parse_recipe(data, origin=f"--init-from {run}")


def evaluate(run_dir: str | Path, split: str = "val", tag: str = "best", tta: str | None = None) -> dict[str, Any]:
    """The run's task metrics of checkpoint ``tag`` on ``split`` (``tta``: over views, gluontl.data.tta)."""
    return evaluate_report(run_dir, split, tag, tta).values


def evaluate_report(run_dir: str | Path, split: str = "val", tag: str = "best", tta: str | None = None) -> Report:
    recipe, net = load_run(run_dir, tag)
    if tta is not None:
        _tta_task(recipe.task, tta)
    return get_task(recipe).evaluate_run(Path(run_dir), recipe, net, split, tag, tta)


def _tta_task(task: str, tta: str) -> None:
    from ..data.tta import views
    from ..errors import DataError
    from ..task_registry import TASKS

    if not TASKS[task].tta:
        raise DataError(f"--tta {tta}: test-time augmentation averages a classifier's probabilities; this is a "
                        f"{task} run. Leave --tta out.")
    views(tta)  # a bad value fails before any work


def predict(source: str | Path, images: list[str], topk: int = 5, tag: str = "best", *,
            out: str | Path | None = None, score: float = 0.25, tta: str | None = None) -> list[dict[str, Any]]:
    """One record per image, as the task of ``source`` answers: a run folder's ``tag`` checkpoint
    in MXNet, or an exported ONNX file in onnxruntime with the preprocessing and class names
    its metadata records (what a deployment has). Tasks that draw write into ``out``."""
    opts = PredictOptions(topk=topk, score=score, out=Path(out) if out is not None else None, tag=tag, tta=tta)
    return predict_report(Path(source), [str(i) for i in images], opts).values["rows"]


def predict_report(source: Path, images: list[str], opts: PredictOptions) -> Report:
    from ..data.transforms import load_images

    from ..export.openvino_ir import is_ir

    if not source.is_dir() or is_ir(source):  # an ONNX file, or an OpenVINO IR (its folder or its .xml)
        task = onnx_task(source)
        if opts.tta is not None:
            _tta_task(task.name, opts.tta)
        return task.predict_onnx(source, images, opts)
    load_images(images)  # a bad image fails before the model loads
    recipe, net = load_run(source, opts.tag)
    if opts.tta is not None:
        _tta_task(recipe.task, opts.tta)
    return get_task(recipe).predict_run(source, recipe, net, images, opts)


def plot(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """PNG of loss, the task's validation curves and the learning rate from the run's metrics log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..atomic import atomic_write
    from .logs import read_metrics

    run, rf = Path(run_dir), RunFolder(run_dir)
    path = rf.metrics_path
    if not path.is_file():
        what = f"has no {rf.METRICS}" if run.is_dir() else "is a file" if run.exists() else "does not exist"
        raise TrainError(f"'{run}' {what}; plot reads the {rf.METRICS} gluontl finetune writes into a run "
                         f"folder: pass runs/NAME.")
    try:
        rows = read_metrics(path)
    except (OSError, UnicodeDecodeError) as e:
        raise TrainError(f"'{path}' is not a readable metrics log ({e}).") from None
    curves = get_task(load_recipe(rf.recipe_path)).curves if rf.is_run() else every_curve()
    steps = _numeric_rows(rows, "step", "loss", "lr")
    epochs = _numeric_rows(rows, "step", "epoch")
    shown = [(key, _title(key), kept) for key in curves if (kept := _numeric_rows(epochs, key))]
    if not steps and not shown:
        raise TrainError(f"'{path}' has no step or epoch rows yet; plot after the run has logged some steps.")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].plot([r["step"] for r in steps], [r["loss"] for r in steps], lw=0.8, label="train (step)")
    validated = _numeric_rows(epochs, "val_loss")
    if validated:
        axes[0].plot([r["step"] for r in validated], [r["val_loss"] for r in validated], "o-", label="val")
    axes[0].set(title="loss", xlabel="step")
    axes[0].legend()
    for key, label, kept in shown:
        axes[1].plot([r["epoch"] for r in kept], [r[key] for r in kept], "o--" if key.startswith("train") else "o-",
                     label=label)
    axes[1].set(title="validation", xlabel="epoch", ylim=(0, 1.02))
    if shown:
        axes[1].legend()
    axes[2].plot([r["step"] for r in steps], [r["lr"] for r in steps])
    axes[2].set(title="learning rate", xlabel="step")
    fig.suptitle(run.name)
    fig.tight_layout()
    target = Path(out) if out else rf.curves_path
    atomic_write(target, lambda tmp: fig.savefig(tmp, format="png", dpi=90), TrainError)
    plt.close(fig)
    return target


def _title(key: str) -> str:
    """A curve's legend: its metric's registered title (a key no metric has: the key itself)."""
    metric = find_metric(key)
    return metric.title if metric else key


def _numeric_rows(rows: list[Any], *keys: str) -> list[dict[str, Any]]:
    return [r for r in rows if isinstance(r, dict) and all(isinstance(r.get(k), (int, float)) for k in keys)]


def export_run(run_dir: str | Path, out_dir: str | Path | None = None, *, formats: list[str] | None = None,
               tag: str = "best", force: bool = False, export: ExportSpec | Mapping[str, Any] | None = None,
               int8: bool = False, echo: Callable[[str], None] | None = None) -> list[Path]:
    """Export a run's checkpoint as the recipe's ``export:`` section says (or ``export``, an
    ``ExportSpec`` or a dict of its keys, in its place), verified on real val images; into
    ``RUN/export/`` unless ``out_dir`` says where. ``int8`` (or ``export.quantize`` set) adds
    ``NAME.int8.onnx`` (see gluontl.export.quantize); ``echo`` prints its choices and numbers. The
    answer lists the written paths and is an ``export.artifacts.Exported``: ``.artifacts`` (format,
    precision, files, verdict) and ``.refused`` (an int8 model whose verdict failed, with its numbers)."""
    from ..export.registry import check_formats

    if formats is not None:
        check_formats(formats, "formats")  # an unknown one, or one whose extra is missing: before the model loads
    recipe, net = load_run(run_dir, tag)
    if export is not None:
        spec = as_spec(export, ExportSpec, "export", ExportError, "{'formats': ['onnx'], 'opset': 13}",
                       "It takes the keys of a recipe's export section (see docs/export.md).")
        recipe = recipe.model_copy(update={"export": spec})
    run = Path(run_dir)
    check_formats(formats or list(recipe.export.formats), "export.formats")  # the recipe's: is the extra there?
    quantize = recipe.export.quantize or (QuantizeSpec() if int8 else None)
    return get_task(recipe).export_run(run, recipe, net, Path(out_dir) if out_dir else RunFolder(run).export_dir,
                                       formats or list(recipe.export.formats), force, quantize, echo or print)
