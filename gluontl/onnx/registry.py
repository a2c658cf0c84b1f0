"""Registry of ONNX op converters, versioned by opset.

One small function per ONNX op (or op family) turns a node into MXNet symbols. A
converter is registered for the opset range whose semantics it implements, so an
op whose meaning changed between opsets (Clip, Split, Squeeze, Softmax, ...) gets one
function per meaning, and the importer picks the one for the model's opset.

Contract of a converter::

    @converter("Relu", since=6)
    def relu(node: Node, inputs: list[Tensor | None]) -> Symbol | list[Symbol]:
        return mx.sym.relu(inputs[0].sym, name=node.name)

- ``inputs[i]`` is ``None`` for an omitted optional input (empty name in ONNX).
- ``Tensor.sym`` is the MXNet symbol of the value; ``Tensor.const`` its numpy value
  when it is known at import time (initializers, Constant nodes, folded shape
  subgraphs), else ``None``. Use ``Tensor.need_const(node, what)`` for inputs that
  must be static (Reshape's shape, Slice's starts, ...).
  Asking for ``.sym`` of a known value makes it a graph variable (a parameter, or a
  non-trainable constant); read ``.const`` when the value is all you need.
- ``Tensor.shape`` is the static ONNX shape when known (dimension ``None`` where
  unknown, e.g. the free batch dimension); ``Tensor.dtype`` the ONNX dtype.
- Carriers: MXNet has no 0-d arrays, so a rank-0 value's symbol has shape ``(1,)``
  while ``Tensor.shape`` stays ``()``; bools travel as float32 0/1 and 16-bit or
  unsigned wide integers widened (``carrier_dtype``).
- Return one symbol, or a list with one entry per ONNX output (``None`` for outputs
  the graph does not use is allowed).
- Name every MXNet op after ``node.name`` (suffix helpers with ``node.sub("x")``) so
  users can find and cut at nodes by their ONNX names.
- Raise ``OnnxImportError`` (via ``node.unsupported(reason)``) for an attribute
  combination that cannot be converted; never a bare assertion.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ..errors import OnnxImportError

ConverterFn = Callable[..., Any]


class Tensor:
    """One ONNX value during conversion.

    ``sym`` may be supplied lazily (``make_sym``): a value known at import time only
    becomes a graph variable (a parameter) when a converter actually asks for its
    symbol, so shape vectors read through ``const`` never turn into parameters.
    ``shape`` may be lazy too (``make_shape``) when ONNX shape inference left it unknown.
    """

    def __init__(self, name: str, sym: Any = None, const: np.ndarray | None = None,
                 shape: tuple[int | None, ...] | None = None, dtype: np.dtype | None = None,
                 *, make_sym: Callable[[], Any] | None = None,
                 make_shape: Callable[[], Any] | None = None, why_unknown: str = "") -> None:
        self.name = name
        self._sym = sym
        self._make_sym = make_sym
        self._shape = shape
        self._make_shape = make_shape
        self.const = canonical(const) if const is not None else None
        self.dtype = canonical_dtype(dtype) if dtype is not None else None
        self.why_unknown = why_unknown

    @property
    def sym(self) -> Any:  # mxnet.symbol.Symbol
        if self._sym is None and self._make_sym is not None:
            self._sym = self._make_sym()
        return self._sym

    @sym.setter
    def sym(self, value: Any) -> None:
        self._sym = value

    @property
    def built_sym(self) -> Any:
        """The symbol if it exists already; never creates one (or a parameter)."""
        return self._sym

    @property
    def shape(self) -> tuple[int | None, ...] | None:
        """Static shape; the importer may work it out only when a converter asks."""
        if self._shape is None and self._make_shape is not None:
            self._shape, self._make_shape = self._make_shape(), None
        return self._shape

    @shape.setter
    def shape(self, value: tuple[int | None, ...] | None) -> None:
        self._shape = value

    def __repr__(self) -> str:
        known = "const" if self.const is not None else "runtime"
        return f"Tensor({self.name!r}, {known}, shape={self.shape}, dtype={self.dtype})"

    def need_const(self, node: "Node", what: str) -> np.ndarray:
        """The value, or a clear error when it is only known at run time."""
        if self.const is None:
            why = self.why_unknown or (
                "depends on the data. Pass input_shapes=... so shape subgraphs fold to "
                "constants, or simplify the model (e.g. onnxsim) before importing")
            raise OnnxImportError(
                f"{node.op_type} node '{node.name}': input '{self.name}' ({what}) must be known at "
                f"import time but {why}."
            )
        return self.const

    @property
    def rank(self) -> int | None:
        if self.shape is not None:
            return len(self.shape)
        if self.const is not None:
            return self.const.ndim
        return None


@dataclasses.dataclass
class Node:
    """An ONNX node with parsed attributes and the opset it is converted under."""

    op_type: str
    name: str
    attrs: dict[str, Any]
    opset: int
    inputs: list[str]
    outputs: list[str]
    domain: str = ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def sub(self, suffix: str) -> str:
        """Name for a helper op that belongs to this node."""
        return f"{self.name}/{suffix}"

    def unsupported(self, reason: str) -> OnnxImportError:
        return OnnxImportError(
            f"{self.op_type} node '{self.name}' (opset {self.opset}) cannot be converted: {reason}."
        )


@dataclasses.dataclass(frozen=True)
class Registration:
    op_type: str
    domain: str
    since: int
    until: int | None  # inclusive upper opset bound, None = open
    fn: ConverterFn


_REGISTRY: dict[tuple[str, str], list[Registration]] = {}


def converter(op_types: str | Iterable[str], since: int = 1, until: int | None = None,
              domain: str = "") -> Callable[[ConverterFn], ConverterFn]:
    """Register ``fn`` for ``op_types`` at opsets ``since..until`` (inclusive)."""
    names = [op_types] if isinstance(op_types, str) else list(op_types)

    def register(fn: ConverterFn) -> ConverterFn:
        for op in names:
            regs = _REGISTRY.setdefault((domain, op), [])
            for r in regs:
                lo, hi = r.since, r.until if r.until is not None else 10**9
                if not (until is not None and until < lo) and not (since > hi):
                    raise RuntimeError(f"converter for {op} opsets {since}..{until} overlaps {r}")
            regs.append(Registration(op, domain, since, until, fn))
        return fn

    return register


def lookup(op_type: str, opset: int, domain: str = "") -> ConverterFn | None:
    """Converter for ``op_type`` at ``opset``, or None when none is registered."""
    domain = "" if domain == "ai.onnx" else domain
    for r in _REGISTRY.get((domain, op_type), []):
        if r.since <= opset and (r.until is None or opset <= r.until):
            return r.fn
    return None


def registrations() -> list[Registration]:
    """All registrations, sorted by op, for support tables."""
    _load_ops()
    return sorted((r for regs in _REGISTRY.values() for r in regs),
                  key=lambda r: (r.domain, r.op_type, r.since))


EvaluatorFn = Callable[["Node", list], list]
_EVALUATORS: dict[tuple[str, str], EvaluatorFn] = {}


def evaluator(op_types: str | Iterable[str], domain: str = "") -> Callable[[EvaluatorFn], EvaluatorFn]:
    """Register a numpy evaluator used when folding ``op_types`` on known inputs.

    Ops without an evaluator are folded by running onnxruntime on the single node;
    an evaluator exists for ops that must never reach a session (Constant) or are
    pure aliases (Identity).
    """
    names = [op_types] if isinstance(op_types, str) else list(op_types)

    def register(fn: EvaluatorFn) -> EvaluatorFn:
        for op in names:
            _EVALUATORS[(domain, op)] = fn
        return fn

    return register


def get_evaluator(op_type: str, domain: str = "") -> EvaluatorFn | None:
    _load_ops()
    return _EVALUATORS.get(("" if domain == "ai.onnx" else domain, op_type))


def _load_ops() -> None:
    from . import ops  # noqa: F401  (importing registers every converter)


def get(op_type: str, opset: int, domain: str = "") -> ConverterFn | None:
    _load_ops()
    return lookup(op_type, opset, domain)


_CARRIERS = {np.dtype(np.bool_): np.dtype(np.float32), np.dtype(np.int16): np.dtype(np.int32),
             np.dtype(np.uint16): np.dtype(np.int32), np.dtype(np.uint32): np.dtype(np.int64),
             np.dtype(np.uint64): np.dtype(np.int64)}


def canonical_dtype(dtype: Any) -> np.dtype:
    """The one numpy dtype for a dtype's value (kind and size), whatever object names it.

    numpy has several type objects per width (``longlong`` and ``int64``, ``intc`` and
    ``int32``); they compare equal as dtypes but not as classes, and tables keyed by class
    (MXNet's among them) miss the alias. onnxruntime returns int64 results as ``longlong``."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biufc" and dtype.isnative:
        return np.dtype(f"{dtype.kind}{dtype.itemsize}")
    return dtype


def canonical(value: Any) -> np.ndarray:
    """``value`` as an array of its :func:`canonical_dtype` (a view when only the name differs)."""
    value = np.asarray(value)
    want = canonical_dtype(value.dtype)
    if value.dtype.type is want.type:
        return value
    return value.view(want) if value.dtype == want else value.astype(want)


def carrier_dtype(dtype: Any) -> np.dtype:
    """The MXNet dtype that holds values of an ONNX/numpy dtype: MXNet has no usable bool
    (float32 0/1, as in ops/elementwise.py) and no 16-bit or unsigned wide integers."""
    dtype = canonical_dtype(dtype)
    return _CARRIERS.get(dtype, dtype)


def ints(values: Sequence[Any]) -> list[int]:
    return [int(v) for v in values]


def parse_attrs(proto: Any) -> dict[str, Any]:
    """ONNX AttributeProtos as plain Python values (bytes decoded, tensors as numpy)."""
    from onnx import helper, numpy_helper

    out: dict[str, Any] = {}
    for a in proto.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode("utf-8", "replace")
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [s.decode("utf-8", "replace") for s in v]
        elif hasattr(v, "dims") and hasattr(v, "data_type"):
            v = numpy_helper.to_array(v)
        out[a.name] = v
    return out


def node_from_proto(proto: Any, opset: int, index: int = 0) -> Node:
    name = proto.name or f"{proto.op_type}_{index}"
    return Node(op_type=proto.op_type, name=name, attrs=parse_attrs(proto), opset=opset,
                inputs=list(proto.input), outputs=list(proto.output), domain=proto.domain)
