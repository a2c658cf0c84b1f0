"""ONNX out for a model that came in as ONNX: its own graph, patched.

Re-converting an imported model through ``mx.onnx`` loses what the importer understood
(transformer batch_dot types, LSTM fills, Resize modes) and renames everything. Instead the
graph the importer read is written back with:

* trained values in its initializers, Constant nodes, or — for weights the importer folded
  out of a computation (DequantizeLinear of int8 weights, a Transpose of a weight) — in a
  new initializer under the same tensor name, replacing that computation;
* running statistics updated the same way (they are MXNet auxiliary states of the same name);
* surgery replayed as graph edits: ``ignore`` rewires readers of a tensor to another,
  ``cut_at``/``drop_last`` make the cut tensors the outputs, a new head is appended as
  standard ONNX nodes; whatever no longer feeds an output is dropped.

Opset, node and tensor names stay. Training settings (grad_req, lr, frozen BatchNorm) have
no ONNX form and do not leak: BatchNormalization nodes stay in inference mode.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import mxnet as mx
import numpy as np
import onnx
from onnx import helper, numpy_helper

from gluontl.errors import ExportError
from gluontl.mxinternals import onnx_info
from gluontl.export.lean import _unique_name, drop_dead_nodes, prune_initializers
from gluontl.onnx.importer import ImportInfo

_DATA_FIELDS = ("raw_data", "float_data", "double_data", "int32_data", "int64_data")


@dataclasses.dataclass(frozen=True)
class Patched:
    model: onnx.ModelProto
    input_shapes: dict[str, tuple[int | None, ...]]  # per graph input, batch dim None when free
    input_dtypes: dict[str, np.dtype]


def source_info(block: mx.gluon.HybridBlock) -> ImportInfo | None:
    """The import record of a block that came from ONNX (directly or through surgery)."""
    info = onnx_info(block)
    return info if isinstance(info, ImportInfo) and info.model is not None else None


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """The graph and every subgraph (If/Loop bodies) inside it."""
    yield graph
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    yield from _graphs(g)


def _values(block: mx.gluon.HybridBlock) -> dict[str, np.ndarray]:
    out = {}
    for name, p in block.collect_params().items():
        ctx = p.list_ctx()[0]
        out[name] = p.data(ctx).asnumpy()
    return out


def _tensor(value: np.ndarray, like: onnx.TensorProto | None, name: str) -> onnx.TensorProto:
    """``value`` as a TensorProto in the dtype and dims of ``like``, if given (MXNet keeps rank-0
    values as shape (1,) and bools as float 0/1)."""
    dtype = helper.tensor_dtype_to_np_dtype(like.data_type) if like is not None else value.dtype
    shape = tuple(like.dims) if like is not None else value.shape
    if int(np.prod(shape, dtype=np.int64)) != value.size:
        raise ExportError(f"Parameter '{name}' has {value.size} values but its ONNX tensor has shape {list(shape)}; "
                          "the block no longer fits the graph it was imported from (was the parameter replaced?).")
    return numpy_helper.from_array(value.reshape(shape).astype(dtype, copy=False), name)


def _write_values(model: onnx.ModelProto, values: dict[str, np.ndarray], info: ImportInfo) -> None:
    """Every parameter that names an ONNX tensor gets its value back into the graph.

    Constants the importer computed from other tensors (shape-derived scales) are left to the
    graph, which computes the same values; folded *weights* become initializers.
    """
    pending = dict(values)
    for graph in _graphs(model.graph):
        for t in graph.initializer:
            if t.name in pending:
                t.CopyFrom(_tensor(pending.pop(t.name), t, t.name))
    for graph in _graphs(model.graph):
        for node in list(graph.node):
            hits = [o for o in node.output if o in pending]
            if not hits:
                continue
            value_attr = next((a for a in node.attribute if a.name == "value"), None)
            if node.op_type == "Constant" and value_attr is not None:
                value_attr.t.CopyFrom(_tensor(pending.pop(hits[0]), value_attr.t, hits[0]))
                continue
            for o in hits:  # a weight the importer folded out of a computation: now a plain tensor
                v = pending.pop(o)
                if o in info.constants:
                    continue
                graph.initializer.append(_tensor(v, None, o))
                node.output[list(node.output).index(o)] = f"{o}/replaced_by_initializer"
    # The rest are the importer's own helpers (batch-free shape vectors), not ONNX tensors.
    leftover = [n for n in pending if n not in info.constants]
    if leftover:
        raise ExportError(f"Parameters {leftover[:5]} of the block are not tensors of the ONNX graph it was "
                          "imported from, so the graph cannot carry them; export with export_symbol instead.")


def _rewire(model: onnx.ModelProto, bypass: tuple[tuple[str, str], ...]) -> None:
    for graph in _graphs(model.graph):
        for node in graph.node:
            node.input[:] = [_follow(x, bypass) for x in node.input]


def _follow(name: str, bypass: tuple[tuple[str, str], ...]) -> str:
    seen = set()
    mapping = dict(bypass)
    while name in mapping and name not in seen:
        seen.add(name)
        name = mapping[name]
    return name


def _value_info(model: onnx.ModelProto, names: list[str]) -> dict[str, onnx.ValueInfoProto]:
    """Types of ``names`` from the file's own declarations, else ONNX shape inference."""
    g = model.graph
    known = {v.name: v for v in (*g.input, *g.output, *g.value_info)}
    if all(n in known for n in names):
        return {n: known[n] for n in names}
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True).graph
        known.update({v.name: v for v in (*inferred.value_info, *inferred.output) if v.name not in known})
    except Exception:  # inference is best effort: an untyped output is still a valid output
        pass
    return {n: known.get(n) or helper.make_empty_tensor_value_info(n) for n in names}


def _set_outputs(model: onnx.ModelProto, tensors: list[str]) -> None:
    infos = _value_info(model, tensors)
    del model.graph.output[:]
    for t in tensors:
        v = onnx.ValueInfoProto()
        v.CopyFrom(infos[t])
        model.graph.output.append(v)


def _check_data(model: onnx.ModelProto) -> None:
    """Every initializer still read must carry data (the import kept only what the block lacks)."""
    for graph in _graphs(model.graph):
        for t in graph.initializer:
            if int(np.prod(t.dims, dtype=np.int64)) > 0 and not any(
                    len(getattr(t, f)) for f in _DATA_FIELDS) and t.data_location != onnx.TensorProto.EXTERNAL:
                raise ExportError(f"The graph still reads tensor '{t.name}' but the block no longer holds that "
                                  "parameter (dropped by surgery?); please report this model.")


def _rename_inputs(model: onnx.ModelProto, names: dict[str, str]) -> None:
    if not names:
        return
    for graph in _graphs(model.graph):
        for node in graph.node:
            node.input[:] = [names.get(x, x) for x in node.input]
    for v in model.graph.input:
        v.name = names.get(v.name, v.name)


def patch_model(block: mx.gluon.HybridBlock, info: ImportInfo, input_names: list[str] | None = None,
                output_names: list[str] | None = None) -> Patched:
    """The imported graph with ``block``'s values and surgery; inputs renamed to ``input_names``
    (positionally) when given, outputs to ``output_names``."""
    model = onnx.ModelProto()
    model.CopyFrom(info.model)
    values = _values(block)
    head = info.head
    if head is not None:
        for name in head.collect_params().keys():
            values.pop(name, None)
    _write_values(model, values, info)
    _rewire(model, info.bypass)
    graph = model.graph
    ends = [_follow(t, info.bypass) for t in info.outputs]
    if head is not None:
        taken = {n.name for n in graph.node} | {x for n in graph.node for x in (*n.input, *n.output)}
        taken |= {t.name for t in graph.initializer} | {i.name for i in graph.input}
        nodes, inits, out, width = _head_nodes(head, ends, taken)
        graph.node.extend(nodes)
        graph.initializer.extend(inits)
        del graph.output[:]
        graph.output.append(helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, ["batch", width]))
    else:
        _set_outputs(model, ends)
    drop_dead_nodes(graph)
    prune_initializers(graph)
    init_names = {t.name for t in graph.initializer}
    inputs = [v for v in graph.input if v.name not in init_names]
    if input_names is not None:
        if len(input_names) != len(inputs):
            raise ExportError(f"input_shapes names {input_names} but the model has {len(inputs)} inputs "
                              f"{[v.name for v in inputs]}; give one shape per input.")
        _rename_inputs(model, {v.name: n for v, n in zip(inputs, input_names) if v.name != n})
        inputs = [v for v in graph.input if v.name not in init_names]
    if output_names is not None:
        if len(output_names) != len(graph.output):
            raise ExportError(f"output_names {output_names} must be {len(graph.output)} names, one per output "
                              f"({[o.name for o in graph.output]}).")
        for o, new in zip(list(graph.output), output_names):
            if o.name != new:
                graph.node.add().CopyFrom(helper.make_node("Identity", [o.name], [new], name=f"{new}/rename"))
                o.name = new
    _check_data(model)
    _name_batch(graph, inputs)
    shapes, dtypes = {}, {}
    for v in inputs:
        tt = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
        shapes[v.name] = tuple(dims)
        dtypes[v.name] = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
    return Patched(model, shapes, dtypes)


def _name_batch(graph: onnx.GraphProto, inputs: list[onnx.ValueInfoProto]) -> None:
    """The inputs' free dimension 0 is called ``batch`` on inputs and outputs alike, as in every
    other gluontl export (a new head's output already says ``batch``): one symbol the file's own
    name for it (``N``) is renamed everywhere, so which dimensions are equal stays as it was."""
    firsts = {v.type.tensor_type.shape.dim[0].dim_param for v in inputs if v.type.tensor_type.shape.dim}
    if len(firsts) != 1 or "" in firsts or firsts == {"batch"}:
        return  # fixed, mixed or already so named: nothing one rename can make consistent
    old, = firsts
    for value in (*graph.input, *graph.output, *graph.value_info):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == old:
                dim.dim_param = "batch"


def _head_nodes(head, features: list[str], taken: set[str]) -> tuple[list, list, str, int]:
    """Surgery's Head as standard ONNX nodes reading tensors ``features``, in inference mode (no
    dropout): (nodes, initializers, output name, output width). Initializers carry the
    parameters' structural names (``head.fc.weight``); node and tensor names start with ``head/``."""
    nodes, inits = [], []

    def node(op: str, inputs: list[str], tag: str, **attrs) -> str:
        out = _unique_name(f"head/{tag}", taken)
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(name: str, value) -> str:
        name = _unique_name(name, taken)
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def data(p) -> np.ndarray:
        return p.data(p.list_ctx()[0]).asnumpy()

    parts = []
    for i, (x, (pool, _)) in enumerate(zip(features, head.pools)):
        if pool:
            x = node("GlobalAveragePool" if pool == "avg" else "GlobalMaxPool", [x], f"pool{i}")
        parts.append(node("Flatten", [x], f"flatten{i}", axis=1))
    x = node("Concat", parts, "concat", axis=1) if len(parts) > 1 else parts[0]
    for dense in [*head.hidden_layers, head.fc]:
        tag = dense.prefix[len(head.prefix):].strip(".")
        x = node("Gemm", [x, const(dense.weight.name, data(dense.weight)), const(dense.bias.name, data(dense.bias))],
                 tag, transB=1)
        if dense is head.fc:
            break
        if head.activation == "gelu":  # exact (erf) GELU, what MXNet's LeakyReLU(gelu) computes
            scaled = node("Div", [x, const("head/sqrt2", np.sqrt(2.0))], "gelu_div")
            erf1 = node("Add", [node("Erf", [scaled], "gelu_erf"), const("head/one", 1.0)], "gelu_add")
            x = node("Mul", [node("Mul", [x, erf1], "gelu_mul"), const("head/half", 0.5)], "gelu")
        else:
            x = node({"relu": "Relu", "tanh": "Tanh", "sigmoid": "Sigmoid"}[head.activation], [x], head.activation)
    return nodes, inits, x, int(head.fc.weight.shape[0])
