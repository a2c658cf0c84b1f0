"""The ``symbol`` format: MXNet's own graph and weights (``NAME-symbol.json`` + ``NAME-0000.params``),
traced from the block as it is, with the run's card beside them (``NAME-preprocess.json``)."""
from __future__ import annotations

import json

from gluontl.atomic import write_text
from gluontl.errors import ExportError
from gluontl.export.artifacts import Artifact, Exported
from gluontl.export.exporters import export_symbol
from gluontl.export.registry import ExportFormat, ExportJob, register

VERDICT = "reloaded in MXNet and compared with the block"


def write(job: ExportJob, result: Exported) -> None:
    card_path = job.out / f"{job.name}-preprocess.json"
    if job.card is not None and card_path.exists() and not job.force:
        raise ExportError(f"{card_path} already exists; refusing to overwrite it. Pass --force to replace it.")
    files = list(export_symbol(job.block, job.out / job.name, dict(job.input_shapes), force=job.force))
    if job.card is not None:
        files.append(write_text(card_path, json.dumps(job.card, indent=1), ExportError))
    result.add(Artifact("symbol", "float", tuple(files), VERDICT))


FORMAT = register(ExportFormat(
    "symbol", "NAME-symbol.json + NAME-0000.params (+ NAME-preprocess.json)", VERDICT,
    "MXNet oneDNN (quantize_net_v2)", "block", write, brief=""))
