"""Names users can write, and the layers behind them.

Gluon gives every Parameter a global name (``resnetv10_conv0_weight``) that depends on
how many models were built before; users think in structural names
(``features.0.weight``, ``layer4.1.conv2.weight``) — the names ``save_parameters``
writes — or, for imported graphs, in the ONNX/symbol tensor names. This module is the
one mapping between the two, and knows which layer (block or graph node) owns each
parameter so rules can select by layer type and BN mode can be set per layer.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Iterator

import mxnet as mx
from mxnet.gluon import HybridBlock, Parameter, SymbolBlock, nn, rnn

# Gluon classes → the layer types rules can select; order matters (subclasses first).
_BLOCK_TYPES: list[tuple[type, str]] = [
    (nn.Conv2DTranspose, "Deconv"), (nn.Conv1DTranspose, "Deconv"), (nn.Conv3DTranspose, "Deconv"),
    (nn.Conv1D, "Conv"), (nn.Conv2D, "Conv"), (nn.Conv3D, "Conv"),
    (nn.Dense, "Dense"), (nn.BatchNorm, "BatchNorm"), (nn.LayerNorm, "LayerNorm"),
    (nn.InstanceNorm, "InstanceNorm"), (nn.GroupNorm, "GroupNorm"), (nn.Embedding, "Embedding"),
    (nn.PReLU, "PReLU"), (rnn.rnn_layer._RNNLayer, "RNN"),
]
_OP_TYPES = {"Convolution": "Conv", "Deconvolution": "Deconv", "FullyConnected": "Dense",
             "BatchNorm": "BatchNorm", "LayerNorm": "LayerNorm", "InstanceNorm": "InstanceNorm",
             "GroupNorm": "GroupNorm", "Embedding": "Embedding", "RNN": "RNN"}


@dataclasses.dataclass
class Layer:
    """A layer owning parameters: a Gluon block, or a node of a SymbolBlock's graph."""

    name: str  # structural path of the block, or graph node name
    type: str | None  # one of recipe.LAYER_TYPES, None for others
    params: list[str]  # structural names of the parameters it owns
    block: HybridBlock | None = None  # the Gluon block (None for graph nodes)
    owner: SymbolBlock | None = None  # the SymbolBlock holding the node
    node: str | None = None  # graph node name inside ``owner``


@dataclasses.dataclass
class ParamEntry:
    name: str  # structural name users write
    param: Parameter
    layer: Layer | None


def block_type(block: HybridBlock) -> str | None:
    for cls, kind in _BLOCK_TYPES:
        if isinstance(block, cls):
            return kind
    return None


def _symbol_of(block: SymbolBlock) -> mx.sym.Symbol:
    return block._cached_graph[1]


def graph_nodes(block: SymbolBlock) -> list[dict]:
    return json.loads(_symbol_of(block).tojson())["nodes"]


def _graph_layers(block: SymbolBlock, prefix: str, skip: frozenset[str]) -> Iterator[ParamEntry]:
    nodes = graph_nodes(block)
    owner_of: dict[str, Layer] = {}
    for n in nodes:
        if n["op"] == "null":
            continue
        inputs = [nodes[i[0]]["name"] for i in n["inputs"] if nodes[i[0]]["op"] == "null"]
        kind = _OP_TYPES.get(n["op"])
        if n["op"] == "LeakyReLU" and n.get("attrs", {}).get("act_type") == "prelu":
            kind = "PReLU"
        layer = Layer(name=n["name"], type=kind, params=[], owner=block, node=n["name"])
        for v in inputs:
            if v in block.params._params and (v not in owner_of or (owner_of[v].type is None and kind)):
                owner_of[v] = layer
    for full, p in block.params.items():
        if full in skip:
            continue
        layer = owner_of.get(full)
        name = prefix + full
        if layer is not None:
            layer.params.append(name)
        yield ParamEntry(name, p, layer)


def _walk(block: HybridBlock, prefix: str, seen: set[int]) -> Iterator[ParamEntry]:
    if isinstance(block, SymbolBlock):
        info = getattr(block, "gluontl_onnx", None)
        skip = frozenset(getattr(info, "constants", ()))
        for e in _graph_layers(block, prefix, skip):
            if id(e.param) not in seen:
                seen.add(id(e.param))
                yield e
        return
    own = [(k, p) for k, p in block._reg_params.items() if id(p) not in seen]
    if own:
        layer = Layer(name=prefix.rstrip("."), type=block_type(block), params=[], block=block)
        for k, p in own:
            seen.add(id(p))
            layer.params.append(prefix + k)
            yield ParamEntry(prefix + k, p, layer)
    for cname, child in block._children.items():
        yield from _walk(child, f"{prefix}{cname}.", seen)


def named_params(block: HybridBlock) -> dict[str, ParamEntry]:
    """Every parameter once, under the structural name users write, in definition order."""
    return {e.name: e for e in _walk(block, "", set())}



def shape_of(p: Parameter) -> tuple[int, ...]:
    """The parameter's shape; SymbolBlock.imports leaves ``Parameter.shape`` None after loading."""
    if p._data is not None:
        return tuple(p._data[0].shape)
    return tuple(p.shape or ())
