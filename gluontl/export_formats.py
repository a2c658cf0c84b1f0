"""The export formats by name: a catalogue below every layer (as ``task_registry`` is for tasks),
so the recipe schema checks ``export.formats`` without importing the exporters. Each format's
module registers how it writes, verifies and quantizes (``gluontl.export.registry``); ``BUILTIN``
maps gluontl's own names to those modules, in the order an export writes them, so adding a format
is its module and one line here. A format registered from elsewhere is added at its registration."""
from __future__ import annotations

from typing import Sequence

BUILTIN = {"symbol": "gluontl.export.symbol_files", "onnx": "gluontl.export.onnx_file",
           "openvino": "gluontl.export.openvino_ir"}
_ADDED: list[str] = []  # names registered by modules outside BUILTIN (registry.register adds them)


def names() -> list[str]:
    """Every known format name, gluontl's own first."""
    return [*BUILTIN, *_ADDED]


def add(name: str) -> None:
    if name not in BUILTIN and name not in _ADDED:
        _ADDED.append(name)


def check(formats: Sequence[str]) -> list[str]:
    """``formats`` as a list if each one is a known format name (ValueError naming the bad ones)."""
    known = names()
    unknown = [f for f in formats if f not in known]
    if unknown:
        what = "is no export format" if len(unknown) == 1 else "are no export formats"
        raise ValueError(f"{', '.join(map(repr, unknown))} {what}; the registered formats are {', '.join(known)}")
    return list(formats)
