"""Verified export of Gluon blocks to MXNet symbol/params and lean ONNX."""
from gluontl.export.exporters import export_onnx, export_symbol
from gluontl.export.verify import OutputCheck, VerifyReport, verify_onnx

__all__ = ["OutputCheck", "VerifyReport", "export_onnx", "export_symbol", "verify_onnx"]
