"""Command line: thin typer layer over the API.

Exit codes: 0 done; 2 bad input (one paragraph on stderr, never a traceback); 130/143
finetune stopped by SIGINT/SIGTERM after checkpointing; 3 a distributed worker's step timed out
(gluontl.dist.backend.WATCHDOG_EXIT); 1 a bug (GLUONTL_DEBUG=1 shows it).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, List, NoReturn, Optional, Sequence

import typer

from .errors import GluontlError, Interrupted, ModelSourceError, short_reason
from .runfolder import RunFolder

if TYPE_CHECKING:  # MXNet is imported only by the commands that need it
    from mxnet.gluon import HybridBlock

    from .recipe import ModelSpec

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="gluontl: parameter-granular fine-tuning for MXNet Gluon.")

RecipeOpt = typer.Option(..., "--recipe", "-r", help="YAML recipe (see recipes/)")
SetOpt = typer.Option(None, "--set", help="override a recipe key, e.g. --set train.epochs=3; list items "
                      "count from 1 as in the plan: --set rules.2.lr_mult=0.1")
ShapeOpt = typer.Option(None, "--input-shape", help="C,H,W of the first input, or NAME=1,C,H,W for input NAME "
                        "(repeatable). Default: the model's own (ONNX: from the file; zoo: its family's size, "
                        "e.g. 3,299,299 for inceptionv3, 3,512,512 for ssd_512_*; symbol: 3,224,224)")
CheckpointOpt = typer.Option("best", help="run checkpoint: best or last")
CHECKPOINTS = ("best", "last")
MAX_INPUT_ELEMENTS = 1 << 28  # 1 GiB of float32 per input: beyond, a typo (3,22400,224), not a model


@app.command()
def plan(recipe: Path = RecipeOpt, set_: Optional[List[str]] = SetOpt,
         as_json: bool = typer.Option(False, "--json", help="print the plan as JSON")) -> None:
    """Show every parameter's training settings and the rule that decided each."""
    from .recipe import load_recipe, resolve_backend

    r = resolve_backend(load_recipe(recipe, set_))  # before MXNet is imported: a bad recipe fails at once
    from .rules import format_plan
    from .tasks import get_task, transform_lines
    from .data.guards import plan_flags

    pending = r.model.weights and r.model.weights_from and not Path(r.model.weights).is_file()
    weights = f"weights: {r.model.weights} (not made yet)"
    if pending:  # planning must not cost a pretraining run
        r = r.model_copy(update={"model": r.model.model_copy(update={
            "weights": None, "restore": r.model.restore.model_copy(update={"type": None, "reuse": {}})})})
    task = get_task(r)
    prep = task.prepare(r, apply=False)
    if r.train.distributed.backend != "none" and r.train.distributed.batch_norm == "frozen":
        from .rules import freeze_bn_stats

        prep.plan = freeze_bn_stats(prep.plan, "train.distributed.batch_norm")  # what workers of a job train
    cache, notes, extra = task.plan_notes(r, prep)
    # what the guards of finetune will say about these weights and rules
    weights, flags = (weights, []) if pending else plan_flags(r, prep)
    transforms = task.transforms(r) if r.data is not None else None
    if as_json:
        out = prep.plan.to_json()
        out["weights"] = weights
        out["restore"] = prep.restore.lines() if prep.restore else []
        out["feature_cache"] = cache
        out["transforms"] = transforms
        out["guards"] = flags
        out.update(extra)
        typer.echo(json.dumps(out, indent=1))
        return
    typer.echo(weights)
    if prep.restore:
        typer.echo("\n".join(prep.restore.lines()))
    typer.echo(format_plan(prep.plan))
    typer.echo(cache)
    for line in notes:
        typer.echo(line)
    for line in transform_lines(transforms) if transforms else []:
        typer.echo(line)
    for line in flags:
        typer.echo(line)
    if pending:
        typer.echo(f"note: weights not made yet; `gluontl finetune` makes them first with {r.model.weights_from}")


@app.command()
def finetune(recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="YAML recipe (with --resume: "
                                                   f"defaults to the run's own {RunFolder.RECIPE})"),
             set_: Optional[List[str]] = SetOpt,
             resume: Optional[Path] = typer.Option(None, help="continue this run folder (runs/NAME)"),
             runs: Path = typer.Option(Path("runs"), help="where run folders are created"),
             init_from: Optional[Path] = typer.Option(None, "--init-from", help="start a new run from another "
                                                      "run's checkpoint: runs/NAME (best), runs/NAME/last"),
             quiet: bool = typer.Option(False, "--quiet", "-q", help="only one line per epoch and the result "
                                        "(progress bars show only on a terminal anyway)"),
             stop_after_steps: Optional[int] = typer.Option(None, "--stop-after-steps", min=1, help="checkpoint and "
                                                            "stop after this many optimizer steps (a time-boxed "
                                                            "slot); --resume RUN continues exactly")) -> None:
    """Fine-tune per the recipe: plan, train, checkpoint, log metrics to runs/NAME.

    --resume RUN --set train.epochs=N extends a run to N epochs."""
    from .train.runs import finetune_recipe

    r = finetune_recipe(recipe, set_, resume, init_from)  # --init-from already applied
    from .api import finetune as run

    # SIGINT/SIGTERM: Interrupted, see main()
    result = run(r, runs_root=runs, resume=resume, quiet=quiet, stop_after_steps=stop_after_steps)
    if result.stopped_early:  # --stop-after-steps, or another worker of the job was signalled
        if result.is_root:
            from .errors import resume_command

            why = f"after {stop_after_steps} steps" if stop_after_steps else "with the other workers"
            typer.echo(f"stopped {why}; continue with `{resume_command(result.run_dir, result.workers)}`")
        return
    _exported(result.exported)  # a distributed run: rank 0 writes the run folder and its export


@app.command("lr-find")
def lr_find(recipe: Path = RecipeOpt, set_: Optional[List[str]] = SetOpt,
            steps: int = typer.Option(100, min=20, help="optimizer steps of the exponential ramp"),
            start: float = typer.Option(1e-7, help="the ramp's first learning rate"),
            end: float = typer.Option(10.0, help="the learning rate the ramp heads for"),
            runs: Path = typer.Option(Path("runs"), help="the plot and record go to RUNS/NAME-lr-find/"),
            quiet: bool = typer.Option(False, "--quiet", "-q", help="only the result")) -> None:
    """fastai's learning-rate range test: train the recipe's model a few steps at growing learning
    rates (in memory; no weights are written), suggest one and plot the curve."""
    from .recipe import load_recipe

    r = load_recipe(recipe, set_)
    from .api import lr_find as run

    found = run(r, runs_root=runs, steps=steps, start=start, end=end, quiet=quiet)
    typer.echo(f"suggested lr {found.suggested:.3g} (minimum; steep {found.steep:.3g}, valley {found.valley:.3g}); "
               f"{len(found.lrs)} steps, {found.stopped}; {found.seconds:.1f}s")
    typer.echo(f"plot: {found.plot}")


@app.command()
def sweep(recipe: Optional[Path] = typer.Option(None, "--recipe", "-r", help="YAML recipe the trials vary"),
          space: Optional[Path] = typer.Option(None, "--space", help="YAML space: dotted recipe keys to "
                                               "distributions, e.g. train.lr: {log_uniform: [1.0e-4, 1.0e-1]}"),
          set_: Optional[List[str]] = SetOpt,
          trials: int = typer.Option(16, "--trials", help="complete or pruned trials to run"),
          jobs: int = typer.Option(1, "--jobs", min=1, help="processes working on the study at once"),
          timeout: Optional[float] = typer.Option(None, "--timeout", help="stop starting trials after S seconds"),
          storage: Optional[str] = typer.Option(None, "--storage", help="Optuna RDB URL (default: SQLite file in "
                                                "the sweep folder)"),
          sampler: str = typer.Option("tpe", "--sampler", help="tpe, random, grid or cmaes"),
          pruner: str = typer.Option("median", "--pruner", help="median, halving, hyperband or none"),
          root: Path = typer.Option(Path("sweeps"), "--sweeps", help="sweeps go to SWEEPS/NAME/"),
          resume: Optional[Path] = typer.Option(None, "--resume", help="continue sweeps/NAME"),
          show_: Optional[Path] = typer.Option(None, "--show", help="print the trial table of sweeps/NAME"),
          dashboard: bool = typer.Option(False, "--dashboard", help="serve optuna-dashboard on 127.0.0.1 while "
                                         "the sweep runs"),
          worker: Optional[Path] = typer.Option(None, "--worker", hidden=True),
          quiet: bool = typer.Option(False, "--quiet", "-q", help="only the trial lines")) -> None:
    """Search recipe settings with Optuna; trials with the same frozen prefix share one feature cache."""
    from .errors import SweepError
    from .recipe import load_recipe

    if show_ is not None:
        from .sweep.runner import show_table

        typer.echo(show_table(show_))
        return
    if worker is not None:
        from .sweep.runner import work

        work(worker, timeout)
        return
    if resume is not None:
        from .readers import read_yaml
        from .sweep.runner import resume as run_resume

        result = run_resume(resume, None if recipe is None else load_recipe(recipe, set_),
                            None if space is None else read_yaml(space, SweepError, "the sweep space"), jobs=jobs,
                            timeout=timeout, quiet=quiet, dashboard=dashboard)
    else:
        if recipe is None or space is None:
            raise SweepError("gluontl sweep needs --recipe R.yaml and --space S.yaml (or --resume sweeps/NAME, "
                             "or --show sweeps/NAME).")
        r = load_recipe(recipe, set_)
        from .sweep.runner import parse, sweep as run

        r, dims, data, origin = parse(r, space)
        result = run(r, dims, trials=trials, jobs=jobs, timeout=timeout, root=root, sampler=sampler, pruner=pruner,
                     storage_url=storage, quiet=quiet, space_data=data, origin=origin, dashboard=dashboard)
    typer.echo(f"sweep folder: {result.folder}")


@app.command()
def export(source: str = typer.Argument(..., help="run folder (runs/NAME) or model: NAME, PREFIX, PATH.onnx "
                                        "or zoo:/symbol:/onnx:"),
           fmt: str = typer.Option("both", "--format", help="symbol, onnx, openvino (OpenVINO IR, the "
                                   "[openvino] extra) or both (symbol and onnx)"),
           out: Path = typer.Option(Path("export"), "--out", help="output folder"),
           force: bool = typer.Option(False, "--force", help="overwrite existing files"),
           input_shape: Optional[List[str]] = ShapeOpt,
           checkpoint: str = CheckpointOpt,
           int8: bool = typer.Option(False, "--int8", help="also write NAME.int8.onnx (onnxruntime), "
                                     "NAME-int8-symbol.json + NAME-int8-0000.params (MXNet oneDNN) and/or "
                                     "NAME.int8-openvino/ (NNCF), a run's export only: calibrated on the run's "
                                     "images, each refused (the rest written) if top-1 (mAP, mIoU) drops by more "
                                     "than export.quantize.max_drop points on its validation split")) -> None:
    """Export a run or a model to MXNet symbol/params, ONNX and/or OpenVINO IR, each verified before it is
    written; a refused int8 model is named and the others are written (exit 2 only when int8 was asked
    for and none holds)."""
    from .export.registry import BOTH, check_formats, check_int8, formats as registered

    formats = check_formats(list(BOTH) if _choice(fmt, ["both", *registered()], "--format") == "both" else [fmt],
                            "--format")
    if int8:
        check_int8(formats)
    _choice(checkpoint, CHECKPOINTS, "--checkpoint")
    if Path(source).is_dir():
        from .train.runs import export_run

        if input_shape:
            raise GluontlError(f"--input-shape is for models; the run '{source}' exports at its recipe's "
                               f"model.input_shape. Drop --input-shape.")
        paths = export_run(source, out, formats=formats, tag=checkpoint, force=force, int8=int8, echo=typer.echo)
    else:
        if int8:
            raise GluontlError(f"--int8 calibrates on a run's images through its recorded preprocessing, and "
                               f"'{source}' is a model, not a run folder. Fine-tune it (a run with no trainable "
                               f"rule is enough) and export that run with --int8.")
        from .export.exporters import export_block

        spec, block, shapes = _model(source, input_shape)
        scheme, _, rest = spec.source.partition(":")
        name = (Path(rest).stem if scheme == "onnx" else Path(rest).name).replace(".", "_") or "model"
        paths = export_block(block, out, name, shapes, formats=formats, force=force)
    _exported(paths)


def _exported(paths: list[Path]) -> None:
    """Say what was written and how each artifact was checked, then name every refused one; exit 2
    when a precision asked for got no artifact at all (``Exported.failure``)."""
    from .export.artifacts import Exported
    from .export.registry import brief

    if not isinstance(paths, Exported):  # a run that exported nothing (stopped early, export=False)
        paths = Exported()
    listed = set()
    for a in paths.artifacts:
        for f in a.files:
            note = brief(a) if f == a.path else ""
            typer.echo(f"exported {f}{note}")
            listed.add(f)
    for p in paths:
        if p not in listed:
            typer.echo(f"int8 report {p}")
    unmet = paths.unmet()
    for r in paths.refused:
        if r not in unmet:  # the unmet ones are the exit-2 paragraph
            typer.echo(f"refused ({r.format} {r.precision}, the other files were written): {r.reason}", err=True)
    failure = paths.failure()
    if failure is not None:
        raise failure


def _choice(value: str, allowed: Sequence[str], option: str) -> str:
    if value not in allowed:
        raise GluontlError(f"{option} '{value}' is not one of {', '.join(allowed)}.")
    return value


def _shapes(values: Optional[List[str]]) -> dict[str | None, tuple[int, ...]]:
    """``--input-shape`` values by input name, batch first; None keys the ``C,H,W`` form (first input)."""
    shapes: dict[str | None, tuple[int, ...]] = {}
    for text in values or []:
        name, eq, dims = text.rpartition("=")
        key = name.strip() if eq else None
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            shape = ()
        shape = shape if key is not None else (1, *shape)
        if (eq and not key) or len(shape) < 2 or len(shape) > 6 or not all(0 < d <= 1 << 16 for d in shape):
            raise GluontlError(f"--input-shape '{text}' must be C,H,W (positive integers without the batch, e.g. "
                               f"3,224,224) or NAME=1,C,H,W (batch first, e.g. data=1,3,224,224).")
        if math.prod(shape) > MAX_INPUT_ELEMENTS:
            raise GluontlError(f"--input-shape '{text}' asks for an input of more than {MAX_INPUT_ELEMENTS:,} "
                               f"values (over 1 GiB); use the size the model was made for, e.g. 3,224,224.")
        if key in shapes:
            raise GluontlError(f"--input-shape gives {'C,H,W' if key is None else repr(key)} twice; "
                               f"give each input once.")
        shapes[key] = shape
    return shapes


def _model(text: str, input_shape: Optional[List[str]],
           classes: int | None = None) -> tuple[ModelSpec, HybridBlock, dict[str, tuple[int, ...]]]:
    """The model behind a CLI model argument, built at the ``--input-shape`` shapes (checked first)."""
    from .recipe import ModelSpec, resolve_source
    from .sources import build_model, input_shapes

    given = _shapes(input_shape)
    source = resolve_source(text)
    shapes = input_shapes(source, given)
    name, first = next(iter(shapes.items()))
    spec = ModelSpec(source=source, input_shape=first[1:], input_name=name)
    block, _ = build_model(spec, classes=classes, input_shapes=shapes)
    return spec, block, shapes


def _onnx_params(source: str, input_shape: Optional[List[str]], classes: int | None,
                 as_json: bool) -> tuple[object, str | None]:
    """An ONNX file's parameter table (text and JSON in one: the plan of no rules, with stages) and
    None, or None and why it cannot be listed (input sizes the file leaves open)."""
    from .errors import ModelSourceError
    from .rules import format_params, make_plan

    try:
        spec, block, shapes = _model(source, input_shape, classes)
    except ModelSourceError as e:
        return None, f"not listed: {e}"
    p = make_plan(block, [], input_shape=spec.input_shape if len(shapes) == 1 else None)
    return (p.to_json()["params"] if as_json else format_params(p)), None


@app.command()
def inspect(model: str = typer.Argument(..., help="NAME, PREFIX, PATH.onnx or zoo:/symbol:/onnx:"),
            input_shape: Optional[List[str]] = ShapeOpt,
            classes: Optional[int] = typer.Option(None, min=1, help="zoo: rebuild the classifier for N classes"),
            nodes: bool = typer.Option(False, "--nodes", help="list cut points (nodes/units) with op and "
                                       "output shape, for surgery.cut_at / ignore / head.inputs"),
            as_json: bool = typer.Option(False, "--json")) -> None:
    """List a model's parameters with structural names, shapes, layer types and stages."""
    from .recipe import resolve_source

    source = resolve_source(model)
    if source.startswith("onnx:") and not nodes:  # a report from the file alone: no shapes needed
        from .onnx import format_report, inspect_onnx
        from .sources import input_shapes

        if input_shape:  # not needed here, but a wrong name, rank or size is still worth saying
            input_shapes(source, _shapes(input_shape))
        report = inspect_onnx(source[5:])
        if not as_json:
            typer.echo(format_report(report))
        if report.problems:
            from .errors import OnnxImportError

            if as_json:
                typer.echo(json.dumps({"report": dataclasses.asdict(report), "params": None}, indent=1))
            raise OnnxImportError(f"{source[5:]} cannot be imported ({len(report.problems)} problem(s), listed "
                                  f"first in the report above): " + " ".join(report.problems))
        params, why = _onnx_params(source, input_shape, classes, as_json)
        if as_json:
            typer.echo(json.dumps({"report": dataclasses.asdict(report), "params": params,
                                   **({"params_note": why} if why else {})}, indent=1))
        else:
            typer.echo("parameters (names: the exporter's module paths where the file records them; the graph's "
                       "own name, in the mxnet name column, still matches in rules):")
            typer.echo(params if why is None else f"  {why}")
        return
    spec, block, shapes = _model(source, input_shape, classes)
    if nodes:
        from .surgery import list_nodes

        rows = list_nodes(block, spec.input_shape)
        if as_json:
            typer.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))
            return
        width = max(len(r.name) for r in rows)
        op_width = max(len(r.op) for r in rows)
        for r in rows:
            dims = "x".join(map(str, r.shape)) if r.shape else "?"
            typer.echo(f"{r.name:<{width}}  {r.op:<{op_width}}  {dims}")
        return
    from .rules import format_params, make_plan

    p = make_plan(block, [], input_shape=spec.input_shape if len(shapes) == 1 else None)
    if as_json:
        typer.echo(json.dumps(p.to_json()["params"], indent=1))
    else:
        typer.echo(format_params(p))


@app.command()
def bench(model: Path = typer.Argument(..., help="an exported .onnx or -symbol.json file, a folder of them, or "
                                       f"a run folder (its {RunFolder.EXPORT}/)"),
          int8: bool = typer.Option(False, "--int8", help="require an int8 partner (NAME.int8.onnx, "
                                    "NAME-int8-symbol.json) for every float file and compare the two"),
          batch: str = typer.Option("1,32", "--batch", help="batch sizes, comma-separated"),
          threads: int = typer.Option(1, "--threads", help="threads of every engine: onnxruntime's intra-op "
                                      "threads and MXNet's OpenMP threads (symbol files are timed in a process "
                                      "started with OMP_NUM_THREADS=N)"),
          repeat: int = typer.Option(20, "--repeat", help="timed runs per round, per file and batch (after 3 warm-up "
                                     "runs); rounds are added until the spread is small"),
          out: Optional[Path] = typer.Option(None, "--json", help=f"report path (default: {RunFolder.BENCH} "
                                             "beside the models)")) -> None:
    """Latency and throughput of exports, float against int8 (ONNX in onnxruntime, symbol/params in MXNet), with
    the CPU's flags."""
    try:
        batches = [int(b) for b in batch.split(",")]
    except ValueError:
        raise GluontlError(f"--batch '{batch}' is not a comma-separated list of batch sizes, e.g. 1,32.") from None
    from .export.bench import bench as run_bench, table

    report, path = run_bench(model, int8=int8, batches=batches, threads=threads, repeat=repeat, out=out)
    typer.echo(table(report))
    typer.echo(f"report: {path}")


TtaOpt = typer.Option(None, "--tta", help="classifiers: average probabilities over views: flip, five_crop, "
                      "ten_crop or scales=S1,S2,...")


@app.command()
def evaluate(run: Path = typer.Argument(..., help="run folder, e.g. runs/resnet18_freeze"),
             split: str = typer.Option("val", help="data split folder/name"),
             checkpoint: str = CheckpointOpt, tta: Optional[str] = TtaOpt) -> None:
    """The task's metrics of a run's checkpoint on a data split: loss, top-1 (top-5) and the confusion
    matrix; a multi-label run's per-class AP table; a detector's per-class AP table and PR curves; a
    segmenter's per-class IoU table."""
    from .train.runs import evaluate_report

    _choice(checkpoint, CHECKPOINTS, "--checkpoint")
    for line in evaluate_report(run, split, checkpoint, tta).lines:
        typer.echo(line)


@app.command()
def predict(model: Path = typer.Argument(..., help="run folder (runs/NAME) or a .onnx file a run's export wrote"),
            images: List[Path] = typer.Argument(..., help="image files"),
            topk: int = typer.Option(5, min=1, help="how many classes to show"),
            checkpoint: str = CheckpointOpt,
            as_json: bool = typer.Option(False, "--json", help="print the results as JSON (full precision)"),
            out: Optional[Path] = typer.Option(None, help="detectors, segmenters: folder for the drawn images "
                                               "and their JSON (default RUN/predictions, NAME-predictions "
                                               "beside NAME.onnx)"),
            score: float = typer.Option(0.25, min=0.0, max=1.0, help="detectors: lowest score shown"),
            tta: Optional[str] = TtaOpt) -> None:
    """What the run's task answers for image files (top-k classes, a detector's boxes, a segmenter's
    masks): a run's checkpoint in MXNet, or an exported ONNX file in onnxruntime with the
    preprocessing and class names stored in the file."""
    from .tasks import PredictOptions
    from .train.runs import predict_report

    _choice(checkpoint, CHECKPOINTS, "--checkpoint")
    if not model.exists():
        raise GluontlError(f"'{model}' does not exist; pass a run folder (runs/NAME) or the .onnx file "
                           f"`gluontl export runs/NAME` wrote.")
    if not model.is_dir() and checkpoint != "best":
        raise GluontlError(f"--checkpoint {checkpoint} picks a run folder's checkpoint, but '{model}' is an exported "
                           f"file holding one set of weights. Pass the run folder, or export that checkpoint: "
                           f"`gluontl export runs/NAME --checkpoint {checkpoint}`.")
    report = predict_report(model, [str(i) for i in images], PredictOptions(topk, score, out, checkpoint, tta))
    if as_json:
        typer.echo(json.dumps(report.values["rows"], indent=1))
        return
    for line in report.lines:
        typer.echo(line)


@app.command()
def plot(run: Path = typer.Argument(..., help="run folder"),
         out: Optional[Path] = typer.Option(None, help=f"PNG path (default "
                                            f"{RunFolder('RUN').curves_path})")) -> None:
    """Write a PNG of loss, the task's validation curves (accuracy, mAP, mIoU) and the learning rate from
    metrics.jsonl; a detector's per-class precision/recall curves come from `gluontl evaluate`."""
    from .train.runs import plot as run_plot

    typer.echo(str(run_plot(run, out)))


@app.command()
def zoo(contains: str = typer.Argument("", help="only names containing this text")) -> None:
    """List the model-zoo names usable as zoo:NAME (GluonCV's zoo, which includes Gluon's)."""
    import difflib

    from .sources import zoo_names

    names = zoo_names()
    hits = [n for n in names if contains.lower() in n]
    if not hits:
        close = difflib.get_close_matches(contains.lower(), names, n=5)
        raise ModelSourceError(f"No model-zoo name contains '{contains}' (close names: {', '.join(close) or 'none'}). "
                               f"`gluontl zoo` without an argument lists all {len(names)} names.")
    typer.echo("\n".join(hits))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def launch(ctx: typer.Context,
           workers: int = typer.Option(..., "-n", "--workers", help="number of workers"),
           servers: int = typer.Option(1, "--servers", help="number of parameter servers"),
           hosts: Optional[Path] = typer.Option(None, "--hosts", help="file with one host per line (HOST or HOST "
                                                "cpus=N); servers and workers go round-robin over them by ssh, "
                                                "localhost runs here. Default: everything on this machine"),
           port: Optional[int] = typer.Option(None, "--port", min=1, max=65535,
                                              help="the scheduler's port (default: a free one)"),
           root_uri: Optional[str] = typer.Option(None, "--root-uri", help="address of this machine the hosts "
                                                  "reach the scheduler at (default: the one on the route to "
                                                  "the first host)"),
           ssh: Optional[str] = typer.Option(None, "--ssh",
                                             help="ssh command (default: ssh -o BatchMode=yes)"),
           max_restarts: int = typer.Option(0, "--max-restarts", help="after a failure, stop everything and "
                                            "restart from the last checkpoint, up to this many times"),
           restart_delay: float = typer.Option(5.0, "--restart-delay", help="seconds to wait before a restart")) -> None:
    """Run a gluontl command on N workers with MXNet's parameter server: gluontl launch -n 2 -- finetune -r R.

    Starts the scheduler, servers and workers, prints their output prefixed, and on the first failure
    stops them all and names the process."""
    from .dist.launch import launch as run

    commands = ctx.find_root().command.commands  # type: ignore[attr-defined]
    raise typer.Exit(run(ctx.args, workers, servers, hosts, port, root_uri, ssh, commands=commands,
                         max_restarts=max_restarts, restart_delay=restart_delay))


def main() -> None:
    """The console script: every outcome is an exit code and at most one paragraph on stderr."""
    from .threads import configure

    configure()
    try:
        code = app(standalone_mode=False)  # returns 130 after a KeyboardInterrupt outside finetune's loop
    except GluontlError as e:
        _fail(_naming_sets(str(e), sys.argv[1:]), e.exit_code)
    except Interrupted as e:
        _fail(str(e), e.exit_code, "interrupted: ")
    except typer.TyperException as e:  # usage: missing argument, unknown option, a value of the wrong type
        msg, ctx = e.format_message().strip().rstrip("."), getattr(e, "ctx", None)
        if not msg:  # bare `gluontl`: the help is already shown
            sys.exit(2)
        _fail(f"{msg}. See `{ctx.command_path if ctx else 'gluontl'} --help`.", 2)
    except Exception as e:
        if os.environ.get("GLUONTL_DEBUG", "0") not in ("", "0"):
            raise
        _fail(f"internal error ({type(e).__name__}: {short_reason(e)}); this is a bug in gluontl, not in your "
              f"input. Set GLUONTL_DEBUG=1 for the traceback; please report it with the command you ran.", 1)
    sys.exit(code if isinstance(code, int) else 0)


def _naming_sets(msg: str, argv: Sequence[str]) -> str:
    """An error that surfaces after the recipe loaded (a rule matching nothing, a missing file)
    may come from a --set value: say which ones changed the recipe, as recipe errors do. Those
    after ``--`` are the command ``launch`` runs, whose workers name them in their own errors."""
    argv = argv[: list(argv).index("--")] if "--" in argv else argv
    sets = [v for a, v in zip(argv, argv[1:]) if a == "--set"] + [a[6:] for a in argv if a.startswith("--set=")]
    if not sets or "--set" in msg:
        return msg
    return f"{msg.rstrip()} (The recipe was changed by --set {', --set '.join(sets)}.)"


def _fail(msg: str, code: int, prefix: str = "error: ") -> NoReturn:
    text = textwrap.fill(" ".join(msg.split()), width=100, subsequent_indent=" " * len(prefix),
                         break_long_words=False, break_on_hyphens=False)  # paths stay whole
    print(prefix + text, file=sys.stderr)
    if os.environ.get("DMLC_ROLE") == "worker" or "HOROVOD_RANK" in os.environ:
        # MXNet's kvstore teardown waits at ps-lite barriers for every other node: a failed worker
        # would hang there (and its peers with it) instead of exiting for the launcher to see
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
