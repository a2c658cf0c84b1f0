"""ONNX → trainable Gluon SymbolBlock importer (a registry of per-op converters)."""
from .importer import ImportInfo, OnnxBlock, import_model
from .inspect import OnnxReport, format_report, inspect_onnx
from .spatial import rebind_spatial

__all__ = ["ImportInfo", "OnnxBlock", "OnnxReport", "format_report", "import_model", "inspect_onnx",
           "rebind_spatial"]
