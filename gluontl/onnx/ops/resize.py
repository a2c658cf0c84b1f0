"""Resize (opsets 10-19) and Upsample (7, 9).

Resizing is separable: along each resized axis every output element is a weighted sum
of a few input elements ("taps"). The tap positions and weights depend only on the
output coordinate, so they are computed from an ``arange`` inside the graph (no
parameters) and applied with ``take``. The coordinate arithmetic is float32 in
onnxruntime's operation order, so nearest-neighbour ties round the same way. The same
formulas run in numpy at import time to detect the cases MXNet has one fast op for:
nearest upsampling by an integer factor (``UpSampling``: YOLO/FPN) and bilinear
resizing matching ``contrib.BilinearResize2D``.
"""
from __future__ import annotations

import dataclasses

import mxnet as mx
import numpy as np

from ..registry import converter
from .shape import need_rank, norm_axes

_MODES = {"nearest", "linear", "cubic"}
_CTMS = {"half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric",
         "half_pixel_symmetric", "tf_crop_and_resize"}
_NEAREST = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}


@dataclasses.dataclass
class _Axis:
    """Resizing of one axis: input size n (None if unknown), output size m, scale."""

    axis: int
    n: int | None
    m: int | None
    scale: float
    roi: tuple[float, float] = (0.0, 1.0)


@dataclasses.dataclass
class _Spec:
    mode: str
    ctm: str
    nearest: str
    cubic_a: float = -0.75
    exclude_outside: bool = False
    extrapolation: float = 0.0
    antialias: bool = False


class _Np:
    """numpy flavour of the few ops the tap formulas use (import-time checks)."""

    floor, ceil, abs = np.floor, np.ceil, np.abs

    @staticmethod
    def arange(m):
        return np.arange(m, dtype=np.float32)

    @staticmethod
    def clip(x, lo, hi):
        return np.clip(x, lo, hi)


class _Sym:
    """MXNet symbol flavour of the same ops (graph construction)."""

    floor, ceil, abs = mx.sym.floor, mx.sym.ceil, mx.sym.abs

    @staticmethod
    def arange(m):
        return mx.sym.arange(start=0, stop=m, dtype="float32")

    @staticmethod
    def clip(x, lo, hi):
        return mx.sym.clip(x, a_min=lo, a_max=hi)


def _source_coords(F, ax: _Axis, ctm: str):
    """Input coordinate of each output position (ONNX coordinate_transformation_mode)."""
    o, n, m, s = F.arange(ax.m), ax.n, ax.m, ax.scale
    if ctm == "asymmetric":
        return o / s
    if ctm == "half_pixel":
        return (o + 0.5) / s - 0.5
    if ctm == "pytorch_half_pixel":
        return (o + 0.5) / s - 0.5 if m > 1 else o * 0  # 0, not -0.5, like onnxruntime
    if ctm == "align_corners":
        return o * (n - 1) / (m - 1) if m > 1 else o * 0
    f32 = np.float32
    if ctm == "half_pixel_symmetric":
        offset = float(f32(n) / f32(2) * (f32(1) - f32(m) / (f32(s) * f32(n))))
        return (o + 0.5) / s + offset - 0.5
    r0, r1 = ax.roi  # tf_crop_and_resize
    start = float(f32(r0) * f32(n - 1))
    if m > 1:
        return o * float(f32(r1) - f32(r0)) * (n - 1) / (m - 1) + start
    return o * 0 + float(0.5 * (r0 + r1) * (n - 1))


def _kernel(F, d, spec: _Spec):
    """Interpolation weight at signed distance ``d`` (in input pixels)."""
    ad = F.abs(d)
    if spec.mode == "linear":
        return 1 - F.clip(ad, 0, 1)
    a = spec.cubic_a
    inner = ((a + 2) * ad - (a + 3)) * ad * ad + 1
    outer = ((a * ad - 5 * a) * ad + 8 * a) * ad - 4 * a
    return inner * (ad <= 1) + outer * (ad > 1) * (ad < 2)


def _taps(F, ax: _Axis, spec: _Spec):
    """[(input index, weight or None)] per tap for every output position of ``ax``."""
    x = _source_coords(F, ax, spec.ctm)
    n = ax.n
    if spec.mode == "nearest":
        rule = spec.nearest
        if rule == "simple":  # onnxruntime's pre-opset-11 rule
            rule = "ceil" if ax.scale < 1 else "floor"
        idx = {"round_prefer_floor": lambda: F.ceil(x - 0.5),
               "round_prefer_ceil": lambda: F.floor(x + 0.5),
               "floor": lambda: F.floor(x), "ceil": lambda: F.ceil(x)}[rule]()
        return [(F.clip(idx, 0, n - 1), None)]
    support = 1 if spec.mode == "linear" else 2
    widen = min(ax.scale, 1.0) if spec.antialias else 1.0
    start = int(np.floor(-support / widen)) + 1
    base = F.ceil(x) - 1  # left neighbour, so the fraction r lies in (0, 1] as in ONNX
    frac = x - base
    taps = []
    for k in range(2 - 2 * start):
        idx = base + (start + k)
        w = _kernel(F, (frac * -1 + (start + k)) * widen, spec)
        if spec.exclude_outside:
            w = w * (idx >= 0) * (idx <= n - 1)
        taps.append((F.clip(idx, 0, n - 1), w))
    if spec.exclude_outside or spec.antialias:
        total = taps[0][1]
        for _, w in taps[1:]:
            total = total + w
        taps = [(i, w / total) for i, w in taps]
    return taps


def _along(shape_rank: int, axis: int) -> tuple[int, ...]:
    return tuple(-1 if i == axis else 1 for i in range(shape_rank))


def _resize_axis(node, sym, ax: _Axis, spec: _Spec, rank: int, dtype: str, name: str):
    with mx.name.Prefix(node.sub(f"ax{ax.axis}/")):
        taps = _taps(_Sym, ax, spec)
        terms = []
        for idx, w in taps:
            got = mx.sym.take(sym, mx.sym.Cast(idx, dtype="int32"), axis=ax.axis)
            if w is not None:
                w = mx.sym.reshape(mx.sym.Cast(w, dtype=dtype), shape=_along(rank, ax.axis))
                got = mx.sym.broadcast_mul(got, w)
            terms.append(got)
        if spec.ctm == "tf_crop_and_resize":
            x = _source_coords(_Sym, ax, spec.ctm)
            outside = mx.sym.Cast((x < 0) + (x > ax.n - 1) > 0, dtype=dtype)
            outside = mx.sym.reshape(outside, shape=_along(rank, ax.axis))
            keep = mx.sym.broadcast_mul(terms[0] if len(terms) == 1 else mx.sym.add_n(*terms),
                                        1 - outside)
            terms = [keep, outside * spec.extrapolation]
    if len(terms) == 1:
        return mx.sym.identity(terms[0], name=name)
    if spec.ctm == "tf_crop_and_resize":
        return mx.sym.broadcast_add(*terms, name=name)
    return mx.sym.add_n(*terms, name=name)


def _repeat_factor(a: _Axis, spec: _Spec) -> int | None:
    """Integer factor when nearest resizing of axis ``a`` is exactly ``repeat`` (each
    input element copied factor times), the case of integer upsampling."""
    factor = a.scale
    if spec.mode != "nearest" or factor != int(factor) or factor < 2:
        return None
    # free dims: only for modes whose index rule does not depend on the size
    if a.n is None and spec.ctm not in ("asymmetric", "half_pixel", "pytorch_half_pixel"):
        return None
    probe = dataclasses.replace(a, n=a.n or 16, m=(a.n or 16) * int(factor))
    if a.m is not None and a.m != probe.m:
        return None
    idx = _taps(_Np, probe, spec)[0][0]
    return int(factor) if np.array_equal(idx, np.arange(probe.m) // int(factor)) else None


def _fast_bilinear(axes: list[_Axis], spec: _Spec, rank: int) -> bool | None:
    """``align_corners`` flag when the resize is exactly ``contrib.BilinearResize2D``."""
    if spec.mode != "linear" or spec.antialias or rank != 4 or [a.axis for a in axes] != [2, 3]:
        return None
    if any(a.n is None or a.m is None or not np.isclose(a.scale * a.n, a.m) for a in axes):
        return None
    if spec.ctm == "align_corners":
        return True
    if spec.ctm == "pytorch_half_pixel" or spec.ctm == "half_pixel" and \
            all(a.m > 1 for a in axes):
        return False
    return None


def _resize(node, x, axes: list[_Axis], spec: _Spec):
    rank = need_rank(node, x)
    dtype = np.dtype(x.dtype or np.float32).name
    # onnxruntime copies the input whenever the output shape equals it, whatever the
    # scales or roi say; otherwise it leaves alone unit-scale axes and, when
    # antialiasing, every axis that keeps its size
    if not all(a.n is not None and a.m == a.n for a in axes):
        axes = [a for a in axes if not (a.m == a.n and (a.scale == 1 or spec.antialias)
                                        and spec.ctm != "tf_crop_and_resize")]
    else:
        axes = []
    if not axes:
        return mx.sym.identity(x.sym, name=node.name)
    factors = [_repeat_factor(a, spec) for a in axes]
    if rank == 4 and [a.axis for a in axes] == [2, 3] and factors[0] and \
            factors[0] == factors[1] and np.dtype(dtype).kind == "f":
        # one fused op (float only: UpSampling has no integer kernels)
        return mx.sym.UpSampling(x.sym, scale=factors[0], sample_type="nearest", num_args=1,
                                 name=node.name)
    corners = _fast_bilinear(axes, spec, rank)
    if corners is not None and dtype == "float32":
        return mx.sym.contrib.BilinearResize2D(x.sym, height=axes[0].m, width=axes[1].m,
                                               align_corners=corners, name=node.name)
    for a, f in zip(axes, factors):
        if a.n is None and not f:
            raise node.unsupported(f"the size of axis {a.axis} of input '{x.name}' is unknown; "
                                   f"only nearest upsampling by an integer factor works on "
                                   f"free dims, otherwise pass input_shapes=...")
    sym = x.sym
    for i, (a, f) in enumerate(reversed(list(zip(axes, factors)))):
        name = node.name if i == len(axes) - 1 else node.sub(f"ax{a.axis}")
        if f:
            sym = mx.sym.repeat(sym, repeats=f, axis=a.axis, name=name)
        else:
            sym = _resize_axis(node, sym, a, spec, rank, dtype, name)
    return sym


def _dims(x, rank):
    return list(x.shape) if x.shape is not None else [None] * rank


def _opt_const(node, t, what):
    """A constant optional input; None when omitted or empty (opset 13 style)."""
    if t is None:
        return None
    value = t.need_const(node, what)
    return None if value.size == 0 else value.astype(np.float64).reshape(-1)


def _plan_scales(node, axes, dims, scales) -> list[_Axis]:
    if len(scales) != len(axes):
        raise node.unsupported(f"{len(scales)} scales for {len(axes)} axes")
    # output size from a float32 product, like onnxruntime (10 * 2.6f is 26, not 25)
    return [_Axis(a, dims[a], None if dims[a] is None
                  else int(np.floor(np.float32(dims[a]) * np.float32(s))), float(s))
            for a, s in zip(axes, scales)]


def _legacy(node, inputs, scales):
    """Upsample and Resize-10: asymmetric coordinates, onnxruntime's 'simple' nearest."""
    mode = node.attr("mode", "nearest")
    mode = "linear" if mode in ("bilinear", "trilinear") else mode
    if mode not in ("nearest", "linear"):
        raise node.unsupported(f"mode '{mode}' is not one of nearest/linear")
    spec = _Spec(mode, "asymmetric", "simple")
    if scales is None:
        raise node.unsupported("no scales given")
    x = inputs[0]
    rank = need_rank(node, x)
    return _resize(node, x, _plan_scales(node, range(rank), _dims(x, rank), scales), spec)


@converter("Upsample", since=7, until=8)
def upsample7(node, inputs):
    return _legacy(node, inputs, node.attr("scales"))


@converter("Upsample", since=9)
def upsample9(node, inputs):
    return _legacy(node, inputs, _opt_const(node, inputs[1], "scales"))


@converter("Resize", since=10, until=10)
def resize10(node, inputs):
    return _legacy(node, inputs, _opt_const(node, inputs[1], "scales"))


@converter("Resize", since=11)
def resize(node, inputs):
    x = inputs[0]
    rank = need_rank(node, x)
    get = (lambda i, what: _opt_const(node, inputs[i], what) if len(inputs) > i else None)
    roi, scales, sizes = get(1, "roi"), get(2, "scales"), get(3, "sizes")
    spec = _Spec(node.attr("mode", "nearest"), node.attr("coordinate_transformation_mode",
                                                         "half_pixel"),
                 node.attr("nearest_mode", "round_prefer_floor"),
                 float(node.attr("cubic_coeff_a", -0.75)), bool(node.attr("exclude_outside", 0)),
                 float(node.attr("extrapolation_value", 0.0)), bool(node.attr("antialias", 0)))
    if spec.mode not in _MODES or spec.ctm not in _CTMS or spec.nearest not in _NEAREST:
        raise node.unsupported(f"mode '{spec.mode}' / coordinate_transformation_mode "
                               f"'{spec.ctm}' / nearest_mode '{spec.nearest}' is unknown")
    if spec.antialias and spec.mode == "nearest":
        raise node.unsupported("antialias is undefined for nearest mode")
    axes = node.attr("axes")
    axes = list(range(rank)) if axes is None else norm_axes(node, axes, rank)
    dims = _dims(x, rank)
    if (scales is None) == (sizes is None):
        raise node.unsupported("exactly one of 'scales' and 'sizes' must be given")
    if scales is not None:
        plan = _plan_scales(node, axes, dims, scales)
    else:
        plan = _plan_sizes(node, axes, dims, [int(v) for v in sizes])
    if spec.ctm == "tf_crop_and_resize":
        if roi is None:
            raise node.unsupported("tf_crop_and_resize needs the 'roi' input")
        k = len(roi) // 2
        start, end = (roi[:k], roi[k:]) if k == len(axes) else (roi[:k][axes], roi[k:][axes])
        for p, r0, r1 in zip(plan, start, end):
            p.roi = (float(r0), float(r1))
    for p in plan:
        if p.m is not None and p.m < 1:
            raise node.unsupported(f"axis {p.axis} would be resized to {p.m} elements")
    return _resize(node, x, plan, spec)


def _plan_sizes(node, axes, dims, sizes) -> list[_Axis]:
    """Axes for target ``sizes``. A size of 0 (never valid in ONNX) keeps the axis: the
    importer writes it for entries that follow the free batch dimension."""
    if len(sizes) != len(axes):
        raise node.unsupported(f"{len(sizes)} sizes for {len(axes)} axes")
    resized = [(a, m) for a, m in zip(axes, sizes) if m != 0]
    if any(dims[a] is None for a, _ in resized):
        raise node.unsupported("target sizes need the input sizes of the resized axes; "
                               "pass input_shapes=...")
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    ratios = [m / dims[a] for a, m in resized]
    if policy != "stretch":
        if policy not in ("not_larger", "not_smaller"):
            raise node.unsupported(f"keep_aspect_ratio_policy '{policy}' is unknown")
        r = min(ratios) if policy == "not_larger" else max(ratios)
        ratios = [r] * len(resized)
        resized = [(a, int(r * dims[a] + 0.5)) for a, _ in resized]
    # the scale is float32(m) / float32(n), as onnxruntime computes it
    plan = {a: _Axis(a, dims[a], m, float(np.float32(m) / np.float32(dims[a]))
                     if policy == "stretch" else r)
            for (a, m), r in zip(resized, ratios)}
    return [plan.get(a, _Axis(a, dims[a], dims[a], 1.0)) for a in axes]
