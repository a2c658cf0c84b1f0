"""The ``onnx`` format: the task's verified ONNX graph (``NAME.onnx``; see ``GraphFinisher``)."""
from __future__ import annotations

from gluontl.export.artifacts import Artifact, Exported
from gluontl.export.registry import ExportFormat, ExportJob, register


def verdict(rtol: float | None) -> str:
    if rtol is None:
        return "verified: onnxruntime reproduces MXNet within the float32 bound of its graph"
    return f"verified: onnxruntime reproduces MXNet within rtol {rtol:g}"


def write(job: ExportJob, result: Exported) -> None:
    path = job.graph.write_onnx(job.out, job.force)
    result.add(Artifact("onnx", "float", (path,), verdict(job.rtol) + job.graph.note))


FORMAT = register(ExportFormat(
    "onnx", "NAME.onnx", "onnxruntime reproduces MXNet within the float32 bound of its graph (or export.rtol)", "onnxruntime static QDQ", "onnx",
    write, brief="verified"))
