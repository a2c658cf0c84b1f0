"""Describe an ONNX file without importing it (works for models import would refuse), and list
what import would refuse in it: the importer's own checks of the graph, run here on the file
alone, plus the onnx checker's finding."""
from __future__ import annotations

import dataclasses
import os
from collections import Counter

import numpy as np
import onnx

from ..errors import OnnxImportError
from .importer import (check_external, check_names, check_outputs, check_size, check_supported, expand,
                       graph_inputs, inline_functions, opsets_of, read_proto, topological, unsupported_ops)

Shape = tuple[int | str | None, ...] | None


@dataclasses.dataclass(frozen=True)
class OpUse:
    domain: str
    op_type: str
    count: int
    supported: bool


@dataclasses.dataclass(frozen=True)
class OnnxReport:
    path: str
    ir_version: int
    producer: str
    opsets: dict[str, int]
    inputs: list[tuple[str, Shape, str]]  # name, shape (str for symbolic dims), dtype
    outputs: list[tuple[str, Shape, str]]
    ops: list[OpUse]
    parameter_count: int  # elements of float weights (initializers and Constant nodes)
    cut_points: list[tuple[str, str, str]]  # node name, op type, first output tensor: near the classifier
    problems: list[str] = dataclasses.field(default_factory=list)  # why import refuses the file
    checker: str | None = None  # onnx.checker's first finding (import may still work)

    @property
    def unsupported(self) -> list[OpUse]:
        return [o for o in self.ops if not o.supported]


def _value(v: onnx.ValueInfoProto) -> tuple[str, Shape, str]:
    t = v.type.tensor_type if v.type.HasField("tensor_type") else None
    if t is None:
        return v.name, None, "non-tensor"
    shape = None if not t.HasField("shape") else tuple(
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    return v.name, shape, onnx.TensorProto.DataType.Name(t.elem_type).lower()


def _float_size(t: onnx.TensorProto) -> int:
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
              onnx.TensorProto.BFLOAT16)
    return int(np.prod(t.dims, dtype=np.int64)) if t.data_type in floats else 0


def _problems(proto: onnx.ModelProto, path: str) -> tuple[list[str], dict[tuple[str, str], list[str]]]:
    """The importer's refusals that the file alone decides, through the importer's own checks
    (each stops at its first finding), and the op types import has no converter for (in file
    order when the graph has no node order; by the default opset's rules when its opset is bad)."""
    g = proto.graph
    found = []

    def attempt(check):
        try:
            return check()
        except OnnxImportError as e:
            found.append(str(e))
            return None

    opsets = attempt(lambda: opsets_of(proto, path))
    attempt(lambda: check_size(proto, path))
    attempt(lambda: check_names(proto, path))
    attempt(lambda: check_external(proto, path))
    attempt(lambda: graph_inputs(g, path))
    valid = opsets or {"": onnx.defs.onnx_opset_version()}
    protos = expand(g.node, valid[""])
    inits = [t.name for t in g.initializer]
    order = attempt(lambda: topological(protos, inits + [i.name for i in g.input], path))
    attempt(lambda: check_outputs(g, protos, path))
    if opsets and order is not None:
        attempt(lambda: check_supported(protos, order, inits, opsets, path))
    return found, unsupported_ops(protos, order or range(len(protos)), inits, valid)


def _checker(path: str) -> str | None:
    try:
        onnx.checker.check_model(path)
    except Exception as e:  # ValidationError, or a C++ error for files it cannot read
        return " ".join(str(e).split())[:300] or type(e).__name__
    return None


_PLUMBING = ("Constant", "Shape", "Gather", "Unsqueeze", "Concat", "Identity")  # never a useful cut
_POOLS = ("GlobalAveragePool", "GlobalMaxPool", "ReduceMean")  # PyTorch exports pool with ReduceMean


def cut_points(nodes, last: int = 8) -> list[tuple[str, str, str]]:
    """Where a new head goes, in file order: the last global pool, the last Flatten, and the last
    ``last`` nodes (the classifier's neighbourhood); a cut in the stem is rarely what anyone wants."""
    named = [n for n in nodes if n.name and n.op_type not in _PLUMBING]
    picks = {id(n) for n in named[-last:]}
    for ops in (_POOLS, ("Flatten",)):
        found = [n for n in named if n.op_type in ops]
        if found:
            picks.add(id(found[-1]))
    return [(n.name, n.op_type, n.output[0] if n.output else "") for n in named if id(n) in picks]


def inspect_onnx(path: str | os.PathLike, *, check: bool = True) -> OnnxReport:
    """The report; ``check=False`` skips ``problems`` and ``checker`` (callers after the inputs only)."""
    proto = inline_functions(read_proto(os.fspath(path)), os.fspath(path))  # as import sees it
    g = proto.graph
    opsets = {(o.domain or "ai.onnx"): int(o.version) for o in proto.opset_import}
    inits = {t.name for t in g.initializer}
    hist = Counter((n.domain or "ai.onnx", n.op_type) for n in g.node)
    problems, missing = _problems(proto, os.fspath(path))
    ops = [OpUse(domain, op, count, (domain, op) not in missing) for (domain, op), count in hist.most_common()]
    params = sum(_float_size(t) for t in g.initializer)
    for n in g.node:
        if n.op_type == "Constant":
            params += sum(_float_size(a.t) for a in n.attribute if a.name == "value")
    return OnnxReport(
        path=os.fspath(path), ir_version=proto.ir_version,
        producer=f"{proto.producer_name} {proto.producer_version}".strip(), opsets=opsets,
        inputs=[_value(i) for i in g.input if i.name not in inits],
        outputs=[_value(o) for o in g.output], ops=ops, parameter_count=params,
        cut_points=cut_points(g.node),
        problems=problems if check else [],
        checker=_checker(os.fspath(path)) if check else None)


def format_report(report: OnnxReport) -> str:
    """Human-readable summary for the CLI."""
    fmt = lambda vals: "\n".join(f"  {n}  {list(s) if s is not None else '?'}  {t}" for n, s, t in vals)
    lines = [f"problems ({len(report.problems)}, import refuses the model):"] if report.problems else []
    lines += [f"  {p}" for p in report.problems]
    if report.checker:
        lines.append(f"onnx.checker: {report.checker}")
    lines += [f"ONNX model {report.path}",
             f"producer: {report.producer or '?'}   ir_version: {report.ir_version}   opsets: "
             + ", ".join(f"{d} {v}" for d, v in report.opsets.items()),
             f"parameters: {report.parameter_count:,}",
             "inputs:", fmt(report.inputs), "outputs:", fmt(report.outputs),
             f"ops ({len(report.ops)} types, {len(report.unsupported)} unsupported):"]
    for o in report.ops:
        dom = "" if o.domain == "ai.onnx" else f" [{o.domain}]"
        lines.append(f"  {o.op_type}{dom} x{o.count}{'' if o.supported else '  UNSUPPORTED'}")
    lines.append("cut points near the classifier (surgery.cut_at; `inspect --nodes` lists every node):")
    lines += [f"  {n}  ({op} -> {out})" for n, op, out in report.cut_points]
    return "\n".join(lines)
