"""Names users can write, and the layers behind them.

Gluon gives every Parameter a global name (``resnetv10_conv0_weight``) that depends on
how many models were built before; users think in structural names
(``features.0.weight``, ``layer4.1.conv2.weight``) — the names ``save_parameters``
writes — or, for imported graphs, in the ONNX/symbol tensor names. This module is the
one mapping between the two, and knows which layer (block or graph node) owns each
parameter so rules can select by layer type and BN mode can be set per layer.

An ONNX export's parameters often carry names nobody can write globs for (``onnx::Conv_402``,
``val_13``): :func:`module_names` gives them the exporter's module path (``conv1.weight``,
``blocks.0.attn.qkv.weight``) from what the file records, and the graph's own name stays an
alias rules still match.
"""
from __future__ import annotations

import ast
import dataclasses
import re
from typing import Any, Iterable, Iterator

from mxnet.gluon import HybridBlock, Parameter, SymbolBlock, nn

from .mxinternals import RNN_BASE, cached_symbol, children, nodes_of, onnx_info, own_params, param_shape, param_table

# Gluon classes → the layer types rules can select; order matters (subclasses first).
_BLOCK_TYPES: list[tuple[type, str]] = [
    (nn.Conv2DTranspose, "Deconv"), (nn.Conv1DTranspose, "Deconv"), (nn.Conv3DTranspose, "Deconv"),
    (nn.Conv1D, "Conv"), (nn.Conv2D, "Conv"), (nn.Conv3D, "Conv"),
    (nn.Dense, "Dense"), (nn.BatchNorm, "BatchNorm"), (nn.LayerNorm, "LayerNorm"),
    (nn.InstanceNorm, "InstanceNorm"), (nn.GroupNorm, "GroupNorm"), (nn.Embedding, "Embedding"),
    (nn.PReLU, "PReLU"), (RNN_BASE, "RNN"),
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
    aliases: tuple[str, ...] = ()  # other names rules match it by (an imported graph's own tensor name)


def block_type(block: HybridBlock) -> str | None:
    for cls, kind in _BLOCK_TYPES:
        if isinstance(block, cls):
            return kind
    return None


def graph_nodes(block: SymbolBlock) -> list[dict]:
    return nodes_of(cached_symbol(block))


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
            if v in param_table(block.params) and (v not in owner_of or (owner_of[v].type is None and kind)):
                owner_of[v] = layer
    readable = getattr(onnx_info(block), "param_names", None) or {}
    for full, p in block.params.items():
        if full in skip:
            continue
        layer = owner_of.get(full)
        name = prefix + readable.get(full, full)
        if layer is not None:
            layer.params.append(name)
        yield ParamEntry(name, p, layer, (prefix + full,) if full in readable else ())


def _walk(block: HybridBlock, prefix: str, seen: set[int]) -> Iterator[ParamEntry]:
    if isinstance(block, SymbolBlock):
        info = onnx_info(block)
        skip = frozenset(getattr(info, "constants", ()))
        for e in _graph_layers(block, prefix, skip):
            if id(e.param) not in seen:
                seen.add(id(e.param))
                yield e
        return
    own = [(k, p) for k, p in own_params(block).items() if id(p) not in seen]
    if own:
        layer = Layer(name=prefix.rstrip("."), type=block_type(block), params=[], block=block)
        for k, p in own:
            seen.add(id(p))
            layer.params.append(prefix + k)
            yield ParamEntry(prefix + k, p, layer)
    for cname, child in children(block).items():
        yield from _walk(child, f"{prefix}{cname}.", seen)


class Params(dict):
    """Structural name → entry, in definition order; an alias (an imported graph's own tensor name,
    as the graph, adapters and old checkpoints know it) finds the same entry but is not listed."""

    def __init__(self, entries: Iterable[ParamEntry]):
        super().__init__((e.name, e) for e in entries)
        self.aliases = {a: e.name for e in self.values() for a in e.aliases}

    def __getitem__(self, name: str) -> ParamEntry:
        return super().__getitem__(name if dict.__contains__(self, name) else self.aliases.get(name, name))

    def __contains__(self, name: object) -> bool:
        return dict.__contains__(self, name) or name in self.aliases

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self else default


def named_params(block: HybridBlock) -> Params:
    """Every parameter once, under the structural name users write, in definition order."""
    return Params(_walk(block, "", set()))


# ---------------------------------------------------------------- names an ONNX file records

_LEAVES = {  # ONNX op → parameter name by input position, as torch names the module's parameters
    "Conv": {1: "weight", 2: "bias"}, "ConvTranspose": {1: "weight", 2: "bias"}, "Gemm": {1: "weight", 2: "bias"},
    "MatMul": {1: "weight"}, "Add": {0: "bias", 1: "bias"}, "PRelu": {1: "weight"},
    "BatchNormalization": {1: "weight", 2: "bias", 3: "running_mean", 4: "running_var"},
    "LayerNormalization": {1: "weight", 2: "bias"}, "InstanceNormalization": {1: "weight", 2: "bias"},
    "GroupNormalization": {1: "weight", 2: "bias"}, "LSTM": {1: "weight_ih", 2: "weight_hh", 3: "bias"},
    "GRU": {1: "weight_ih", 2: "weight_hh", 3: "bias"}, "RNN": {1: "weight_ih", 2: "weight_hh", 3: "bias"},
}
_MODULE_NAME = re.compile(r"[A-Za-z_][\w-]*(\.[\w-]+)*")  # torchvision's RegNet has block1-0
_GENERATED = re.compile(r"(val|_val)_\d+")  # the dynamo exporter's names for values it computed


def _module_of(node: Any) -> str | None:
    """The module path a node belongs to: the dynamo exporter's name scopes (each a full path, the
    last the op itself), else a legacy node name ``/features/features.3/conv/conv.0/Conv`` (scopes
    each relative to the one before, the last the op); None when the file records neither."""
    for p in getattr(node, "metadata_props", ()):
        if p.key == "pkg.torch.onnx.name_scopes":
            if len(p.value) > 1 << 16:  # a path list is short; a huge or deeply nested one is no name
                return None
            try:
                scopes = ast.literal_eval(p.value)  # a list literal: data, never code
            except (ValueError, SyntaxError, RecursionError, MemoryError):
                return None
            if isinstance(scopes, list) and scopes and all(isinstance(x, str) for x in scopes):
                return scopes[-2] if len(scopes) >= 2 else ""
            return None
    if not node.name.startswith("/"):
        return None
    path: list[str] = []
    for seg in node.name.split("/")[1:-1]:
        if path and seg.startswith(path[-1] + "."):
            path[-1] = seg  # features.3 under features
        else:
            path.append(seg)
    joined = ".".join(path)
    return joined if _MODULE_NAME.fullmatch(joined) or not joined else None


def module_names(nodes: Iterable[Any], params: Iterable[str]) -> dict[str, str]:
    """Each of ``params`` (graph tensor names) whose name the exporter made up → the module path the
    file records for its first reader plus the parameter's role (``onnx::Conv_402`` →
    ``features.3.conv.0.weight``). Names that are module paths already stay; a made-up name that
    would collide gets ``_1``, ``_2`` in file order, so the mapping is the same on every import."""
    params = list(params)
    wanted = set(params)
    first: dict[str, tuple[Any, int]] = {}
    for node in nodes:
        for i, x in enumerate(node.input):
            if x in wanted and x not in first and _module_of(node) is not None:
                first[x] = (node, i)
    out: dict[str, str] = {}
    taken = set(params)
    for name in params:
        if name not in first:
            continue
        node, i = first[name]
        module = _module_of(node)
        keep = _MODULE_NAME.fullmatch(name) and not _GENERATED.fullmatch(name) and ("." in name or not module)
        if keep:
            continue
        leaf = _LEAVES.get(node.op_type, {}).get(i) or f"{node.op_type.lower()}_{i}"
        base = f"{module}.{leaf}" if module else leaf
        new, k = base, 0
        while new in taken:
            k += 1
            new = f"{base}_{k}"
        taken.add(new)
        out[name] = new
    return out



def shape_of(p: Parameter) -> tuple[int, ...]:
    """The parameter's shape; SymbolBlock.imports leaves ``Parameter.shape`` None after loading."""
    return param_shape(p)
