"""Frozen prefixes: where a network can be cut so everything before the cut is pure inference,
and engines that run that inference (MXNet, or onnxruntime on a lean ONNX export).

The cut is taken at the top-level trunk units of ``stages._units`` (``features.7``,
``output``, …): the prefix is the run of units before the first one that trains, holds a
BatchNorm in ``bn: train`` (batch statistics) or a Dropout. That the network's forward
really is the chain of those units is checked numerically, not assumed.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import mxnet as mx
import numpy as np
from mxnet import autograd
from mxnet.gluon import HybridBlock, SymbolBlock, nn

from ..errors import TrainError
from ..rules import Plan
from ..stages import _units

AGREE_RTOL = 1e-4


@dataclass
class Split:
    """``net`` = ``suffix(prefix(x))``; ``prefix`` is None when nothing before the first live unit
    is frozen, and ``reason`` then says why."""

    prefix: HybridBlock | None
    suffix: HybridBlock
    boundary: str | None  # first unit of the suffix
    reason: str


def _chain(blocks: list[HybridBlock]) -> nn.HybridSequential:
    seq = nn.HybridSequential(prefix="")
    for b in blocks:
        seq.add(b)
    return seq


def _has_dropout(block: HybridBlock) -> bool:
    return isinstance(block, nn.Dropout) or any(_has_dropout(c) for c in block._children.values())


def _live(unit: str, block: HybridBlock, plan: Plan) -> str | None:
    """Why ``unit`` cannot be in a frozen prefix, or None."""
    rows = [r for r in plan.rows if r.name.startswith(unit + ".")]
    for r in rows:
        if r.trainable:
            where = f"stage {r.stage}" if r.stage is not None else unit
            return f"{where} trains ({r.name} has grad_req {r.grad_req})"
    for r in rows:
        if r.bn == "train":
            return f"BatchNorm {r.layer} is in bn: train (batch statistics) — say bn: frozen to cache before it"
    if _has_dropout(block):
        return f"{unit} contains Dropout (random in training)"
    return None


def split_frozen_prefix(net: HybridBlock, plan: Plan, input_shape: tuple[int, ...], ctx: mx.Context) -> Split:
    """Cut ``net`` after its longest fully frozen run of leading trunk units."""
    whole = Split(None, net, None, "")
    if isinstance(net, SymbolBlock):
        whole.reason = "imported graphs (SymbolBlock) are not split yet; only zoo/Gluon models are"
        return whole
    units = _units(net)
    names = [n for n, _ in units]
    orphans = [r.name for r in plan.rows if not any(r.name.startswith(n + ".") for n in names)]
    if orphans:
        whole.reason = f"parameter {orphans[0]} belongs to no top-level unit"
        return whole
    cut, why = len(units), "nothing trains"
    for k, (name, block) in enumerate(units):
        why = _live(name, block, plan)
        if why is not None:
            cut = k
            break
    if cut == 0:
        whole.reason = why
        return whole
    if cut == len(units):
        whole.reason = "every unit is frozen: nothing to train after the prefix"
        return whole
    prefix = _chain([b for _, b in units[:cut]])
    suffix = _chain([b for _, b in units[cut:]])
    x = mx.nd.array(np.random.default_rng(0).standard_normal((2, *input_shape)), ctx=ctx)
    with autograd.predict_mode():
        want, got = net(x).asnumpy(), suffix(prefix(x)).asnumpy()
    if want.shape != got.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5):
        whole.reason = "the model's forward is not the chain of its top-level units"
        return whole
    return Split(prefix, suffix, names[cut], f"frozen prefix {names[0]}..{names[cut - 1]}, training from {names[cut]}")


class Engine(Protocol):
    name: str

    def __call__(self, x: np.ndarray) -> np.ndarray: ...


class MxEngine:
    """The prefix in MXNet, hybridized, in predict mode."""

    name = "mxnet"

    def __init__(self, prefix: HybridBlock, ctx: mx.Context, hybridize: bool = True) -> None:
        self.block, self.ctx = prefix, ctx
        if hybridize:
            prefix.hybridize(static_alloc=True, static_shape=True)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with autograd.predict_mode():
            return self.block(mx.nd.array(x, ctx=self.ctx)).asnumpy()


class OrtEngine:
    """The prefix exported to lean ONNX (BN folded, verified) and run by onnxruntime."""

    name = "onnxruntime"

    def __init__(self, prefix: HybridBlock, input_shape: tuple[int, ...], ctx: mx.Context) -> None:
        import onnxruntime as ort

        from ..export import export_onnx

        with tempfile.TemporaryDirectory(prefix="gluontl-prefix-") as d:
            path = Path(d) / "prefix.onnx"
            export_onnx(prefix, path, {"data": (1, *input_shape)}, verify=True)
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
            providers: list = ["CPUExecutionProvider"]
            if ctx.device_type == "gpu":
                providers.insert(0, ("CUDAExecutionProvider", {"device_id": ctx.device_id}))
            self.session = ort.InferenceSession(str(path), opts, providers=providers)
        self.input = self.session.get_inputs()[0].name

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input: np.ascontiguousarray(x, np.float32)})[0]


def _median_seconds(engine: Engine, x: np.ndarray, reps: int = 3) -> float:
    engine(x)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        engine(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def choose_engine(kind: str, prefix: HybridBlock, input_shape: tuple[int, ...], ctx: mx.Context,
                  probe: np.ndarray, hybridize: bool = True) -> tuple[Engine, str]:
    """The engine ``train.prefix_engine`` asks for (``auto``: the faster on ``probe`` among
    those agreeing with MXNet within ``AGREE_RTOL``), and a line for the run log."""
    mx_engine = MxEngine(prefix, ctx, hybridize)
    if kind == "mxnet":
        return mx_engine, "prefix engine: mxnet (train.prefix_engine: mxnet)"
    try:
        ort_engine = OrtEngine(prefix, input_shape, ctx)
    except Exception as e:  # export or session failures: fall back under auto, explain under onnxruntime
        if kind == "onnxruntime":
            raise TrainError(f"train.prefix_engine: onnxruntime, but the frozen prefix cannot run in onnxruntime "
                             f"({str(e).splitlines()[0][:300]}). Use prefix_engine: mxnet or auto.") from None
        return mx_engine, f"prefix engine: mxnet (onnxruntime export failed: {str(e).splitlines()[0][:200]})"
    want, got = mx_engine(probe), ort_engine(probe)
    rel = float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))
    if rel > AGREE_RTOL:
        if kind == "onnxruntime":
            raise TrainError(f"train.prefix_engine: onnxruntime, but onnxruntime's prefix output differs from "
                             f"MXNet's by rel {rel:.1e} > {AGREE_RTOL:.0e} on the first batch. Use "
                             f"prefix_engine: mxnet, and report the model.")
        return mx_engine, f"prefix engine: mxnet (onnxruntime disagrees: rel {rel:.1e})"
    if kind == "onnxruntime":
        return ort_engine, f"prefix engine: onnxruntime (agrees with mxnet: rel {rel:.1e})"
    t_mx, t_ort = _median_seconds(mx_engine, probe), _median_seconds(ort_engine, probe)
    best = ort_engine if t_ort < t_mx else mx_engine
    return best, (f"prefix engine: {best.name} (auto: mxnet {t_mx * 1e3:.1f} ms, onnxruntime "
                  f"{t_ort * 1e3:.1f} ms per batch of {len(probe)}; agreement rel {rel:.1e})")
