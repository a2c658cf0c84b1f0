"""An ONNX graph bound at another image size than the one it declares, up to the tensors a dense
head reads.

A classifier declares the size it was trained at (EfficientNet-Lite0: 224 x 224) and usually
ends in Flatten -> Gemm, which holds it to that size; the importer rightly refuses any other.
A segmentation or detection head reads feature maps before that end, and the graph up to them
computes the same function at any H x W when every node on the way is spatially agnostic:
convolutions, pooling with kernels, global pooling, normalization, elementwise ops whose
constant operands do not span the image, Pad, Resize by scales, Concat over channels. That is
decided here from the graph alone, node by node from the image input to the tensors read; a
node of any other kind (Reshape, Flatten, Gemm, MatMul, Shape, Slice, a Resize to fixed sizes,
...) is refused by name. What lies past those tensors is cut off, so it is neither imported
nor computed, and may hold any size it likes.
"""
from __future__ import annotations

from typing import Sequence

import onnx
from onnx import helper

from ..errors import OnnxImportError
from .importer import _copy_fields

# Ops whose output is defined at any H x W given their input's, with the extra checks in _refusal.
CONV = frozenset({"Conv", "ConvTranspose"})
POOL = frozenset({"MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
NORM = frozenset({"BatchNormalization", "InstanceNormalization", "LRN"})
# Elementwise: their constant operands broadcast against the feature map, so must not span H, W.
ELEMENTWISE = frozenset({
    "Relu", "LeakyRelu", "PRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu", "Celu",
    "Softplus", "Softsign", "Mish", "Gelu", "Erf", "Exp", "Log", "Abs", "Neg", "Sqrt", "Reciprocal", "Floor",
    "Ceil", "Round", "Sign", "ThresholdedRelu", "Identity", "Dropout", "Cast",
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean"})
REDUCE = frozenset({"ReduceMean", "ReduceMax", "ReduceMin", "ReduceSum", "ReduceL2"})
AGNOSTIC = CONV | POOL | NORM | ELEMENTWISE | REDUCE | {"Pad", "Resize", "Upsample", "Concat"}


def rebind_spatial(proto: onnx.ModelProto, ends: Sequence[str], input_name: str, hw: tuple[int, int],
                   source: str) -> onnx.ModelProto:
    """``proto`` cut after the nodes or tensors ``ends`` (they become its outputs), its image input
    ``input_name`` (N, C, H, W) declared at ``hw``; refused, naming the node, unless every node
    between that input and ``ends`` is spatially agnostic (module docstring)."""
    graph = proto.graph
    producer = {o: n for n in graph.node for o in n.output if o}
    by_name = {n.name: n for n in graph.node if n.name}
    tensors = []
    for end in ends:
        node = by_name.get(end)
        tensor = next((o for o in node.output if o), None) if node is not None else end
        if tensor not in producer and tensor != input_name:
            raise OnnxImportError(f"'{source}' has no node or tensor '{end}' to bind at {hw[0]}x{hw[1]} up to; "
                                  f"`gluontl inspect {source}` lists its nodes.")
        tensors.append(tensor)
    kept = _ancestors(tensors, producer)
    data = _reads_input(graph.node, kept, input_name)
    constant_shapes = _constant_shapes(graph)
    for node in graph.node:
        if id(node) in kept and any(i in data for i in node.input):
            why = _refusal(node, data, constant_shapes)
            if why:
                label = node.name or node.output[0]
                raise OnnxImportError(
                    f"'{source}': node '{label}' ({node.op_type}) lies between input '{input_name}' and "
                    f"{', '.join(map(repr, ends))} and {why}, so the graph up to there runs only at the size the "
                    f"file declares, not at {hw[0]}x{hw[1]}. Give model.input_shape the declared size, or read "
                    f"nodes before '{label}'.")
    out = onnx.ModelProto()
    _copy_fields(out, proto, skip={"graph"})  # field by field: the weights are copied once, below
    g = out.graph
    g.name = graph.name
    g.node.extend(n for n in graph.node if id(n) in kept)
    used = {i for n in g.node for i in n.input} | set(tensors)
    g.initializer.extend(t for t in graph.initializer if t.name in used)
    for i in graph.input:
        if i.name not in used:
            continue
        new = g.input.add()
        new.CopyFrom(i)
        if i.name == input_name:
            dims = new.type.tensor_type.shape.dim
            if len(dims) != 4:
                raise OnnxImportError(f"'{source}': input '{input_name}' has rank {len(dims)}; binding another "
                                      f"image size needs an N, C, H, W input.")
            for d, size in zip(dims[2:], hw):
                d.Clear()
                d.dim_value = int(size)
    elem = {i.name: i.type.tensor_type.elem_type for i in graph.input}
    elem.update({v.name: v.type.tensor_type.elem_type for v in (*graph.value_info, *graph.output)})
    for t in tensors:
        g.output.append(helper.make_tensor_value_info(t, elem.get(t) or onnx.TensorProto.FLOAT, None))
    return out


def _ancestors(tensors: Sequence[str], producer: dict[str, onnx.NodeProto]) -> set[int]:
    """ids of the nodes ``tensors`` depend on."""
    seen: set[int] = set()
    stack = [producer[t] for t in tensors if t in producer]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack += [producer[i] for i in node.input if i in producer]
    return seen


def _reads_input(nodes, kept: set[int], input_name: str) -> set[str]:
    """The tensors whose value depends on the image input, among the kept nodes' (in graph order)."""
    tainted = {input_name}
    for node in nodes:
        if id(node) in kept and any(i in tainted for i in node.input):
            tainted.update(o for o in node.output if o)
    return tainted


def _constant_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    shapes = {t.name: tuple(t.dims) for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant":
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            if value is not None:
                shapes[n.output[0]] = tuple(value.dims)
    return shapes


def _refusal(node: onnx.NodeProto, data: set[str], constant_shapes: dict[str, tuple[int, ...]]) -> str | None:
    """Why ``node`` ties the graph to one image size, or None."""
    op, attrs = node.op_type, {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.domain not in ("", "ai.onnx") or op not in AGNOSTIC:
        return f"is not one of the spatially agnostic ops ({op} may fix or read the image size)"
    if op == "ConvTranspose" and "output_shape" in attrs:
        return "sets a fixed output_shape"
    if op == "Resize" and len(node.input) > 3 and node.input[3]:
        return "resizes to fixed sizes (give scales instead)"
    if op == "Concat" and attrs.get("axis") not in (1, -3):
        return f"concatenates along axis {attrs.get('axis')}, not the channels"
    if op in REDUCE and attrs.get("keepdims", 1) == 0:
        return "drops the reduced axes (keepdims 0), changing the rank the next nodes see"
    for i in node.input if op in ELEMENTWISE else ():
        if not i or i in data:
            continue
        shape = constant_shapes.get(i)
        if shape is None:
            return f"reads '{i}', a computed constant whose shape may span the image"
        if any(d != 1 for d in shape[-2:]):
            return f"broadcasts the constant '{i}' of shape {list(shape)} over the image's H, W"
    return None
