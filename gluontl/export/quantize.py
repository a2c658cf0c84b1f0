"""Post-training int8 of a verified float ONNX export: onnxruntime static QDQ, calibrated on the
run's own images through the preprocessing the float file records, and kept only if the int8 file
still answers like the float one on the validation split.

The float export's rtol check cannot judge int8 (every activation moves by up to half a
quantization step). The judge is the task's own metric on real images: a ``Metric`` gets the
float and int8 outputs of the same batches and the labels and says how much was lost, so a task
(classification here; detection's mAP, segmentation's mIoU) plugs in its measure. A symbol
export beside the ONNX file gets its int8 pair from ``quantize_mx``, judged the same way.
"""
from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from gluontl.atomic import atomic_write, write_text
from gluontl.console import root_log_level
from gluontl.errors import ExportError, short_reason
from gluontl.export import cpu, quantize_mx
from gluontl.export.artifacts import Artifact, Exported, Refusal
from gluontl.export.exporters import check_target, set_metadata
from gluontl.export.verify import deploy_session

try:
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType, \
        quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process
except ImportError as err:  # onnxruntime imports ml_dtypes there without declaring it
    raise ExportError(f"int8 exports need onnxruntime.quantization, which cannot be imported here ({err}): "
                      f"install what it names (gluontl's setup.cfg lists ml_dtypes>=0.5,<0.6 for it; `bash "
                      f"scripts/env.sh` installs it).") from None
from gluontl.recipe import QuantizeSpec
from gluontl.data.transforms import load_preprocess, onnx_preprocess

log = logging.getLogger(__name__)

META_INT8 = "gluontl.int8"
_METHODS = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile}
_CALIBRATION_BATCH = 8  # onnxruntime holds every intermediate tensor of a batch while calibrating
_EVAL_BATCH = 32


class Images(Protocol):
    """Decoded images by index (a run's ``ImageDataset`` is one)."""

    def __len__(self) -> int: ...

    def image(self, index: int) -> np.ndarray: ...


# A task's judge: (float outputs, int8 outputs, labels) -> report with "drop" (points lost, the
# number max_drop bounds) and "summary" (one line); outputs are the graph's, batches concatenated.
Metric = Callable[[list[np.ndarray], list[np.ndarray], Any], dict[str, Any]]


class CalibrationReader(CalibrationDataReader):
    """Model inputs ``tensor(i)`` for ``i`` in ``indices``, as batches keyed by the input name."""

    def __init__(self, tensor: Callable[[int], np.ndarray], indices: Sequence[int], input_name: str,
                 batch_size: int = _CALIBRATION_BATCH) -> None:
        self.tensor, self.input_name = tensor, input_name
        self.batches = [list(indices[i:i + batch_size]) for i in range(0, len(indices), batch_size)]
        self.set_range(0, len(self.batches))

    def __len__(self) -> int:  # in batches: onnxruntime's set_range counts in these units
        return len(self.batches)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._todo = iter(self.batches[start_index:end_index])

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._todo, None)
        if batch is None:
            return None
        return {self.input_name: np.stack([self.tensor(i) for i in batch])}


def file_tensors(float_path: Path, images: Images) -> Callable[[int], np.ndarray]:
    """Image ``i`` through the preprocessing ``float_path`` records: exactly the tensor
    ``gluontl predict`` feeds the file."""
    preprocess, _ = onnx_preprocess(float_path)
    return lambda i: preprocess(images.image(i))


def symbol_tensors(json_path: Path, images: Images) -> Callable[[int], np.ndarray]:
    """Image ``i`` through the preprocessing recorded beside a symbol export (``NAME-preprocess.json``):
    what a deployment of the symbol files feeds them."""
    card = json_path.with_name(json_path.name[: -len("-symbol.json")] + "-preprocess.json")
    if not card.is_file():
        raise ExportError(f"int8 of {json_path.name} calibrates through the preprocessing recorded beside it, but "
                          f"{card.name} is missing; export a run (whose card it is), not a bare model.")
    preprocess, _ = load_preprocess(card)
    return lambda i: preprocess(images.image(i))


def calibration_indices(setting: str | int, train: Images, val: Images) -> tuple[Images, list[int], str]:
    """The images the calibration sees: a whole split, or N training images drawn with a fixed
    seed (the same N every export, spread over the classes as the split is)."""
    if setting in ("train", "val"):
        images = train if setting == "train" else val
        return images, list(range(len(images))), f"the {setting} split ({len(images)} images)"
    n = min(int(setting), len(train))
    picked = sorted(np.random.default_rng(0).permutation(len(train))[:n].tolist())
    return train, picked, f"{n} training images (a fixed draw of {len(train)})"


def per_channel_choice(model: onnx.ModelProto, setting: str | bool) -> tuple[bool, str]:
    """``auto`` is per-channel weights. BatchNorm folded into a convolution scales each output
    channel by its own factor, so one scale per tensor wastes most of the 8 bits on the
    channels with small weights. Measured on the ELPV demo's EfficientNet-Lite0 (a third of its
    convolutions depthwise, the kind onnxruntime #11415 saw collapse per-channel): per-channel
    kept top-1 (+0.0 points, 98.5 % agreement), per-tensor lost 3.0 points. A model that does
    collapse is caught by the max_drop check, whose advice names per_channel: false."""
    if setting is not True and setting is not False and setting != "auto":
        raise ExportError(f"export.quantize.per_channel is {setting!r}; use auto, true or false.")
    init = {t.name: t for t in model.graph.initializer}
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    depthwise = sum(1 for n in convs if next((a.i for a in n.attribute if a.name == "group"), 1) > 1
                    and len(n.input) > 1 and n.input[1] in init and init[n.input[1]].dims[1] == 1)
    census = f"{depthwise} of {len(convs)} convolutions depthwise"
    if setting != "auto":
        return bool(setting), f"per-{'channel' if setting else 'tensor'} weights (as set; {census})"
    return True, f"per-channel weights (auto; {census})"


def excluded_nodes(model: onnx.ModelProto, globs: Sequence[str]) -> list[str]:
    """The node names ``globs`` match; a glob matching none is an error (a typo would otherwise
    quantize the layer it meant to keep float)."""
    names = [n.name for n in model.graph.node if n.name]
    out: list[str] = []
    for glob in globs:
        hits = [n for n in names if fnmatch.fnmatchcase(n, glob)]
        if not hits:
            raise ExportError(f"export.quantize.exclude '{glob}' matches no node of the ONNX export (its nodes "
                              f"include {', '.join(names[:3])}, ..., {', '.join(names[-3:])}); give globs of "
                              f"node names as `python -c \"import onnx; print([n.name for n in "
                              f"onnx.load('FILE').graph.node])\"` lists them.")
        out += [h for h in hits if h not in out]
    return out


def quantize_onnx(float_path: Path, reader: CalibrationReader, spec: QuantizeSpec, *, reduce_range: bool,
                  per_channel: bool, exclude: Sequence[str], op_types: Sequence[str] | None = None) -> onnx.ModelProto:
    """onnxruntime's static QDQ quantization (uint8 activations, int8 weights, the CPU layout)
    of ``float_path``, calibrated batch by batch so memory holds one batch's tensors."""
    with tempfile.TemporaryDirectory(prefix="gluontl-int8-") as tmp:
        prepared, out = Path(tmp) / "prepared.onnx", Path(tmp) / "int8.onnx"
        try:
            with quiet_onnxruntime():
                prepare(float_path, prepared)
                quantize_static(str(prepared), str(out), reader, quant_format=QuantFormat.QDQ,
                                per_channel=per_channel, reduce_range=reduce_range,
                                activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                                nodes_to_exclude=list(exclude), calibrate_method=_METHODS[spec.method],
                                op_types_to_quantize=list(op_types) if op_types else None,
                                extra_options={"CalibStridedMinMax": 1})  # one batch at a time, any method
        except ExportError:
            raise
        except Exception as err:  # onnxruntime's quantizer raises bare ValueErrors/RuntimeErrors
            raise ExportError(f"onnxruntime could not quantize {float_path} ({short_reason(err)}); exclude "
                              f"the layer it names with export.quantize.exclude, or ship the float file.") from err
        return onnx.load(str(out))


def prepare(float_path: Path, out: Path) -> None:
    """onnxruntime's pre-quantization pass: shape inference and the basic optimizations, which
    fold an imported graph's BatchNormalization into the Conv before it, so one int8 Conv
    computes Conv+BN (with one requantization, not two)."""
    quant_pre_process(str(float_path), str(out), skip_symbolic_shape=True)


@contextlib.contextmanager
def quiet_onnxruntime() -> Iterator[None]:
    """The quantizer logs advice at WARNING on the root logger and prints per-batch progress."""
    with root_log_level(logging.ERROR), contextlib.redirect_stdout(io.StringIO()):
        yield


def paired_outputs(float_model: str | Path | bytes, int8_model: bytes, tensor: Callable[[int], np.ndarray], n: int,
                   input_name: str, outputs: Sequence[str] | None = None
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Both files' ``outputs`` (None: all) on inputs ``tensor(0..n-1)`` (each image decoded and
    preprocessed once)."""
    sessions = [deploy_session(float_model), deploy_session(int8_model)]
    results: list[list[list[np.ndarray]]] = [[], []]
    for start in range(0, n, _EVAL_BATCH):
        x = np.stack([tensor(i) for i in range(start, min(start + _EVAL_BATCH, n))])
        for session, out in zip(sessions, results):
            out.append(session.run(None if outputs is None else list(outputs), {input_name: x}))
    return tuple([np.concatenate(parts) for parts in zip(*batches)] for batches in results)  # type: ignore


def classification_metric(float_out: list[np.ndarray], int8_out: list[np.ndarray], labels: Any) -> dict[str, Any]:
    """Top-1 of each model on the labels, their change in points, and how often the two agree."""
    labels = np.asarray(labels).astype(np.int64)
    f, q = np.argmax(float_out[0], axis=1), np.argmax(int8_out[0], axis=1)
    acc_f, acc_q = float(np.mean(f == labels)), float(np.mean(q == labels))
    agree = float(np.mean(f == q))
    change = 100 * (acc_q - acc_f)
    return {"metric": "top-1", "images": int(len(labels)), "float": acc_f, "int8": acc_q, "drop": -change,
            "agreement": agree,
            "summary": f"top-1 {100 * acc_f:.2f} % float, {100 * acc_q:.2f} % int8 ({change:+.2f} points), "
                       f"top-1 agreement {100 * agree:.2f} % on {len(labels)} validation images"}


@dataclass(frozen=True)
class Int8Result:
    model: onnx.ModelProto
    report: dict[str, Any]


def quantize_verified(float_path: Path, spec: QuantizeSpec, train: Images, val: Images, labels: Any,
                      metric: Metric, *, tensors: Callable[[Path, Any], Callable[[int], np.ndarray]] = file_tensors,
                      op_types: Sequence[str] | None = None, outputs: Sequence[str] | None = None,
                      flags: set[str] | None = None,
                      echo: Callable[[str], None] = log.info) -> Int8Result:
    """The int8 model of ``float_path`` and its report; ExportError (nothing returned) when the
    metric drops by more than ``spec.max_drop`` points. ``tensors(float_path, images)`` gives
    the model inputs of a split (default: the float file's recorded preprocessing of its
    images); ``op_types`` limits what is quantized (None: every op onnxruntime can); ``outputs``
    are what the metric reads (None: every output; a segmenter's masks, not its logits, so the
    validation split's outputs fit in memory)."""
    float_model = onnx.load(str(float_path))
    input_name = float_model.graph.input[0].name
    flags = cpu.cpu_flags() if flags is None else flags
    reduce, reduce_why = cpu.reduce_range(flags)
    per_channel, channel_why = per_channel_choice(float_model, spec.per_channel)
    exclude = excluded_nodes(float_model, spec.exclude)
    images, indices, calib_what = calibration_indices(spec.calibration, train, val)
    echo(f"int8: {reduce_why}; {channel_why}; calibrating ({spec.method}) on {calib_what}")
    reader = CalibrationReader(tensors(float_path, images), indices, input_name)
    model = quantize_onnx(float_path, reader, spec, reduce_range=reduce, per_channel=per_channel, exclude=exclude,
                          op_types=op_types)
    data = model.SerializeToString()
    try:
        float_out, int8_out = paired_outputs(float_path, data, tensors(float_path, val), len(val), input_name,
                                             outputs)
    except Exception as err:  # onnxruntime's errors share no base class
        raise ExportError(f"onnxruntime cannot run the int8 model of {float_path} ({short_reason(err)}); exclude "
                          f"the layer it names with export.quantize.exclude, or ship the float file.") from err
    verdict = metric(float_out, int8_out, labels)
    report = {"settings": spec.model_dump(), "calibration": calib_what, "reduce_range": reduce,
              "reduce_range_reason": reduce_why, "per_channel": per_channel, "per_channel_reason": channel_why,
              "excluded_nodes": exclude, "cpu": cpu.flag_summary(flags), "onnxruntime": ort.__version__,
              "kernels": "onnxruntime CPU, all graph optimizations (QDQ fused into integer kernels)",
              "verification": verdict,
              "quantized_nodes": sum(n.op_type == "QuantizeLinear" for n in model.graph.node)}
    if verdict["drop"] > spec.max_drop:
        raise ExportError(
            f"The int8 export of {float_path.name} was not written: {verdict['summary']}; the drop exceeds "
            f"export.quantize.max_drop {spec.max_drop:g} points (settings: {reduce_why.split(':')[0]}, "
            f"{channel_why.split(':')[0]}, {spec.method} calibration on {calib_what}). Try, in this order: keep "
            f"the first and last layers float (export.quantize.exclude: [FIRST_NODE, LAST_NODE]), per-tensor "
            f"weights (per_channel: false) or per-channel (true), another method (entropy, percentile), more "
            f"calibration images (calibration: train); or raise max_drop if the loss is acceptable.")
    echo(f"int8: {verdict['summary']}")
    meta = {p.key: p.value for p in float_model.metadata_props}
    set_metadata(model, {**meta, META_INT8: json.dumps(report)})
    return Int8Result(model, report)


def export_with_int8(write_float: Callable[[Path], Exported], out_dir: Path, name: str, spec: QuantizeSpec,
                     train: Images, val: Images, labels: Any, metric: Metric, *, force: bool = False,
                     report_dir: Path | None = None, echo: Callable[[str], None] = log.info,
                     tensors: Callable[[Path, Any], Callable[[int], np.ndarray]] | None = None,
                     op_types: Sequence[str] | None = None, outputs: Sequence[str] | None = None,
                     symbol_outputs: quantize_mx.Outputs | None = None) -> Exported:
    """The float export (``write_float(folder)`` writes it, verified, and returns its artifacts) and
    the int8 partner of each float artifact whose format has an int8 step (``registry.Int8Step``:
    ``NAME.int8.onnx`` by onnxruntime, ``NAME-int8-symbol.json`` / ``NAME-int8-0000.params`` by
    MXNet oneDNN, an IR's made by its own write step). Each is made in a scratch folder and moved
    into ``out_dir`` if its own verdict holds: a refused int8 model is listed in ``refused`` (with
    its numbers and what to try) and takes neither the float files nor another int8 model down
    with it. The reports of the written ones also go to ``report_dir`` (a run folder), under the
    names their steps give. ``tensors(float_file, images)``: a task's model inputs (default: the
    preprocessing each file records); ``op_types`` limits quantization to those ONNX op types
    (MXNet: the operators computing them); ``outputs``: the ONNX outputs the metric reads,
    ``symbol_outputs`` the same of the symbol's outputs of one batch (a segmenter's arg-max)."""
    from gluontl.export import registry

    created = not out_dir.exists()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(f"Cannot create the output folder '{out_dir}': {e.strerror}. Pick a writable place "
                          f"with --out.") from None
    scratch = None
    result = Exported()
    made: list[Artifact] = []  # in scratch: the float artifacts, then the int8 ones that passed
    reports: list[registry.Int8Made] = []

    def name_out(text: str) -> str:  # messages name where the file would have gone, not the scratch folder
        return text.replace(str(scratch), str(out_dir))

    try:
        scratch = Path(tempfile.mkdtemp(dir=out_dir, prefix=f".{name}.int8."))
        floats = write_float(scratch)
        made += floats.artifacts
        result.refused += [Refusal(r.format, r.precision, name_out(r.reason)) for r in floats.refused]  # OpenVINO's
        known = registry.formats()
        steps = {a.format: (a, known[a.format].int8) for a in made if a.precision == "float" and known[a.format].int8}
        for fmt, (_, step) in steps.items():  # a step inside the format's write that had no judge
            if step.make is None and step.unjudged and not any(
                    a.format == fmt and a.precision == "int8" for a in made) and not any(
                    r.format == fmt for r in result.refused):
                result.refused.append(Refusal(fmt, "int8", step.unjudged))
        if not steps:
            raise ExportError(f"int8 quantizes a float export whose format has an int8 step; add one of "
                              f"{', '.join(registry.with_int8())} to export.formats (or --format).")
        steps = {fmt: pair for fmt, pair in steps.items() if pair[1].make is not None}
        for _, step in steps.values():
            if step.check is not None:
                step.check(spec)
        targets = [scratch / t for _, step in steps.values() for t in step.targets(name)]
        for f in [*(f for a in made for f in a.files), *targets]:
            if (out_dir / f.relative_to(scratch)).parent.is_dir():  # (an IR folder not there yet: nothing to lose)
                check_target(out_dir / f.relative_to(scratch), force)
        job = registry.Int8Job(spec, train, val, labels, metric, scratch, name, tuple(made),
                               calibration_indices(spec.calibration, train, val), echo=echo, tensors=tensors,
                               op_types=op_types, outputs=outputs, symbol_outputs=symbol_outputs)
        for fmt, (float_artifact, step) in sorted(steps.items(), key=lambda kv: kv[1][1].order):  # stable
            try:
                int8 = step.make(job, float_artifact)
            except ExportError as err:
                result.refused.append(Refusal(fmt, "int8", name_out(str(err))))
                continue
            made.append(int8.artifact)
            reports.append(int8)
        for artifact in made:
            for f in artifact.files:
                (out_dir / f.relative_to(scratch)).parent.mkdir(exist_ok=True)
                atomic_write(out_dir / f.relative_to(scratch), lambda t, src=f: shutil.copyfile(src, t), ExportError)
            result.add(artifact.moved(scratch, out_dir))
    except BaseException as err:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        if created:  # an export that failed before writing anything leaves no trace, not even its folder
            shutil.rmtree(out_dir, ignore_errors=True)
        if isinstance(err, ExportError) and scratch is not None and str(scratch) in str(err):
            raise ExportError(name_out(str(err))) from None
        raise
    shutil.rmtree(scratch, ignore_errors=True)
    if report_dir is not None:
        for int8 in reports:
            if int8.report_name is None:
                continue
            sizes = {"float_bytes": quantize_mx.model_bytes(out_dir / int8.source.name),
                     "int8_bytes": quantize_mx.model_bytes(out_dir / int8.artifact.path.name)}
            result.append(write_text(report_dir / int8.report_name, json.dumps(
                {"file": str(out_dir / int8.artifact.path.name), **sizes, **int8.report}, indent=1), ExportError))
    return result
