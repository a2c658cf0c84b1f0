"""The ``onnx`` format: the task's verified ONNX graph (``NAME.onnx``; see ``GraphFinisher``)."""
from __future__ import annotations

from gluontl.export.artifacts import Artifact, Exported
from gluontl.export.registry import ExportFormat, ExportJob, Int8Job, Int8Made, Int8Step, register


def verdict(rtol: float | None) -> str:
    if rtol is None:
        return "verified: onnxruntime reproduces MXNet within the float32 bound of its graph"
    return f"verified: onnxruntime reproduces MXNet within rtol {rtol:g}"


def write(job: ExportJob, result: Exported) -> None:
    path = job.graph.write_onnx(job.out, job.force)
    result.add(Artifact("onnx", "float", (path,), verdict(job.rtol) + job.graph.note))


def write_int8(job: Int8Job, float_file: Artifact) -> Int8Made:
    """``NAME.int8.onnx``: onnxruntime's static QDQ of the float file, judged by the task's metric
    (``quantize.quantize_verified``; ExportError past max_drop)."""
    from gluontl.export.quantize import quantize_verified

    result = quantize_verified(float_file.path, job.spec, job.train, job.val, job.labels, job.metric, echo=job.echo,
                               op_types=job.op_types, outputs=job.outputs,
                               **({"tensors": job.tensors} if job.tensors else {}))
    path = job.scratch / int8_name(job.name)
    path.write_bytes(result.model.SerializeToString())
    return Int8Made(Artifact("onnx", "int8", (path,), f"int8 (onnxruntime): {result.report['verification']['summary']}"),
                    float_file.path, f"{job.name}.int8.json", result.report)


def int8_name(name: str) -> str:
    return f"{name}.int8.onnx"


FORMAT = register(ExportFormat(
    "onnx", "NAME.onnx", "onnxruntime reproduces MXNet within the float32 bound of its graph (or export.rtol)",
    Int8Step("onnxruntime static QDQ", lambda name: (int8_name(name),), write_int8), "onnx",
    write, brief="verified"))
