"""gluontl: parameter-granular fine-tuning for Apache MXNet Gluon.

The public API is loaded lazily so ``gluontl.threads.configure()`` (and the CLI) can size
MXNet's thread pool before MXNet is imported. ``npcompat`` is imported first, so whichever part
of gluontl is imported, numpy's removed aliases are back before MXNet (which needs them) loads.
"""
from __future__ import annotations

from typing import Any

from . import npcompat  # noqa: F401

__version__ = "0.1.0"

_API = {
    "load_model": ("gluontl.sources", "load_model"),
    "load_recipe": ("gluontl.recipe", "load_recipe"),
    "prepare": ("gluontl.api", "prepare"),
    "Rule": ("gluontl.recipe", "Rule"),
    "make_plan": ("gluontl.rules", "make_plan"),
    "apply_plan": ("gluontl.rules", "apply_plan"),
    "finetune": ("gluontl.api", "finetune"),
    "lr_find": ("gluontl.api", "lr_find"),
    "export_run": ("gluontl.train.runs", "export_run"),
    "evaluate": ("gluontl.train.runs", "evaluate"),
    "attach_head": ("gluontl.surgery", "attach_head"),
    "cut_at": ("gluontl.surgery", "cut_at"),
    "import_onnx": ("gluontl.onnx", "import_model"),
    "export_onnx": ("gluontl.export", "export_onnx"),
    "export_symbol": ("gluontl.export", "export_symbol"),
    "preprocess": ("gluontl.data.transforms", "preprocess"),
    "Metric": ("gluontl.metrics", "Metric"),
    "register_metric": ("gluontl.metrics", "register_metric"),
    "Callback": ("gluontl.train.callbacks", "Callback"),
    "register_callback": ("gluontl.train.callbacks", "register_callback"),
    "EarlyStopping": ("gluontl.train.callbacks", "EarlyStopping"),
    "CsvLogger": ("gluontl.train.callbacks", "CsvLogger"),
    "sweep": ("gluontl.sweep", "sweep"),  # the package is callable too: gluontl.sweep(recipe, space, trials=...)
}
__all__ = sorted(_API)


def __dir__() -> list[str]:
    """The lazy API too: ``dir(gluontl)`` and tab completion list it before anything is imported."""
    return sorted({*__all__, *(name for name in globals() if name.startswith("__"))})


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib

        module, attr = _API[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'gluontl' has no attribute '{name}'")
