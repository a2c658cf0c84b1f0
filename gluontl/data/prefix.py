"""Frozen prefixes: where a network can be cut so everything before the cut is pure inference,
and engines that run that inference (MXNet, or onnxruntime on a lean ONNX export).

Gluon models are cut at the top-level trunk units of ``stages.trunk_units`` (``features.7``,
``output``, …): the prefix is the run of units before the first one that trains, holds a
BatchNorm in ``bn: train`` (batch statistics) or a Dropout. Imported graphs (SymbolBlock)
are cut after the last node that has no such node upstream and that every such node (and
every output) can only reach the data through. Either way ``suffix(prefix(x)) == net(x)``
is checked numerically, not assumed.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

import mxnet as mx
import numpy as np
from mxnet import autograd
from mxnet.gluon import HybridBlock, SymbolBlock, nn

from ..errors import DataError, TrainError, short_reason
from ..mxinternals import cached_graph, children, graph_of, symbol_from
from ..rules import Plan
from ..stages import trunk_units

AGREE_RTOL = 1e-4
# Images of the probe batch an explicitly chosen engine is checked on (``auto`` times the whole
# batch): agreement shows on a few real images, and MXNet's pass over the probe is start-up time.
AGREE_IMAGES = 8
# An int8 prefix moves every activation by up to half a quantization step, and a deep prefix adds
# these up: its features are accepted within this norm-relative distance of MXNet's.
# EfficientNet-Lite0's 15-block prefix measures 0.16-0.18 (per-channel weights); broken quantization
# is far off: one scale per tensor there 0.6, a calibration on a black image 0.9, u8xs8
# saturation without VNNI ~0.3.
INT8_AGREE_RTOL = 0.25
# Features whose spread across the batch is below this share of their size differ only by
# float32 rounding (eps 1.2e-7): the images are indistinguishable after the prefix.
COLLAPSE_RTOL = 1e-6
_FEATURES = "gluontl_prefix_features"


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
    return isinstance(block, nn.Dropout) or any(_has_dropout(c) for c in children(block).values())


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
    if isinstance(net, SymbolBlock):
        return _check(net, _split_graph(net, plan), input_shape, ctx)
    whole = Split(None, net, None, "")
    units = trunk_units(net)
    names = [n for n, _ in units]
    orphans = [r.name for r in plan.rows if not any(r.name.startswith(n + ".") for n in names)]
    if orphans:
        whole.reason = f"parameter {orphans[0]} belongs to no top-level unit"
        return whole
    cut, why = len(units), None
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
    split = Split(_chain([b for _, b in units[:cut]]), _chain([b for _, b in units[cut:]]), names[cut],
                  f"frozen prefix {names[0]}..{names[cut - 1]}, training from {names[cut]}")
    return _check(net, split, input_shape, ctx)


def _check(net: HybridBlock, split: Split, input_shape: tuple[int, ...], ctx: mx.Context) -> Split:
    """The split, if ``suffix(prefix(x))`` computes ``net(x)``; otherwise no split, saying so."""
    if split.prefix is None:
        return split
    x = mx.nd.array(np.random.default_rng(0).standard_normal((2, *input_shape)), ctx=ctx)
    with autograd.predict_mode():
        want, got = net(x), split.suffix(split.prefix(x))
    want, got = (np.concatenate([a.asnumpy().ravel() for a in (v if isinstance(v, (list, tuple)) else [v])])
                 for v in (want, got))
    if want.shape != got.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5):
        return Split(None, net, None, f"the model does not compute suffix(prefix(x)) at {split.boundary}")
    return split


def _split_graph(net: SymbolBlock, plan: Plan) -> Split:
    """Cut an imported graph after the last frozen node that every trainable node depends on
    (a dominator of the trainable part, seen from the data input)."""
    inputs, sym = cached_graph(net)
    whole = Split(None, net, None, "")
    if len(inputs) != 1:
        whole.reason = "graphs with several inputs are not split"
        return whole
    graph = graph_of(sym)
    nodes, heads = graph["nodes"], [h[0] for h in graph["heads"]]
    trainable = {r.global_name: r.name for r in plan.rows if r.trainable}  # the graph's names → the plan's
    bn_train = {r.layer for r in plan.rows if r.bn == "train"}
    data = next(i for i, n in enumerate(nodes) if n["op"] == "null" and n["name"] == inputs[0].name)
    why: dict[int, str] = {}
    for i, n in enumerate(nodes):
        if n["op"] == "null":
            continue
        params = [trainable[nodes[j[0]]["name"]] for j in n["inputs"] if nodes[j[0]]["name"] in trainable]
        if params:
            why[i] = f"node {n['name']} trains ({params[0]} has grad_req write)"
        elif n["name"] in bn_train:
            why[i] = f"BatchNorm {n['name']} is in bn: train (batch statistics)"
        elif n["op"] == "Dropout":
            why[i] = f"node {n['name']} is Dropout (random in training)"
    live_below = [False] * len(nodes)
    uses_multi = set()
    for i, n in enumerate(nodes):
        live_below[i] = i in why or any(live_below[j[0]] for j in n["inputs"])
        uses_multi |= {j[0] for j in n["inputs"] if j[1] != 0}

    def reaches(cut: int) -> list[bool]:
        seen = [False] * len(nodes)
        for i, n in enumerate(nodes):
            seen[i] = i == data or (i != cut and any(seen[j[0]] for j in n["inputs"]))
        return seen

    from_data = reaches(-1)
    for c in reversed(range(len(nodes))):
        n = nodes[c]
        if n["op"] == "null" or not from_data[c] or live_below[c] or c in uses_multi or c in heads:
            continue
        seen = reaches(c)
        if any(seen[i] for i in why) or any(seen[h] for h in heads):
            continue
        prefix_sym = sym.get_internals()[_entry_name(sym, n["name"])]
        nodes[c] = {"op": "null", "name": _FEATURES, "inputs": []}
        graph["arg_nodes"] = sorted(set(graph["arg_nodes"]) | {c})
        graph.pop("node_row_ptr", None)
        suffix_sym = symbol_from(graph)
        params = net.collect_params()
        first = next((why[i] for i in sorted(why)), "the rest trains")
        return Split(SymbolBlock(prefix_sym, mx.sym.var(inputs[0].name, dtype="float32"), params=params),
                     SymbolBlock(suffix_sym, mx.sym.var(_FEATURES, dtype="float32"), params=params), n["name"],
                     f"frozen prefix up to node {n['name']}; {first}")
    whole.reason = next((why[i] for i in sorted(why)), "nothing trains")
    return whole


def nested(net: HybridBlock, split: Split, shallower: str) -> tuple[HybridBlock, HybridBlock] | None:
    """``(head, middle)`` with ``middle(head(x)) == split.prefix(x)``: ``head`` the frozen prefix of a
    shallower cut of ``net`` (the ``boundary`` of its split), ``middle`` the rest of ``split.prefix``.
    Features stored for the shallower cut then make this cut's by running ``middle`` alone. None when
    ``shallower`` is not a cut inside this prefix. Callers check the numbers (``middle(head(x))``)."""
    if split.prefix is None or shallower == split.boundary:
        return None
    if not isinstance(net, SymbolBlock):
        units = trunk_units(net)
        names = [n for n, _ in units]
        if shallower not in names or split.boundary not in names:
            return None
        k, cut = names.index(shallower), names.index(split.boundary)
        if not 0 < k < cut:
            return None
        return _chain([b for _, b in units[:k]]), _chain([b for _, b in units[k:cut]])
    inputs, sym = cached_graph(net)
    internals = sym.get_internals()
    prefix_sym = internals[_entry_name(sym, split.boundary)]
    graph = graph_of(prefix_sym)
    at = [i for i, n in enumerate(graph["nodes"]) if n["name"] == shallower and n["op"] != "null"]
    if len(at) != 1:
        return None
    graph["nodes"][at[0]] = {"op": "null", "name": _FEATURES, "inputs": []}
    graph["arg_nodes"] = sorted(set(graph["arg_nodes"]) | {at[0]})
    graph.pop("node_row_ptr", None)
    middle_sym = symbol_from(graph)
    if inputs[0].name in middle_sym.list_arguments():  # the data reaches this cut around the shallower one
        return None
    params = net.collect_params()
    return (SymbolBlock(internals[_entry_name(sym, shallower)], mx.sym.var(inputs[0].name, dtype="float32"),
                        params=params),
            SymbolBlock(middle_sym, mx.sym.var(_FEATURES, dtype="float32"), params=params))


def _entry_name(sym: mx.sym.Symbol, node: str) -> str:
    outs = set(sym.get_internals().list_outputs())
    return f"{node}_output" if f"{node}_output" in outs else f"{node}_output0"


def feature_spread(a: np.ndarray) -> tuple[float, float]:
    """RMS over features of the std across the batch, and RMS of the batch mean."""
    a = a.reshape(len(a), -1).astype(np.float64)
    return float(np.sqrt(np.mean(a.std(axis=0) ** 2))), float(np.sqrt(np.mean(a.mean(axis=0) ** 2)))


def collapsed(a: np.ndarray) -> bool:
    """Rows that differ by no more than float32 rounding of their size (or are all equal)."""
    spread, size = feature_spread(a)
    return spread <= COLLAPSE_RTOL * (1.0 + size)


def check_images(shape: tuple[int, ...], input_shape: tuple[int, ...], where: str) -> None:
    """Refuse a batch whose images are not ``input_shape``: onnxruntime and a hybridized block
    with static shapes would fail on it with an error naming neither the transform nor the fix.
    (Recipes are checked when loaded; this catches what reaches the model another way.)"""
    if tuple(shape[1:]) != tuple(input_shape):
        size = "x".join(map(str, input_shape[1:]))
        raise DataError(f"A batch of {'x'.join(map(str, shape[1:]))} images (C x H x W) reached {where}, which is "
                        f"built for model.input_shape {list(input_shape)}: data.train_transform and "
                        f"data.val_transform must make {size} images. Set their size to the input's (resize: "
                        f"{input_shape[-2]}), or leave the sizes out to get the default (shorter side to "
                        f"{input_shape[-2]}, centre crop {size}).")


class Engine(Protocol):
    name: str
    key: dict  # what it adds to the feature cache's key (``cache.cache_key``)

    def __call__(self, x: np.ndarray) -> np.ndarray: ...


class MxEngine:
    """The prefix in MXNet, hybridized, in predict mode."""

    name = "mxnet"
    key: dict = {}

    def __init__(self, prefix: HybridBlock, input_shape: tuple[int, ...], ctx: mx.Context,
                 hybridize: bool = True) -> None:
        self.block, self.input_shape, self.ctx = prefix, tuple(input_shape), ctx
        if hybridize:
            prefix.hybridize(static_alloc=True, static_shape=True)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        check_images(x.shape, self.input_shape, "the frozen prefix (MXNet)")
        with autograd.predict_mode():
            return self.block(mx.nd.array(x, ctx=self.ctx)).asnumpy()


class OrtEngine:
    """The prefix exported to lean ONNX (BN folded) and run by onnxruntime. The export is not
    verified on its own: ``choose_engine``'s agreement probe on real training images is the one
    check, before any feature is kept."""

    name = "onnxruntime"
    key: dict = {}

    def __init__(self, prefix: HybridBlock, input_shape: tuple[int, ...], ctx: mx.Context,
                 model: bytes | None = None) -> None:
        import onnxruntime as ort

        if model is None:
            from ..export import export_onnx

            with tempfile.TemporaryDirectory(prefix="gluontl-prefix-") as d:
                path = export_onnx(prefix, Path(d) / "prefix.onnx", {"data": (1, *input_shape)}, verify=False)
                model = path.read_bytes()
        self.model = model
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0)
        providers: list = ["CPUExecutionProvider"]
        if ctx.device_type == "gpu" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": ctx.device_id}))
        self.session = ort.InferenceSession(model, opts, providers=providers)
        self.input, self.input_shape = self.session.get_inputs()[0].name, tuple(input_shape)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        check_images(x.shape, self.input_shape, f"the frozen prefix ({self.name})")
        return self.session.run(None, {self.input: np.ascontiguousarray(x, np.float32)})[0]


class Int8Engine(OrtEngine):
    """The float ORT prefix quantized (``int8.quantize``), calibrated on ``calibration`` batches;
    ``note`` says how (for the run log)."""

    name = "onnxruntime-int8"

    def __init__(self, float_engine: OrtEngine, calibration: Sequence[np.ndarray], ctx: mx.Context,
                 flags: set[str] | None = None) -> None:
        from ..export.cpu import cpu_flags, reduce_range
        from .int8 import quantize

        reduce, why = reduce_range(cpu_flags() if flags is None else flags)
        model, images = quantize(float_engine.model, float_engine.input, calibration, reduce)
        super().__init__(None, float_engine.input_shape, ctx, model)
        self.note = f"QDQ int8 calibrated on {images} training images, {why}"
        self.key = self.key_for(reduce)

    @staticmethod
    def key_for(reduce: bool) -> dict:
        """Its features depend on ``reduce_range`` (u8xs8 kernels with or without VNNI)."""
        return {"engine": Int8Engine.name, "reduce_range": reduce}


class OvEngine:
    """The float onnxruntime prefix's ONNX model converted by OpenVINO (``openvino.convert_model``) and
    compiled for the CPU in float32 (the CPU plugin picks bfloat16 by itself where the CPU has it);
    checked against MXNet by ``choose_engine`` like the onnxruntime one."""

    name = "openvino"
    key: dict = {}  # float features agree with MXNet's within AGREE_RTOL: the same cache

    def __init__(self, float_engine: OrtEngine, model=None) -> None:
        from ..export import openvino_ir

        ov = openvino_ir.require()
        if model is None:
            with tempfile.TemporaryDirectory(prefix="gluontl-prefix-ov-") as d:
                path = Path(d) / "prefix.onnx"
                path.write_bytes(float_engine.model)
                model = ov.convert_model(str(path))
        self.model, self.input_shape = model, float_engine.input_shape
        threads = int(os.environ.get("OMP_NUM_THREADS", "0") or 0) or None
        self.compiled = openvino_ir.compiled(model, threads)
        self.request = self.compiled.create_infer_request()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        check_images(x.shape, self.input_shape, f"the frozen prefix ({self.name})")
        return np.array(self.request.infer({0: np.ascontiguousarray(x, np.float32)})[self.compiled.output(0)])


class OvInt8Engine(OvEngine):
    """The OpenVINO prefix quantized by NNCF (post-training, performance preset), calibrated on
    ``calibration`` batches."""

    name = "openvino-int8"

    def __init__(self, float_engine: "OvEngine", calibration: Sequence[np.ndarray], ort_engine: OrtEngine) -> None:
        import nncf

        images = getattr(calibration, "images", None) or sum(len(b) for b in calibration)
        model = nncf.quantize(float_engine.model.clone(), nncf.Dataset(calibration, lambda b: np.ascontiguousarray(
            b, np.float32)), subset_size=max(len(calibration), 1), preset=nncf.QuantizationPreset.PERFORMANCE)
        super().__init__(ort_engine, model)
        self.note = f"NNCF int8 calibrated on {images} training images"
        self.key = {"engine": self.name}


def _openvino_or_fallback(kind: str, ort_engine: OrtEngine, calibration: Sequence[np.ndarray], probe: np.ndarray,
                          want: np.ndarray, rel: float) -> tuple[Engine, str]:
    """``prefix_engine: openvino`` / ``openvino-int8``: OpenVINO's float prefix if it agrees with MXNet
    within AGREE_RTOL (else an error, as for onnxruntime); its NNCF int8 when its features are within
    INT8_AGREE_RTOL and not collapsed, else the float OpenVINO prefix, and the log says why."""
    try:
        engine = OvEngine(ort_engine)
    except Exception as e:  # not installed (a GluontlError naming the extra), or OpenVINO's own errors
        raise TrainError(f"train.prefix_engine: {kind}, but the frozen prefix cannot run in OpenVINO "
                         f"({short_reason(e, 300)}). Use prefix_engine: onnxruntime or auto.") from None
    rel_ov = _rel(engine(probe), want)
    if rel_ov > AGREE_RTOL:
        raise TrainError(f"train.prefix_engine: {kind}, but OpenVINO's prefix output differs from MXNet's by rel "
                         f"{rel_ov:.1e} > {AGREE_RTOL:.0e} on the first batch. Use prefix_engine: onnxruntime, and "
                         f"report the model.")
    line = f"prefix engine: openvino (agrees with mxnet: rel {rel_ov:.1e}; onnxruntime rel {rel:.1e})"
    if kind == "openvino":
        return engine, line
    try:
        int8 = OvInt8Engine(engine, calibration, ort_engine)
    except Exception as e:  # NNCF missing or failing
        return engine, f"{line}; openvino-int8 refused: NNCF could not quantize the prefix ({short_reason(e)})"
    got = int8(probe)
    rel8 = _rel(got, want) if np.isfinite(got).all() else float("inf")
    if rel8 > INT8_AGREE_RTOL:
        return engine, f"{line}; openvino-int8 refused: its features differ from MXNet's by rel {rel8:.1e} > " \
                       f"{INT8_AGREE_RTOL:g} on the first batch ({int8.note})"
    if len(probe) > 1 and collapsed(got) and not collapsed(want):
        return engine, f"{line}; openvino-int8 refused: its features are the same for every image of the first " \
                       f"batch ({int8.note})"
    return int8, f"prefix engine: openvino-int8 ({int8.note}; agrees with mxnet: rel {rel8:.1e} <= " \
                 f"{INT8_AGREE_RTOL:g}, float openvino rel {rel_ov:.1e})"


def _median_seconds(engine: Engine, x: np.ndarray, reps: int = 3) -> float:
    engine(x)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        engine(x)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def choose_engine(kind: str, prefix: HybridBlock, input_shape: tuple[int, ...], ctx: mx.Context,
                  probe: np.ndarray, hybridize: bool = True, margin: float = 1.0,
                  calibration: Sequence[np.ndarray] = ()) -> tuple[Engine, str]:
    """The engine ``train.prefix_engine`` asks for, and a line for the run log.

    ``auto`` takes onnxruntime when it agrees with MXNet within ``AGREE_RTOL`` and is
    ``margin`` times faster on ``probe``, the other kinds check the first ``AGREE_IMAGES`` of it; a margin > 1 covers costs the probe does not see
    (per-step copies between the engines) and its noise. ``onnxruntime-int8`` quantizes the
    float onnxruntime prefix, calibrated on the ``calibration`` batches, and keeps it when its
    features on ``probe`` are within ``INT8_AGREE_RTOL`` of MXNet's and not collapsed (the
    collapsed-features guard); otherwise the float one runs, and the log says why.
    """
    mx_engine = MxEngine(prefix, input_shape, ctx, hybridize)
    if kind == "mxnet":
        return mx_engine, "prefix engine: mxnet (train.prefix_engine: mxnet)"
    if kind != "auto":
        probe = probe[:AGREE_IMAGES]
    try:
        ort_engine = OrtEngine(prefix, input_shape, ctx)
    except Exception as e:  # export or session failures: fall back under auto, explain otherwise
        if kind != "auto":
            raise TrainError(f"train.prefix_engine: {kind}, but the frozen prefix cannot run in onnxruntime "
                             f"({short_reason(e, 300)}). Use prefix_engine: mxnet or auto.") from None
        return mx_engine, f"prefix engine: mxnet (onnxruntime export failed: {short_reason(e)})"
    want = mx_engine(probe)
    rel = _rel(ort_engine(probe), want)
    if rel > AGREE_RTOL:
        if kind != "auto":
            raise TrainError(f"train.prefix_engine: {kind}, but onnxruntime's prefix output differs from "
                             f"MXNet's by rel {rel:.1e} > {AGREE_RTOL:.0e} on the first batch. Use "
                             f"prefix_engine: mxnet, and report the model.")
        return mx_engine, f"prefix engine: mxnet (onnxruntime disagrees: rel {rel:.1e})"
    if kind == "onnxruntime-int8":
        return _int8_or_float(ort_engine, calibration, ctx, probe, want, rel)
    if kind == "onnxruntime":
        return ort_engine, f"prefix engine: onnxruntime (agrees with mxnet: rel {rel:.1e})"
    if kind in ("openvino", "openvino-int8"):
        return _openvino_or_fallback(kind, ort_engine, calibration, probe, want, rel)
    t_mx, t_ort = _median_seconds(mx_engine, probe), _median_seconds(ort_engine, probe)
    timed = f"mxnet {t_mx * 1e3:.1f} ms, onnxruntime {t_ort * 1e3:.1f} ms"
    best, t_best = (ort_engine, t_ort) if t_ort * margin < t_mx else (mx_engine, t_mx)
    ov_engine = _agreeing_openvino(ort_engine, probe, want)  # measured, not assumed: only where installed
    if ov_engine is not None:
        t_ov = _median_seconds(ov_engine, probe)
        timed += f", openvino {t_ov * 1e3:.1f} ms"
        if t_ov * (margin if best is mx_engine else 1.0) < t_best:
            best = ov_engine
    return best, (f"prefix engine: {best.name} (auto: {timed} per batch of {len(probe)}; agreement rel "
                  f"{rel:.1e})")


def _agreeing_openvino(ort_engine: OrtEngine, probe: np.ndarray, want: np.ndarray) -> "OvEngine | None":
    """OpenVINO's float prefix for ``auto`` to time, if OpenVINO is installed and agrees with MXNet."""
    import importlib.util

    if importlib.util.find_spec("openvino") is None:
        return None
    try:
        engine = OvEngine(ort_engine)
        return engine if _rel(engine(probe), want) <= AGREE_RTOL else None
    except Exception:  # auto falls back to what it measured without it
        return None


def _int8_or_float(ort_engine: OrtEngine, calibration: Sequence[np.ndarray], ctx: mx.Context, probe: np.ndarray,
                   want: np.ndarray, rel: float) -> tuple[Engine, str]:
    """The int8 prefix if the probe and the collapsed-features guard accept it, else the float one."""
    fallback = f"prefix engine: onnxruntime (agrees with mxnet: rel {rel:.1e}); onnxruntime-int8 refused: "
    try:
        engine = Int8Engine(ort_engine, calibration, ctx)
    except Exception as e:  # the quantizer raises bare ValueErrors/RuntimeErrors
        return ort_engine, fallback + f"onnxruntime could not quantize the prefix ({short_reason(e)})"
    got = engine(probe)
    rel8 = _rel(got, want) if np.isfinite(got).all() else float("inf")
    if rel8 > INT8_AGREE_RTOL:
        return ort_engine, fallback + (f"its features differ from MXNet's by rel {rel8:.1e} > {INT8_AGREE_RTOL:g} "
                                       f"on the first batch ({engine.note})")
    if len(probe) > 1 and collapsed(got) and not collapsed(want):
        return ort_engine, fallback + f"its features are the same for every image of the first batch ({engine.note})"
    return engine, f"prefix engine: onnxruntime-int8 ({engine.note}; agrees with mxnet: rel {rel8:.1e} <= " \
                   f"{INT8_AGREE_RTOL:g}, float onnxruntime rel {rel:.1e})"
