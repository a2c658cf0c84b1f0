"""The ``symbol`` format: MXNet's own graph and weights (``NAME-symbol.json`` + ``NAME-0000.params``),
traced from the block as it is, with the run's card beside them (``NAME-preprocess.json``)."""
from __future__ import annotations

import json

from gluontl.atomic import write_text
from gluontl.errors import ExportError
from gluontl.export import quantize_mx
from gluontl.export.artifacts import Artifact, Exported
from gluontl.export.exporters import export_symbol
from gluontl.export.registry import ExportFormat, ExportJob, Int8Job, Int8Made, Int8Step, register

VERDICT = "reloaded in MXNet and compared with the block"


def write(job: ExportJob, result: Exported) -> None:
    card_path = job.out / f"{job.name}-preprocess.json"
    if job.card is not None and card_path.exists() and not job.force:
        raise ExportError(f"{card_path} already exists; refusing to overwrite it. Pass --force to replace it.")
    files = list(export_symbol(job.block, job.out / job.name, dict(job.input_shapes), force=job.force))
    if job.card is not None:
        files.append(write_text(card_path, json.dumps(job.card, indent=1), ExportError))
    result.add(Artifact("symbol", "float", tuple(files), VERDICT))


def write_int8(job: Int8Job, float_files: Artifact) -> Int8Made:
    """``NAME-int8-symbol.json`` / ``NAME-int8-0000.params``: MXNet oneDNN's quantization of the float
    pair, judged by the task's metric (``quantize_mx.quantize_symbol_verified``; ExportError past
    max_drop). Exclude globs may match either graph when an ONNX file is exported beside it."""
    from gluontl.export.quantize import symbol_tensors

    beside_onnx = any(a.format == "onnx" for a in job.made)
    result = quantize_mx.quantize_symbol_verified(
        float_files.path, job.spec, *job.calibration, job.val, job.labels, job.metric, job.tensors or symbol_tensors,
        out_dir=job.scratch, op_types=job.op_types, outputs=job.symbol_outputs or (lambda outs: outs),
        strict_exclude=not beside_onnx, echo=job.echo)
    return Int8Made(Artifact("symbol", "int8", tuple(result.files),
                             f"int8 (MXNet oneDNN): {result.report['verification']['summary']}"),
                    float_files.path, f"{job.name}-int8-symbol.report.json", result.report)


FORMAT = register(ExportFormat(
    "symbol", "NAME-symbol.json + NAME-0000.params (+ NAME-preprocess.json)", VERDICT,
    Int8Step("MXNet oneDNN (quantize_net_v2)", quantize_mx.int8_names, write_int8, check=quantize_mx.check_method,
             order=1), "block", write,
    brief=""))
