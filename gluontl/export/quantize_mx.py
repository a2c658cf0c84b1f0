"""Post-training int8 of a verified float symbol/params export through MXNet's oneDNN path
(``mx.contrib.quantization.quantize_net_v2``), judged like the int8 ONNX file: the float and the
int8 MXNet models on the validation split, through the task's metric, refused past ``max_drop``.

What oneDNN does, and why the settings are what they are:
- Weights: int8, per tensor or per output channel (``per_channel``); the fused oneDNN layers
  keep them float32 in the params file and quantize them when the graph first runs, so the int8
  files are about as large as the float ones (unlike the ONNX file).
- Activations, per tensor, chosen from the CPU (``activation_policy``). With VNNI:
  ``quantized_dtype='auto'``, uint8 where the calibrated range has no negative value (after
  ReLU), int8 elsewhere, every layer with an int8 kernel quantized. Without VNNI (or with
  ``DNNL_MAX_CPU_ISA`` capping oneDNN below it) MXNet 1.9.1's int8 kernels saturate their
  int16 pair sums for uint8 inputs and in FullyConnected, giving wrong numbers (measured on
  one layer: errors 10-20x the quantization bound); only int8-input convolutions stay right
  there, so activations are int8 and FullyConnected stays float.
- ``method`` minmax is MXNet's ``naive`` calibration, entropy its KL-divergence one; MXNet has
  no percentile calibration.
"""
from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import mxnet as mx
import numpy as np

from gluontl.console import root_log_level
from gluontl.errors import ExportError, short_reason
from gluontl.mxinternals import nodes_of
from gluontl.export import cpu
from gluontl.recipe import QuantizeSpec

log = logging.getLogger(__name__)

_CALIB_MODES = {"minmax": "naive", "entropy": "entropy"}
_CALIBRATION_BATCH = 8
_EVAL_BATCH = 32
# ONNX op types a task limits quantization to (detectors and segmenters: ["Conv"]) -> the MXNet
# operators that compute them, before and after oneDNN's fusion pass.
_MX_OPS = {"Conv": {"Convolution", "_sg_mkldnn_conv"}, "Gemm": {"FullyConnected", "_sg_mkldnn_fully_connected"},
           "MatMul": {"FullyConnected", "_sg_mkldnn_fully_connected"}}
# Turns the symbol's outputs of one batch into what the task's metric reads (a segmenter's
# logits into its mask, batch by batch so the split's logits never sit in memory at once).
Outputs = Callable[[list[np.ndarray]], list[np.ndarray]]


def params_of(json_path: Path) -> Path:
    """``NAME-symbol.json`` -> ``NAME-0000.params``."""
    return json_path.with_name(json_path.name[: -len("-symbol.json")] + "-0000.params")


def model_bytes(path: Path) -> int:
    """An ONNX file's size; a symbol export's is its graph's and its params' together."""
    if path.name.endswith("-symbol.json"):
        return path.stat().st_size + params_of(path).stat().st_size
    if path.suffix == ".xml":  # an OpenVINO IR: its graph and its weights
        return path.stat().st_size + path.with_suffix(".bin").stat().st_size
    return path.stat().st_size


def int8_names(name: str) -> tuple[str, str]:
    return f"{name}-int8-symbol.json", f"{name}-int8-0000.params"


class CalibrationIter(mx.io.DataIter):
    """Model inputs ``tensor(i)`` for ``i`` in ``indices``, as the DataIter quantize_net_v2 reads
    (its Module re-binds for a shorter last batch)."""

    def __init__(self, tensor: Callable[[int], np.ndarray], indices: Sequence[int], input_name: str,
                 batch_size: int = _CALIBRATION_BATCH) -> None:
        self.tensor, self.input_name = tensor, input_name
        self.batches = [list(indices[i:i + batch_size]) for i in range(0, len(indices), batch_size)]
        if not self.batches:
            raise ExportError("int8 calibration got no images; set export.quantize.calibration to train, val or "
                              "a number of images >= 1.")
        super().__init__(len(self.batches[0]))
        self._shape = (len(self.batches[0]), *np.shape(tensor(self.batches[0][0])))
        self._next = 0

    @property
    def provide_data(self) -> list[mx.io.DataDesc]:
        return [mx.io.DataDesc(self.input_name, self._shape)]

    @property
    def provide_label(self) -> list[mx.io.DataDesc]:
        return []

    def reset(self) -> None:
        self._next = 0

    def next(self) -> mx.io.DataBatch:
        if self._next >= len(self.batches):
            raise StopIteration
        batch = self.batches[self._next]
        self._next += 1
        return mx.io.DataBatch(data=[mx.nd.array(np.stack([self.tensor(i) for i in batch]))], label=None, pad=0)


def load_symbol(json_path: Path, params_path: Path, input_name: str) -> mx.gluon.SymbolBlock:
    with warnings.catch_warnings():  # imports() warns that input dtypes are unknown; they are float32
        warnings.simplefilter("ignore", UserWarning)
        return mx.gluon.SymbolBlock.imports(os.fspath(json_path), [input_name], os.fspath(params_path))


def input_of(symbol: mx.sym.Symbol, params_path: Path) -> str:
    """The one data input of an exported image model (its inputs less its parameters)."""
    stored = {k.split(":", 1)[-1] for k in mx.nd.load(os.fspath(params_path))}
    inputs = [n for n in symbol.list_inputs() if n not in stored]
    if len(inputs) != 1:
        raise ExportError(f"int8 of a symbol export feeds one image batch, but {params_path.name}'s symbol takes "
                          f"{inputs or 'no input'}; export the float files again.")
    return inputs[0]


def layer_names(symbol: mx.sym.Symbol) -> list[str]:
    """The symbol's operator nodes (the names ``exclude`` globs match)."""
    return [n["name"] for n in _nodes(symbol) if n["op"] != "null"]


def _nodes(symbol: mx.sym.Symbol) -> list[dict[str, Any]]:
    return nodes_of(symbol)


def excluded_layers(symbol: mx.sym.Symbol, globs: Sequence[str], *, strict: bool) -> tuple[list[str], list[str]]:
    """(the layers ``globs`` match, the globs matching none). ``strict``: a glob matching no
    layer is an error (with an ONNX file beside it, a glob may name an ONNX node alone)."""
    names = layer_names(symbol)
    out: list[str] = []
    unmatched = []
    for glob in globs:
        hits = [n for n in names if fnmatch.fnmatchcase(n, glob)]
        if not hits:
            unmatched.append(glob)
        out += [h for h in hits if h not in out]
    if unmatched and strict:
        raise ExportError(f"export.quantize.exclude '{unmatched[0]}' matches no layer of the symbol export (its "
                          f"layers include {', '.join(names[:3])}, ..., {', '.join(names[-3:])}); give globs of "
                          f"layer names as `python -c \"import mxnet as mx; print(mx.sym.load('NAME-symbol.json')"
                          f".get_internals().list_outputs())\"` lists them (without _output).")
    return out, unmatched


def excluded_operators(symbol: mx.sym.Symbol, op_types: Sequence[str] | None) -> list[str]:
    """The operators of the graph (after oneDNN's fusion) outside ``op_types``: what stays float
    when a task quantizes its convolutions only (decoding, NMS and arg-max float)."""
    if not op_types:
        return []
    unknown = [t for t in op_types if t not in _MX_OPS]
    if unknown:
        raise ExportError(f"int8 of a symbol export can be limited to {', '.join(_MX_OPS)} (ONNX op types), not "
                          f"{', '.join(unknown)}.")
    keep = set().union(*(_MX_OPS[t] for t in op_types))
    fused = symbol.get_backend_symbol("MKLDNN_QUANTIZE")
    return sorted({n["op"] for n in _nodes(symbol) + _nodes(fused) if n["op"] != "null"} - keep)


def granularity(setting: str | bool) -> tuple[str, str]:
    """oneDNN's weight granularity and why: per channel unless told otherwise (BatchNorm is folded
    into the convolution, scaling each output channel by its own factor; see quantize.per_channel_choice)."""
    if setting is False:
        return "tensor-wise", "per-tensor weights (as set)"
    return "channel-wise", f"per-channel weights ({'as set' if setting is True else 'auto'})"


@contextlib.contextmanager
def _quiet_mxnet() -> Iterator[None]:
    """quantize_net_v2 logs each layer it calibrates at INFO on the root logger."""
    with root_log_level(logging.WARNING), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def check_method(spec: QuantizeSpec) -> None:
    if spec.method not in _CALIB_MODES:
        raise ExportError(f"export.quantize.method {spec.method} has no MXNet counterpart (the symbol export is "
                          f"quantized by MXNet's oneDNN path: minmax or entropy); use one of those, or export "
                          f"only the ONNX file (--format onnx) with {spec.method}.")


def activation_policy(flags: set[str], max_isa: str | None = None) -> tuple[str, list[str], str]:
    """(quantized_dtype, operators kept float, why) for MXNet's oneDNN int8 on this CPU."""
    vnni, why = cpu.onednn_vnni(flags, max_isa)
    if vnni:
        return "auto", [], f"uint8/int8 activations by their calibrated sign, every int8-capable layer ({why})"
    return "int8", sorted(_MX_OPS["Gemm"]), (f"int8 activations and FullyConnected kept float: {why}, and without "
                                             f"it MXNet's uint8 and FullyConnected int8 kernels saturate")


def quantize_block(block: mx.gluon.SymbolBlock, calib: CalibrationIter, spec: QuantizeSpec, *,
                   exclude_layers: Sequence[str] = (), exclude_ops: Sequence[str] = (),
                   flags: set[str] | None = None) -> mx.gluon.SymbolBlock:
    """``block`` through quantize_net_v2 (oneDNN, CPU), calibrated on ``calib``, with this CPU's
    ``activation_policy`` (``flags``: its cpuinfo flags, default this machine's)."""
    dtype, float_ops, _ = activation_policy(cpu.cpu_flags() if flags is None else flags)
    check_method(spec)
    try:
        with _quiet_mxnet():
            return mx.contrib.quantization.quantize_net_v2(
                block, quantized_dtype=dtype, quantize_mode="full",
                quantize_granularity=granularity(spec.per_channel)[0], exclude_layers=list(exclude_layers),
                exclude_operators=sorted({*exclude_ops, *float_ops}), calib_data=calib,
                calib_mode=_CALIB_MODES[spec.method], ctx=mx.cpu())
    except (mx.base.MXNetError, ValueError, KeyError) as err:
        raise ExportError(f"MXNet could not quantize the symbol export ({short_reason(err)}); exclude the layer it "
                          f"names with export.quantize.exclude, or ship the float symbol files.") from err


def paired_outputs(float_block: mx.gluon.HybridBlock, int8_block: mx.gluon.HybridBlock,
                   tensor: Callable[[int], np.ndarray], n: int, outputs: Outputs
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Both models' ``outputs`` on inputs ``tensor(0..n-1)`` (each image decoded once)."""
    results: list[list[list[np.ndarray]]] = [[], []]
    for start in range(0, n, _EVAL_BATCH):
        x = mx.nd.array(np.stack([tensor(i) for i in range(start, min(start + _EVAL_BATCH, n))]))
        for block, out in zip((float_block, int8_block), results):
            with mx.autograd.predict_mode():
                got = block(x)
            out.append(outputs([a.asnumpy() for a in (got if isinstance(got, (list, tuple)) else [got])]))
    return tuple([np.concatenate(parts) for parts in zip(*batches)] for batches in results)  # type: ignore


@dataclass(frozen=True)
class SymbolInt8:
    files: tuple[Path, Path]  # NAME-int8-symbol.json, NAME-int8-0000.params (in the folder asked for)
    report: dict[str, Any]


def quantize_symbol_verified(json_path: Path, spec: QuantizeSpec, calib_images: Any,
                             calib_indices: Sequence[int], calib_what: str, val: Any, labels: Any, metric: Any,
                             tensors: Callable[[Path, Any], Callable[[int], np.ndarray]], *, out_dir: Path,
                             op_types: Sequence[str] | None = None, outputs: Outputs = lambda outs: outs,
                             strict_exclude: bool = True, flags: set[str] | None = None,
                             echo: Callable[[str], None] = log.info) -> SymbolInt8:
    """Quantize the float ``NAME-symbol.json`` (+ its params) and write ``NAME-int8-symbol.json``
    / ``NAME-int8-0000.params`` into ``out_dir`` (a scratch folder: nothing reaches the user
    before the verdict); the written pair is reloaded and it is what the metric judges. ExportError
    when the metric drops by more than ``spec.max_drop`` points."""
    params_path = params_of(json_path)
    symbol = mx.sym.load(os.fspath(json_path))
    input_name = input_of(symbol, params_path)
    float_block = load_symbol(json_path, params_path, input_name)
    layers, unmatched = excluded_layers(symbol, spec.exclude, strict=strict_exclude)
    ops = excluded_operators(symbol, op_types)
    gran, gran_why = granularity(spec.per_channel)
    flags = cpu.cpu_flags() if flags is None else flags
    dtype, float_ops, dtype_why = activation_policy(flags)
    echo(f"int8 (MXNet oneDNN): {dtype_why}; {gran_why}; calibrating ({spec.method}) on {calib_what}"
         + (f"; only {'/'.join(op_types or [])} layers quantized, {len(ops)} other operator kinds float (listed in "
            f"the report)" if ops else ""))
    calib = CalibrationIter(tensors(json_path, calib_images), calib_indices, input_name)
    quantized = quantize_block(float_block, calib, spec, exclude_layers=layers, exclude_ops=ops, flags=flags)
    name = json_path.name[: -len("-symbol.json")]
    files = tuple(out_dir / f for f in int8_names(name))
    calib.reset()
    quantized(calib.next().data[0])  # export() writes the parameters of the graph a forward pass built: none before
    try:
        quantized.export(os.fspath(out_dir / f"{name}-int8"), epoch=0)  # writes exactly ``files``
    except (OSError, mx.base.MXNetError) as err:
        raise ExportError(f"Cannot write the int8 symbol files into {out_dir}: {err}. Check free space and "
                          f"permissions.") from err
    int8_block = load_symbol(files[0], files[1], input_name)
    float_out, int8_out = paired_outputs(float_block, int8_block, tensors(json_path, val), len(val), outputs)
    verdict = metric(float_out, int8_out, labels)
    quantized_layers = sum(n.get("attrs", {}).get("quantized") == "true" for n in _nodes(mx.sym.load(
        os.fspath(files[0]))))
    report = {"settings": spec.model_dump(), "engine": f"MXNet {mx.__version__} oneDNN (quantize_net_v2)",
              "calibration": calib_what, "calib_mode": _CALIB_MODES[spec.method], "quantized_dtype": dtype,
              "activation_reason": dtype_why, "granularity": gran, "granularity_reason": gran_why,
              "excluded_layers": layers, "unmatched_exclude": unmatched, "float_operators": sorted({*ops, *float_ops}),
              "quantized_layers": quantized_layers,
              "cpu": cpu.flag_summary(flags), "verification": verdict}
    if verdict["drop"] > spec.max_drop:
        raise ExportError(
            f"The int8 symbol export {files[0].name} was not written: {verdict['summary']} (MXNet oneDNN); the drop "
            f"exceeds export.quantize.max_drop {spec.max_drop:g} points (settings: {gran_why}, {spec.method} "
            f"calibration on {calib_what}). Try, in this order: keep the first and last layers float "
            f"(export.quantize.exclude: [FIRST_LAYER, LAST_LAYER]), per-tensor weights (per_channel: false), "
            f"entropy calibration, more calibration images (calibration: train); or raise max_drop if the loss "
            f"is acceptable.")
    echo(f"int8 (MXNet oneDNN): {verdict['summary']}")
    return SymbolInt8(files, report)  # type: ignore[arg-type]
