"""The export formats. Each format is one module that registers an ``ExportFormat`` (its name,
what it writes, how it is verified, its int8 step, and the step that writes it); ``BUILTIN``
lists the modules of gluontl's own (from ``gluontl.export_formats``, which the recipe schema
reads), so adding a format, with or without int8, is its module and one line there. The
CLI's choices, ``export_block`` and the task exporters (which only add a graph finisher, see
``GraphFinisher``) read this and never name a format."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Protocol, Sequence

from gluontl import export_formats
from gluontl.errors import ExportError

if TYPE_CHECKING:
    from gluontl.export.artifacts import Artifact, Exported

# the modules whose import registers gluontl's formats, in the order an export writes them (an
# IR is converted from the ONNX file when that is written too): gluontl.export_formats lists them
BUILTIN = tuple(export_formats.BUILTIN.values())
# --format's shorthand for the two formats gluontl exported before it had a third
BOTH = ("symbol", "onnx")


class GraphFinisher(Protocol):
    """What a task adds to an export: its ONNX graph (the network's outputs plus the task's
    finishing nodes, e.g. a detector's per-class NMS, a segmenter's arg-max), verified against
    MXNet. Formats whose ``source`` is ``onnx`` are written from this one file."""

    note: str  # what its verification adds to the ONNX verdict, e.g. " (masks)"
    # how a format made from the ONNX file is checked against it: (its outputs, onnxruntime's) -> why
    # they differ, or None; None here: every output within rtol of its range (a detector aligns ties)
    compare: Callable[[list, list], str | None] | None

    def write_onnx(self, folder: Path, overwrite: bool) -> Path:
        """The verified ``folder/NAME.onnx`` (ExportError, nothing written, when it disagrees)."""

    def batches(self) -> list[tuple[str, Any]]:
        """The (label, input batch) pairs the ONNX file was verified on, for derived formats."""


@dataclass
class ExportJob:
    """One export: the network and where its files go, the task's ``graph``, the checks' settings,
    and for a run its ``judge`` (validation split and metric) and ``int8`` (a QuantizeSpec)."""

    block: Any
    out: Path
    name: str
    input_shapes: Mapping[str, tuple[int, ...]]
    graph: GraphFinisher
    rtol: float | None = None  # None: ONNX judged by its graph's float32 bound
    force: bool = False
    card: Mapping[str, Any] | None = None
    judge: Any = None
    int8: Any = None
    echo: Callable[[str], None] = print


@dataclass
class Int8Job:
    """What a format's int8 step gets (``quantize.export_with_int8`` makes it): the QuantizeSpec,
    the run's images and the task's judge (``metric``: (float outputs, int8 outputs, labels) ->
    report with ``drop`` and ``summary``), the ``scratch`` folder the float artifacts ``made`` are
    in and its int8 files go to, and the task's overrides (None: the format's defaults)."""

    spec: Any
    train: Any
    val: Any
    labels: Any
    metric: Callable
    scratch: Path
    name: str
    made: Sequence["Artifact"]  # the float artifacts of this export, in scratch
    calibration: tuple[Any, list[int], str]  # quantize.calibration_indices(spec.calibration, train, val)
    echo: Callable[[str], None] = print
    tensors: Callable | None = None  # (float file, images) -> (index -> model input); None: the file's record
    op_types: Sequence[str] | None = None  # the ONNX op types quantized (None: all the engine can)
    outputs: Sequence[str] | None = None  # the ONNX outputs the metric reads (None: all)
    symbol_outputs: Callable | None = None  # the same of MXNet's outputs of one batch


@dataclass(frozen=True)
class Int8Made:
    """An int8 step's artifact (in scratch) and, if it writes one, the report a run keeps as
    ``report_name`` (with both files' sizes) about the float file ``source``."""

    artifact: "Artifact"
    source: Path
    report_name: str | None = None
    report: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Int8Step:
    """A format's int8 partner (``--int8``, ``export.quantize``). ``make(job, float_artifact)``
    returns it, or raises ExportError to refuse it (its numbers and what to try: the float files
    and other int8 models are still written). ``make`` None: the format's own write step makes it
    from ``ExportJob.int8`` (OpenVINO's, from the ONNX file it converts), and ``unjudged`` is the
    refusal when a task's exporter gives that step no judge."""

    engine: str  # what --int8 runs, e.g. "onnxruntime static QDQ"
    targets: Callable[[str], Sequence[str]] = lambda name: ()  # its file names for NAME (the overwrite check)
    make: Callable[[Int8Job, "Artifact"], Int8Made] | None = None
    check: Callable[[Any], None] | None = None  # a QuantizeSpec it cannot take: ExportError before any work
    unjudged: str | None = None
    order: int = 0  # int8 steps run by this, then in registration order (onnxruntime's before MXNet's)


@dataclass(frozen=True)
class ExportFormat:
    name: str        # what --format and export.formats say
    writes: str      # the files, NAME standing for the run's name
    verified: str    # the check a written file passed
    int8: Int8Step | None  # how its int8 partner (--int8) is made, None if it has none
    source: Literal["block", "onnx"]  # traced from the MXNet block, or made from the task's verified ONNX graph
    write: Callable[[ExportJob, "Exported"], None]  # adds its artifacts (and refusals) to the result
    extra: str | None = None  # the setup.cfg extra it needs, None if gluontl's own dependencies suffice
    needs: str | None = None  # the module that extra installs, checked before any work
    brief: str | None = None  # what the CLI prints after a float file's name; None: every file's verdict


_FORMATS: dict[str, ExportFormat] = {}


def register(fmt: ExportFormat) -> ExportFormat:
    """Add ``fmt`` (a format's module calls this once, at import); a name taken by another module
    is an error, re-registering the same one (a re-import) is not."""
    known = _FORMATS.get(fmt.name)
    if known is not None and getattr(known.write, "__module__", None) != getattr(fmt.write, "__module__", None):
        raise ExportError(f"export format {fmt.name!r} is registered twice ({known.write.__module__} and "
                          f"{fmt.write.__module__}); give the new one another name.")
    _FORMATS[fmt.name] = fmt
    export_formats.add(fmt.name)  # so a recipe's export.formats may name it
    return fmt


def formats() -> dict[str, ExportFormat]:
    """Every registered format by name, gluontl's own first (importing their modules)."""
    for module in BUILTIN:
        importlib.import_module(module)
    return dict(_FORMATS)


def get(name: str) -> ExportFormat:
    return formats()[name]


def check_formats(names: Sequence[str], where: str = "export.formats") -> list[str]:
    """``names`` as a list, each one a registered format whose extra is installed (else one
    paragraph naming them, before any work)."""
    known = formats()
    unknown = [f for f in names if f not in known]
    if unknown:
        raise ExportError(f"{where} names {', '.join(map(repr, unknown))}, which is no export format; use "
                          f"{', '.join(known)}.")
    for f in names:
        needs = known[f].needs
        if needs and not _importable(needs):
            raise ExportError(f"{where} asks for {f}, and {needs} is not installed in this Python: install "
                              f"gluontl's extra (pip install 'gluontl[{known[f].extra}]'), or export another "
                              f"format ({', '.join(n for n in known if not known[n].needs)}).")
    return list(names)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, a half-installed package
        return False


def with_int8() -> list[str]:
    """The registered formats that have an int8 step."""
    return [name for name, fmt in formats().items() if fmt.int8 is not None]


def check_int8(names: Sequence[str], where: str = "--int8") -> None:
    """``--int8`` on formats none of which has an int8 step is bad input."""
    known = formats()
    if names and not any(known[f].int8 for f in names if f in known):
        raise ExportError(f"{where} asks for int8, but {', '.join(names)} has no int8 export; use "
                          f"{', '.join(with_int8())}.")


def from_onnx(names: Sequence[str]) -> bool:
    """Whether any of ``names`` is made from the task's ONNX graph (so a task builds it)."""
    known = formats()
    return any(known[f].source == "onnx" for f in names)


def from_block(names: Sequence[str]) -> bool:
    """Whether any of ``names`` is traced from the MXNet block as it is."""
    known = formats()
    return any(known[f].source == "block" for f in names)


def write(job: ExportJob, names: Sequence[str], result: "Exported") -> "Exported":
    """Each asked-for format's step, in registration order, into ``result``."""
    for fmt in formats().values():
        if fmt.name in names:
            fmt.write(job, result)
    return result


def brief(artifact: "Artifact") -> str:
    """The CLI's note after an artifact's file name."""
    text = formats()[artifact.format].brief
    if text is None:
        return f" ({artifact.verdict})"
    if artifact.precision == "int8":
        return " (int8, checked on the validation split)"
    return f" ({text})" if text else ""
