"""Keep oneDNN-blocked gradients from reaching a reshape (MXNet 1.9.1 cannot train that; issue 23).

A convolution's backward writes the gradient of its data input in oneDNN's blocked layout
(e.g. ``aBcd8b``). When that input came from a reshape (possibly through elementwise ops,
activations or BatchNorm, whose backward hands the gradient on as it is),
``_backward_reshape`` (an in-place identity) passes the same memory on under the reshaped
dims while it keeps the convolution's 4-D blocked descriptor. The next oneDNN op to read it
(a transpose: mkldnn_transpose.cc builds a reorder from ``GetMKLDNNData()``'s descriptor to
the reshaped strides) asks for a reorder between memories of different dims: "could not
create a primitive descriptor for a reorder primitive". Attention models that fold tokens
back into images hit this (MobileViT, EfficientFormerV2, XCiT).

The fix: such a convolution reads its input through ``slice_axis`` over the whole batch axis,
a plain copy forward whose backward (an MXNet kernel, not oneDNN) writes a fresh plain-layout
gradient, so the reshape behind it only ever sees plain memory. Forward values are the same
bits; the graph gains the copy only before convolutions a reshape feeds (MXNet's own count:
the channel Concat of ops/slice.py ends in one).
"""
from __future__ import annotations

import mxnet as mx

from .symjson import graph_of, symbol_from

# Backward hands the incoming gradient on in place under another shape.
RESHAPES = frozenset({"Reshape", "Flatten", "expand_dims", "squeeze", "reshape_like"})
# Backward writes a fresh gradient (or reads a blocked one correctly): the walk stops there.
# Any other op is assumed to hand its gradient on, which at worst costs one needless copy.
FRESH = frozenset({"null", "Convolution", "Deconvolution", "FullyConnected", "Pooling", "transpose",
                   "Concat", "slice", "slice_axis", "slice_like", "Pad", "dot", "batch_dot", "take",
                   "SwapAxis", "UpSampling", "_contrib_BilinearResize2D", "tile", "repeat",
                   "broadcast_to", "broadcast_like", "broadcast_axis", "sum", "mean", "max", "min",
                   "SliceChannel", "_split_v2", "stack", "depth_to_space", "space_to_depth",
                   "_contrib_AdaptiveAvgPooling2D", "softmax", "log_softmax", "BlockGrad"})


def fed_by_reshape(nodes: list[dict], entry: int) -> bool:
    """Whether the gradient arriving at node ``entry``'s output reaches a reshape unchanged."""
    seen, stack = set(), [entry]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        op = nodes[i]["op"]
        if op in RESHAPES:
            return True
        if op not in FRESH:
            stack.extend(src for src, _, _ in nodes[i]["inputs"])
    return False


def plain_conv_gradients(sym: mx.sym.Symbol) -> mx.sym.Symbol:
    """``sym`` with a copy named ``<conv>/plain_grad`` before every convolution whose data
    input is fed by a reshape (``sym`` itself when there is none)."""
    graph = graph_of(sym)
    nodes = graph["nodes"]
    targets = {i for i, n in enumerate(nodes)
               if n["op"] == "Convolution" and fed_by_reshape(nodes, n["inputs"][0][0])}
    if not targets:
        return sym
    new_index: dict[int, int] = {}
    out: list[dict] = []
    for i, n in enumerate(nodes):  # JSON nodes are in topological order: inputs come first
        inputs = [[new_index[s], o, v] for s, o, v in n["inputs"]]
        if i in targets:
            out.append({"op": "slice_axis", "name": f"{n['name']}/plain_grad",
                        "attrs": {"axis": "0", "begin": "0", "end": "None"}, "inputs": [inputs[0]]})
            inputs[0] = [len(out) - 1, 0, 0]
        new_index[i] = len(out)
        out.append({**n, "inputs": inputs})
    graph["nodes"] = out
    graph["arg_nodes"] = [new_index[i] for i in graph["arg_nodes"]]
    graph["heads"] = [[new_index[s], o, v] for s, o, v in graph["heads"]]
    graph.pop("node_row_ptr", None)
    return symbol_from(graph)
