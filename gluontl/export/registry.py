"""The export formats. Each format is one module that registers an ``ExportFormat`` (its name,
what it writes, how it is verified, its int8 engine, and the step that writes it); ``BUILTIN``
lists the modules of gluontl's own, so adding a format is its module and one line there. The
CLI's choices, ``export_block`` and the task exporters (which only add a graph finisher, see
``GraphFinisher``) read this and never name a format."""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Protocol, Sequence

from gluontl.errors import ExportError

if TYPE_CHECKING:
    from gluontl.export.artifacts import Artifact, Exported

# the modules whose import registers gluontl's formats, in the order an export writes them (an
# IR is converted from the ONNX file when that is written too)
BUILTIN = ("gluontl.export.symbol_files", "gluontl.export.onnx_file", "gluontl.export.openvino_ir")
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


@dataclass(frozen=True)
class ExportFormat:
    name: str        # what --format and export.formats say
    writes: str      # the files, NAME standing for the run's name
    verified: str    # the check a written file passed
    int8: str | None  # the engine of its int8 partner (--int8), None if it has none
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


def check_int8(names: Sequence[str], where: str = "--int8") -> None:
    """``--int8`` on formats none of which has an int8 engine is bad input."""
    known = formats()
    if names and not any(known[f].int8 for f in names):
        raise ExportError(f"{where} asks for int8, but {', '.join(names)} has no int8 export; use "
                          f"{', '.join(f for f in known if known[f].int8)}.")


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
