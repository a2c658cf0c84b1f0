"""The numpy names mxnet 1.9.1 and GluonCV 0.10.5 still use, put back where numpy removed them.

numpy 1.24 removed the builtin aliases (``np.bool``, ``np.int``, ``np.float``, ...), numpy 2.0 the
constants (``np.PZERO``, ``np.NaN``, ``np.Inf``, ...), ``np.alltrue``, ``np.sometrue``, ``np.product``,
``np.round_``, ``np.msort``, ``np.compat``
and ``ndarray.tostring``, and later 2.x releases ``np.trapz`` and ``np.in1d``. mxnet reads most of
them when it is imported (``mxnet/numpy/utils.py``, ``mxnet/numpy/fallback.py``), the rest at run
time (``mx.np.pad``, ``recordio.pack``/``pack_img``, gluon's estimator), and GluonCV reads
``np.float``/``np.int``/``np.Inf``. gluontl imports this module before anything imports mxnet:
first thing in ``gluontl/__init__.py``, and ``_gluontl_hook`` (run at start-up by the
``gluontl-npcompat.pth`` installed with gluontl) imports it before the first ``import mxnet`` or
``import gluoncv`` whatever a script imports first.

Only a name numpy does not have is defined, with what it meant in the last numpy that had it
(numpy 1.23 has every name here, and this module then changes nothing). Two patches, each applied
when its module is first imported and only where needed: where numpy has no ``ndarray.tostring``,
``mxnet.recordio.pack``/``pack_img`` become the same code with ``tobytes`` (the same bytes); where
onnx has no ``onnx.mapping`` (onnx >= 1.19, needed on Python 3.13/3.14), it is rebuilt for
``mx.onnx``.
"""
from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import math
import numbers
import struct
import sys
import types
import warnings
from typing import Any

import numpy


def _msort(a: Any) -> numpy.ndarray:
    """numpy 1.x's ``msort``: a sorted copy along the first axis."""
    out = numpy.array(a, subok=True, copy=True)
    out.sort(axis=0)
    return out


def _in1d(ar1: Any, ar2: Any, assume_unique: bool = False, invert: bool = False, *, kind: Any = None) -> numpy.ndarray:
    """numpy 1.x's ``in1d``: ``isin`` of the flattened first argument."""
    extra = {} if kind is None else {"kind": kind}  # numpy 1.23's isin has no kind
    return numpy.isin(numpy.asarray(ar1).ravel(), ar2, assume_unique=assume_unique, invert=invert, **extra)


def _calling(name: str, target: Any):
    """A function of its own that calls ``target``: mxnet registers its operators for numpy's by
    identity (``__array_function__``), so an alias must not be numpy's function object itself."""
    def alias(*args: Any, **kwargs: Any):
        return target(*args, **kwargs)
    alias.__name__ = alias.__qualname__ = name
    alias.__doc__ = f"numpy 1.x's ``{name}``: ``numpy.{target.__name__}``."
    return alias


def _removed_financial(name: str):
    def removed(*args: Any, **kwargs: Any):
        raise RuntimeError(f"numpy.{name} was removed from numpy in 1.20 (NEP 32); use numpy_financial.{name}.")
    removed.__name__ = name
    return removed


def _replacements() -> dict[str, Any]:
    """Every name this module may define, with what it stood for when numpy still had it."""
    names: dict[str, Any] = {n: getattr(builtins, n) for n in ("bool", "int", "float", "complex", "object", "str")}
    names.update(PZERO=0.0, NZERO=-0.0, PINF=math.inf, NINF=-math.inf, NAN=math.nan, NaN=math.nan, Inf=math.inf)
    names.update(alltrue=_calling("alltrue", numpy.all), sometrue=_calling("sometrue", numpy.any),
                 product=_calling("product", numpy.prod), round_=_calling("round_", numpy.round),
                 msort=_msort, in1d=_in1d, compat=types.SimpleNamespace(basestring=str))
    if hasattr(numpy, "trapezoid"):  # numpy 2.0 renamed trapz
        names["trapz"] = _calling("trapz", numpy.trapezoid)
    # removed in 1.20 already; numpy 1.2x kept stubs that raise when called, mxnet's fallback reads them
    names.update({n: _removed_financial(n) for n in ("mirr", "npv", "pmt", "ppmt", "pv", "rate")})
    return names


def _has(name: str) -> bool:
    with warnings.catch_warnings():  # numpy warns that a deprecated name is deprecated when it is read
        warnings.simplefilter("ignore")
        try:
            getattr(numpy, name)
        except AttributeError:
            return False
        return True


def _define_missing() -> tuple[str, ...]:
    missing = tuple(n for n, value in _replacements().items() if not _has(n))
    for name, value in _replacements().items():
        if name in missing:
            setattr(numpy, name, value)
    return missing


ADDED = _define_missing()
"""The names this process got from here; empty where numpy still has them all (numpy 1.23)."""

# ---------------------------------------------------------------- mxnet.recordio without tostring

NEEDS_TOBYTES = not hasattr(numpy.ndarray, "tostring")
"""numpy 2.3 removed ``ndarray.tostring`` (deprecated since 1.19 for ``tobytes``, the same bytes)."""


def _pack(header, s):
    """``mxnet.recordio.pack`` of mxnet 1.9.1, with ``tobytes`` for ``tostring``."""
    recordio = sys.modules["mxnet.recordio"]
    header = recordio.IRHeader(*header)
    if isinstance(header.label, numbers.Number):
        header = header._replace(flag=0)
    else:
        label = numpy.asarray(header.label, dtype=numpy.float32)
        header = header._replace(flag=label.size, label=0)
        s = label.tobytes() + s
    return struct.pack(recordio._IR_FORMAT, *header) + s


def _pack_img(header, img, quality=95, img_fmt=".jpg"):
    """``mxnet.recordio.pack_img`` of mxnet 1.9.1, with ``tobytes`` for ``tostring``."""
    import cv2

    params = {".JPG": [cv2.IMWRITE_JPEG_QUALITY, quality], ".JPEG": [cv2.IMWRITE_JPEG_QUALITY, quality],
              ".PNG": [cv2.IMWRITE_PNG_COMPRESSION, quality]}.get(img_fmt.upper())
    ret, buf = cv2.imencode(img_fmt, img, params)
    assert ret, "failed to encode image"
    return _pack(header, buf.tobytes())


def patch_recordio(module: types.ModuleType) -> None:
    module.pack, module.pack_img = _pack, _pack_img


# ---------------------------------------------------------------- onnx without onnx.mapping

def patch_onnx(module: types.ModuleType) -> None:
    """onnx 1.19 removed ``onnx.mapping`` (deprecated since 1.13; Python 3.14 needs onnx >= 1.20);
    ``mx.onnx.export_model`` reads its two dtype tables. Rebuilt from ``onnx.helper``'s converter,
    first tensor type per numpy dtype as the old table had it (FLOAT16 before BFLOAT16)."""
    if hasattr(module, "mapping") or "onnx.mapping" in sys.modules:
        return
    from onnx import TensorProto, helper

    to_np = {}
    for code in sorted(TensorProto.DataType.values()):
        try:
            to_np[code] = numpy.dtype(helper.tensor_dtype_to_np_dtype(code))
        except (KeyError, TypeError, ValueError):
            continue
    to_tensor: dict[numpy.dtype, int] = {}
    for code, dtype in to_np.items():
        to_tensor.setdefault(dtype, code)
    mapping = types.ModuleType("onnx.mapping", "onnx < 1.19's dtype tables, rebuilt by gluontl.npcompat.")
    mapping.TENSOR_TYPE_TO_NP_TYPE, mapping.NP_TYPE_TO_TENSOR_TYPE = to_np, to_tensor
    module.mapping = sys.modules["onnx.mapping"] = mapping


def _onnx_lacks_mapping() -> bool:
    """Whether the installed onnx has no ``mapping.py``, asked without importing onnx."""
    import importlib.util
    import os

    spec = importlib.util.find_spec("onnx")
    places = (spec.submodule_search_locations or []) if spec is not None else []
    return bool(places) and not any(os.path.exists(os.path.join(p, "mapping.py")) for p in places)


NEEDS_ONNX_MAPPING = _onnx_lacks_mapping()

PATCHES = {**({"mxnet.recordio": patch_recordio} if NEEDS_TOBYTES else {}),
           **({"onnx": patch_onnx} if NEEDS_ONNX_MAPPING else {})}
"""Module → patch, applied right after the module is first imported (or now, if it is already)."""


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds a module of PATCHES as the path finder would and patches it right after it runs."""

    def find_spec(self, name, path=None, target=None):
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                PATCHES[name](module)
            spec.loader.exec_module = exec_module
        return spec


for _name, _patch in PATCHES.items():
    if _name in sys.modules:
        _patch(sys.modules[_name])
if PATCHES and not any(isinstance(f, _PatchAfterImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _PatchAfterImport())
