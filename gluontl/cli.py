"""Command line: thin typer layer over the API; user errors become exit code 2 and one paragraph."""
from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path
from typing import List, Optional

import typer

from .errors import GluontlError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="gluontl: parameter-granular fine-tuning for MXNet Gluon.")

RecipeOpt = typer.Option(..., "--recipe", "-r", help="YAML recipe (see recipes/)")
SetOpt = typer.Option(None, "--set", help="override a recipe key, e.g. --set train.epochs=3")


@app.command()
def plan(recipe: Path = RecipeOpt, set_: Optional[List[str]] = SetOpt,
         as_json: bool = typer.Option(False, "--json", help="print the plan as JSON")) -> None:
    """Show every parameter's training settings and the rule that decided each."""
    from .pipeline import prepare
    from .recipe import load_recipe
    from .rules import format_plan
    from .train.cache import preview

    r = load_recipe(recipe, set_)
    pending = r.model.weights and r.model.weights_from and not Path(r.model.weights).is_file()
    if pending:  # planning must not cost a pretraining run
        r = r.model_copy(update={"model": r.model.model_copy(update={"weights": None})})
    prep = prepare(r, apply=False)
    cache = preview(r, prep.block, prep.plan)
    if as_json:
        out = prep.plan.to_json()
        out["restore"] = prep.restore.lines() if prep.restore else []
        out["feature_cache"] = cache
        typer.echo(json.dumps(out, indent=1))
        return
    if prep.restore:
        typer.echo("\n".join(prep.restore.lines()))
    typer.echo(format_plan(prep.plan))
    typer.echo(cache)
    if pending:
        typer.echo(f"note: weights not made yet; `gluontl finetune` makes them first with {r.model.weights_from}")


@app.command()
def finetune(recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="YAML recipe (with --resume: "
                                                   "defaults to the run's own recipe.yaml)"),
             set_: Optional[List[str]] = SetOpt,
             resume: Optional[Path] = typer.Option(None, help="continue this run folder (runs/NAME)"),
             runs: Path = typer.Option(Path("runs"), help="where run folders are created"),
             quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bars (CI, logs)")) -> None:
    """Fine-tune per the recipe: plan, train, checkpoint, log metrics to runs/NAME."""
    from .recipe import load_recipe
    from .train.loop import finetune as run

    if resume is not None and not (resume / "recipe.yaml").is_file():
        raise GluontlError(f"--resume {resume}: not a run folder (no recipe.yaml). Pass runs/NAME of an earlier run.")
    if recipe is None and resume is None:
        raise GluontlError("finetune needs --recipe FILE (or --resume runs/NAME to continue a run).")
    r = load_recipe(resume / "recipe.yaml" if resume is not None and recipe is None else recipe, set_)
    result = run(r, runs_root=runs, resume=resume, quiet=quiet)
    if result.stopped_early:
        typer.echo(f"stopped; resume with: gluontl finetune --resume {result.run_dir}")
    elif r.export.formats:
        from .train.runs import export_run

        for path in export_run(result.run_dir, force=resume is not None):
            typer.echo(f"exported {path} (verified)" if path.suffix == ".onnx" else f"exported {path}")


@app.command()
def export(source: str = typer.Argument(..., help="run folder (runs/NAME) or model spec (zoo:/symbol:/onnx:)"),
           fmt: str = typer.Option("both", "--format", help="symbol, onnx or both"),
           out: Path = typer.Option(Path("export"), "--out", help="output folder"),
           force: bool = typer.Option(False, "--force", help="overwrite existing files"),
           input_shape: str = typer.Option("3,224,224", help="C,H,W for model specs (runs use their recipe)"),
           checkpoint: str = typer.Option("best", help="run checkpoint: best or last")) -> None:
    """Export a run or a model to MXNet symbol/params and/or ONNX, verified against onnxruntime."""
    formats = {"both": ["symbol", "onnx"], "symbol": ["symbol"], "onnx": ["onnx"]}.get(fmt)
    if formats is None:
        raise GluontlError(f"--format '{fmt}' is not one of symbol, onnx, both.")
    if Path(source).is_dir():
        from .train.runs import export_run

        paths = export_run(source, out, formats=formats, tag=checkpoint, force=force)
    else:
        from .recipe import ModelSpec
        from .sources import build_model
        from .train.runs import export_block

        shape = _shape(input_shape)
        block, _ = build_model(ModelSpec(source=source, input_shape=shape))
        name = Path(source.split(":", 1)[1]).stem.replace(".", "_") or "model"
        paths = export_block(block, out, name, shape, formats=formats, force=force)
    for p in paths:
        typer.echo(f"exported {p}")


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise GluontlError(f"--input-shape '{text}' must be comma-separated integers, e.g. 3,224,224.") from None


@app.command()
def inspect(model: str = typer.Argument(..., help="zoo:NAME, symbol:PREFIX or onnx:PATH"),
            input_shape: str = typer.Option("3,224,224", help="C,H,W (no batch) to resolve shapes"),
            classes: Optional[int] = typer.Option(None, help="zoo: rebuild the classifier for N classes"),
            nodes: bool = typer.Option(False, "--nodes", help="list cut points (nodes/units) with op and "
                                       "output shape, for surgery.cut_at / ignore / head.inputs"),
            as_json: bool = typer.Option(False, "--json")) -> None:
    """List a model's parameters with structural names, shapes, layer types and stages."""
    from .recipe import ModelSpec
    from .rules import format_plan, make_plan
    from .sources import build_model

    shape = _shape(input_shape)
    if nodes:
        from .surgery import list_nodes

        spec = ModelSpec(source=model, input_shape=shape)
        if model.startswith("onnx:"):  # shapes go to the file's own (first) input
            from .onnx import inspect_onnx

            spec = spec.model_copy(update={"input_name": inspect_onnx(model[5:]).inputs[0][0]})
        block, _ = build_model(spec, classes=classes)
        rows = list_nodes(block, shape)
        if as_json:
            typer.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
            return
        width = max(len(r.name) for r in rows)
        op_width = max(len(r.op) for r in rows)
        for r in rows:
            dims = "x".join(map(str, r.shape)) if r.shape else "?"
            typer.echo(f"{r.name:<{width}}  {r.op:<{op_width}}  {dims}")
        return
    if model.startswith("onnx:"):
        from .onnx import format_report, inspect_onnx

        typer.echo(format_report(inspect_onnx(model[5:])))
        return
    block, _ = build_model(ModelSpec(source=model, input_shape=shape), classes=classes)
    p = make_plan(block, [], input_shape=shape)
    if as_json:
        typer.echo(json.dumps(p.to_json()["params"], indent=1))
    else:
        typer.echo(format_plan(p))


@app.command()
def evaluate(run: Path = typer.Argument(..., help="run folder, e.g. runs/resnet18_freeze"),
             split: str = typer.Option("val", help="data split folder/name"),
             checkpoint: str = typer.Option("best", help="best or last")) -> None:
    """Loss, top-1 (top-5) and the confusion matrix of a run's checkpoint on a data split."""
    from .train.runs import evaluate as run_eval

    out = run_eval(run, split, checkpoint)
    typer.echo(f"{run} [{checkpoint}] on {split} ({out['images']} images): loss {out['val_loss']:.4f} "
               f"top-1 {out['val_top1']:.4f}" + (f" top-5 {out['val_top5']:.4f}" if "val_top5" in out else ""))
    names = out["class_names"]
    width = max(5, *(len(n) for n in names))
    typer.echo("confusion (rows: true, columns: predicted)")
    typer.echo(" " * width + " " + " ".join(f"{n:>{width}}" for n in names))
    for n, row in zip(names, out["confusion"]):
        typer.echo(f"{n:>{width}} " + " ".join(f"{v:>{width}}" for v in row))


@app.command()
def predict(run: Path = typer.Argument(..., help="run folder"),
            images: List[Path] = typer.Argument(..., help="image files"),
            topk: int = typer.Option(5, help="how many classes to show")) -> None:
    """Top-k classes for image files with a run's best checkpoint."""
    from .train.runs import predict as run_predict

    for r in run_predict(run, [str(i) for i in images], topk):
        typer.echo(f"{r['image']}: " + ", ".join(f"{n} {p:.3f}" for n, p in r["top"]))


@app.command()
def plot(run: Path = typer.Argument(..., help="run folder"),
         out: Optional[Path] = typer.Option(None, help="PNG path (default RUN/curves.png)")) -> None:
    """Write a PNG of loss, accuracy and learning-rate curves from metrics.jsonl."""
    from .train.runs import plot as run_plot

    typer.echo(str(run_plot(run, out)))


@app.command()
def zoo(contains: str = typer.Argument("", help="only names containing this text")) -> None:
    """List the model-zoo names usable as zoo:NAME (GluonCV's zoo, which includes Gluon's)."""
    from .sources import zoo_names

    typer.echo("\n".join(n for n in zoo_names() if contains.lower() in n))


def main() -> None:
    from .threads import configure

    configure()
    try:
        app(standalone_mode=False)
    except GluontlError as e:
        _fail_plain(e)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        sys.exit(130)
    except typer.TyperException as e:  # usage errors: typer shows them like click does
        show = getattr(e, "show", None)
        if show is None:
            print(f"error: {e}", file=sys.stderr)
        else:
            show()
        sys.exit(2)


def _fail_plain(err: GluontlError) -> None:
    msg = " ".join(str(err).split())
    print("error: " + textwrap.fill(msg, width=100, subsequent_indent="       "), file=sys.stderr)
    sys.exit(err.exit_code)
