"""OpenVINO IR (``NAME.xml`` + ``NAME.bin`` in a folder ``NAME-openvino/``), float and int8.

The IR is converted from the float ONNX export, which was itself verified against MXNet, by
OpenVINO's own converter (``openvino.convert_model``), saved in float32 (``save_model`` halves
weights to float16 unless told not to), and kept only if OpenVINO's CPU plugin (float32
inference precision: it picks bfloat16 by itself on CPUs that have it) reproduces the ONNX
outputs within ``rtol`` of their range on the same batches, and, for a run, answers like it on
the validation split by the task's metric. The card (preprocessing, class names, task) goes
into the IR's runtime info under the ONNX metadata keys, so ``predict`` reads either file alike.

int8 is NNCF's post-training quantization of the float IR, calibrated on the run's own images
through the recorded preprocessing, with the ONNX path's verdict: refused past ``max_drop``.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import onnx

from gluontl.data.transforms import META_CLASSES, META_PREPROCESS, card_of, onnx_metadata, preprocess_of
from gluontl.errors import ExportError, ModelSourceError, short_reason
from gluontl.export.artifacts import Artifact, Exported, Refusal
from gluontl.export.registry import ExportFormat, ExportJob, Int8Step, register
from gluontl.export.verify import FIXED_RTOL, output_error
from gluontl.runfolder import RunFolder

INSTALL = ("OpenVINO is not installed in this Python; install gluontl's extra: pip install 'gluontl[openvino]' "
           "(openvino 2026.4), or export --format onnx.")
NNCF_INSTALL = ("int8 OpenVINO IR needs NNCF 3.4: pip install 'gluontl[openvino-int8]' (numpy >= 1.24), or on "
                "numpy 1.23, whose floor NNCF 3.4 declares too high but runs on, pip install --no-deps "
                "nncf==3.4.0 after the [openvino] extra.")
SUFFIX = "-openvino"
MIN_LABEL_AGREEMENT = 0.999  # integer outputs (masks, ids): the share of elements equal to onnxruntime's
_F32 = {"INFERENCE_PRECISION_HINT": "f32"}
_BATCH = 32


def require() -> Any:
    """The ``openvino`` module, or the error naming the extra to install."""
    try:
        import openvino
    except ImportError:
        raise ExportError(INSTALL) from None
    return openvino


def folder_of(out_dir: Path, name: str) -> Path:
    return out_dir / f"{name}{SUFFIX}"


def convert(onnx_path: Path) -> Any:
    """OpenVINO's own conversion of the ONNX file, with its gluontl metadata as runtime info."""
    ov = require()
    try:
        model = ov.convert_model(str(onnx_path))
    except Exception as err:  # the converter raises its own untyped errors from C++
        raise ExportError(f"OpenVINO cannot convert {onnx_path} ({short_reason(err)}); ship the ONNX file, "
                          f"which onnxruntime runs.") from None
    for prop in onnx.load(str(onnx_path), load_external_data=False).metadata_props:
        if prop.key.startswith("gluontl."):
            model.set_rt_info(prop.value, prop.key)
    return model


def compiled(model: Any, threads: int | None = None) -> Any:
    """The model compiled for the CPU in float32 (or as quantized, for an int8 IR)."""
    ov = require()
    config = dict(_F32)
    if threads is not None:
        config["INFERENCE_NUM_THREADS"] = str(threads)
    return ov.Core().compile_model(model, "CPU", config)


def run(model: Any, x: np.ndarray) -> list[np.ndarray]:
    """Every output of a compiled model on one batch, in the model's output order."""
    result = model(x)
    return [np.asarray(result[o]) for o in model.outputs]


def outputs_on(model: Callable[[np.ndarray], list[np.ndarray]], tensor: Callable[[int], np.ndarray], n: int
               ) -> list[np.ndarray]:
    """``model(batch)`` over inputs ``tensor(0..n-1)``, batches concatenated."""
    parts: list[list[np.ndarray]] = []
    for start in range(0, n, _BATCH):
        parts.append(model(np.stack([tensor(i) for i in range(start, min(start + _BATCH, n))])))
    return [np.concatenate(p) for p in zip(*parts)]


def save(model: Any, folder: Path, name: str) -> tuple[Path, Path]:
    """``folder/NAME.xml`` and ``.bin`` in float32 (``compress_to_fp16`` off)."""
    ov = require()
    folder.mkdir(parents=True, exist_ok=True)
    xml = folder / f"{name}.xml"
    try:
        ov.save_model(model, str(xml), compress_to_fp16=False)
    except Exception as err:
        raise ExportError(f"Cannot write {xml}: {short_reason(err)}. Check free space and permissions.") from None
    return xml, xml.with_suffix(".bin")


def verify_float(model: Any, onnx_path: Path, batches: Sequence[tuple[str, np.ndarray]], rtol: float,
                 where: Path, compare: Callable[[list, list], str | None] | None = None) -> str:
    """OpenVINO's outputs against onnxruntime's (float kernels) of the verified ONNX file: by the
    task's ``compare`` (its finisher's: (got, want) -> why they differ, or None) when it has one,
    else each output within ``rtol`` of its range (integer ones: equal on 99.9 % of elements)."""
    from gluontl.export.verify import ort_session

    session = ort_session(onnx_path, str(onnx_path))
    net = compiled(model)
    worst = 0.0
    for label, x in batches:
        want = session.run(None, {session.get_inputs()[0].name: x})
        try:
            got = run(net, x)
        except Exception as err:
            raise ExportError(f"{where} was not written: OpenVINO cannot run it on a {label} "
                              f"({short_reason(err)}); ship the ONNX file.") from None
        if compare is not None:
            why = compare(got, want)
            if why is not None:
                raise ExportError(f"{where} was not written: OpenVINO disagrees with onnxruntime on the {label}: "
                                  f"{why}; ship the ONNX file.")
            continue
        for o, g, w in zip(session.get_outputs(), got, want):
            if np.issubdtype(np.asarray(w).dtype, np.integer):  # a mask or class ids: an arg-max flips at ties
                agree = float(np.mean(np.asarray(g) == np.asarray(w))) if np.shape(g) == np.shape(w) else 0.0
                if agree < MIN_LABEL_AGREEMENT:
                    raise ExportError(f"{where} was not written: OpenVINO's output {o.name} equals onnxruntime's "
                                      f"on {100 * agree:.3f} % of its elements on a {label} (< "
                                      f"{100 * MIN_LABEL_AGREEMENT:g} %); ship the ONNX file.")
                continue
            _, rel = output_error(g, w)
            if rel > rtol:
                raise ExportError(f"{where} was not written: OpenVINO's output {o.name} differs from onnxruntime's "
                                  f"on a {label} by {rel:.2e} of its range (> rtol {rtol:g}); ship the ONNX file.")
            worst = max(worst, rel)
    if compare is not None:
        return f"verified: OpenVINO reproduces the verified ONNX by the task's check (rtol {rtol:g})"
    return f"verified: OpenVINO reproduces the verified ONNX within {worst:.1e} of the output range (rtol {rtol:g})"


def write_float(onnx_path: Path, out_dir: Path, name: str, batches: Sequence[tuple[str, np.ndarray]], rtol: float,
                force: bool, compare: Callable[[list, list], str | None] | None = None) -> Artifact:
    """The float IR of ``onnx_path`` into ``out_dir/NAME-openvino/``, verified first."""
    folder = folder_of(out_dir, name)
    xml = folder / f"{name}.xml"
    if folder.exists() and not force:
        raise ExportError(f"{folder} already exists; refusing to overwrite it. Pass --force to replace it.")
    model = convert(onnx_path)
    verdict = verify_float(model, onnx_path, batches, rtol, xml, compare)
    return Artifact("openvino", "float", _replace_folder(model, folder, name), verdict)


def _replace_folder(model: Any, folder: Path, name: str) -> tuple[Path, Path]:
    """Saved beside ``folder`` and renamed into place, so a failed write leaves what was there."""
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        save(model, tmp, name)
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder / f"{name}.xml", folder / f"{name}.bin"


def quantize(float_xml: Path, tensor: Callable[[int], np.ndarray], indices: Sequence[int]) -> Any:
    """NNCF's post-training int8 of the float IR, calibrated on ``tensor(i)`` for ``indices``."""
    ov = require()
    try:
        import nncf
    except ImportError:
        raise ExportError(NNCF_INSTALL) from None
    if tuple(int(p) for p in nncf.__version__.split(".")[:2]) < (3, 4):
        raise ExportError(f"NNCF {nncf.__version__} cannot read OpenVINO 2026 models; {NNCF_INSTALL}")
    model = ov.Core().read_model(str(float_xml))
    data = nncf.Dataset([np.stack([tensor(i)]) for i in indices])
    try:
        return nncf.quantize(model, data, subset_size=len(indices), preset=nncf.QuantizationPreset.PERFORMANCE)
    except Exception as err:  # NNCF raises its own errors and bare RuntimeErrors from OpenVINO
        raise ExportError(f"NNCF could not quantize {float_xml} ({short_reason(err)}); ship the float IR.") from None


def _openvino(model: Any) -> Callable[[np.ndarray], list[np.ndarray]]:
    net = compiled(require().Core().read_model(str(model)) if isinstance(model, Path) else model)
    return lambda x: run(net, x)


def _onnxruntime(path: Path) -> Callable[[np.ndarray], list[np.ndarray]]:
    from gluontl.export.verify import ort_session

    session = ort_session(path, str(path))
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})


@contextlib.contextmanager
def from_onnx(written: Exported, out_dir: Path, name: str, make_onnx: Callable[[Path], Path]) -> Iterator[Path]:
    """The verified float ONNX file to convert: the one ``written`` holds, else one
    ``make_onnx(folder)`` writes into a scratch folder (removed after)."""
    made = next((a.path for a in written.artifacts if a.format == "onnx" and a.precision == "float"), None)
    if made is not None:
        yield made
        return
    scratch = Path(tempfile.mkdtemp(dir=out_dir, prefix=f".{name}.onnx."))
    try:
        yield make_onnx(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _float_summary(verdict: dict[str, Any]) -> str:
    """A task metric's report (quantize's ``Metric``: ``metric``, ``float``, ``int8``, ``images``)
    read as float ONNX (onnxruntime) against the float IR (OpenVINO)."""
    return (f"{verdict['metric']} {100 * verdict['float']:.3f} ONNX (onnxruntime), {100 * verdict['int8']:.3f} "
            f"OpenVINO ({-verdict['drop']:+.3f} points) on {verdict['images']} validation images")


def write(job: ExportJob, result: Exported) -> None:
    """The ``openvino`` format's step: the task's verified float ONNX (``result``'s, or one written
    into a scratch folder) converted and checked by ``add_openvino``."""
    require()
    with from_onnx(result, job.out, job.name, lambda folder: job.graph.write_onnx(folder, True)) as onnx_path:
        add_openvino(result, job.out, job.name, onnx_path=onnx_path, batches=job.graph.batches(),
                     rtol=FIXED_RTOL if job.rtol is None else job.rtol,
                     force=job.force, judge=job.judge, int8_spec=job.int8, echo=job.echo, compare=job.graph.compare)


def add_openvino(result: Exported, out_dir: Path, name: str, *, onnx_path: Path, batches, rtol: float,
                 force: bool, judge: "Judge | None" = None, int8_spec: Any = None,
                 echo: Callable[[str], None] = print, compare: Callable[[list, list], str | None] | None = None
                 ) -> Exported:
    """The float IR (and with ``int8_spec`` its NNCF int8 partner) of the verified ONNX file, added
    to ``result``; ``judge`` holds the run's validation split and task metric, ``compare`` the
    task's check of the IR's outputs against the ONNX file's (see ``verify_float``)."""
    artifact = write_float(onnx_path, out_dir, name, batches, rtol, force, compare)
    if judge is not None:
        verdict = judge.verdict(onnx_path, _onnxruntime(onnx_path), _openvino(artifact.path))
        if abs(verdict["drop"]) > 0.05:
            shutil.rmtree(artifact.path.parent, ignore_errors=True)
            raise ExportError(f"{artifact.path} was not written: {_float_summary(verdict)}; a float conversion must "
                              f"not change the metric. Ship the ONNX file.")
        artifact = Artifact(artifact.format, artifact.precision, artifact.files,
                            f"{artifact.verdict}; {_float_summary(verdict)}")
    result.add(artifact)
    if int8_spec is None or judge is None:
        return result
    int8_name = f"{name}.int8"
    folder = folder_of(out_dir, int8_name)
    if folder.exists() and not force:
        raise ExportError(f"{folder} already exists; refusing to overwrite it. Pass --force to replace it.")
    images, indices, what = judge.calibrate(int8_spec)
    echo(f"int8 (OpenVINO NNCF): calibrating on {what}")
    try:
        model = quantize(artifact.path, judge.tensors(onnx_path, images), indices)
        verdict = judge.verdict(onnx_path, _openvino(artifact.path), _openvino(model))
        if verdict["drop"] > int8_spec.max_drop:
            raise ExportError(
                f"The int8 OpenVINO IR {folder / (int8_name + '.xml')} was not written: {verdict['summary']} (NNCF "
                f"post-training, performance preset, {what}); the drop exceeds export.quantize.max_drop "
                f"{int8_spec.max_drop:g} points. Try more calibration images (calibration: train), the ONNX or "
                f"symbol int8 (--format onnx/symbol), or raise max_drop if the loss is acceptable.")
    except ExportError as err:
        result.refused.append(Refusal("openvino", "int8", str(err)))
        return result
    echo(f"int8 (OpenVINO NNCF): {verdict['summary']}")
    model.set_rt_info(json.dumps({"verification": verdict, "calibration": what}, default=float), "gluontl.int8")
    result.add(Artifact("openvino", "int8", _replace_folder(model, folder, int8_name),
                        f"int8 (OpenVINO NNCF): {verdict['summary']}"))
    return result


@dataclass(frozen=True)
class Judge:
    """A run's validation split and labels, the task's metric ((reference outputs, candidate
    outputs, labels) -> report with ``drop`` in points, as quantize's ``Metric``), its model
    inputs (``tensors(onnx_path, images)``) and the images to calibrate on (``calibrate(spec)``: a
    QuantizeSpec -> (images, indices, description), as ``quantize.calibration_indices``)."""

    val: Any
    labels: Any
    metric: Callable
    tensors: Callable[[Path, Any], Callable[[int], np.ndarray]]
    calibrate: Callable[[Any], tuple[Any, list[int], str]]

    def verdict(self, onnx_path: Path, reference: Callable, candidate: Callable) -> dict[str, Any]:
        tensor = self.tensors(onnx_path, self.val)
        return self.metric(outputs_on(reference, tensor, len(self.val)), outputs_on(candidate, tensor, len(self.val)),
                           self.labels)


# made by ``write`` (it needs the verified ONNX file the float IR is converted from, and the judge)
INT8 = Int8Step("NNCF post-training quantization", lambda name: (), None,
                unjudged="The int8 OpenVINO IR was not made: it is judged by the task's metric on the run's validation "
                         "split, and this task's exporter gives OpenVINO none yet (classification and detection do). "
                         "Use --format onnx --int8, or ship the float IR.")

FORMAT = register(ExportFormat(
    "openvino", "NAME-openvino/NAME.xml + NAME.bin",
    "OpenVINO reproduces the verified ONNX within export.rtol, and the run's metric on its validation split",
    INT8, "onnx", write, extra="openvino", needs="openvino"))


# ---------------------------------------------------------------- reading an IR (predict)

def ir_xml(path: Path) -> Path:
    """The ``.xml`` of an IR folder (or the file itself), with its ``.bin`` checked."""
    path = Path(path)
    if path.is_dir():
        found = sorted(path.glob("*.xml"))
        if len(found) != 1:
            raise ModelSourceError(f"'{path}' holds {len(found)} .xml files; an OpenVINO IR folder written by "
                                   f"gluontl export --format openvino holds one NAME.xml with its NAME.bin.")
        path = found[0]
    if not path.with_suffix(".bin").is_file():
        raise ModelSourceError(f"The OpenVINO IR '{path}' has no '{path.with_suffix('.bin').name}' beside it (its "
                               f"weights); copy the whole folder gluontl export wrote, or export the run again.")
    return path


def is_ir(path: Path) -> bool:
    path = Path(path)
    return path.suffix == ".xml" or (path.is_dir() and not RunFolder(path).is_run()
                                     and any(path.glob("*.xml")))


def ir_metadata(path: Path) -> dict[str, str]:
    """The gluontl runtime info of an IR (the ONNX metadata keys)."""
    ov = require()
    xml = ir_xml(path)
    try:
        model = ov.Core().read_model(str(xml))
    except Exception as err:
        raise ModelSourceError(f"OpenVINO cannot read '{xml}' ({short_reason(err)}); export the run again.") from None
    info = model.get_rt_info()
    meta = {str(k): info[k].astype(str) for k in info.keys() if str(k).startswith("gluontl.")}
    missing = [k for k in (META_CLASSES, META_PREPROCESS) if k not in meta]
    if missing:
        raise ModelSourceError(f"The OpenVINO IR '{xml}' has no {' and no '.join(missing)} runtime info, so its class "
                               f"names and preprocessing are unknown: it was not exported by gluontl from a run. "
                               f"Export the run with `gluontl export runs/NAME --format openvino`.")
    return meta


def deployed_metadata(path: Path) -> dict[str, str]:
    """The gluontl metadata of an exported file: an IR's runtime info or an ONNX file's metadata_props."""
    return ir_metadata(path) if is_ir(path) else onnx_metadata(path)


def deployed_preprocess(path: Path) -> tuple[Any, list[str]]:
    """The recorded pipeline and class names of an IR or an ONNX file."""
    return preprocess_of(deployed_metadata(path), path)


def deployed_card(path: Path) -> dict[str, Any]:
    """The run card (``preprocess``, ``classes``) of an IR or an ONNX file."""
    return card_of(deployed_metadata(path), path)


def deployed_session(path: Path) -> Any:
    """An onnxruntime session of an ONNX file, or an IR behind the same calls (``IRSession``)."""
    from gluontl.export.verify import ort_session

    return IRSession(path) if is_ir(path) else ort_session(path, f"'{path}'")


class IRSession:
    """An IR compiled for the CPU behind onnxruntime's ``InferenceSession`` calls that predict
    uses (``get_inputs``, ``get_outputs``, ``run``), so a task's predict serves both files."""

    class _Port:
        def __init__(self, port: Any) -> None:
            self.name = port.get_any_name()
            shape = port.get_partial_shape()
            self.shape = [d.get_length() if d.is_static else None for d in shape]

    def __init__(self, path: Path) -> None:
        xml = ir_xml(path)
        ov = require()
        try:
            self.model = compiled(ov.Core().read_model(str(xml)))
        except Exception as err:
            raise ModelSourceError(f"OpenVINO cannot load '{xml}' ({short_reason(err)}); export the run "
                                   f"again.") from None

    def get_inputs(self) -> list[Any]:
        return [self._Port(p) for p in self.model.inputs]

    def get_outputs(self) -> list[Any]:
        return [self._Port(p) for p in self.model.outputs]

    def run(self, names: Sequence[str] | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        outs = run(self.model, next(iter(feeds.values())))
        if names is None:
            return outs
        order = [p.get_any_name() for p in self.model.outputs]
        return [outs[order.index(n)] for n in names]
