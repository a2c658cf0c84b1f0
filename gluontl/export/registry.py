"""The export formats, one entry each: its name (what ``--format`` and ``export.formats`` say), what it
writes, how it is verified, which int8 engine it has and the module that writes it. The CLI's
choices, the tasks' format checks and the docs' table read this; adding a format is its module
and one line here."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Sequence

from gluontl.errors import ExportError


@dataclass(frozen=True)
class ExportFormat:
    name: str
    writes: str     # the files, NAME standing for the run's name
    verified: str   # the check a written file passed
    int8: str | None  # the engine of its int8 partner (--int8), None if it has none
    module: str     # where its writer lives
    extra: str | None = None  # the setup.cfg extra it needs, None if gluontl's own dependencies suffice
    needs: str | None = None  # the module that extra installs, checked before any work


FORMATS: dict[str, ExportFormat] = {f.name: f for f in (
    ExportFormat("symbol", "NAME-symbol.json + NAME-0000.params (+ NAME-preprocess.json)",
                 "reloaded in MXNet and compared with the block", "MXNet oneDNN (quantize_net_v2)",
                 "gluontl.export.exporters"),
    ExportFormat("onnx", "NAME.onnx", "onnxruntime reproduces MXNet within the float32 bound of its graph "
                 "(or export.rtol)", "onnxruntime static QDQ", "gluontl.export.exporters"),
    ExportFormat("openvino", "NAME-openvino/NAME.xml + NAME.bin",
                 "OpenVINO reproduces the verified ONNX within export.rtol (1e-4 unset), and the run's metric on its "
                 "validation split", "NNCF post-training quantization", "gluontl.export.openvino_ir", "openvino", "openvino"),
)}
# --format's shorthand for the two formats gluontl exported before it had a third
BOTH = ("symbol", "onnx")


def check_formats(formats: Sequence[str], where: str = "export.formats") -> list[str]:
    """``formats`` as a list, each one a registered name whose extra is installed (else one
    paragraph naming them, before any work)."""
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ExportError(f"{where} names {', '.join(map(repr, unknown))}, which is no export format; use "
                          f"{', '.join(FORMATS)}.")
    for f in formats:
        needs = FORMATS[f].needs
        if needs and not _importable(needs):
            raise ExportError(f"{where} asks for {f}, and {needs} is not installed in this Python: install "
                              f"gluontl's extra (pip install 'gluontl[{FORMATS[f].extra}]'), or export another "
                              f"format ({', '.join(n for n in FORMATS if not FORMATS[n].needs)}).")
    return list(formats)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses it, a half-installed package
        return False


def check_int8(formats: Sequence[str], where: str = "--int8") -> None:
    """``--int8`` on formats none of which has an int8 engine is bad input."""
    if formats and not any(FORMATS[f].int8 for f in formats):
        raise ExportError(f"{where} asks for int8, but {', '.join(formats)} has no int8 export; use "
                          f"{', '.join(f for f in FORMATS if FORMATS[f].int8)}.")
