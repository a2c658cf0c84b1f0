"""Prove an ONNX file computes what the Gluon block computes, on the same batch."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import mxnet as mx
import numpy as np
import onnx
import onnxruntime as ort

from gluontl.errors import ExportError, short_reason
from gluontl.export.errorbound import Budget, bound, output_budgets
from gluontl.export.trace import predict

FIXED_RTOL = 1e-4  # checks not judged by a graph's float32 bound (detection scores, OpenVINO): rtol None means this

_ORT_TYPES = {"tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
              "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
              "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


# Outputs of these ops live in a fixed interval: they are meaningful in absolute terms, and
# onnxruntime's Sigmoid is accurate to ~1e-7 absolute (not relative) near 0 and 1.
_CODOMAIN_WIDTH = {"Sigmoid": 1.0, "HardSigmoid": 1.0, "Softmax": 1.0, "Tanh": 2.0}


def saturating_scales(model: onnx.ModelProto) -> dict[str, float]:
    """Graph output -> width of the interval its producing op maps into (Sigmoid, Softmax, ...),
    looking through Identity nodes; outputs of other ops are absent."""
    producer = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for o in model.graph.output:
        node = producer.get(o.name)
        while node is not None and node.op_type == "Identity":
            node = producer.get(node.input[0])
        if node is not None and node.op_type in _CODOMAIN_WIDTH:
            out[o.name] = _CODOMAIN_WIDTH[node.op_type]
    return out


def output_error(got: np.ndarray, want: np.ndarray, floor: float = 0.0) -> tuple[float, float]:
    """(max abs error, max abs error relative to the range of ``want``, or to ``floor`` if larger).

    Why the range: a norm-relative error misjudges outputs that saturate. A sigmoid map that is
    ~0 almost everywhere has a tiny norm, so float noise of 1e-8 on its few bright pixels looks
    like a 1e-4 error; logits offset by a large constant hide real errors the other way. The
    range (max - min) is the scale the outputs actually vary on, so ``rel`` ≈ 1e-7 is float32
    noise whatever the output's offset, and a corrupted weight moves it by orders of magnitude.
    An output squashed by a saturating op can have a range near zero (every pixel of a
    detection map at 1e-7): ``floor``, the op's codomain width, is then the scale. Constant
    outputs are judged against their magnitude (or absolutely, if zero); a NaN anywhere fails.
    """
    g, w = got.astype(np.float64), want.astype(np.float64)
    if g.shape != w.shape or np.isnan(g).any() or np.isnan(w).any():  # NaN proves nothing
        return float("inf"), float("inf")
    if w.size == 0:
        return 0.0, 0.0
    diff = np.abs(g - w)
    diff[g == w] = 0.0  # equal infinities
    max_abs = float(np.max(diff))
    return max_abs, max_abs / range_scale(w, floor)


def range_scale(want: np.ndarray, floor: float = 0.0) -> float:
    """The scale ``output_error`` divides by: the range of ``want`` (its magnitude if constant, 1
    if zero or not finite), at least ``floor``."""
    w = np.asarray(want, np.float64)
    if w.size == 0:
        return max(1.0, floor)
    span = float(np.max(w) - np.min(w))
    scale = span if np.isfinite(span) and span > 0 else float(np.max(np.abs(w)))
    if not np.isfinite(scale) or scale == 0:
        scale = 1.0
    return max(scale, floor)


@dataclass(frozen=True)
class OutputCheck:
    """One output's agreement: ``max_abs`` = max |onnx - mxnet|, ``rel`` the same over the range of
    the MXNet output (see ``output_error``), ``tolerance`` the largest ``max_abs`` allowed (the
    float32 bound, or ``rtol`` of the range when one was given), ``where`` the index of the
    largest difference with the two values there, ``why`` how the tolerance was reached."""

    name: str
    shape: tuple[int, ...]
    max_abs: float
    rel: float
    tolerance: float = float("inf")
    where: tuple[int, ...] = ()
    values: tuple[float, float] = (0.0, 0.0)  # (onnxruntime, MXNet) at ``where``
    why: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.max_abs <= self.tolerance)  # NaN fails

    def describe(self) -> str:
        at = (f" at {list(self.where)} (onnxruntime {self.values[0]:.7g}, MXNet {self.values[1]:.7g})"
              if self.where or self.shape == () else "")
        return (f"{self.name}{list(self.shape)}: max |difference| {self.max_abs:.2e}{at}, "
                f"{self.rel:.2e} of the range; tolerance {self.tolerance:.2e} ({self.why})")


@dataclass(frozen=True)
class VerifyReport:
    """Agreement over all outputs of one batch; ``ok`` means every output's ``max_abs`` is within its
    ``tolerance``. ``max_rel`` is the largest ``OutputCheck.rel`` (error over the output's range);
    ``rtol`` the fixed tolerance asked for (None: each output's float32 bound)."""

    max_abs: float
    max_rel: float
    ok: bool
    rtol: float | None
    outputs: list[OutputCheck] = field(default_factory=list)

    def describe(self) -> str:
        return "; ".join(o.describe() for o in self.outputs)

    @property
    def worst(self) -> OutputCheck:
        """The output furthest past (or nearest to) its tolerance."""
        return max(self.outputs, key=lambda o: o.max_abs / o.tolerance if o.tolerance > 0 else np.inf)


def check_output(name: str, got: np.ndarray, want: np.ndarray, rtol: float | None, floor: float = 0.0,
                 budget: Budget | None = None) -> OutputCheck:
    """``got`` (onnxruntime) against ``want`` (MXNet). With ``rtol`` None the tolerance is the float32
    bound of the output's ``budget`` (``errorbound``) at the scale max(max |want|, ``floor``);
    with a number, ``rtol`` times the range ``output_error`` judges by."""
    max_abs, rel = output_error(got, want, floor)
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    where, values = (), (0.0, 0.0)
    if g.shape == w.shape and w.size:
        diff = np.abs(g - w)
        diff[g == w] = 0.0
        diff[np.isnan(diff)] = np.inf
        where = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), w.shape))
        values = (float(g[where]), float(w[where]))
    if rtol is not None:
        tolerance = rtol * range_scale(w, floor)
        why = f"rtol {rtol:g} of the range"
    else:
        finite = w[np.isfinite(w)] if w.size else w
        scale = max(float(np.max(np.abs(finite), initial=0.0)), floor)
        budget = budget or Budget(1.0)
        tolerance = bound(budget, scale)
        why = f"float32 bound 8·eps32·D·scale, scale {scale:.3g}, {budget.describe()}"
    return OutputCheck(name, tuple(w.shape), max_abs, rel, float(tolerance), where, values, why)


def ort_session(model: str | os.PathLike | bytes, label: str) -> ort.InferenceSession:
    """A CPU session on float kernels; ``model`` is a path or serialized bytes, ``label`` names
    it in errors.

    Basic graph optimizations only: the extended level fuses QuantizeLinear/DequantizeLinear
    pairs into integer kernels, whose uint8×int8 products saturate on CPUs without VNNI, so
    the reference would depend on the machine.
    """
    source = os.fspath(model)  # a path as str; bytes pass through unchanged
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    try:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own untyped Fail/InvalidGraph errors
        raise ExportError(
            f"onnxruntime cannot load {label}: {err}. A truncated or edited file needs re-exporting; "
            "if export_onnx itself produced it, the model has a layer mx.onnx converts wrongly, so "
            "ship it with export_symbol and report the model."
        ) from err


def deploy_session(model: str | os.PathLike | bytes, threads: int = 1) -> ort.InferenceSession:
    """A session as a deployment runs the file: every graph optimization, so QDQ pairs fuse into
    onnxruntime's integer kernels on this CPU (which is what int8 is for)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(os.fspath(model), options, providers=["CPUExecutionProvider"])


def compare(session: ort.InferenceSession, block: mx.gluon.HybridBlock, inputs: dict[str, np.ndarray],
            rtol: float | None, scales: dict[str, float] | None = None,
            budgets: dict[str, Budget] | None = None) -> VerifyReport:
    """Run ``session`` and ``block`` on ``inputs``; the block gets them in the file's input order.
    ``scales`` are the outputs' ``saturating_scales``, ``budgets`` their float32 budgets
    (``errorbound.output_budgets`` of the file's graph; judged with ``check_output``)."""
    file_inputs = [i.name for i in session.get_inputs()]
    if set(file_inputs) != set(inputs):
        raise ExportError(
            f"The ONNX file takes inputs {file_inputs} but {sorted(inputs)} were given; "
            "pass one array per file input, keyed by its name."
        )
    types = {i.name: _ORT_TYPES.get(i.type, np.float32) for i in session.get_inputs()}
    ordered = {name: np.asarray(inputs[name]).astype(types[name], copy=False) for name in file_inputs}
    shapes = {k: v.shape for k, v in ordered.items()}
    try:
        got = session.run(None, ordered)
        want = predict(block, ordered)
    except Exception as err:  # onnxruntime's InvalidArgument and MXNetError share no base class
        raise ExportError(
            f"The inputs {shapes} do not fit the ONNX file or the block ({short_reason(err)}); "
            "pass arrays shaped like the export's input_shapes with any batch size."
        ) from err
    names = [o.name for o in session.get_outputs()]
    if len(got) != len(want):
        raise ExportError(
            f"The ONNX file has {len(got)} outputs {names} but the block returns {len(want)}; "
            "this file was not exported from this block."
        )
    scales, budgets = scales or {}, budgets or {}
    checks = [check_output(name, np.asarray(g), w, rtol, scales.get(name, 0.0), budgets.get(name))
              for name, g, w in zip(names, got, want)]
    return VerifyReport(max(c.max_abs for c in checks), max(c.rel for c in checks), all(c.ok for c in checks),
                        rtol, checks)


def verify_onnx(block: mx.gluon.HybridBlock, path: str | os.PathLike, inputs: dict[str, np.ndarray],
                rtol: float | None = None) -> VerifyReport:
    """Run ``path`` in onnxruntime and ``block`` in MXNet predict mode on the same batch; each output
    within the float32 bound of its graph (``rtol`` None) or ``rtol`` of its range."""
    session = ort_session(path, os.fspath(path))
    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
        scales, budgets = saturating_scales(model), output_budgets(model)
    except Exception:  # onnxruntime read it, so only an exotic encoding gets here: one unit at the output
        scales, budgets = {}, {}
    return compare(session, block, inputs, rtol, scales, budgets)
