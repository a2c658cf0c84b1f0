"""LoRA adapters on Conv and Dense layers, for Gluon blocks and graphs alike (HF PEFT's idea).

A layer ``y = W * x + b`` becomes ``y + s * B(A(dropout(x)))`` with ``s = alpha / rank``. A has
the layer's own geometry (kernel, stride, padding, dilation) and ``rank`` outputs; B maps those
to the layer's outputs as a 1x1 convolution (or Dense). B starts at zero, so the adapted model
computes exactly what the base model did; A starts Kaiming-uniform with PEFT's bound
1/sqrt(fan_in). B being 1x1, ``B∘A`` is one kernel of the layer's own shape,
``Σ_r B[o, r] · A[r, ...]``: ``merge_adapters`` folds it into W and returns a plain model, which
is what exports write. Grouped and depthwise convolutions are refused (a rule's adapter leaves
them out, named in the plan's notes): per group this is no low-rank saving, and for a depthwise
kernel the factors have more parameters than the kernel.

Gluon blocks (zoo:): the layer becomes a subclass of its own class whose forward adds the
adapter before the activation; the factors are its children ``lora_a``/``lora_b``, so their
parameters are ``<layer>.lora_a.weight`` and ``<layer>.lora_b.weight``. Graphs (symbol:
checkpoints, imported ONNX): the node's output is rewired through new nodes, and the
parameters are named the same way after the node. The block's adapter record (``mxinternals.lora_record``) says what
was adapted and, for graphs, the symbol before adapters (the merged model's graph).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any, Mapping

import mxnet as mx
import numpy as np
from mxnet.gluon import HybridBlock, Parameter, ParameterDict, SymbolBlock, nn

from .atomic import atomic_write, write_text
from .errors import AdapterError
from .mxinternals import (CONV_BASE, cached_graph, cached_symbol, children, conv_op_name, copy_block, dense_args, graph_of,
                          lora_record, onnx_info, op_kwargs, param_table, put_param, remove_child, set_lora_record, set_onnx_info,
                          symbol_from)
from .naming import Layer, graph_nodes, named_params, shape_of
from .recipe import AdapterSpec, as_spec
from .runfolder import RunFolder

LORA_TYPE = "LoRA"  # the layer type adapter parameters show in a plan (no rule `type` selects it)
FORMAT = "gluontl-lora/1"
FACTOR_STEP = 0.4  # scale**2 x lr_mult of adapter factors by default (Adapted.default_lr_mult)


@dataclasses.dataclass(frozen=True)
class Adapted:
    """One adapted layer."""

    layer: str  # Gluon: the layer's structural path; graphs: the Convolution/FullyConnected node
    source: str  # the layer name it was asked for by (an ONNX MatMul's: its weight's transpose node)
    kind: str  # Conv | Dense
    spec: AdapterSpec
    weight: str  # structural name of the base weight
    frozen: tuple[str, ...]  # the base parameters the adapter freezes (weight, bias)
    transposed: bool = False  # graphs: the op reads the weight transposed (ONNX MatMul, Gemm transB=0)

    @property
    def a(self) -> str:
        return _inside(self.layer, "lora_a.weight")

    @property
    def b(self) -> str:
        return _inside(self.layer, "lora_b.weight")

    @property
    def scale(self) -> float:
        return self.spec.alpha / self.spec.rank

    @property
    def default_lr_mult(self) -> float:
        """The factors' lr_mult when the adapter rule sets none (docs/recipes.md, 'Adapters').

        The factors are small tensors (A's norm about 1.2 against about 20 for the weight it adapts)
        and a step on them moves the layer's effective weight by ``scale**2`` times as much as the
        gradient step (B starts at 0: d(s·B·A) = s·dB·A and dB itself carries s), so a full
        fine-tune's SGD rate makes them run away. ``0.4 / scale**2`` (capped at 1) keeps that
        product at what was measured to train on recipes/resnet18_freeze.yaml (scale 2, lr_mult
        0.1: val top-1 0.9162, where lr_mult 1 diverges), the way PEFT users give LoRA its own rate."""
        return min(1.0, FACTOR_STEP / self.scale ** 2)


@dataclasses.dataclass(frozen=True)
class Record:
    layers: dict[str, Adapted]
    base: mx.sym.Symbol | None = None  # graphs: the symbol without adapters


def _inside(layer: str, name: str) -> str:
    """The structural name of ``name`` in ``layer``; a bare layer that is the whole model has path ''."""
    return f"{layer}.{name}" if layer else name


def adapters_of(block: HybridBlock) -> dict[str, Adapted]:
    """The adapted layers of ``block`` by layer name (empty for a plain model)."""
    rec = lora_record(block)
    return dict(rec.layers) if isinstance(rec, Record) else {}


def adapter_params(block: HybridBlock) -> dict[str, Adapted]:
    """Structural names of adapter parameters -> the layer they adapt."""
    return {n: t for t in adapters_of(block).values() for n in (t.a, t.b)}


# ============================================================================ targets

def _attrs(node: dict) -> dict[str, str]:
    return node.get("attrs", {})


def target(block: HybridBlock, layer: Layer, spec: AdapterSpec) -> Adapted | None:
    """What an adapter on ``layer`` adapts, None for a layer that is neither Conv nor Dense; a
    grouped convolution, or a graph layer inside a Gluon block, is refused by name."""
    if layer.block is not None:
        if layer.type not in ("Conv", "Dense"):
            return None
        own = nn.Dense.hybrid_forward if layer.type == "Dense" else CONV_BASE.hybrid_forward
        if type(layer.block).hybrid_forward not in (own, _LoraLayer.hybrid_forward):  # the adapter's replaces it
            raise AdapterError(f"layer '{layer.name}' ({type(layer.block).__name__}) computes its own forward; LoRA "
                               f"adapts Gluon's Conv and Dense layers. Narrow the rule's match so it leaves it out.")
        if layer.type == "Dense":
            return Adapted(layer.name, layer.name, "Dense", spec, _inside(layer.name, "weight"), tuple(layer.params))
        groups, layout = op_kwargs(layer.block)["num_group"], op_kwargs(layer.block)["layout"]
        _refuse(layer.name, groups, layout)
        return Adapted(layer.name, layer.name, "Conv", spec, _inside(layer.name, "weight"), tuple(layer.params))
    if layer.owner is None:
        return None
    nodes = graph_nodes(layer.owner)
    index = {n["name"]: i for i, n in enumerate(nodes)}
    i = index[layer.node]
    node, transposed = nodes[i], False
    if node["op"] == "transpose" and "axes" not in _attrs(node):  # how the importer reads an ONNX MatMul weight
        readers = [j for j, n in enumerate(nodes) if any(e[0] == i for e in n["inputs"])]
        if len(readers) == 1 and nodes[readers[0]]["op"] == "FullyConnected" and nodes[readers[0]]["inputs"][1][0] == i:
            node, transposed = nodes[readers[0]], True
    if node["op"] not in ("Convolution", "FullyConnected"):
        return None
    if layer.owner is not block:
        raise AdapterError(f"layer '{layer.name}' is a node of a graph inside a Gluon block; adapters go on Gluon "
                           f"layers or on the nodes of a graph model (symbol:, onnx:) itself. Narrow the rule's "
                           f"match so it leaves this layer out.")
    if node["op"] == "Convolution":
        _refuse(layer.name, int(_attrs(node).get("num_group", "1")), _attrs(node).get("layout") or "NC")
    params = param_table(block.params)
    weight_node = nodes[node["inputs"][1][0]]
    weight = nodes[weight_node["inputs"][0][0]]["name"] if transposed else weight_node["name"]
    if weight not in params:
        raise AdapterError(f"node '{node['name']}' computes its weight ({weight_node['op']}) rather than reading a "
                           f"parameter, so an adapter could not be merged into it. Narrow the rule's match so it "
                           f"leaves '{layer.name}' out.")
    frozen = [weight] + [nodes[e[0]]["name"] for e in node["inputs"][2:] if nodes[e[0]]["name"] in params]
    kind = "Conv" if node["op"] == "Convolution" else "Dense"
    return Adapted(node["name"], layer.name, kind, spec, weight, tuple(frozen), transposed)


def _refuse(name: str, groups: int, layout: str) -> None:
    if groups > 1:
        raise AdapterError(f"layer '{name}' is a grouped convolution ({groups} groups; depthwise when every channel "
                           f"is its own group): LoRA adapts ungrouped Conv and Dense layers only. Narrow the rule's "
                           f"match so it leaves '{name}' out.")
    if not layout.startswith("NC"):
        raise AdapterError(f"layer '{name}' has layout {layout}; LoRA adapts channel-first (NC...) convolutions only.")


# ============================================================================ adding

def add_lora(block: HybridBlock, layers: Mapping[str, AdapterSpec | Mapping[str, Any]]) -> HybridBlock:
    """``block`` with a LoRA adapter on each named layer (layer names as ``gluontl inspect`` and the
    plan show them; specs as a rule's ``adapter``). Gluon blocks are changed in place; graphs
    come back as a new block sharing the base parameters."""
    specs = {name: as_spec(s, AdapterSpec, f"adapter of layer '{name}'", AdapterError, "{'rank': 8, 'alpha': 16}")
             for name, s in layers.items()}
    owners: dict[str, Layer] = {}
    for e in named_params(block).values():
        if e.layer is not None:
            owners.setdefault(e.layer.name, e.layer)
    have = adapters_of(block)
    targets = []
    for name, spec in specs.items():
        if name not in owners:
            raise AdapterError(f"the model has no layer '{name}' to put an adapter on (layers look like: "
                               f"{', '.join(list(owners)[:3])}); `gluontl inspect` lists the parameters.")
        t = target(block, owners[name], spec)
        if t is None:
            raise AdapterError(f"layer '{name}' is a {owners[name].type or 'parameterized'} layer; LoRA adapts "
                               f"Conv and Dense layers.")
        if t.layer in have:
            raise AdapterError(f"layer '{t.layer}' already has an adapter; give each layer one.")
        targets.append(t)
    if not targets:
        return block
    if isinstance(block, SymbolBlock):
        rec = lora_record(block)
        new = _graph_add(block, targets)
        base = rec.base if isinstance(rec, Record) else cached_symbol(block)
    else:
        for t in targets:
            _gluon_add(_child(block, t.layer), t)
        new, base = block, None
    set_lora_record(new, Record({**have, **{t.layer: t for t in targets}}, base))
    return new


def _fan_in(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape[1:]))


def _initialized(p: Parameter, value: mx.init.Initializer, ctx) -> Parameter:
    p.initialize(value, ctx=ctx)
    return p


def _factor_inits(a_shape: tuple[int, ...]) -> tuple[mx.init.Initializer, mx.init.Initializer]:
    return mx.init.Uniform(1.0 / math.sqrt(_fan_in(a_shape))), mx.init.Zero()


class _Factor(HybridBlock):
    """One LoRA factor: an op and its weight. Its block type is none of the rules' layer types,
    so a ``type: [Conv]`` rule does not select adapter parameters."""

    def __init__(self, op: str, kwargs: dict[str, Any], shape: tuple[int, ...], **kw) -> None:
        super().__init__(**kw)
        self._op, self._op_kwargs = op, kwargs
        with self.name_scope():
            self.weight = self.params.get("weight", shape=shape)

    def hybrid_forward(self, F, x, weight):
        return getattr(F, self._op)(x, weight, name="fwd", **self._op_kwargs)


class _LoraLayer:
    """Mixed in before a Conv/Dense class: its forward plus the adapter, before the activation."""

    def hybrid_forward(self, F, x, weight, bias=None):
        if isinstance(self, nn.Dense):
            units, flatten = dense_args(self)
            y = F.FullyConnected(x, weight, bias, no_bias=bias is None, num_hidden=units, flatten=flatten, name="fwd")
        elif bias is None:
            y = getattr(F, conv_op_name(self))(x, weight, name="fwd", **op_kwargs(self))
        else:
            y = getattr(F, conv_op_name(self))(x, weight, bias, name="fwd", **op_kwargs(self))
        scale, dropout = self._lora
        h = F.Dropout(x, p=dropout) if dropout else x
        y = y + self.lora_b(self.lora_a(h)) * scale
        return self.act(y) if self.act is not None else y


_CLASSES: dict[type, type] = {}


def _lora_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Lora{cls.__name__}", (_LoraLayer, cls), {})
    return _CLASSES[cls]


def _child(block: HybridBlock, path: str) -> HybridBlock:
    for part in path.split(".") if path else ():
        block = children(block)[part]
    return block


def _geometry(t: Adapted, w_shape: tuple[int, ...], conv: dict[str, Any] | None, flatten: Any
              ) -> tuple[tuple[int, ...], dict[str, Any], tuple[int, ...], dict[str, Any]]:
    """Shapes and op arguments of A and B for a layer of weight shape ``w_shape`` (out, in, k...)."""
    rank, out = t.spec.rank, w_shape[0]
    a_shape = (rank, *w_shape[1:])
    if t.kind == "Dense":
        return (a_shape, {"num_hidden": rank, "flatten": flatten, "no_bias": True},
                (out, rank), {"num_hidden": out, "flatten": flatten, "no_bias": True})
    n = len(w_shape) - 2
    one = (1,) * n
    a_kw = {**conv, "num_filter": rank, "num_group": 1, "no_bias": True}
    b_kw = {**conv, "kernel": one, "stride": one, "dilate": one, "pad": (0,) * n, "num_filter": out, "num_group": 1,
            "no_bias": True}
    return a_shape, a_kw, (out, rank, *one), b_kw


def _known(shape: tuple[int, ...], t: Adapted) -> tuple[int, ...]:
    if len(shape) < 2 or 0 in shape:
        raise AdapterError(f"layer '{t.layer}' does not know its input size yet (weight shape {shape}); run one "
                           f"forward pass (or give in_units/in_channels) before adding adapters.")
    return shape


def _gluon_add(layer: HybridBlock, t: Adapted) -> None:
    w_shape = _known(tuple(layer.weight.shape), t)
    conv = None if t.kind == "Dense" else dict(op_kwargs(layer))
    flatten = dense_args(layer)[1] if isinstance(layer, nn.Dense) else True
    a_shape, a_kw, b_shape, b_kw = _geometry(t, w_shape, conv, flatten)
    op = "FullyConnected" if t.kind == "Dense" else conv_op_name(layer)
    ctx = layer.weight.list_ctx()
    with layer.name_scope():
        fa = _Factor(op, a_kw, a_shape, prefix="lora_a_")
        fb = _Factor(op, b_kw, b_shape, prefix="lora_b_")
    init_a, init_b = _factor_inits(a_shape)
    fa.initialize(init_a, ctx=ctx)
    fb.initialize(init_b, ctx=ctx)
    layer.lora_a, layer.lora_b = fa, fb
    layer._lora = (t.scale, t.spec.dropout)
    layer.__class__ = _lora_class(type(layer))


def _graph_add(block: SymbolBlock, targets: list[Adapted]) -> SymbolBlock:
    """The graph with each target node's output rewired through ``+ scale · B(A(x))``."""
    inputs, sym = cached_graph(block)
    graph = graph_of(sym)
    by_node = {t.layer: t for t in targets}
    shared = ParameterDict()
    shared.update(block.params)
    ctx = next(iter(block.params.values())).list_ctx()
    out: list[dict] = []
    new_id: dict[int, int] = {}
    redirect: dict[tuple[int, int], int] = {}

    def entry(e: list[int]) -> list[int]:
        if (e[0], e[1]) in redirect:
            return [redirect[(e[0], e[1])], 0, 0]
        return [new_id[e[0]], e[1], *e[2:]]

    def add(op: str, name: str, inputs_: list[list[int]], attrs: dict[str, Any] | None = None) -> list[int]:
        node = {"op": op, "name": name, "inputs": inputs_}
        if attrs:
            node["attrs"] = {k: str(v) for k, v in attrs.items()}
        out.append(node)
        return [len(out) - 1, 0, 0]

    for i, node in enumerate(graph["nodes"]):
        node = {**node, "inputs": [entry(e) for e in node["inputs"]]}
        new_id[i] = len(out)
        out.append(node)
        t = by_node.get(node["name"])
        if t is None:
            continue
        w_shape = _known(shape_of(block.params[t.weight]), t)
        w_shape = w_shape[::-1] if t.transposed else w_shape
        attrs = _attrs(node)
        # the node's own attribute strings (the new nodes' attributes are written as strings); the
        # layout is NC... (``target`` refused others), the default for the kernel's dimensions
        conv = {k: attrs[k] for k in ("kernel", "stride", "dilate", "pad") if k in attrs} if t.kind == "Conv" else None
        a_shape, a_kw, b_shape, b_kw = _geometry(t, w_shape, conv, attrs.get("flatten", True))
        op = "Convolution" if t.kind == "Conv" else "FullyConnected"
        x = node["inputs"][0]
        if t.spec.dropout:
            x = add("Dropout", f"{t.layer}.lora_dropout", [x], {"p": t.spec.dropout})
        init_a, init_b = _factor_inits(a_shape)
        h = x
        for name, shape, kw, init in ((t.a, a_shape, a_kw, init_a), (t.b, b_shape, b_kw, init_b)):
            put_param(shared, name, _initialized(Parameter(name, shape=shape), init, ctx))
            h = add(op, name.removesuffix(".weight"), [h, add("null", name, [])], kw)
        scaled = add("_mul_scalar", f"{t.layer}.lora_scale", [h], {"scalar": t.scale})
        redirect[(i, 0)] = add("elemwise_add", f"{t.layer}.lora_sum", [[new_id[i], 0, 0], scaled])[0]
    graph["nodes"] = out
    graph["heads"] = [entry(h) for h in graph["heads"]]
    graph["arg_nodes"] = [i for i, n in enumerate(out) if n["op"] == "null"]  # node_row_ptr is recomputed on load
    return _same_kind(block, symbol_from(graph), inputs, shared)


def _same_kind(block: SymbolBlock, sym: mx.sym.Symbol, inputs, params: ParameterDict) -> SymbolBlock:
    """A block of ``block``'s class on ``sym``, with its import record (export patches that file)."""
    new = type(block)(sym, inputs, params=params)
    if onnx_info(block) is not None:
        set_onnx_info(new, onnx_info(block))
    return new


# ============================================================================ merging

def delta(t: Adapted, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``scale · B∘A`` in the shape of the base weight parameter (float64)."""
    b64 = np.asarray(b, np.float64)  # the product promotes a float32 A to float64 too
    d = t.scale * np.tensordot(b64.reshape(len(b64), -1), a, axes=1)
    return d.T if t.transposed else d


def merge_adapters(block: HybridBlock) -> HybridBlock:
    """A plain model computing what the adapted ``block`` computes, each adapter folded into its
    layer's weight; ``block`` itself is unchanged. A block without adapters comes back as is."""
    adapted = adapters_of(block)
    if not adapted:
        return block
    entries = named_params(block)
    arrays = {n: entries[n].param.list_data()[0].asnumpy()  # every context holds the same
              for t in adapted.values() for n in (t.weight, t.a, t.b)}
    merged = {t.weight: arrays[t.weight] + delta(t, arrays[t.a], arrays[t.b])  # float64: rounded once, when set
              for t in adapted.values()}
    if isinstance(block, SymbolBlock):
        params = ParameterDict()
        params.update(block.params)
        for name, value in merged.items():
            put_param(params, name, _initialized(Parameter(name, shape=value.shape), mx.init.Constant(value),
                                                 block.params[name].list_ctx()))
        plain = _same_kind(block, lora_record(block).base, cached_graph(block)[0], params)
        head = getattr(onnx_info(block), "head", None)
        if head is not None and set(merged) & set(head.collect_params().keys()):
            head = copy_block(head)  # export writes an imported model's new head from the Head block itself
            for name, p in head.collect_params().items():
                if name in merged:
                    p.set_data(mx.nd.array(merged[name]))
            set_onnx_info(plain, dataclasses.replace(onnx_info(block), head=head))
        return plain
    plain = copy_block(block)
    set_lora_record(plain, None)
    for t in adapted.values():
        layer = _child(plain, t.layer)
        layer.weight.set_data(mx.nd.array(merged[t.weight]))
        for name in ("lora_a", "lora_b"):
            remove_child(layer, name)
            object.__delattr__(layer, name)
        del layer._lora
        layer.__class__ = layer.__class__.__bases__[1]
    return plain


# ============================================================================ files

def _config_path(path: Path) -> Path:
    return path.with_suffix(".json")


def _fingerprint(block: HybridBlock, t: Adapted) -> str:
    """SHA-256 of the frozen base weight: adapters only mean something on the weights they were trained on."""
    w = named_params(block)[t.weight].param.list_data()[0].asnumpy().astype(np.float32)
    return hashlib.sha256(w.tobytes()).hexdigest()


def save_adapters(block: HybridBlock, path: str | os.PathLike) -> Path:
    """Write the adapter tensors alone to ``path`` (a .params file) and their configuration, with a
    fingerprint of the base weights they belong to, to the same name with .json."""
    adapted = adapters_of(block)
    path = Path(path)
    if not adapted:
        raise AdapterError(f"the model has no adapters to save to '{path}'; add them with a rule's adapter: setting.")
    entries = named_params(block)
    tensors = {n: entries[n].param.list_data()[0].copy() for t in adapted.values() for n in (t.a, t.b)}
    config = {"format": FORMAT, "layers": {t.layer: {
        "source": t.source, **t.spec.model_dump(), "weight": t.weight,
        "weight_shape": list(shape_of(entries[t.weight].param)), "weight_sha256": _fingerprint(block, t)}
        for t in adapted.values()}}
    atomic_write(path, lambda p: mx.nd.save(os.fspath(p), tensors), AdapterError)
    write_text(_config_path(path), json.dumps(config, indent=1), AdapterError)
    return path


def load_adapters(block: HybridBlock, path: str | os.PathLike) -> HybridBlock:
    """``block`` with the adapters ``save_adapters`` wrote to ``path``: added where it has none
    (a new block for graphs), else onto its own, which must be the same. Refused, naming the file
    and the layer or parameter, when they were made for another base model."""
    path = Path(path)
    cfg_path = _config_path(path)
    for f in (path, cfg_path):
        if not f.is_file():
            raise AdapterError(f"adapter file '{f}' does not exist; save_adapters writes NAME.params and NAME.json "
                               f"side by side (a run writes {RunFolder('RUN').adapters_path}).")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
        if config["format"] != FORMAT:
            raise ValueError(f"format {config['format']!r}, not {FORMAT!r}")
        layers = config["layers"]
        specs = {name: (c["source"], AdapterSpec(**{k: c[k] for k in ("kind", "rank", "alpha", "dropout")}))
                 for name, c in layers.items()}
        tensors = mx.nd.load(os.fspath(path))
    except (OSError, ValueError, KeyError, TypeError, mx.base.MXNetError) as e:
        raise AdapterError(f"'{cfg_path}' with '{path}' is not a gluontl adapter file pair ({e}); save_adapters "
                           f"writes them.") from None
    have = adapters_of(block)
    if not have:
        entries = named_params(block)
        owners = {e.layer.name for e in entries.values() if e.layer is not None}
        missing = [s for s, _ in specs.values() if s not in owners]
        if missing:
            raise AdapterError(f"'{path}' holds adapters for layer '{missing[0]}', which this model does not have: "
                               f"they were made for another base model.")
        block = add_lora(block, {s: spec for s, spec in specs.values()})
        have = adapters_of(block)
    if set(have) != set(specs) or any(have[n].spec != specs[n][1] for n in specs):
        diff = sorted(set(have) ^ set(specs)) or [n for n in specs if have[n].spec != specs[n][1]]
        what = "differs in rank/alpha/dropout" if diff[0] in have and diff[0] in specs else "is in only one"
        raise AdapterError(f"'{path}' holds adapters that do not fit this model's: layer '{diff[0]}' {what}. Load "
                           f"them onto a model with the same adapter rules, or onto one without adapters.")
    entries = named_params(block)
    for name, t in have.items():
        c = layers[name]
        if list(shape_of(entries[t.weight].param)) != c["weight_shape"] or _fingerprint(block, t) != c["weight_sha256"]:
            raise AdapterError(f"'{path}' was trained on other base weights: parameter '{t.weight}' of layer "
                               f"'{name}' differs from the one the adapters were saved with. Load them onto the "
                               f"base model they were trained on.")
        for n in (t.a, t.b):
            p = entries[n].param
            got = tensors.get(n)
            if got is None or tuple(got.shape) != shape_of(p):
                raise AdapterError(f"'{path}' has no tensor '{n}' of shape {shape_of(p)} "
                                   f"({'missing' if got is None else f'it has {tuple(got.shape)}'}).")
            p.set_data(got)
    return block
