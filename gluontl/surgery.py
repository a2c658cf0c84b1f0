"""Graph surgery for transfer learning: cut, drop, ignore, new heads, feature taps.

Every operation returns a *new* block built from the *same* Parameter objects, under the
names users already know (structural names for Gluon models, ONNX/symbol names for
graphs), so rules, restore, BN freezing and export work on the result unchanged.

Two model kinds, one vocabulary:

* **Graphs** (``SymbolBlock``: ``symbol:`` checkpoints, imported ``onnx:`` models). A
  *node* is an ONNX node (its name, or any tensor name it outputs) for imported models,
  an MXNet operator for symbol models. The result is a new SymbolBlock of the same class
  whose ParameterDict shares the original Parameters; nodes nothing uses any more drop out
  with their parameters.
* **Gluon blocks** (``zoo:``). A *unit* is what ``stages.trunk_units`` calls one: a top-level
  child, with plain Sequential containers opened one level; paths into nested Sequential
  containers (``features.6.0``) open them further. The result is a ``Trunk`` that runs the
  kept units as a chain and registers them under their original paths, so
  ``features.3.weight`` stays ``features.3.weight``. That the model's forward *is* that
  chain is checked numerically whenever an input shape is given.

A *layer*, for ``drop_last`` (SINGA's ``last_layers``), is one node on the output chain:
start at the output and step to the single data input of the node producing it; a node
with several data inputs (Add, Concat) ends the chain. Parameter-free nodes (Softmax,
Flatten) count. For Gluon blocks a layer is one unit.

The head (``attach_head``) is ``head.*``: optional global pooling + flatten of each
feature (several ``inputs`` are concatenated, N2D2's ``Input=onnx,NODE``), dropout,
hidden ``head.fc1``, ``head.fc2``, … with the activation, and ``head.fc`` with ``classes``
units.
"""
from __future__ import annotations

import dataclasses
import difflib
from collections import Counter
from typing import Any, Iterable, Mapping, Sequence

import mxnet as mx
import numpy as np
import onnx
from mxnet.gluon import HybridBlock, ParameterDict, SymbolBlock, nn

from .errors import OnnxImportError, SurgeryError, short_reason
from .mxinternals import cached_graph, children, graph_of, nodes_of, onnx_info, set_onnx_info, symbol_from
from .recipe import HeadSpec, SurgerySpec, as_spec
from .sources import INITS
from .stages import trunk_units

Shape = tuple[int, ...]

__all__ = ["NodeInfo", "Head", "Trunk", "cut_at", "drop_last", "ignore", "attach_head", "tap", "list_nodes",
           "feature_shapes", "feature_end", "apply_surgery", "needs_surgery"]


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    name: str  # what cut_at / ignore / head.inputs accept
    op: str  # ONNX op type, MXNet operator, or Gluon block class
    shape: Shape | None  # batch-1 output shape


def _close(name: str, valid: Iterable[str], what: str) -> str:
    valid = list(valid)
    close = difflib.get_close_matches(name, valid, n=5, cutoff=0.5)
    return (f"Close matches: {', '.join(close) or 'none'}. This model has {len(valid)} {what} "
            f"(e.g. {', '.join(valid[-4:])}); `gluontl inspect MODEL --nodes` lists them.")


# ============================================================================ the head

class Head(HybridBlock):
    """The new classifier on one or more features; parameters are named ``head.*``.

    Feature ranks are fixed at construction (from shape inference) because a hybridized
    forward sees symbols without shapes, and knowing ``in_units`` lets the head be
    initialized before any forward pass. Feature maps (rank ≥ 3) are globally pooled
    (``auto`` = ``avg``) so the head fits any input size; ``none`` flattens them, which
    ties the head to the input size it was built for.
    """

    def __init__(self, spec: HeadSpec, feature_shapes: Sequence[Shape]) -> None:
        super().__init__(prefix="head.")
        self.activation = spec.activation
        self.pools: list[tuple[str | None, int]] = []  # per feature: (pool type or None, spatial rank)
        units = 0
        for shape in feature_shapes:
            pool = {"auto": "avg", "none": None}.get(spec.pool, spec.pool) if len(shape) > 2 else None
            self.pools.append((pool, len(shape) - 2))
            units += shape[1] if pool else int(np.prod(shape[1:]))
        with self.name_scope():
            self.drop = nn.Dropout(spec.dropout) if spec.dropout else None
            self.hidden_layers = []
            for i, width in enumerate(spec.hidden, 1):
                dense = nn.Dense(width, in_units=units, prefix=f"fc{i}.")
                setattr(self, f"fc{i}", dense)
                self.hidden_layers.append(dense)
                units = width
            self.fc = nn.Dense(spec.classes, in_units=units, prefix="fc.")

    def hybrid_forward(self, F, *features):
        parts = []
        for x, (pool, rank) in zip(features, self.pools):
            if pool:
                x = F.Pooling(x, kernel=(1,) * rank, global_pool=True, pool_type=pool)
            parts.append(F.flatten(x))
        x = F.concat(*parts, dim=1) if len(parts) > 1 else parts[0]
        if self.drop is not None:
            x = self.drop(x)
        for dense in self.hidden_layers:
            x = dense(x)
            x = F.LeakyReLU(x, act_type="gelu") if self.activation == "gelu" else F.Activation(x, act_type=self.activation)
        return self.fc(x)


def _new_head(spec: HeadSpec, shapes: Sequence[Shape], ctx) -> Head:
    for name, shape in zip(spec.inputs or ["the cut"], shapes):
        if shape is None or len(shape) < 2 or 0 in shape:
            raise SurgeryError(f"head input '{name}' has shape {shape}; a head needs a (batch, features, …) "
                               f"tensor of known shape. Pick another node (`gluontl inspect --nodes`).")
    head = Head(spec, shapes)
    head.initialize(INITS[spec.init](), ctx=ctx)
    return head


# ============================================================================ graphs

class _Graph:
    """A SymbolBlock's graph with the name maps surgery needs."""

    def __init__(self, block: SymbolBlock) -> None:
        self.block = block
        self.inputs, self.sym = cached_graph(block)
        self.info = onnx_info(block)
        self.internals = self.sym.get_internals()
        self.nodes = nodes_of(self.sym)
        self.index = {n["name"]: i for i, n in enumerate(self.nodes)}
        self.entry: dict[str, tuple[int, int]] = {}  # output name -> (node index, output index)
        seen: Counter = Counter()
        for i, out in enumerate(self.internals.list_outputs()):
            node = self.internals[i].name
            self.entry[out] = (self.index[node], seen[node])
            seen[node] += 1
        self.out_name = {e: o for o, e in self.entry.items()}
        self.input_names = input_names = {s.name for s in self.inputs}
        if self.info is not None:  # ONNX node and tensor names
            self.names = {k: v for k, v in self.info.node_outputs.items()
                          if v in self.entry and self.nodes[self.entry[v][0]]["op"] != "null"}
        else:
            self.names = {n["name"]: self.out_name[(i, 0)] for i, n in enumerate(self.nodes) if n["op"] != "null"}
        self.boundaries = set(self.names.values()) | input_names
        self.onnx_tensor: dict[str, str] = {}  # MXNet output -> the ONNX tensor holding it
        for tensor, out in (self.info.tensor_outputs.items() if self.info is not None else ()):
            self.onnx_tensor.setdefault(out, tensor)
        self.data = []  # per node: does it depend on a graph input?
        for n in self.nodes:
            self.data.append(n["name"] in input_names if n["op"] == "null"
                             else any(self.data[j] for j, *_ in n["inputs"]))

    def resolve(self, name: str, role: str) -> str:
        out = self.names.get(name)
        if out is None:
            kind = "ONNX node/tensor names" if self.info is not None else "operator names"
            raise SurgeryError(f"{role} '{name}' is not a node of this model. " + _close(name, self.names, kind))
        return out

    def label(self, out: str) -> str:
        """A name for an output: the importer maps node names after tensor names, so the last wins."""
        return next((k for k, v in reversed(self.names.items()) if v == out), out)

    def chain_back(self, out: str, role: str) -> str:
        """The output of the node (or graph input) whose value the node producing ``out`` transforms."""
        start = self.entry[out][0]
        found: list[str] = []
        stack = [tuple(e[:2]) for e in self.nodes[start]["inputs"]]
        while stack:
            j, k = stack.pop()
            if not self.data[j]:
                continue
            name = self.out_name[(j, k)]
            if name in self.boundaries:
                if name not in found:
                    found.append(name)
            else:
                stack += [tuple(e[:2]) for e in self.nodes[j]["inputs"]]
        if len(found) != 1:
            what = "no data input" if not found else f"{len(found)} data inputs ({', '.join(map(self.label, found))})"
            raise SurgeryError(f"{role}: node '{self.label(out)}' has {what}; only single-input nodes can be "
                               f"ignored or dropped. Use cut_at to choose the new output instead.")
        return found[0]

    def tensor(self, out: str) -> str:
        """The ONNX tensor whose value is MXNet output ``out`` (graph inputs are their own)."""
        return out if out in self.input_names else self.onnx_tensor.get(out, out)

    def rebuild(self, outputs: list[mx.sym.Symbol], head: Head | None = None, ends: Sequence[str] | None = None,
                bypass: Sequence[tuple[str, str]] = ()) -> SymbolBlock:
        """A block of the same class on ``outputs`` sharing the Parameters; for imported models
        the ONNX record follows: ``ends`` (the tensors the graph now ends at, which ``head``
        reads) and ``bypass`` (tensor rewires), so export can replay the surgery on the graph."""
        shared = ParameterDict("")
        shared.update(self.block.params)
        if head is not None:
            shared.update(head.collect_params())
        out = outputs[0] if len(outputs) == 1 else mx.sym.Group(outputs)
        new = type(self.block)(out, self.inputs, params=shared)
        if self.info is not None:
            present = set(out.get_internals().list_outputs())
            set_onnx_info(new, dataclasses.replace(
                self.info, outputs=tuple(ends) if ends is not None else self.info.outputs,
                constants=frozenset(self.info.constants & set(new.params.keys())),
                node_outputs={k: v for k, v in self.info.node_outputs.items() if v in present},
                tensor_outputs={k: v for k, v in self.info.tensor_outputs.items() if v in present},
                bypass=self.info.bypass + tuple(bypass), head=head))
        return new

    def shapes(self, outs: Sequence[str], input_shape: Shape, what: str = "surgery",
               batch: int = 1) -> list[Shape | None]:
        known = {self.inputs[0].name: (batch, *input_shape)}
        if self.info is not None:
            free = self.info.free_axes
            lengths = {s: known[self.inputs[0].name][k] for k, (s, _) in free.get(self.inputs[0].name, {}).items()
                       if k < len(known[self.inputs[0].name])}
            for name, shape in self.info.input_shapes.items():
                if name not in known and shape is not None and shape and name in self.info.batch_free:
                    shape = (batch, *shape[1:])  # a second batched input (a text model's mask)
                if name not in known and shape is not None:  # a free length shared with the first input
                    shape = tuple(lengths.get(free.get(name, {}).get(k, ("",))[0], d) if d is None else d
                                  for k, d in enumerate(shape))
                if name not in known and shape is not None and None not in shape:
                    known[name] = tuple(shape)
        try:
            _, shapes, _ = self.internals.infer_shape_partial(**known)
        except mx.base.MXNetError as e:
            raise SurgeryError(f"after {what} the model does not fit inputs of shape {input_shape}: "
                               f"{short_reason(e)}") from None
        by_name = dict(zip(self.internals.list_outputs(), shapes))
        return [tuple(by_name[o]) if by_name.get(o) else None for o in outs]


# ============================================================================ Gluon blocks

def _is_seq(block: HybridBlock) -> bool:
    return isinstance(block, (nn.HybridSequential, nn.Sequential))


class Trunk(HybridBlock):
    """Kept units of a Gluon model run as a chain (recording ``taps``), then an optional head.

    Units are registered under their original paths through Sequential containers, so
    structural parameter names are unchanged and ``stages.trunk_units`` sees the same units.
    """

    def __init__(self, units: Sequence[tuple[str, HybridBlock]], taps: Sequence[str] = (),
                 head: Head | None = None) -> None:
        super().__init__(prefix="")
        self._paths = [p for p, _ in units]  # paths only: Gluon warns about lists of blocks
        self.taps = list(taps)
        self._chain: list[str] = []
        for path, block in units:
            *parents, leaf = path.split(".")
            holder: HybridBlock = self
            for p in parents:
                if p not in children(holder):
                    holder.register_child(nn.HybridSequential(prefix=""), p)
                holder = children(holder)[p]
            holder.register_child(block, leaf)
            if not parents:
                self._chain.append(leaf)
            elif parents[0] not in self._chain:
                self._chain.append(parents[0])
        self.head = head

    @property
    def units(self) -> list[tuple[str, HybridBlock]]:
        out = []
        for path in self._paths:
            block: HybridBlock = self
            for p in path.split("."):
                block = children(block)[p]
            out.append((path, block))
        return out

    def _run(self, holder: HybridBlock, names: Iterable[str], x, prefix: str, feats: dict):
        for name in names:
            path, child = prefix + name, children(holder)[name]
            if any(t.startswith(path + ".") for t in self.taps):
                x = self._run(child, children(child), x, path + ".", feats)
            else:
                x = child(x)
            if path in self.taps:
                feats[path] = x
        return x

    def features(self, x):
        """The trunk's output, or the tapped unit outputs in ``taps`` order."""
        feats: dict = {}
        x = self._run(self, self._chain, x, "", feats)
        return [feats[t] for t in self.taps] if self.taps else [x]

    def hybrid_forward(self, F, x):
        feats = self.features(x)
        if self.head is not None:
            return self.head(*feats)
        return feats if len(feats) > 1 else feats[0]


def _chain_units(net: HybridBlock, input_shape: Shape | None) -> list[tuple[str, HybridBlock]]:
    """The model as a chain of units, checked against its own forward when a shape is given."""
    if isinstance(net, Trunk):
        if net.head is not None:
            raise SurgeryError("this model already has a new head; cut, drop or ignore before attach_head.")
        return list(net.units)
    units = trunk_units(net)
    if input_shape is not None:
        x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (1, *input_shape)), ctx=_ctx(net))
        with mx.autograd.predict_mode():
            want = net(x)
            got = x
            for _, block in units:
                got = block(got)
        same = isinstance(want, mx.nd.NDArray) and isinstance(got, mx.nd.NDArray) and \
            want.shape == got.shape and np.allclose(want.asnumpy(), got.asnumpy(), rtol=1e-4, atol=1e-5)
        if not same:
            raise SurgeryError(f"{type(net).__name__}'s forward is not the chain of its units "
                               f"({', '.join(p for p, _ in units)}), so cutting it by unit would change what it "
                               f"computes. Export it (HybridBlock.export) and load it as symbol:PREFIX to cut the graph.")
    return units


def _ctx(net: HybridBlock) -> mx.Context:
    params = list(net.collect_params().values())
    return params[0].list_ctx()[0] if params else mx.cpu()


def _paths(units: Sequence[tuple[str, HybridBlock]]) -> list[str]:
    """Every name a unit can be addressed by: units and, inside Sequential ones, their children."""
    out = []

    def walk(path: str, block: HybridBlock) -> None:
        out.append(path)
        if _is_seq(block):
            for k, c in children(block).items():
                walk(f"{path}.{k}", c)
    for path, block in units:
        walk(path, block)
    return out


def _open(units: list[tuple[str, HybridBlock]], path: str, role: str) -> tuple[list[tuple[str, HybridBlock]], range]:
    """Units with Sequential containers opened until ``path`` is one or a run of them; and where."""
    while True:
        inside = [i for i, (p, _) in enumerate(units) if p.startswith(path + ".")]
        if inside:  # an opened container: the run of its units
            return units, range(inside[0], inside[-1] + 1)
        for i, (p, block) in enumerate(units):
            if p == path:
                return units, range(i, i + 1)
            if path.startswith(p + ".") and _is_seq(block):
                units = units[:i] + [(f"{p}.{k}", c) for k, c in children(block).items()] + units[i + 1:]
                break
        else:
            raise SurgeryError(f"{role} '{path}' is not a unit of this model (a top-level block, or a block "
                               f"inside Sequential containers). " + _close(path, _paths(units), "units"))


# ============================================================================ public API

def cut_at(block: HybridBlock, name: str, *, input_shape: Shape | None = None) -> HybridBlock:
    """The model up to ``name``, whose output becomes the model's output."""
    if isinstance(block, SymbolBlock):
        g = _Graph(block)
        out = g.resolve(name, "cut_at")
        return g.rebuild([g.internals[out]], ends=[g.tensor(out)])
    units, at = _open(_chain_units(block, input_shape), name, "cut_at")
    return Trunk(units[:at.stop])


def tap(block: HybridBlock, names: Sequence[str], *, input_shape: Shape | None = None) -> HybridBlock:
    """The model up to its deepest tap, returning the tapped nodes' outputs (a list in ``names``
    order; one tap: that tensor): the features a dense head reads (segmentation, a detector's
    neck). Parameters are shared and keep their names; what lies past the deepest tap drops out."""
    if not names:
        raise SurgeryError("tap needs at least one node name (`gluontl inspect MODEL --nodes` lists them).")
    if isinstance(block, SymbolBlock):
        g = _Graph(block)
        outs = [g.resolve(n, "tap") for n in names]
        return g.rebuild([g.internals[o] for o in outs], ends=[g.tensor(o) for o in outs])
    units, stop = _chain_units(block, input_shape), 0
    for name in names:
        units, at = _open(units, name, "tap")
        stop = max(stop, at.stop)
    return Trunk(units[:stop], names)


def drop_last(block: HybridBlock, n: int, *, input_shape: Shape | None = None) -> HybridBlock:
    """The model without its last ``n`` layers (see the module docstring for what a layer is)."""
    if n < 1:
        raise SurgeryError(f"drop_last must be at least 1, got {n}.")
    if isinstance(block, SymbolBlock):
        g = _Graph(block)
        outs = g.sym.list_outputs()
        if len(outs) != 1:
            raise SurgeryError(f"drop_last needs a single-output model; this one has outputs {outs}. "
                               f"Use cut_at.")
        out = outs[0]
        for _ in range(n):
            if out in g.input_names:
                raise SurgeryError(f"drop_last {n} walks past the model input; the output chain is shorter.")
            out = g.chain_back(out, f"drop_last {n}")
        return g.rebuild([g.internals[out]], ends=[g.tensor(out)])
    units = _chain_units(block, input_shape)
    if n >= len(units):
        raise SurgeryError(f"drop_last {n} would drop every unit; this model has {len(units)}: "
                           f"{', '.join(p for p, _ in units)}.")
    return Trunk(units[:-n])


def ignore(block: HybridBlock, names: Sequence[str], *, input_shape: Shape | None = None) -> HybridBlock:
    """The model with ``names`` removed, their consumers fed from their (single) input."""
    if not names:
        return block
    if isinstance(block, SymbolBlock):
        g = _Graph(block)
        replace, bypass = {}, []
        passthrough = g.info.passthrough if g.info is not None else {}
        for name in names:
            if name in passthrough:  # Identity/Dropout: nothing in the block, a rewire in the file
                bypass.append(passthrough[name])
                continue
            out = g.resolve(name, "ignore")
            back = g.chain_back(out, f"ignore '{name}'")
            replace[g.entry[out]] = g.entry[back]
            bypass.append((g.tensor(out), g.tensor(back)))
        for target in list(replace):  # ignoring a run of nodes: follow replacements through
            while replace[target] in replace:
                replace[target] = replace[replace[target]]
        graph = graph_of(g.sym)
        for node in graph["nodes"]:
            node["inputs"] = [[*replace.get(tuple(e[:2]), e[:2]), *e[2:]] for e in node["inputs"]]
        graph["heads"] = [[*replace.get(tuple(h[:2]), h[:2]), *h[2:]] for h in graph["heads"]]
        sym = symbol_from(graph)
        outs = [sym[i] for i in range(len(sym.list_outputs()))]
        new = g.rebuild(outs, bypass=bypass)
        if input_shape is not None:
            after = _Graph(new)
            after.shapes(after.sym.list_outputs(), input_shape, f"ignoring {', '.join(names)}")
        return new
    units = _chain_units(block, input_shape)
    for name in names:
        units, at = _open(units, name, "ignore")
        units = units[:at.start] + units[at.stop:]
    trunk = Trunk(units)
    if input_shape is not None:
        _features(trunk, input_shape, _ctx(trunk), f"ignoring {', '.join(names)}",
                  " Ignore only units that keep their input's shape (activations, dropout, a flatten "
                  "before a Dense).")
    return trunk


def attach_head(block: HybridBlock, spec: HeadSpec | Mapping[str, Any], input_shape: Shape,
                ctx: mx.Context | None = None) -> HybridBlock:
    """A new ``head.*`` classifier on the model's output, or on the tensors ``spec.inputs`` names;
    ``spec`` is a ``HeadSpec`` or a dict with a recipe's ``surgery.head`` keys."""
    spec = as_spec(spec, HeadSpec, "head", SurgeryError, "{'classes': 3}",
                   "A head takes the keys of a recipe's surgery.head (see docs/recipes.md, Surgery).")
    ctx = ctx or mx.cpu()
    if isinstance(block, SymbolBlock):
        g = _Graph(block)
        outs = [g.resolve(n, "head input") for n in spec.inputs] or g.sym.list_outputs()
        if len(outs) > 1 and not spec.inputs:
            raise SurgeryError(f"the model has {len(outs)} outputs ({', '.join(outs)}); name the head's "
                               f"features with head.inputs or cut_at one of them first.")
        head = _new_head(spec, g.shapes(outs, input_shape), ctx)
        return g.rebuild([head(*[g.internals[o] for o in outs])], head, [g.tensor(o) for o in outs])
    units = _chain_units(block, input_shape)
    stop = 0
    for name in spec.inputs:
        units, at = _open(units, name, "head input")
        stop = max(stop, at.stop)
    if spec.inputs:
        units = units[:stop]
    feats = _features(Trunk(units, spec.inputs), input_shape, ctx, "the surgery")
    return Trunk(units, spec.inputs, _new_head(spec, [f.shape for f in feats], ctx))


def _features(trunk: Trunk, input_shape: Shape, ctx: mx.Context, what: str, hint: str = "") -> list[mx.nd.NDArray]:
    """One batch-1 forward: the feature shapes, and proof that the kept units still fit together."""
    try:
        with mx.autograd.predict_mode():
            return trunk.features(mx.nd.zeros((1, *input_shape), ctx=ctx))
    except mx.base.MXNetError as e:
        raise SurgeryError(f"after {what} the model no longer runs on inputs of shape {input_shape}: "
                           f"{short_reason(e)}.{hint}") from None


def list_nodes(block: HybridBlock, input_shape: Shape, batch: int = 1) -> list[NodeInfo]:
    """Nodes (graphs) or units (Gluon blocks) with op type and output shape at ``batch``, in order."""
    if isinstance(block, SymbolBlock):
        g = _Graph(block)
        ops = _onnx_ops(g.info.source, g.names) if g.info is not None else {}
        names = list(ops) if ops else list(g.names)
        names.sort(key=lambda k: g.entry[g.names[k]])
        shapes = g.shapes([g.names[k] for k in names], input_shape, batch=batch)
        return [NodeInfo(k, ops.get(k) or g.nodes[g.entry[g.names[k]][0]]["op"], s) for k, s in zip(names, shapes)]
    units = block.units if isinstance(block, Trunk) else trunk_units(block)
    x = data = mx.nd.zeros((batch, *input_shape), ctx=_ctx(block))
    rows = []
    with mx.autograd.predict_mode():
        for path, unit in units:
            x = unit(x)
            rows.append(NodeInfo(path, type(unit).__name__, tuple(x.shape)))
        if getattr(block, "head", None) is not None:
            rows.append(NodeInfo("head", "Head", tuple(block(data).shape)))
    return rows


def feature_shapes(block: HybridBlock, names: Sequence[str], input_shape: Shape, key: str,
                   source: str = "the model") -> list[Shape]:
    """Each named node's batch-1 output shape, checked as the taps of a dense head (a detector's
    features, a segmenter's taps): nodes of the model, feature maps, shallow to deep; errors
    name the recipe ``key`` that lists them."""
    found = {n.name: n.shape for n in list_nodes(block, input_shape)}
    shapes = []
    for name in names:
        if name not in found:
            close = difflib.get_close_matches(name, list(found), n=3)
            raise SurgeryError(f"{key} names '{name}', which is not a node of {source} "
                               f"(close: {', '.join(close) or 'none'}; `gluontl inspect` lists them).")
        if found[name] is None or len(found[name]) != 4:
            raise SurgeryError(f"{key} '{name}' outputs {found[name]}, not a feature map (N, C, H, W); pick a "
                               f"convolutional node.")
        shapes.append(found[name])
    heights = [s[2] for s in shapes]
    if heights != sorted(heights, reverse=True):
        raise SurgeryError(f"{key} must go from shallow to deep (large maps first); their heights are {heights}.")
    return shapes


def _onnx_ops(source: str, names: dict[str, str]) -> dict[str, str]:
    """One row per converted ONNX node (its name, or its output's for unnamed nodes) -> op type,
    when the imported file is still there to say what the ops were."""
    from .onnx.importer import read_proto

    try:
        nodes = read_proto(source).graph.node
    except OnnxImportError:
        return {}
    rows = {}
    for n in nodes:
        key = n.name if n.name in names else next((o for o in n.output[:1] if o in names), None)
        if key is not None:
            rows[key] = n.op_type
    return rows


def feature_end(block: HybridBlock, input_shape: Shape) -> str:
    """The last node whose output is still a feature map (rank ≥ 3) of every sample: the default
    cut for a new head. Shapes are taken at batch 2, so a node that keeps one sample (``t[:1]``)
    is not mistaken for a feature map."""
    info = onnx_info(block)
    tokens = [] if info is None or info.model is None else [
        i.name for i in info.model.graph.input if i.name in info.inputs
        and i.type.tensor_type.elem_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32)]
    if tokens:  # rank-3 tensors of a text model are [batch, tokens, features] or attention maps
        raise SurgeryError(f"this model reads integer input(s) {tokens} (token ids), so its rank ≥ 3 "
                           "tensors are not image feature maps to pool for a new head; say where the head "
                           "goes with head.inputs (e.g. the pooled output) or surgery.cut_at.")
    maps = [n for n in list_nodes(block, input_shape, batch=2)
            if n.shape is not None and len(n.shape) >= 3 and n.shape[0] == 2]
    if not maps:
        raise SurgeryError("this model has no feature-map node (rank ≥ 3) to put a new head on; "
                           "say where with surgery.cut_at or head.inputs.")
    return maps[-1].name


def needs_surgery(spec: SurgerySpec, source: str) -> bool:
    """False when a zoo model can rebuild its own classifier (GluonCV ``reset_class`` style)."""
    h = spec.head
    custom_head = h is not None and (h.inputs or h.hidden or h.dropout or h.pool != "auto"
                                     or not source.startswith("zoo:"))
    return bool(spec.cut_at or spec.drop_last or spec.ignore or custom_head)


def apply_surgery(block: HybridBlock, spec: SurgerySpec | Mapping[str, Any], input_shape: Shape,
                  ctx: mx.Context | None = None) -> HybridBlock:
    """ignore → cut_at / drop_last → head, in that order; with a head but no cut, cut at ``feature_end``.
    ``spec``: a ``SurgerySpec`` or a dict with a recipe's ``surgery`` keys."""
    spec = as_spec(spec, SurgerySpec, "surgery", SurgeryError, "{'cut_at': 'flatten', 'head': {'classes': 3}}",
                   "Surgery takes the keys of a recipe's surgery section (see docs/recipes.md, Surgery).")
    block = ignore(block, spec.ignore, input_shape=input_shape)
    if spec.cut_at:
        block = cut_at(block, spec.cut_at, input_shape=input_shape)
    elif spec.drop_last:
        block = drop_last(block, spec.drop_last, input_shape=input_shape)
    elif spec.head is not None and not spec.head.inputs:
        block = cut_at(block, feature_end(block, input_shape), input_shape=input_shape)
    if spec.head is not None:
        block = attach_head(block, spec.head, input_shape, ctx)
    return block
