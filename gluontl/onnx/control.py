"""Control flow at import: what an If/Loop/Scan body reads from the enclosing graph, and
a Loop or Scan written out as plain nodes, one copy of its body per iteration.

A body that reads an outer-scope value depends on it exactly as on an input, so a
control-flow node is constant only when its inputs *and* those reads are (tf2onnx writes
an LSTM as a Loop whose body Gathers step t of the outer sequence). A Loop that is not
constant unrolls when its trip count is known at import (a Scan's: its sequence length);
the importer drives this.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan"})
MAX_UNROLL = 1024  # iterations; each one copies the body into the MXNet graph


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    out: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def _local(g: onnx.GraphProto) -> set[str]:
    return ({t.name for t in g.initializer} | {i.name for i in g.input}
            | {o for n in g.node for o in n.output})


def outer_refs(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (nested ones too) read from the enclosing graph."""
    refs: set[str] = set()
    for g in subgraphs(node):
        local = _local(g)
        for n in g.node:
            refs |= ({x for x in n.input if x} | outer_refs(n)) - local
        refs |= {o.name for o in g.output} - local  # a body may return an outer value
    return refs


def _rename_nested(node: onnx.NodeProto, rename: dict[str, str]) -> None:
    """Rename, in place, what ``node``'s subgraphs read from outside themselves."""
    for g in subgraphs(node):
        local = _local(g)
        for n in g.node:
            n.input[:] = [rename.get(x, x) if x and x not in local else x for x in n.input]
            _rename_nested(n, rename)
        for o in g.output:
            if o.name not in local:
                o.name = rename.get(o.name, o.name)


def loop_iteration(loop: onnx.NodeProto, name: str, k: int, state: Sequence[str]
                   ) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray], str, list[str], list[str]]:
    """Iteration ``k`` of a Loop body as plain nodes reading the carried values ``state``.

    Body-local names get the prefix ``{name}/{k}/``; the iteration number and the incoming
    condition become constants. Returns the nodes, the constants to set, and the names of
    the condition the body computes, the carried values and the scan outputs."""
    body = next(a.g for a in loop.attribute if a.name == "body")
    prefix = f"{name}/{k}/"
    rename = {x: prefix + x for x in _local(body)}
    consts = {}
    if len(body.input) > 0:
        consts[rename[body.input[0].name]] = np.array(k, np.int64)
    if len(body.input) > 1:
        consts[rename[body.input[1].name]] = np.array(True)
    for i, s in zip(body.input[2:], state):
        rename[i.name] = s
    nodes, outs = _copy_body(body, prefix, rename, consts)
    carried = len(state)
    return nodes, consts, outs[0], outs[1:1 + carried], outs[1 + carried:]


def scan_iteration(scan: onnx.NodeProto, name: str, k: int, state: Sequence[str],
                   sequences: Sequence[str]) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray],
                                                      list[str], list[str]]:
    """Iteration ``k`` of a Scan body (scan axes 0, forward) as plain nodes: each scan input
    element is a Gather of step ``k``. Returns the nodes, the constants to set, and the names
    of the carried values and the scan outputs."""
    body = next(a.g for a in scan.attribute if a.name == "body")
    prefix = f"{name}/{k}/"
    rename = {x: prefix + x for x in _local(body)}
    index = f"{prefix}scan_index"
    consts = {index: np.array(k, np.int64)}
    for i, s in zip(body.input, state):
        rename[i.name] = s
    gathers = [helper.make_node("Gather", [seq, index], [rename[i.name]], name=rename[i.name], axis=0)
               for i, seq in zip(body.input[len(state):], sequences)]
    nodes, outs = _copy_body(body, prefix, rename, consts)
    return gathers + nodes, consts, outs[:len(state)], outs[len(state):]


def _copy_body(body: onnx.GraphProto, prefix: str, rename: dict[str, str],
               consts: dict[str, np.ndarray]) -> tuple[list[onnx.NodeProto], list[str]]:
    """The body's nodes renamed by ``rename`` (initializers added to ``consts``), and the
    names of its outputs."""
    for t in body.initializer:
        consts[rename[t.name]] = numpy_helper.to_array(t)
    nodes = []
    for j, inner in enumerate(body.node):
        n = onnx.NodeProto()
        n.CopyFrom(inner)
        n.name = f"{prefix}{inner.name or f'{inner.op_type}_{j}'}"
        n.input[:] = [rename.get(x, x) if x else "" for x in inner.input]
        n.output[:] = [rename.get(x, x) if x else "" for x in inner.output]
        _rename_nested(n, rename)
        nodes.append(n)
    return nodes, [rename.get(o.name, o.name) for o in body.output]


def stack_nodes(name: str, pieces: Sequence[str], out: str, opset: int) -> tuple[
        list[onnx.NodeProto], dict[str, np.ndarray]]:
    """Nodes stacking the per-iteration ``pieces`` of a scan output along a new axis 0."""
    axes = f"{name}/stack_axes"
    nodes, consts, parts = [], {}, []
    for k, p in enumerate(pieces):
        part = f"{name}/{k}/stacked_{out}"
        if opset >= 13:
            consts[axes] = np.array([0], np.int64)
            nodes.append(helper.make_node("Unsqueeze", [p, axes], [part], name=part))
        else:
            nodes.append(helper.make_node("Unsqueeze", [p], [part], name=part, axes=[0]))
        parts.append(part)
    nodes.append(helper.make_node("Concat", parts, [out], name=f"{name}/stack_{out}", axis=0))
    return nodes, consts


def refusal(op_type: str, name: str, source: str, reads: Sequence[str], why: str) -> str:
    """The one-paragraph error for a control-flow node that can be neither folded nor converted."""
    listed = ", ".join(f"'{r}'" for r in sorted(reads)[:5]) + (" ..." if len(reads) > 5 else "")
    what = (f"reads {listed}, known only at run time, so it is not a constant and is not "
            f"evaluated at import" if reads else "depends on values known only at run time")
    return (f"{op_type} node '{name}' in '{source}' {what}; gluontl cannot convert it: {why}. "
            f"Pass input_shapes=... (fixing the sequence length) so the trip count folds, or "
            f"re-export the model with the recurrence as an ONNX LSTM/GRU/RNN op.")
