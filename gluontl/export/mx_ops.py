"""MXNet→ONNX converters that ``mx.onnx`` (1.9.1) lacks, registered into its own registry.

Only ops our importer emits and mx.onnx cannot write: ``erf`` (exact GELU in every
transformer exported from PyTorch).
"""
from __future__ import annotations

from mxnet.onnx.mx2onnx._export_onnx import MXNetGraph
from mxnet.onnx.mx2onnx._op_translations._op_translations_opset12 import create_basic_op_node


@MXNetGraph.register("erf")
def _erf(node, **kwargs):
    return create_basic_op_node("Erf", node, kwargs)
