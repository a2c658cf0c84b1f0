"""ONNX model → trainable Gluon ``SymbolBlock``.

The walk: load and validate the file, order nodes topologically, infer shapes with
the user's ``input_shapes``, fold every node whose inputs are known at import time,
and convert the rest with the per-op converters of :mod:`gluontl.onnx.registry`.
Known values become graph variables only when a converter asks for their symbol, so
shape vectors never turn into parameters while weights keep their ONNX names.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import heapq
import io
import os
import re
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping, Sequence

import mxnet as mx
import numpy as np
import onnx
import onnx.inliner
from onnx import external_data_helper, helper, numpy_helper

from ..errors import OnnxImportError, short_reason
from ..mxinternals.graphblock import GraphBlock
from ..naming import module_names
from . import control, fold
from .control import outer_refs as _outer_refs
from ..mxinternals import onnx_info, set_onnx_info
from ..mxinternals.plain_grad import plain_conv_gradients
from .ops.quantize import integer_as_float
from .ops.shape import range_along, range_over_batch
from .registry import Node, Tensor, canonical, carrier_dtype, get, get_evaluator, node_from_proto

Shape = tuple[int | None, ...]

# onnxruntime's integer-arithmetic contrib ops (QLinearConv/MatMul, ConvInteger and
# MatMulInteger are rewritten to float): named in the unsupported-op report with advice.
QUANTIZED_INTEGER_OPS = frozenset({"QLinearAdd", "QLinearMul", "QLinearSigmoid",
                                   "QLinearLeakyRelu", "QLinearGlobalAveragePool",
                                   "QLinearConcat", "QLinearAveragePool", "QLinearSoftmax"})
_MAX_ELEMENTS = 2 ** 34
# Graph size limits (docs/onnx-import.md). The largest fixtures have ~4,000 nodes and 3 outputs.
MAX_NODES = 1_000_000  # nodes of the main graph, functions inlined
MAX_OUTPUTS = 4096  # graph outputs; onnxruntime's session set-up (export verifies in it) grows faster than linearly
MAX_PROTO_BYTES = 2 ** 31 - 1  # protobuf's own limit; bigger models keep weights in external data


@dataclasses.dataclass(frozen=True)
class ImportInfo:
    """What the importer knows about the block it returned (for rules and surgery)."""

    source: str
    opset: int
    inputs: tuple[str, ...]
    input_shapes: dict[str, Shape]
    batch_free: frozenset[str]  # inputs whose dimension 0 (the batch) may vary
    outputs: tuple[str, ...]  # ONNX tensors the graph ends at (after surgery: the cut, or the head's inputs)
    constants: frozenset[str]  # non-trainable helper params (grad_req 'null')
    node_outputs: dict[str, str]  # ONNX node/tensor name -> MXNet output name
    tensor_outputs: dict[str, str] = dataclasses.field(default_factory=dict)  # ONNX tensor -> MXNet output
    passthrough: dict[str, tuple[str, str]] = dataclasses.field(default_factory=dict)  # Identity/Dropout
    # node -> (its output, its input): folded away, so the block has nothing to cut or ignore there
    model: onnx.ModelProto | None = None  # the graph as imported (functions inlined); export patches it
    bypass: tuple[tuple[str, str], ...] = ()  # surgery ``ignore``: readers of tensor a read tensor b
    head: Any = None  # surgery's Head block, appended after ``outputs``
    param_names: dict[str, str] = dataclasses.field(default_factory=dict)  # graph name -> module path
    # the file records (naming.module_names): the name users see; the graph name stays an alias
    free_axes: dict[str, dict[int, tuple[str, int]]] = dataclasses.field(default_factory=dict)
    # input -> {axis: (dim_param, an example size)}: other axes than the batch that stay free
    # (a text encoder's sequence); input_shapes holds None there


class OnnxBlock(GraphBlock):
    """The imported model: a SymbolBlock whose multi-output calls return a tuple in
    graph-output order (SymbolBlock itself returns a list)."""

    def forward(self, x, *args):
        try:
            out = super().forward(*(_carried(a) for a in (x, *args)))
        except mx.base.MXNetError as err:
            _explain_fixed_dims(self, (x, *args), err)
            raise
        return tuple(out) if isinstance(out, list) else out


def _explain_fixed_dims(block, args: Sequence, err: Exception) -> None:
    """MXNet fixes shapes when the graph is built: a call at other non-batch sizes than the
    import's (a text encoder's sequence length, H/W a Resize folded) fails inside MXNet;
    say which input and what to do instead of MXNet's broadcast message."""
    info = onnx_info(block)
    if info is None or not isinstance(info, ImportInfo):
        return
    for name, a in zip(info.inputs, args):
        fixed = info.input_shapes.get(name)
        if not isinstance(a, mx.nd.NDArray) or fixed is None or len(fixed) != a.ndim:
            continue
        off = [k for k, d in enumerate(fixed) if k > 0 and d is not None and d != a.shape[k]]
        if off:
            want = ["N" if k == 0 else d for k, d in enumerate(fixed)]
            raise OnnxImportError(
                f"Input '{name}' has shape {tuple(a.shape)} but '{info.source}' was imported for "
                f"{want} (N free): MXNet fixes the other dimensions when the graph is built. Import "
                f"again with input_shapes={{'{name}': [None, ...]}} at this size, or pad to the imported "
                f"size (with an attention mask, padding a text encoder's tokens changes nothing).") from err


def _carried(value):
    """A rank-0 NDArray (``mx.nd.array(np.float32(2))``, e.g. a Gemm bias or Pow exponent fed
    as ONNX has it) as the shape (1,) that carries rank-0 values in the graph; MXNet's
    shape inference reads shape () as unknown."""
    return value.reshape((1,)) if isinstance(value, mx.nd.NDArray) and value.shape == () else value


def import_model(model: str | os.PathLike | onnx.ModelProto,
                 input_shapes: Mapping[str, Sequence[int | None]] | None = None,
                 ctx: mx.Context | None = None, *, fixed_batch: bool = False,
                 source: str | None = None) -> OnnxBlock:
    """Import an ONNX model as a SymbolBlock whose weights are Gluon parameters.

    ``input_shapes`` fills unknown dimensions of graph inputs. A first dimension the file
    leaves symbolic stays free (any batch size works, as in onnxruntime), and None there
    frees a batch size the exporter pinned. ``fixed_batch`` pins every batch to the size
    in ``input_shapes``; only models that compute values from their batch size in ways
    a batch-free graph cannot express need that. ``source`` names a ModelProto in messages and
    in ``ImportInfo.source`` (the file it was read from, when it is an edited copy).
    """
    proto, name = load(model)
    name = source or name
    try:
        return _Importer(proto, name, input_shapes or {}, fixed_batch).build(ctx or mx.cpu())
    except OnnxImportError as e:  # a converter's refusal names its node; the file too, then
        if name in str(e):
            raise
        raise OnnxImportError(f"'{name}': {e}") from None


# --------------------------------------------------------------------------- loading

def load(model: str | os.PathLike | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The ModelProto with external data loaded, and a name for messages."""
    if isinstance(model, onnx.ModelProto):
        for t in external_data_helper._get_all_tensors(model):
            if external_data_helper.uses_external_data(t):
                raise OnnxImportError(
                    f"ONNX model object: initializer '{t.name}' keeps its data in an external file "
                    f"that was not loaded; pass the model's file path instead so the data is "
                    f"found next to it.")
        check_size(model, "<ModelProto>")
        check_names(model, "<ModelProto>")
        return inline_functions(model, "<ModelProto>"), "<ModelProto>"
    path = os.fspath(model)
    proto = read_proto(path)
    check_size(proto, path)
    check_names(proto, path)
    _load_external(proto, path)
    return inline_functions(proto, path), path


def inline_functions(proto: onnx.ModelProto, source: str) -> onnx.ModelProto:
    """Model-local functions (torch.onnx dynamo exports use many) become plain nodes."""
    if not proto.functions:
        return proto
    try:
        return onnx.inliner.inline_local_functions(proto)
    except Exception as e:
        raise OnnxImportError(f"'{source}': its local functions could not be inlined "
                              f"({str(e).strip()[:200]}); the model is probably invalid.") from None


def read_proto(path: str) -> onnx.ModelProto:
    """Parse an ONNX file without its external data; errors name the file and the problem."""
    if not os.path.isfile(path):
        raise OnnxImportError(f"ONNX file '{path}' does not exist (or is not a file). Check the path.")
    if os.path.getsize(path) > MAX_PROTO_BYTES:
        raise OnnxImportError(
            f"'{path}' is {os.path.getsize(path):,} bytes, over protobuf's limit of {MAX_PROTO_BYTES:,} for "
            f"one message; save the model with its weights as external data (onnx.save_model(..., "
            f"save_as_external_data=True)).")
    try:
        proto = onnx.load(path, load_external_data=False)
    except Exception as e:  # protobuf DecodeError, truncated reads, ...
        raise OnnxImportError(
            f"'{path}' is not a readable ONNX model: the protobuf could not be parsed "
            f"({type(e).__name__}: {str(e)[:200]}). The file may be truncated or not ONNX; "
            f"re-export or re-download it.") from None
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise OnnxImportError(
            f"'{path}' parsed as protobuf but contains no ONNX graph; it is probably not an "
            f"ONNX model (or was truncated). Re-export or re-download it.")
    return proto


def _load_external(proto: onnx.ModelProto, path: str) -> None:
    base = check_external(proto, path)
    try:
        external_data_helper.load_external_data_for_model(proto, base)
    except Exception as e:
        raise OnnxImportError(f"'{path}': external data could not be read ({e}).") from None


def check_external(proto: onnx.ModelProto, path: str) -> str:
    """The model's folder, after checking that every external data file lies inside it and exists
    (a received model must not make gluontl read files elsewhere)."""
    base = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    for t in external_data_helper._get_all_tensors(proto):
        if not external_data_helper.uses_external_data(t):
            continue
        entries = {e.key: e.value for e in t.external_data}
        location = entries.get("location", "")
        try:
            offset, length = (int(entries[k]) if entries.get(k) else None for k in ("offset", "length"))
            full = os.path.realpath(os.path.join(base, location))
        except ValueError:  # a non-integer offset/length, or a NUL byte in the location
            raise OnnxImportError(f"'{path}': initializer '{t.name}' has malformed external data fields "
                                  f"{entries!r}; the file is corrupt.") from None
        if not location or os.path.commonpath([base, full]) != base:
            raise OnnxImportError(
                f"'{path}': initializer '{t.name}' points to external data '{location}' outside "
                f"the model's folder; refusing to read it. Move the data next to the model.")
        if not os.path.isfile(full):
            raise OnnxImportError(
                f"'{path}': external data file '{location}' of initializer '{t.name}' is missing; "
                f"copy it next to the model.")
        size, start = os.path.getsize(full), offset or 0
        stored = length if length is not None else size - start
        want = _tensor_bytes(t)
        if start < 0 or stored < 0 or start + stored > size or want is not None and stored != want:
            raise OnnxImportError(
                f"'{path}': initializer '{t.name}' (dims {list(t.dims)}) asks for {stored:,} bytes at offset "
                f"{start:,} of '{location}', which has {size:,} bytes"
                + (f", and needs {want:,}" if want is not None else "") + "; the model or its data is "
                "corrupt or truncated. Re-export or re-download both.")
    return base


def _tensor_bytes(t: onnx.TensorProto) -> int | None:
    """Bytes of an initializer's data by its dims and type (None for strings and unknown types)."""
    dtype = _np_dtype(t.data_type) if t.data_type != onnx.TensorProto.STRING else None
    if dtype is None or dtype.kind == "O":
        return None
    bits = 4 if t.data_type in _FOUR_BIT else dtype.itemsize * 8
    return -(-int(np.prod(t.dims, dtype=np.int64)) * bits // 8)


_FOUR_BIT = frozenset(getattr(onnx.TensorProto, n) for n in ("INT4", "UINT4") if hasattr(onnx.TensorProto, n))


def check_initializer(t: onnx.TensorProto, source: str) -> None:
    """Dims that no tensor can have (negative, or more elements than any machine holds)."""
    if any(d < 0 for d in t.dims) or np.prod(t.dims, dtype=np.float64) > _MAX_ELEMENTS:
        raise OnnxImportError(f"'{source}': initializer '{t.name}' has impossible "
                              f"dims {list(t.dims)}; the file is corrupt.")


def check_size(proto: onnx.ModelProto, source: str) -> None:
    """The graph's size against gluontl's limits, and its weights against free memory, before
    any weight is read: a refusal names the limit (docs/onnx-import.md)."""
    g = proto.graph
    for t in g.initializer:
        check_initializer(t, source)
    nodes = len(g.node) + sum(len(f.node) for f in proto.functions)
    if nodes > MAX_NODES:
        raise OnnxImportError(f"'{source}' has {nodes:,} nodes, over gluontl's limit of {MAX_NODES:,}; "
                              f"simplify the model (onnxsim) or split it.")
    if len(g.output) > MAX_OUTPUTS:
        raise OnnxImportError(f"'{source}' has {len(g.output):,} graph outputs, over gluontl's limit of "
                              f"{MAX_OUTPUTS:,}; concatenate outputs in the model, or end the graph at "
                              f"fewer tensors.")
    need = sum(_tensor_bytes(t) or 0 for t in g.initializer)
    free = available_memory()
    if free is not None and need > free:
        raise OnnxImportError(f"'{source}': its initializers need {need:,} bytes, more than the "
                              f"{free:,} bytes of memory available; the file is corrupt, or the "
                              f"model needs a machine with more memory.")


def check_names(proto: onnx.ModelProto, source: str) -> None:
    """Names become MXNet's, and MXNet writes control characters unescaped into the graph JSON
    every graph pass reads: refuse them, and names that are not UTF-8, by name."""
    g = proto.graph
    tensors = (x for n in g.node for x in (*n.input, *n.output))
    for kind, names in (("node", (n.name for n in g.node)), ("tensor", tensors),
                        ("initializer", (t.name for t in g.initializer)),
                        ("graph input", (v.name for v in g.input)), ("graph output", (v.name for v in g.output))):
        for name in names:
            bad = "is not UTF-8" if isinstance(name, bytes) else (  # protobuf hands such strings as bytes
                "contains control characters" if _CONTROL.search(name) else None)
            if bad:
                raise OnnxImportError(f"'{source}': {kind} name {name!r} {bad}, which gluontl cannot carry "
                                      f"into MXNet's graph; rename it in the model (onnx.helper, or the exporter).")


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def available_memory() -> int | None:
    """Memory the process may still use: the kernel's MemAvailable, capped by RLIMIT_AS."""
    free = None
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            free = soft if free is None else min(free, soft)
    except (ImportError, ValueError, OSError):
        pass
    return free


def opsets_of(proto: onnx.ModelProto, source: str) -> dict[str, int]:
    """Opset per domain (default domain as ''), validated."""
    opsets = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in proto.opset_import}
    if "" not in opsets:
        raise OnnxImportError(
            f"'{source}' imports no default-domain (ai.onnx) opset, so its ops have no defined "
            f"meaning. Re-export the model with a standard opset.")
    newest = onnx.defs.onnx_opset_version()
    if not 1 <= opsets[""] <= newest:
        raise OnnxImportError(
            f"'{source}' uses ai.onnx opset {opsets['']}, outside the range 1..{newest} this "
            f"installation understands. Convert it (onnx.version_converter) to opset <= {newest}.")
    return opsets


def topological(nodes: Sequence[onnx.NodeProto], known: Iterable[str], source: str) -> list[int]:
    """Node indices in dependency order; clear errors for dangling inputs and cycles."""
    producer: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for o in n.output:
            if not o:
                continue
            if o in producer:
                raise OnnxImportError(
                    f"'{source}': tensor '{o}' is produced by two nodes ('{nodes[producer[o]].name}' "
                    f"and '{n.name}'); ONNX graphs must assign each tensor once.")
            producer[o] = i
    known = set(known)
    waiting = [0] * len(nodes)
    users: dict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(nodes):
        for x in {x for x in n.input if x} | _outer_refs(n):
            if x in producer:
                waiting[i] += 1
                users[producer[x]].append(i)
            elif x not in known:
                raise OnnxImportError(
                    f"'{source}': input '{x}' of {n.op_type} node '{n.name or i}' is not a graph "
                    f"input, an initializer or the output of any node (dangling input). The model "
                    f"is broken; re-export it.")
    ready = [i for i in range(len(nodes)) if waiting[i] == 0]  # a heap: file order when free
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in users[i]:
            waiting[j] -= 1
            if waiting[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(nodes):
        stuck = [nodes[i].name or str(i) for i in range(len(nodes)) if waiting[i]]
        raise OnnxImportError(
            f"'{source}': the graph has a cycle through nodes {stuck[:5]}; ONNX graphs must be "
            f"acyclic. Re-export the model.")
    return order


def function_body(node: onnx.NodeProto, opset: int) -> list[onnx.NodeProto] | None:
    """The node replaced by the nodes of its ONNX function definition (e.g. a
    DynamicQuantizeLinear as Reduce/Div/Round/QuantizeLinear), or None if it has none."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset)
    except Exception:
        return None
    versions = [v for v in schema.function_opset_versions if v <= opset]
    if not versions:
        return None
    fn = onnx.FunctionProto()
    fn.ParseFromString(schema.get_function_with_opset_version(max(versions)))
    prefix = f"{node.name or node.output[0]}/"
    rename = {f: a for f, a in zip(fn.input, node.input)}
    rename.update({f: a for f, a in zip(fn.output, node.output)})
    given = {a.name: a for a in node.attribute}
    defaults = {k: v.default_value for k, v in schema.attributes.items()
                if v.default_value.name}
    out = []
    for k, inner in enumerate(fn.node):
        n = onnx.NodeProto()
        n.CopyFrom(inner)
        n.name = f"{prefix}{inner.name or k}"
        n.input[:] = [rename.get(x, prefix + x) if x else "" for x in inner.input]
        n.output[:] = [rename.get(x, prefix + x) if x else "" for x in inner.output]
        del n.attribute[:]
        for a in inner.attribute:
            ref = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
            if not a.ref_attr_name:
                n.attribute.append(a)
            elif ref is not None:
                resolved = onnx.AttributeProto()
                resolved.CopyFrom(ref)
                resolved.name = a.name
                n.attribute.append(resolved)
        out.append(n)
    return out


def graph_inputs(graph: onnx.GraphProto, source: str) -> list[onnx.ValueInfoProto]:
    """The inputs fed at run time (initializers excepted); a block needs at least one."""
    inits = {t.name for t in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    if not inputs:
        raise OnnxImportError(
            f"'{source}' has no graph inputs (its outputs are constants), so there is nothing "
            f"to run or train; a Gluon block needs at least one input.")
    return inputs


def check_outputs(graph: onnx.GraphProto, nodes: Sequence[onnx.NodeProto], source: str) -> None:
    """Every graph output names a tensor the graph has."""
    known = {t.name for t in graph.initializer} | {i.name for i in graph.input}
    known |= {o for n in nodes for o in n.output if o}
    for o in graph.output:
        if o.name not in known:
            raise OnnxImportError(f"'{source}': graph output '{o.name}' is not a graph input, "
                                  f"an initializer or the output of any node; the model is "
                                  f"broken, re-export it.")


def expand(protos: Sequence[onnx.NodeProto], opset: int) -> list[onnx.NodeProto]:
    """Ops without a converter, rewritten into ops that have one: integer-arithmetic
    quantized ops as dequantize → float op, others by their ONNX function body."""
    out: list[onnx.NodeProto] = []
    for p in protos:
        body = None
        if p.domain in ("", "ai.onnx") and get(p.op_type, opset) is None \
                and get_evaluator(p.op_type) is None:
            body = integer_as_float(p) or function_body(p, opset)
        out.extend(expand(body, opset) if body else [p])
    return out


def unsupported_ops(protos: Sequence[onnx.NodeProto], order: Iterable[int], inits: Iterable[str],
                    opsets: Mapping[str, int]) -> dict[tuple[str, str], list[str]]:
    """(domain, op type) -> names of the nodes import has no converter for. ``protos`` as
    :func:`expand` leaves them, visited in ``order``; default-domain nodes whose inputs are
    all known from the initializers (and Shape/Size) fold at import, so they need none."""
    known = set(inits)
    missing: dict[tuple[str, str], list[str]] = defaultdict(list)
    for i in order:
        p = protos[i]
        domain = "" if p.domain == "ai.onnx" else p.domain
        ins = {x for x in p.input if x}
        if p.op_type in ("Shape", "Size") or (
                p.op_type not in fold.NONDETERMINISTIC and ins | _outer_refs(p) <= known):
            known.update(o for o in p.output if o)
            if not domain:
                continue
        if not domain and (p.op_type in ("Loop", "Scan") or p.op_type == "If" and ins <= known):
            continue  # inlined or unrolled at import, else refused there by name
        if get(p.op_type, opsets.get(domain, opsets[""]), domain) is None \
                and get_evaluator(p.op_type, domain) is None:
            missing[(domain or "ai.onnx", p.op_type)].append(p.name or f"{p.op_type}_{i}")
    return missing


def check_supported(protos: Sequence[onnx.NodeProto], order: Iterable[int], inits: Iterable[str],
                    opsets: Mapping[str, int], source: str) -> None:
    """Raise one error listing every op :func:`unsupported_ops` finds."""
    missing = unsupported_ops(protos, order, inits, opsets)
    if not missing:
        return
    parts = []
    for (domain, op), names in sorted(missing.items(), key=lambda kv: -len(kv[1])):
        where = f"custom domain '{domain}'" if domain != "ai.onnx" else "ai.onnx"
        parts.append(f"{op} ({where}, {len(names)} node{'s' * (len(names) > 1)}, e.g. "
                     + ", ".join(f"'{x}'" for x in names[:3]) + ")")
    advice = "Simplify or re-export the model with supported ops (see docs/onnx-support.md)"
    if any(op in QUANTIZED_INTEGER_OPS for _, op in missing):
        advice += ("; onnxruntime's integer-arithmetic QLinear* contrib ops are not supported: "
                   "export a float model or a QDQ-quantized one (QuantizeLinear/"
                   "DequantizeLinear), whose weights import as float parameters")
    raise OnnxImportError(
        f"'{source}' (opset {opsets['']}) uses {len(missing)} op type{'s' * (len(missing) > 1)} gluontl "
        f"cannot convert: " + "; ".join(parts) + f". {advice}.")


# --------------------------------------------------------------------------- import

def _np_dtype(elem_type: int) -> np.dtype | None:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        return None


def _dims(type_proto: onnx.TypeProto) -> Shape | None:
    if not type_proto.HasField("tensor_type") or not type_proto.tensor_type.HasField("shape"):
        return None
    # Paddle writes -1 for a dynamic dim: unknown, like a dim_param.
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value != -1 else None
                 for d in type_proto.tensor_type.shape.dim)


# The two sizes a free non-batch axis takes during import (one pair per dim_param): values
# that differ between them are computed at run time. Distinct from the batch's (b, b + 1).
_FREE_SIZES = ((5, 9), (13, 17), (19, 29), (31, 37))

_TENSOR_DATA = frozenset({"raw_data", "float_data", "double_data", "int32_data", "int64_data"})


def _param_types(group, input_syms) -> dict[str, np.dtype]:
    """Parameter dtypes inferred from the inputs the graph uses. SymbolBlock passes it every
    input and, when one is unused (an output that is a folded constant, e.g. Shape(x) of a
    static x), falls back to float32 for all parameters."""
    used = set(group.list_arguments())
    given = {s.name: s.infer_type()[0][0] for s in input_syms if s.name in used}
    try:
        arg_types, _, aux_types = group.infer_type(**given)
    except mx.base.MXNetError:
        return {}
    if arg_types is None:
        return {}
    names = group.list_arguments() + group.list_auxiliary_states()
    return {n: np.dtype(t) for n, t in zip(names, arg_types + aux_types)}


def _copy_fields(dst, src, skip: frozenset[str] | set[str]) -> None:
    """Copy protobuf message ``src`` into ``dst`` except the fields named in ``skip``."""
    for field, value in src.ListFields():
        if field.name in skip:
            continue
        if hasattr(value, "extend"):  # repeated
            getattr(dst, field.name).extend(value)
        elif hasattr(value, "CopyFrom"):  # message
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


class _Importer:
    """One import. Known values are tracked at two batch sizes ``b1``/``b2`` so values
    computed from the batch size are recognised and rewritten into batch-free forms
    (see :mod:`gluontl.onnx.fold`) instead of freezing the batch into the graph."""

    def __init__(self, proto: onnx.ModelProto, source: str, input_shapes: Mapping, fixed_batch: bool):
        self.proto, self.source = proto, source
        self.graph = proto.graph
        self.opsets = opsets_of(proto, source)
        self.opset = self.opsets[""]
        self.inits = self._initializers()
        self.inputs = graph_inputs(self.graph, source)
        self.input_shapes, free = self._merge_shapes(input_shapes)
        self.batched = set() if fixed_batch else free
        self.free_axes = self._free_axes()
        first = [self.input_shapes[i.name][0] for i in self.inputs
                 if i.name in self.batched and self.input_shapes[i.name][0]]
        self.b1 = first[0] if first else 1
        self.b2 = self.b1 + 1 if self.batched or self.free_axes else self.b1  # b1/b2 name the two worlds
        symbols = sorted({s for axes in self.free_axes.values() for s in axes.values()})
        self.sizes = {s: _FREE_SIZES[k % len(_FREE_SIZES)] for k, s in enumerate(symbols)}
        self.consts: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # value at b1, b2
        self.weights: set[str] = set()
        self.shaped: set[str] = set()  # folded values computed from a run-time tensor's shape
        self.alias: dict[str, str] = {}
        self.runtime: dict[str, Tensor] = {}
        self.materialized: dict[str, Tensor] = {}
        self.params: dict[str, np.ndarray] = {}
        self.constants: set[str] = set()
        self.producer: dict[str, tuple[Node, onnx.NodeProto]] = {}
        self.node_syms: dict[str, Any] = {}
        self.shape_cache: dict[tuple[str, int], tuple[int, ...] | None] = {}
        self.seen_names: Counter = Counter()
        self.branch_nodes: list[tuple[Node, onnx.NodeProto]] = []  # inlined If branches

    # ----- inputs
    def _initializers(self) -> dict[str, np.ndarray]:
        declared = {i.name: _dims(i.type) for i in self.graph.input}
        out = {}
        for t in self.graph.initializer:
            check_initializer(t, self.source)
            try:
                value = numpy_helper.to_array(t)
            except Exception as e:
                raise OnnxImportError(
                    f"'{self.source}': initializer '{t.name}' (dims {list(t.dims)}) cannot be read: "
                    f"its data does not match its dims/type ({str(e)[:150]}). The file is "
                    f"corrupt or truncated.") from None
            want = declared.get(t.name)
            if want is not None and len(want) != value.ndim or want is not None and any(
                    w is not None and w != v for w, v in zip(want, value.shape)):
                raise OnnxImportError(
                    f"'{self.source}': initializer '{t.name}' has shape {value.shape} but the graph "
                    f"input of the same name declares {want}; the file is inconsistent.")
            out[t.name] = value
        return out

    def _merge_shapes(self, given: Mapping) -> tuple[dict[str, Shape], set[str]]:
        """Declared input shapes completed by ``given``, and the inputs with a free batch.

        The batch (dim 0) is free where the file leaves it symbolic, as in onnxruntime, or
        where ``given`` says None for a declared size (exports pinned to batch 1).
        """
        names = [i.name for i in self.inputs]
        unknown = sorted(set(given) - set(names))
        if unknown:
            raise OnnxImportError(
                f"input_shapes names {unknown}, but '{self.source}' has graph inputs {names}.")
        out, free = {}, set()
        for i in self.inputs:
            declared = _dims(i.type)
            if declared is not None and any(d is not None and not 0 <= d < 2 ** 31
                                            for d in declared):
                raise OnnxImportError(f"'{self.source}': input '{i.name}' declares impossible dims "
                                      f"{declared}; the file is corrupt.")
            if declared and declared[0] is None:
                free.add(i.name)
            if i.name not in given:
                out[i.name] = declared
                continue
            want = tuple(given[i.name])
            if any(not (d is None or isinstance(d, (int, np.integer)) and 0 < d < 2 ** 31)
                   for d in want) or np.prod([d or 1 for d in want], dtype=np.float64) > _MAX_ELEMENTS:
                raise OnnxImportError(f"input_shapes['{i.name}'] = {want}: dimensions must be "
                                      f"positive integers (or None) of sensible size.")
            declared = declared if declared is not None else (None,) * len(want)
            if len(want) == len(declared) - 1:  # C,H,W as recipes write it: the batch is the file's own
                want = (declared[0], *want)
            if len(declared) != len(want):
                raise OnnxImportError(
                    f"input_shapes['{i.name}'] = {want} has rank {len(want)} but '{self.source}' "
                    f"declares rank {len(declared)} ({declared}).")
            for k, (d, w) in enumerate(zip(declared, want)):
                if d is not None and w is not None and d != w:
                    raise OnnxImportError(
                        f"input_shapes['{i.name}'] = {want} conflicts with the declared shape "
                        f"{declared} at dimension {k}" + (" (give None there to free the batch "
                                                          "dimension)" if k == 0 else "") + ".")
            if want and want[0] is None:
                free.add(i.name)
            out[i.name] = tuple(int(w) if w is not None else d for w, d in zip(want, declared))
        return out, free

    def _free_axes(self) -> dict[str, dict[int, str]]:
        """Non-batch axes of integer inputs (token ids, masks) the file leaves symbolic and
        ``input_shapes`` does not fix: they stay free, tracked like the batch at two sizes.
        Inputs sharing a dim_param share the size. Float inputs' H/W keep today's rule
        (``input_shapes`` fills them): image models compute Resize sizes and anchors from them."""
        out: dict[str, dict[int, str]] = {}
        for i in self.inputs:
            shape = self.input_shapes[i.name]
            dtype = _np_dtype(i.type.tensor_type.elem_type) if i.type.HasField("tensor_type") else None
            if shape is None or dtype is None or dtype.kind not in "iu":
                continue
            dims = i.type.tensor_type.shape.dim
            axes = {k: dims[k].dim_param or f"{i.name}:{k}" for k, d in enumerate(shape) if k > 0 and d is None}
            if axes:
                out[i.name] = axes
        return out

    def _free_pairs(self) -> list[tuple[tuple[int, int], str, int]]:
        """((size in world 1, in world 2), input, axis) for every free axis, the batch first."""
        pairs = [((self.b1, self.b2), n, 0) for n in sorted(self.batched)]
        pairs += [(self.sizes[s], n, k) for n, axes in sorted(self.free_axes.items()) for k, s in axes.items()]
        return pairs

    def _ref_axis(self, pair: tuple[int, int]):
        """(input symbol, axis) whose run-time size is the free size ``pair``, or None."""
        for p, n, k in self._free_pairs():
            if p == pair:
                return self.runtime[n].sym, k
        return None

    def _at(self, name: str, b: int) -> tuple[int, ...] | None:
        """The concrete shape of input ``name`` in world ``b`` (b1 or b2; None if a dim is unknown)."""
        shape = self.input_shapes[name]
        if shape is None:
            return None
        free = self.free_axes.get(name, {})
        world = 0 if b == self.b1 else 1
        dims = tuple((b if k == 0 and name in self.batched else self.sizes[free[k]][world] if k in free else d)
                     for k, d in enumerate(shape))
        return None if any(d is None for d in dims) else dims

    # ----- shape inference
    def _inferred(self, protos: Sequence[onnx.NodeProto]
                  ) -> dict[str, tuple[Shape | None, np.dtype | None]]:
        """ONNX shape inference on a weight-free copy (batch dimension symbolic)."""
        g = onnx.GraphProto()
        g.node.extend(protos)
        g.output.extend(self.graph.output)
        for i in self.inputs:
            shape = self.input_shapes[i.name]
            dims = None if shape is None else [
                ("batch" if k == 0 and i.name in self.batched else self.free_axes.get(i.name, {}).get(k, d))
                for k, d in enumerate(shape)]
            g.input.append(helper.make_tensor_value_info(i.name, i.type.tensor_type.elem_type, dims)
                           if i.type.HasField("tensor_type") else i)
        for t in self.graph.initializer:
            if t.data_type != onnx.TensorProto.FLOAT or int(np.prod(t.dims)) <= 64:
                g.initializer.append(t)
            else:
                g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        m = helper.make_model(g, opset_imports=self.proto.opset_import)
        m.ir_version = self.proto.ir_version
        try:
            m = onnx.shape_inference.infer_shapes(m, strict_mode=False, data_prop=True)
        except Exception:
            return {}
        out = {}
        for v in list(m.graph.value_info) + list(m.graph.output) + list(m.graph.input):
            if v.type.HasField("tensor_type"):
                out[v.name] = (_dims(v.type), _np_dtype(v.type.tensor_type.elem_type))
        return out

    # ----- values
    def _set_const(self, name: str, v1: np.ndarray, v2: np.ndarray | None = None) -> None:
        v1 = canonical(v1)  # e.g. onnxruntime's longlong results as int64
        v2 = v1 if v2 is None or (v2.shape == v1.shape and np.array_equal(v1, v2)) else canonical(v2)
        self.consts[name] = (v1, v2)

    def _is_dependent(self, name: str) -> bool:
        v1, v2 = self.consts[name]
        return v1 is not v2

    def tensor(self, name: str) -> Tensor:
        name = self.alias.get(name, name)
        if name in self.runtime:
            return self.runtime[name]
        if name in self.materialized:
            return self.materialized[name]
        v1, v2 = self.consts[name]
        if v1 is v2:
            t = Tensor(name, const=v1, shape=v1.shape, dtype=v1.dtype,
                       make_sym=lambda: self._param(name, v1))
        else:
            t = Tensor(name, const=None, shape=self.info.get(name, (None, None))[0], dtype=v1.dtype,
                       make_sym=lambda: self._runtime_sym(name),
                       why_unknown=self._why_dependent())
        self.materialized[name] = t
        return t

    def _why_dependent(self) -> str:
        if not self.free_axes:
            return ("its value changes with the batch size. Pass fixed_batch=True (with input_shapes) "
                    "to import at one fixed batch size")
        axes = ", ".join(f"'{n}' axis {k} ({s})" for n, a in sorted(self.free_axes.items()) for k, s in a.items())
        return (f"its value changes with the batch size or the free length of {axes}. Pass input_shapes "
                f"with those lengths (e.g. {{'{min(self.free_axes)}': [None, 128]}}) to import at one "
                f"fixed length, or fixed_batch=True to fix the batch too")

    def _param(self, name: str, value: np.ndarray):
        """A graph variable holding a known value; weights trainable, the rest constants."""
        if value.size == 0 or value.dtype.kind not in "biuf":
            raise OnnxImportError(f"'{self.source}': tensor '{name}' ({value.dtype}, shape "
                                  f"{value.shape}) is empty or not numeric, and MXNet cannot hold "
                                  f"it as a graph value.")
        if value.ndim == 0:
            value = value.reshape(1)
        value = value.astype(carrier_dtype(value.dtype), copy=False)
        self.params[name] = value
        if name not in self.weights:
            self.constants.add(name)
        return mx.sym.var(name, shape=value.shape, dtype=value.dtype)

    def _runtime_sym(self, name: str):
        """Symbol computing a batch-dependent folded value at run time via its converters."""
        node, proto = self.producer[name]
        if proto.name not in self.node_syms:
            self.node_syms[proto.name] = self._convert(node, proto)
        return self.node_syms[proto.name][list(node.outputs).index(name)]

    def _shape_of(self, name: str, b: int) -> tuple[int, ...] | None:
        """Concrete shape of a value at batch size ``b`` (MXNet shape inference)."""
        key = (name, b)
        if key not in self.shape_cache:
            self.shape_cache[key] = self._infer_mx(name, b)
        return self.shape_cache[key]

    def _free_shape(self, name: str) -> Shape | None:
        """Shape from MXNet inference at both batch sizes; batch-dependent dims are None."""
        s1, s2 = self._shape_of(name, self.b1), self._shape_of(name, self.b2)
        if s1 is None or s2 is None or len(s1) != len(s2):
            return None
        return tuple(a if a == b else None for a, b in zip(s1, s2))

    def _infer_mx(self, name: str, b: int) -> tuple[int, ...] | None:
        name = self.alias.get(name, name)
        if name in self.consts:
            v1, v2 = self.consts[name]
            return (v1 if b == self.b1 else v2).shape
        shape, _ = self.info.get(name, (None, None))
        if shape is not None and all(d is not None for d in shape):
            return shape
        sym = self.runtime[name].sym
        feed = {}
        for a in sym.list_arguments():
            if a in self.input_shapes:
                s = self._at(a, b)
                if s is None:
                    return None
                feed[a] = s
        try:
            _, out, _ = sym.infer_shape_partial(**feed)
        except Exception:
            return None
        if not out or not out[0] or any(d <= 0 for d in out[0]):
            return None
        return tuple(int(d) for d in out[0])

    # ----- nodes
    def _known_inputs(self, node: Node) -> list[tuple[np.ndarray, np.ndarray] | None] | None:
        """Input values at both batch sizes, or None when one is only known at run time."""
        if node.domain not in ("", "ai.onnx") or node.op_type in fold.NONDETERMINISTIC:
            return None
        out = []
        for k, x in enumerate(node.inputs):
            x = self.alias.get(x, x)
            if not x:
                out.append(None)
            elif x in self.consts:
                out.append(self.consts[x])
            elif node.op_type == "CastLike" and k == 1 and self.tensor(x).dtype is not None:
                typed = np.zeros((0,), self.tensor(x).dtype)  # only its type matters
                out.append((typed, typed))
            else:
                return None
        return out

    def _gathers_rows_by_shape(self, node: Node) -> bool:
        """A Gather of weight rows at indices computed from an input's shape (BERT's position
        embeddings at ``arange(S)``) runs at run time: folded, the rows would train as a new
        tensor of the import's sequence length, and the export would bake that length in; kept,
        the table trains under its own name and the exported graph still gathers by length."""
        names = [self.alias.get(x, x) for x in node.inputs]
        return node.op_type == "Gather" and len(names) == 2 and names[0] in self.weights \
            and names[1] in self.shaped

    def _fold(self, node: Node, proto: onnx.NodeProto, known: list) -> None:
        names = [self.alias.get(x, x) if x else "" for x in node.inputs]
        if any(x in self.shaped for x in names):
            self.shaped.update(o for o in node.outputs if o)
        if node.op_type == "Identity" or node.op_type == "Dropout" and len(
                [o for o in node.outputs if o]) == 1:
            self.alias[node.outputs[0]] = names[0]
            return
        v1s = [k[0] if k else None for k in known]
        outer = {r: self.consts[self.alias.get(r, r)][0] for r in _outer_refs(proto)}
        try:
            if any(k and k[0] is not k[1] for k in known):  # batch-dependent: evaluate twice
                session = fold.Session(proto, v1s, self.opsets, outer)
                r1 = session.run(v1s)
                r2 = session.run([k[1] if k else None for k in known])
            else:
                r1 = fold.evaluate(proto, node, v1s, self.opsets, outer)
                r2 = r1
        except OnnxImportError:
            raise
        except Exception as e:
            raise fold.fold_error(node, e) from None
        # Paddle keeps weights in Constant nodes; DequantizeLinear turns int8 weights to float.
        weighty = node.op_type == "Constant" or any(x in self.weights for x in names) or (
            node.op_type == "DequantizeLinear" and v1s[0].ndim > 0)
        for o, a, b in zip(node.outputs, r1, r2):
            if not o or a is None:
                continue
            self._set_const(o, np.asarray(a), np.asarray(b))
            self.producer[o] = (node, proto)
            if weighty and a.dtype.kind == "f" and a.ndim > 0 and not self._is_dependent(o):
                self.weights.add(o)

    def _fold_shape(self, node: Node, proto: onnx.NodeProto) -> bool:
        """Shape/Size of a runtime value whose dims are known at both batch sizes."""
        if not node.inputs or not node.inputs[0]:
            raise node.unsupported("its data input has no tensor name (an empty input); the model is broken")
        s1 = self._shape_of(node.inputs[0], self.b1)
        s2 = self._shape_of(node.inputs[0], self.b2)
        if s1 is None or s2 is None:
            return False
        if node.op_type == "Size":
            vals = [np.array(np.prod(s, dtype=np.int64), dtype=np.int64) for s in (s1, s2)]
        else:
            start, end = node.attr("start", 0), node.attr("end", None)
            vals = [np.array(s, dtype=np.int64)[start:end] for s in (s1, s2)]
        self._set_const(node.outputs[0], *vals)
        self.producer[node.outputs[0]] = (node, proto)
        self.shaped.add(node.outputs[0])
        return True

    def _inputs_for(self, node: Node) -> tuple[list[Tensor | None], list[tuple[int, tuple[int, int]]]]:
        """Input tensors with shape vectors that depend on a free axis (the batch, a sequence)
        rewritten into shape-free forms, and the output axes to broadcast afterwards, each with
        the free size (as its pair of import sizes) it takes at run time."""
        tensors = [self.tensor(x) if x else None for x in node.inputs]
        to_batch: list[tuple[int, tuple[int, int]]] = []
        for k, x in enumerate(node.inputs):
            x = self.alias.get(x, x)
            if not x or x not in self.consts or not self._is_dependent(x):
                continue
            v1, v2 = self.consts[x]
            data = node.inputs[0]
            dims = (self._shape_of(data, self.b1), self._shape_of(data, self.b2)) if data else (None, None)
            fixed = None
            if node.op_type == "Slice" and k == 2 and node.opset >= 10:
                axes_t = self.tensor(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] else None
                axes = axes_t.const if axes_t is not None else np.arange(len(v1))
                if axes is not None and dims[1] is not None:
                    fixed = fold.slice_free(v1, v2, axes, *dims)
            elif dims[1] is not None or node.op_type == "Reshape":
                fixed = fold.batch_free(node.op_type, k, v1, v2, *dims,
                                        allowzero=bool(node.attr("allowzero", 0)))
            if (node.op_type, k) == ("Tile", 1) and dims[1] is not None:  # x[:1].repeat(B, 1)
                fixed, axes = fold.tile_free(v1, v2, self.b1, self.b2, *dims) or (None, ())
                to_batch = [(a, (self.b1, self.b2)) for a in axes]
            if fixed is None and (node.op_type, k) in (("Expand", 1), ("ConstantOfShape", 0)):
                data_dims = dims if node.op_type == "Expand" and dims[1] is not None else (None, None)
                pairs = {p for p, _, _ in self._free_pairs()}
                sized = fold.batch_sized(v1, v2, pairs, *data_dims)  # cls tokens, attention masks
                if sized is not None:
                    fixed, axes = sized
                    rank = len(data_dims[0]) if data_dims[0] is not None else 0
                    to_batch = [(a + max(0, rank - len(fixed)), p) for a, p in axes]
            if fixed is not None:
                tensors[k] = Tensor(x, const=fixed, shape=fixed.shape, dtype=fixed.dtype,
                                    make_sym=lambda x=x, f=fixed: self._param(f"{x}/batch_free", f))
        return tensors, to_batch

    def _convert(self, node: Node, proto: onnx.NodeProto) -> list:
        fn = get(node.op_type, self.opsets.get(node.domain or "", self.opset), node.domain)
        if fn is None:
            raise OnnxImportError(
                f"{node.op_type} node '{node.name}' in '{self.source}' computes a value at run time "
                f"(its inputs are not all known at import) but gluontl has no converter for "
                f"{node.op_type} at opset {node.opset}. Pass input_shapes=... so it can fold, or "
                f"simplify the model (onnxsim).")
        inputs, to_batch = self._inputs_for(node)
        if not getattr(fn, "empty_inputs", False):
            self._refuse_empty_inputs(node)
        if node.op_type == "Reshape" and node.attr("allowzero", 0) and self._literal_zero_free(node.inputs[1]):
            node = dataclasses.replace(node, attrs={**node.attrs, "allowzero": 0})  # no 0 to keep literal
        if node.op_type == "Range" and node.outputs[0] in self.consts:  # folded, free-size-dependent
            values = [self.consts[self.alias.get(x, x)] for x in node.inputs]
            fn = self._range_along(node, values)
        try:
            out = fn(node, inputs)
        except OnnxImportError:
            raise
        except Exception as e:
            detail = short_reason(e, 300)
            raise OnnxImportError(
                f"{node.op_type} node '{node.name}' in '{self.source}' (opset {node.opset}) failed "
                f"to convert: {type(e).__name__}: {detail}. This is a gluontl converter "
                f"limitation; please report it with the model.") from e
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        for k, (axis, pair) in enumerate(to_batch):
            ref, ref_axis = self._ref_axis(pair)
            out[0] = mx.sym.broadcast_like(out[0], ref, lhs_axes=(axis,), rhs_axes=(ref_axis,),
                                           name=node.sub("batch" if k == 0 else f"batch{k}"))
        return out

    def _literal_zero_free(self, name: str) -> bool:
        """A folded Reshape target with no 0 at either import size: ``allowzero`` changes
        nothing, so the 0 (copy) codes of its shape-free form are safe."""
        name = self.alias.get(name, name)
        return name in self.consts and all(0 not in v for v in self.consts[name])

    def _range_along(self, node: Node, values: list):
        """The converter for a folded Range whose length follows a free axis: ``arange(S)``
        (BERT's position ids) as ``arange_like`` along that axis of the input that carries it;
        bounds affine in the batch (dynamo's indexing) as ``range_over_batch``."""
        (s1, s2), (l1, l2), (d1, d2) = ([np.asarray(v).reshape(()).item() for v in pair] for pair in values)
        if s1 == s2 and d1 == d2 and d1 != 0:
            n = tuple(max(int(np.ceil((lim - s1) / d1)), 0) for lim in (l1, l2))
            found = self._ref_axis(n) if n[0] != n[1] else None
            if found is not None:
                return functools.partial(range_along, start=s1, step=d1, ref=found[0], axis=found[1],
                                         dtype=np.asarray(values[0][0]).dtype)
        if self.free_axes:
            raise node.unsupported(
                "its bounds depend on the free sizes of the inputs in a way that is not the length of "
                "one free axis; import with input_shapes fixing the free axes (e.g. the sequence length)")
        ref = next(self.runtime[i.name].sym for i in self.inputs if i.name in self.batched)
        return functools.partial(range_over_batch, values=values, batches=(self.b1, self.b2), ref=ref)

    def _refuse_empty_inputs(self, node: Node) -> None:
        """MXNet reads a 0 in a shape as unknown, so an op on an empty run-time tensor fails
        in shape inference at the first call; refuse it here, by name. (ONNX's shapes only:
        asking MXNet for every input's shape would cost a graph inference per node.)"""
        for x in node.inputs:
            x = self.alias.get(x, x)
            shape = self.info.get(x, (None, None))[0] if x in self.runtime else None
            if shape is not None and 0 in shape:
                raise node.unsupported(f"input '{x}' has shape {tuple(shape)}: it is empty, "
                                       f"which MXNet cannot hold (its shapes read 0 as unknown)")

    def build(self, ctx: mx.Context) -> OnnxBlock:
        protos = expand(self.graph.node, self.opset)
        for name, value in self.inits.items():
            self._set_const(name, value)
            if value.dtype.kind == "f" and value.ndim > 0:  # a 1-channel bias is a weight too
                self.weights.add(name)
        for n in protos:  # quantization scales are metadata, never weights
            if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
                self.weights.difference_update(n.input[1:])
        order = topological(protos, list(self.inits) + [i.name for i in self.inputs], self.source)
        check_outputs(self.graph, protos, self.source)
        check_supported(protos, order, self.inits, self.opsets, self.source)
        nodes = self._nodes(protos, order)
        self.info = self._inferred(protos)
        for i in self.inputs:
            shape = self.input_shapes[i.name]
            dtype = _np_dtype(i.type.tensor_type.elem_type) if i.type.HasField("tensor_type") else None
            free = None if shape is None else tuple(
                None if k == 0 and i.name in self.batched else d for k, d in enumerate(shape))
            if dtype is not None and dtype.kind not in "biuf":
                raise OnnxImportError(
                    f"'{self.source}': input '{i.name}' holds {dtype} values (e.g. strings); "
                    f"MXNet blocks take numeric tensors only. Preprocess outside the model.")
            carrier = carrier_dtype(dtype if dtype is not None else np.float32)
            self.runtime[i.name] = Tensor(
                i.name, mx.sym.var(i.name, dtype=carrier), shape=free, dtype=dtype,
                why_unknown="it is a graph input, fed at run time, while MXNet fixes shapes when the "
                            "graph is built. Store the value in the model as an initializer")
        for node, proto in nodes:
            self._process(node, proto)
        return self._block(nodes + self.branch_nodes, ctx)

    def _process(self, node: Node, proto: onnx.NodeProto) -> None:
        """Fold, inline or convert one node."""
        if node.op_type == "If" and node.domain in ("", "ai.onnx") and self._inline_if(node):
            return
        reads = self._runtime_reads(proto)
        known = self._known_inputs(node) if not reads else None
        if known is None and node.op_type in ("Loop", "Scan") and node.domain in ("", "ai.onnx"):
            if node.op_type == "Scan":
                return self._unroll_scan(node, proto, reads)
            return self._unroll_loop(node, proto, reads)
        if known is not None and self._gathers_rows_by_shape(node):
            known = None
        if known is not None:
            try:
                self._fold(node, proto, known)
                return
            except OnnxImportError:  # e.g. no onnxruntime kernel for these dtypes
                if get(node.op_type, node.opset, node.domain) is None:
                    raise
        if node.op_type in ("Shape", "Size") and node.domain in ("", "ai.onnx") \
                and self._fold_shape(node, proto):
            return
        syms = self._convert(node, proto)
        self.node_syms[proto.name] = syms
        for o, s in zip(node.outputs, syms):
            if o and s is not None:
                shape, dtype = self.info.get(o, (None, None))
                lazy = shape is None or None in shape  # MXNet may know more than ONNX
                self.runtime[o] = Tensor(
                    o, s, shape=None if lazy else shape, dtype=dtype,
                    make_shape=lambda o=o, s=shape: self._free_shape(o) or s)

    def _inline_if(self, node: Node) -> bool:
        """An If whose condition folds to a constant (exports of shape checks) becomes the
        nodes of the branch it takes; False when the condition is only known at run time."""
        cond = self.alias.get(node.inputs[0], node.inputs[0])
        if cond not in self.consts:
            return False
        if self._is_dependent(cond):
            raise node.unsupported("its condition depends on the batch size; import with "
                                   "fixed_batch=True and input_shapes")
        branch = node.attr("then_branch" if bool(self.consts[cond][0].reshape(-1)[0])
                           else "else_branch")
        for t in branch.initializer:
            self._set_const(t.name, numpy_helper.to_array(t))
        known = set(self.consts) | set(self.runtime) | set(self.alias)
        nodes = self._nodes(branch.node, topological(branch.node, known, self.source))
        self.branch_nodes += nodes
        for n, p in nodes:
            self._process(n, p)
        for out, res in zip(node.outputs, branch.output):
            self.alias[out] = self.alias.get(res.name, res.name)
        return True

    def _runtime_reads(self, proto: onnx.NodeProto) -> list[str]:
        """What a node's subgraphs read from the enclosing graph that is not a batch-free
        constant: such a node is never folded."""
        names = [r for r in _outer_refs(proto) if self.alias.get(r, r) not in self.consts
                 or self._is_dependent(self.alias.get(r, r))]
        return sorted(names)

    def _inline_nodes(self, protos: list[onnx.NodeProto], consts: dict[str, np.ndarray]) -> None:
        for name, value in consts.items():
            self._set_const(name, value)
        known = set(self.consts) | set(self.runtime) | set(self.alias)
        nodes = self._nodes(protos, topological(protos, known, self.source))
        self.branch_nodes += nodes
        for n, p in nodes:
            self._process(n, p)

    def _unrolled_outputs(self, node: Node, state: list[str], scans: list[list[str]]) -> None:
        """An unrolled Loop/Scan's outputs: the last carried values, and each scan output's
        per-iteration values stacked on a new axis 0."""
        for out, s in zip(node.outputs, state):
            if out:
                self.alias[out] = self.alias.get(s, s)
        for j, out in enumerate(node.outputs[len(state):]):
            if out:
                self._inline_nodes(*control.stack_nodes(node.name, [sc[j] for sc in scans], out,
                                                        self.opset))

    def _unroll_loop(self, node: Node, proto: onnx.NodeProto, reads: list[str]) -> None:
        """A Loop that is not constant, as one copy of its body per iteration: its trip
        count must fold, and so must the condition each iteration computes. Without a trip
        count (tf2onnx's ``tf.while_loop``: ``M`` empty, ``t < T`` recomputed by the body) the
        folded conditions alone fix the number of iterations, at most MAX_UNROLL."""
        def refuse(why: str) -> OnnxImportError:
            return OnnxImportError(control.refusal("Loop", node.name, self.source, reads, why))

        trip, cond = [self.alias.get(x, x) for x in (list(node.inputs) + ["", ""])[:2]]
        if not trip and not cond:
            raise refuse("it has neither a trip count nor a condition, so it never ends")
        if trip and (trip not in self.consts or self._is_dependent(trip)):
            raise refuse(f"its trip count ('{trip}') is not known at import, and only loops "
                         f"with a known trip count are unrolled")
        steps = int(self.consts[trip][0].reshape(-1)[0]) if trip else None
        if cond and (cond not in self.consts or self._is_dependent(cond)):
            raise refuse(f"its initial condition ('{cond}') is known only at run time")
        if cond and not bool(self.consts[cond][0].reshape(-1)[0]):
            steps = 0
        if steps is not None and not 0 < steps <= control.MAX_UNROLL:
            raise refuse(f"it runs {steps} iterations; unrolling takes 1 to {control.MAX_UNROLL}")
        state = [self.alias.get(x, x) for x in node.inputs[2:]]
        scans: list[list[str]] = []
        for k in range(steps if steps is not None else control.MAX_UNROLL + 1):
            if k == control.MAX_UNROLL:
                raise refuse(f"it has no trip count and its condition still holds after "
                             f"{control.MAX_UNROLL} iterations; unrolling takes at most "
                             f"{control.MAX_UNROLL}")
            protos, consts, cond_out, state, scan = control.loop_iteration(proto, node.name, k, state)
            self._inline_nodes(protos, consts)
            scans.append(scan)
            c = self.alias.get(cond_out, cond_out)
            if c not in self.consts or self._is_dependent(c):
                raise refuse(f"the condition its body computes ('{node.attr('body').output[0].name}') "
                             f"is known only at run time, so the number of iterations is not "
                             f"fixed at import")
            if not bool(self.consts[c][0].reshape(-1)[0]):
                break
        self._unrolled_outputs(node, state, scans)

    def _unroll_scan(self, node: Node, proto: onnx.NodeProto, reads: list[str]) -> None:
        """A Scan that is not constant, as one copy of its body per step of its sequences
        (scan axes 0, forward: what exporters write); other layouts are refused by name."""
        def refuse(why: str) -> OnnxImportError:
            return OnnxImportError(control.refusal("Scan", node.name, self.source, reads, why))

        if node.opset < 9:
            raise refuse("opset 8's Scan (with sequence_lens and a batch axis) is not supported")
        n_scan = int(node.attr("num_scan_inputs"))
        if any(node.attr(a) and any(int(v) != 0 for v in node.attr(a)) for a in (
                "scan_input_axes", "scan_input_directions", "scan_output_axes",
                "scan_output_directions")):
            raise refuse("only scan axes 0 and forward directions are unrolled")
        state = [self.alias.get(x, x) for x in node.inputs[:len(node.inputs) - n_scan]]
        seqs = [self.alias.get(x, x) for x in node.inputs[len(node.inputs) - n_scan:]]
        lengths = {(s[0] if s else None) for q in seqs
                   for s in (self._shape_of(q, self.b1), self._shape_of(q, self.b2))}
        steps = next(iter(lengths)) if len(lengths) == 1 else None
        if steps is None or not 0 < steps <= control.MAX_UNROLL:
            raise refuse(f"its sequence length must be known at import, the same at every batch "
                         f"size, and 1 to {control.MAX_UNROLL} (found {sorted(map(str, lengths))})")
        scans: list[list[str]] = []
        for k in range(steps):
            protos, consts, state, scan = control.scan_iteration(proto, node.name, k, state, seqs)
            self._inline_nodes(protos, consts)
            scans.append(scan)
        self._unrolled_outputs(node, state, scans)

    def _nodes(self, protos: Sequence[onnx.NodeProto], order: list[int]
               ) -> list[tuple[Node, onnx.NodeProto]]:
        """Parsed nodes with unique names (empty or repeated names get a suffix)."""
        out = []
        for i in order:
            proto = protos[i]
            opset = self.opsets.get("" if proto.domain == "ai.onnx" else proto.domain, self.opset)
            node = node_from_proto(proto, opset, i)
            base = node.name
            self.seen_names[base] += 1
            if self.seen_names[base] > 1:
                node.name = f"{base}_{self.seen_names[base] - 1}"
            if node.name != proto.name:
                proto = onnx.NodeProto()
                proto.CopyFrom(protos[i])
                proto.name = node.name
            out.append((node, proto))
        return out

    def _block(self, nodes, ctx: mx.Context) -> OnnxBlock:
        outs, seen = [], set()
        for o in self.graph.output:
            name = self.alias.get(o.name, o.name)
            if name not in self.runtime and name not in self.consts:  # check_outputs passed
                raise OnnxImportError(f"'{self.source}': graph output '{o.name}' is an optional "
                                      f"output its node does not compute in gluontl; end the "
                                      f"graph at another tensor.")
            sym = self.tensor(name).sym
            if sym.get_children() is None or sym.name in seen:
                sym = mx.sym.identity(sym, name=f"{o.name}/output")
            seen.add(sym.name)
            outs.append(sym)
        group = plain_conv_gradients(mx.sym.Group(outs) if len(outs) > 1 else outs[0])
        input_syms = [self.runtime[i.name].sym for i in self.inputs]
        unused = set(s.name for s in input_syms) - set(group.list_arguments())
        try:
            # with an input the outputs do not read (they are constants, e.g. Shape(x) of a
            # static x) SymbolBlock's type inference fails and MXNet prints the failure;
            # _param_types below works the dtypes out
            with contextlib.redirect_stdout(io.StringIO()) if unused else contextlib.nullcontext():
                block = OnnxBlock(group, input_syms)
        except mx.base.MXNetError as e:
            raise OnnxImportError(
                f"'{self.source}': the converted graph is inconsistent "
                f"({short_reason(e, 300)}); check the model with "
                f"onnx.checker.check_model and onnxruntime.") from None
        params = block.collect_params()
        types = _param_types(group, input_syms)
        for n, p in params.items():
            want = np.dtype(types.get(n, p.dtype))
            if want != np.dtype(p.dtype):
                p.cast(want)
            if want != self.params[n].dtype:
                users = [node.name for node, _ in nodes if n in node.inputs]
                raise OnnxImportError(
                    f"'{self.source}': tensor '{n}' is {self.params[n].dtype} but node(s) "
                    f"{users[:3]} use it where {want} is needed; the model's types are "
                    f"inconsistent (check it with onnx.checker.check_model).")
        for n, p in params.items():  # load_dict leaves Parameter.shape None otherwise
            p.shape = self.params[n].shape
        params.load_dict({n: mx.nd.array(v, dtype=v.dtype) for n, v in self.params.items()
                          if n in params}, ctx=ctx)
        for n, p in params.items():
            if self._is_constant(n):
                p.grad_req = "null"
        set_onnx_info(block, ImportInfo(
            source=self.source, opset=self.opset, inputs=tuple(i.name for i in self.inputs),
            input_shapes=dict(self.input_shapes), batch_free=frozenset(self.batched),
            free_axes={n: {k: (s, self.sizes[s][0]) for k, s in axes.items()} for n, axes in self.free_axes.items()},
            outputs=tuple(o.name for o in self.graph.output),
            constants=frozenset(n for n in params if self._is_constant(n)),
            node_outputs=self._node_outputs(nodes, group), tensor_outputs=self._tensor_outputs(group),
            passthrough=self._passthrough(nodes), model=self._skeleton(set(params.keys())),
            param_names=module_names((p for _, p in nodes), (n for n in params if not self._is_constant(n)))))
        return block

    def _skeleton(self, held: set[str]) -> onnx.ModelProto:
        """A copy of the graph whose initializers that became parameters carry no data: the
        block holds their (trained) values and export writes them back."""
        model = onnx.ModelProto()  # field by field: CopyFrom of the weights costs ~1 s per 100 MB
        _copy_fields(model, self.proto, skip={"graph"})
        _copy_fields(model.graph, self.proto.graph, skip={"initializer"})
        for t in self.proto.graph.initializer:
            if t.name in held:
                _copy_fields(model.graph.initializer.add(), t, skip=_TENSOR_DATA)
            else:
                model.graph.initializer.append(t)
        return model

    def _is_constant(self, name: str) -> bool:
        return name in self.constants or self.params[name].dtype.kind != "f"

    def _tensor_outputs(self, group) -> dict[str, str]:
        """ONNX tensor -> MXNet output, producers' own tensors before their aliases."""
        present = set(group.get_internals().list_outputs())
        out: dict[str, str] = {}
        tensors = {**self.materialized, **self.runtime}
        for name, t in tensors.items():
            if t.built_sym is not None:
                o = t.built_sym.list_outputs()[0]
                if o in present:
                    out[name] = o
        out.update({a: out[t] for a, t in self.alias.items() if t in out})
        return out

    def _passthrough(self, nodes) -> dict[str, tuple[str, str]]:
        return {node.name: (node.outputs[0], node.inputs[0]) for node, _ in nodes
                if node.outputs and node.outputs[0] in self.alias and node.inputs
                and self.alias[node.outputs[0]] == self.alias.get(node.inputs[0], node.inputs[0])}

    def _node_outputs(self, nodes, group) -> dict[str, str]:
        out = self._tensor_outputs(group)
        for node, _ in nodes:
            first = next((o for o in node.outputs if o), None)
            first = self.alias.get(first, first)
            if first in out:
                out[node.name] = out[first]
        return out
