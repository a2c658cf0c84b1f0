"""SymbolBlocks that keep the Gluon contract: imported ONNX graphs and symbol checkpoints.

MXNet's SymbolBlock saves parameters under their names minus the names' common prefix, but
loads names without a '.' by prepending the block's own prefix instead, so
``save_parameters``/``load_parameters`` do not round-trip (``resnetv10_conv0_weight`` is saved
as ``conv0_weight`` and looked up as ``symbolblock0_conv0_weight``). And ``SymbolBlock.imports``
loads data into parameters whose ``shape`` stays None. A GraphBlock saves and loads its
parameters under their graph names, and every parameter knows its shape.

MXNet's common-subexpression pass (run when a cached graph is built) takes time cubic in the
number of structurally identical nodes: 250, 500 and 1,000 copies of ``relu(x)`` cost 0.5, 4.5
and 34 s (``scripts/bench_onnx_outputs.py``). ONNX graphs with thousands of outputs have such
copies (each output an op on the same input, or an identity of an aliased tensor), so a
GraphBlock counts them first, in linear time, and builds without that pass when there are more
than ``CSE_MAX_DUPLICATES``: the copies are then computed separately, as the graph says.
"""
from __future__ import annotations

import contextlib
import os

import mxnet as mx

from .blocks import cached_symbol, set_own_params
from .symjson import nodes_of

CSE_MAX_DUPLICATES = 128  # 128 copies cost MXNet's pass about 0.05 s; it grows as the cube


class GraphBlock(mx.gluon.SymbolBlock):
    def __init__(self, outputs, inputs, params=None) -> None:
        super().__init__(outputs, inputs, params=params)
        set_own_params(self, dict(self.params.items()))  # graph names, as saved and as loaded

    def load_parameters(self, filename, ctx=None, allow_missing=False, ignore_extra=False, cast_dtype=False,
                        dtype_source="current") -> None:
        loaded = mx.nd.load(os.fspath(filename))
        if isinstance(loaded, dict) and loaded and not any("." in k for k in loaded):
            self.collect_params().load(os.fspath(filename), ctx, allow_missing, ignore_extra, restore_prefix="",
                                       cast_dtype=cast_dtype, dtype_source=dtype_source)
            return
        super().load_parameters(filename, ctx, allow_missing, ignore_extra, cast_dtype, dtype_source)

    def _call_cached_op(self, *args):
        # MXNet runs the pass when it builds the cached op and again at its first call per context
        if getattr(self, "_cse_graph", None) is not cached_symbol(self):
            self._cse_graph, self._cse_off = cached_symbol(self), cse_off(cached_symbol(self))
        if not self._cse_off:
            return super()._call_cached_op(*args)
        with _without_cse():
            return super()._call_cached_op(*args)

    @classmethod
    def from_files(cls, symbol_file: str, input_names: list[str], param_file: str, ctx=None) -> "GraphBlock":
        """``SymbolBlock.imports`` for a GraphBlock, parameter dtypes as saved."""
        block = cls(mx.sym.load(symbol_file), [mx.sym.var(n) for n in input_names])
        block.collect_params().load(param_file, ctx, cast_dtype=True, dtype_source="saved")
        for p in block.collect_params().values():
            p.shape = p.data().shape
        return block


def duplicate_nodes(sym: mx.sym.Symbol) -> int:
    """How many operator nodes compute what an earlier node computes (same op, attributes and
    inputs, inputs compared after merging): what MXNet's common-subexpression pass would merge."""
    nodes = nodes_of(sym)
    canon: list[int] = []
    seen: dict[tuple, int] = {}
    dups = 0
    for i, n in enumerate(nodes):  # topological order
        if n["op"] == "null":
            canon.append(i)
            continue
        key = (n["op"], tuple(sorted(n.get("attrs", {}).items())),
               tuple((canon[a], b) for a, b, *_ in n["inputs"]))
        dups += key in seen
        canon.append(seen.setdefault(key, i))
    return dups


def cse_off(sym: mx.sym.Symbol) -> bool:
    """Whether graphs of ``sym`` are to be built without MXNet's common-subexpression pass."""
    return duplicate_nodes(sym) > CSE_MAX_DUPLICATES


def common_expr_pass(sym: mx.sym.Symbol):
    """Context for running a block of ``sym`` that GraphBlock does not own (a reloaded export)."""
    return _without_cse() if cse_off(sym) else contextlib.nullcontext()


@contextlib.contextmanager
def _without_cse():
    """MXNet reads MXNET_ELIMINATE_COMMON_EXPR each time it builds a graph; restore it after."""
    old = os.environ.get("MXNET_ELIMINATE_COMMON_EXPR")
    os.environ["MXNET_ELIMINATE_COMMON_EXPR"] = "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["MXNET_ELIMINATE_COMMON_EXPR"]
        else:
            os.environ["MXNET_ELIMINATE_COMMON_EXPR"] = old
