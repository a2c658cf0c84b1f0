"""Gluon's private block attributes (MXNet 1.9.1, pinned), read and changed through named functions.

What each relies on is a platform fact in tests/test_platform_facts.py, so an MXNet change fails there:
``_children`` maps names to the blocks themselves in registration order (not weak references),
``_reg_params`` holds a block's own parameters by attribute name, ``ParameterDict._params`` is the
dict behind ``params``, ``_kwargs`` the op arguments a Gluon layer passes on every forward, and a
SymbolBlock's ``_cached_graph`` is ``(inputs, outputs)`` from construction on.
"""
from __future__ import annotations

import copy
from types import MappingProxyType
from typing import Any, Mapping, Sequence

import mxnet as mx
from mxnet.gluon import Block, HybridBlock, Parameter, ParameterDict, SymbolBlock, nn, rnn

from .symjson import graph_of, symbol_from

# Gluon's private base classes, for ``isinstance``: every Conv (and transposed Conv) layer, every RNN layer.
CONV_BASE: type = nn.conv_layers._Conv
RNN_BASE: type = rnn.rnn_layer._RNNLayer


# ============================================================================ graphs

def cached_graph(block: HybridBlock) -> tuple[list[mx.sym.Symbol], mx.sym.Symbol]:
    """``(input variables, output symbol)`` of a SymbolBlock (a HybridBlock's once a hybridized call traced it)."""
    inputs, out = block._cached_graph
    return inputs, out


def cached_symbol(block: HybridBlock) -> mx.sym.Symbol:
    """The output symbol of ``cached_graph``."""
    return block._cached_graph[1]


def replace_cached_graph(block: SymbolBlock, inputs: Sequence[mx.sym.Symbol], out: mx.sym.Symbol) -> None:
    """Give a SymbolBlock another graph over the same parameters; clear its cached op afterwards
    (``clear_cached_ops``), which was built from the old one."""
    block._cached_graph = (inputs, out)


def set_graph_bn_modes(owner: SymbolBlock, modes: Mapping[str, bool]) -> None:
    """BatchNorm mode of a graph's nodes (node name → use global statistics).

    A SymbolBlock's BatchNorm nodes read ``use_global_stats`` from the graph's attributes, and
    Gluon has no per-layer switch for a graph, so the mode is written into the graph itself. The
    cached op still runs the old graph until it is cleared (``clear_cached_ops``)."""
    inputs, out = cached_graph(owner)
    graph = graph_of(out)
    for node in graph["nodes"]:
        if node["name"] in modes:
            node.setdefault("attrs", {})["use_global_stats"] = str(modes[node["name"]])
    replace_cached_graph(owner, inputs, symbol_from(graph))


def clear_cached_op(block: HybridBlock) -> None:
    """Drop the block's cached op (not its children's), so its next hybridized call traces anew.

    A hybridized call builds a CachedOp from the graph once and reuses it: a parameter's new
    ``grad_req``, a layer's changed op arguments (BatchNorm's ``use_global_stats``), a SymbolBlock's
    new graph, or a change of mode a block's forward branches on, reach the computation only
    after this."""
    block._clear_cached_op()


def clear_cached_ops(block: Block) -> None:
    """``clear_cached_op`` on ``block`` and every block inside it."""
    block.apply(lambda b: b._clear_cached_op() if isinstance(b, HybridBlock) else None)


def is_hybridized(block: HybridBlock) -> bool:
    """Whether ``hybridize()`` is on for ``block`` (its calls run a cached op)."""
    return bool(block._active)


def copy_block(block: Block) -> Block:
    """A deep copy of a Gluon block with parameters of its own, sharing the Trainer they belong to
    (a Trainer holds a kvstore, which cannot be copied). Cached ops are dropped first: they hold C
    pointers, which ``copy.deepcopy`` cannot copy."""
    clear_cached_ops(block)
    trainers = {id(p._trainer): None for p in block.collect_params().values() if p._trainer is not None}
    return copy.deepcopy(block, trainers)


# ============================================================================ children and parameters

def children(block: Block) -> Mapping[str, Block]:
    """The registered child blocks by attribute name, in registration order (read-only)."""
    return MappingProxyType(block._children)


def remove_child(block: Block, name: str) -> None:
    """Unregister child ``name`` (its attribute stays: delete that too)."""
    del block._children[name]


def own_params(block: Block) -> Mapping[str, Parameter]:
    """The parameters ``block`` registered itself (not its children's), by attribute name (read-only)."""
    return MappingProxyType(block._reg_params)


def set_own_params(block: Block, params: Mapping[str, Parameter]) -> None:
    """Register ``params`` as ``block``'s own parameters under the given names."""
    block._reg_params = dict(params)


def param_table(params: ParameterDict) -> Mapping[str, Parameter]:
    """The full-name → Parameter table behind a ParameterDict, without its prefix rules (read-only)."""
    return MappingProxyType(params._params)


def put_param(params: ParameterDict, name: str, param: Parameter) -> None:
    """Put ``param`` into ``params`` under ``name`` as it is (``ParameterDict.get`` would make a new one
    under the dict's prefix, and ``update`` refuses a name it holds)."""
    params._params[name] = param


def param_shape(p: Parameter) -> tuple[int, ...]:
    """The parameter's shape; SymbolBlock.imports leaves ``Parameter.shape`` None after loading."""
    if p._data is not None:
        return tuple(p._data[0].shape)
    return tuple(p.shape or ())


def is_differentiable(p: Parameter) -> bool:
    """False for a parameter Gluon made non-differentiable (``differentiable=False``: it never gets a gradient)."""
    return bool(p._differentiable)


def conv_op_name(block: HybridBlock) -> str:
    """The operator a Gluon Conv layer calls (``Convolution`` or ``Deconvolution``)."""
    return block._op_name


def dense_args(block: nn.Dense) -> tuple[int, bool]:
    """A Dense layer's ``(units, flatten)``, as it passes them to ``FullyConnected``."""
    return block._units, block._flatten


def op_kwargs(block: HybridBlock) -> Mapping[str, Any]:
    """The op arguments a Gluon layer (Conv, BatchNorm, ...) passes to its operator (read-only)."""
    return MappingProxyType(block._kwargs)


def set_op_kwarg(block: HybridBlock, key: str, value: Any) -> None:
    """Change one op argument of a Gluon layer; clear the cached ops of the model that holds it."""
    block._kwargs[key] = value


def collect_params_by_path(block: Block) -> dict[str, Parameter]:
    """Parameters by the names ``save_parameters`` writes (structural paths, no prefixes)."""
    return block._collect_params_with_prefix()
