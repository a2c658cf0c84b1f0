"""Prove an ONNX file computes what the Gluon block computes, on the same batch."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import mxnet as mx
import numpy as np
import onnxruntime as ort

from gluontl.errors import ExportError
from gluontl.export.trace import predict


@dataclass(frozen=True)
class OutputCheck:
    """One output's agreement: ``rel`` is ||onnx - mxnet|| / ||mxnet||."""

    name: str
    shape: tuple[int, ...]
    max_abs: float
    rel: float


@dataclass(frozen=True)
class VerifyReport:
    """Worst-case agreement over all outputs of one batch; ``ok`` means max_rel <= rtol."""

    max_abs: float
    max_rel: float
    ok: bool
    rtol: float
    outputs: list[OutputCheck] = field(default_factory=list)

    def describe(self) -> str:
        return ", ".join(f"{o.name}{list(o.shape)}: rel {o.rel:.2e}, max abs {o.max_abs:.2e}" for o in self.outputs)


def ort_session(model: str | os.PathLike | bytes, label: str) -> ort.InferenceSession:
    """A CPU session; ``model`` is a path or serialized bytes, ``label`` names it in errors."""
    source = model if isinstance(model, bytes) else os.fspath(model)
    try:
        return ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own untyped Fail/InvalidGraph errors
        raise ExportError(
            f"onnxruntime cannot load {label}: {err}. A truncated or edited file needs re-exporting; "
            "if export_onnx itself produced it, the model has a layer mx.onnx converts wrongly, so "
            "ship it with export_symbol and report the model."
        ) from err


def compare(session: ort.InferenceSession, block: mx.gluon.HybridBlock, inputs: dict[str, np.ndarray],
            rtol: float) -> VerifyReport:
    """Run ``session`` and ``block`` on ``inputs``; the block gets them in the file's input order."""
    file_inputs = [i.name for i in session.get_inputs()]
    if set(file_inputs) != set(inputs):
        raise ExportError(
            f"The ONNX file takes inputs {file_inputs} but {sorted(inputs)} were given; "
            "pass one array per file input, keyed by its name."
        )
    ordered = {name: np.asarray(inputs[name], dtype=np.float32) for name in file_inputs}
    shapes = {k: v.shape for k, v in ordered.items()}
    try:
        got = session.run(None, ordered)
        want = predict(block, ordered)
    except Exception as err:  # onnxruntime's InvalidArgument and MXNetError share no base class
        raise ExportError(
            f"The inputs {shapes} do not fit the ONNX file or the block ({str(err).splitlines()[0]}); "
            "pass arrays shaped like the export's input_shapes with any batch size."
        ) from err
    names = [o.name for o in session.get_outputs()]
    if len(got) != len(want):
        raise ExportError(
            f"The ONNX file has {len(got)} outputs {names} but the block returns {len(want)}; "
            "this file was not exported from this block."
        )
    checks = []
    for name, g, w in zip(names, got, want):
        if g.shape != w.shape:
            checks.append(OutputCheck(name, tuple(w.shape), float("inf"), float("inf")))
            continue
        diff = g.astype(np.float64) - w.astype(np.float64)
        ref = float(np.linalg.norm(w.astype(np.float64)))
        err = float(np.linalg.norm(diff))
        rel = err / ref if ref > 0 else (0.0 if err == 0 else float("inf"))
        checks.append(OutputCheck(name, tuple(w.shape), float(np.max(np.abs(diff), initial=0.0)), rel))
    max_rel = max(c.rel for c in checks)
    return VerifyReport(max(c.max_abs for c in checks), max_rel, bool(max_rel <= rtol), rtol, checks)


def verify_onnx(block: mx.gluon.HybridBlock, path: str | os.PathLike, inputs: dict[str, np.ndarray],
                rtol: float = 1e-4) -> VerifyReport:
    """Run ``path`` in onnxruntime and ``block`` in MXNet predict mode on the same batch."""
    return compare(ort_session(path, os.fspath(path)), block, inputs, rtol)
