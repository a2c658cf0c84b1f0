"""SymbolBlocks that keep the Gluon contract: imported ONNX graphs and symbol checkpoints.

MXNet's SymbolBlock saves parameters under their names minus the names' common prefix, but
loads names without a '.' by prepending the block's own prefix instead, so
``save_parameters``/``load_parameters`` do not round-trip (``resnetv10_conv0_weight`` is saved
as ``conv0_weight`` and looked up as ``symbolblock0_conv0_weight``). And ``SymbolBlock.imports``
loads data into parameters whose ``shape`` stays None. A GraphBlock saves and loads its
parameters under their graph names, and every parameter knows its shape.
"""
from __future__ import annotations

import os

import mxnet as mx


class GraphBlock(mx.gluon.SymbolBlock):
    def __init__(self, outputs, inputs, params=None) -> None:
        super().__init__(outputs, inputs, params=params)
        self._reg_params = dict(self.params.items())  # graph names, as saved and as loaded

    def load_parameters(self, filename, ctx=None, allow_missing=False, ignore_extra=False, cast_dtype=False,
                        dtype_source="current") -> None:
        loaded = mx.nd.load(os.fspath(filename))
        if isinstance(loaded, dict) and loaded and not any("." in k for k in loaded):
            self.collect_params().load(os.fspath(filename), ctx, allow_missing, ignore_extra, restore_prefix="",
                                       cast_dtype=cast_dtype, dtype_source=dtype_source)
            return
        super().load_parameters(filename, ctx, allow_missing, ignore_extra, cast_dtype, dtype_source)

    @classmethod
    def from_files(cls, symbol_file: str, input_names: list[str], param_file: str, ctx=None) -> "GraphBlock":
        """``SymbolBlock.imports`` for a GraphBlock, parameter dtypes as saved."""
        block = cls(mx.sym.load(symbol_file), [mx.sym.var(n) for n in input_names])
        block.collect_params().load(param_file, ctx, cast_dtype=True, dtype_source="saved")
        for p in block.collect_params().values():
            p.shape = p.data().shape
        return block
