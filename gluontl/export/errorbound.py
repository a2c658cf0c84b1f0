"""How far two correct float32 evaluations of an ONNX graph may differ: the export check's bound.

Export verification runs the file in onnxruntime and the block in MXNet: the same arithmetic in
another order. IEEE float32 ``+ - * /`` and ``sqrt`` are correctly rounded, so on equal inputs
both engines give equal bits; they part where an engine is free to choose, and each node gets a
cost in units of 16·u (u = eps32/2, the unit roundoff) of its output's size:

- **contractions** (Conv, ConvTranspose, MatMul, Gemm, recurrent cells: one per time step) and
  **reductions** (ReduceSum/Mean/…, pooling windows, Softmax, Layer/Instance/Group norms) sum
  ``n`` terms in an order each kernel picks (oneDNN by CPU: AVX2 and AVX-512 block differently).
  A float32 sum of ``n`` products is off by at most n·u·Σ|aᵢbᵢ| and, roundings being
  independent, by about sqrt(n)·u·Σ|aᵢbᵢ| (Higham, *Accuracy and Stability of Numerical
  Algorithms*, §3.1): cost sqrt(n) (+1 where an exp, log or rsqrt follows the sum);
- **transcendental ops** (Exp, Log, Tanh, Sigmoid, Erf, Pow, …) are not correctly rounded: each
  library's approximation is within a few ulps: cost 1; so are ops engines re-associate
  (BatchNormalization folded into a Conv or split, HardSwish); linear interpolation (Resize,
  GridSample) costs max(2, size / 4) per resized axis, its weights being off by ulps of the
  float32 source coordinate (``_interpolation_cost``);
- **elementwise arithmetic** (Add, Mul, Div, PRelu, …) rounds a difference already there to
  the output's grid: one ulp, cost 1/8. Data movement (Reshape, Transpose, Relu, MaxPool,
  Concat, …) is exact: cost 0.

A relative error made at one node reaches the output at about its size through a normalised
network (the assumption of the training tests' ``tests/helpers.py:f32_tol``, whose
8·eps32·depth·sqrt(terms) this is, node by node), so costs add along a path; parallel branches
do not add (the worse one counts: a residual sum's error is not twice its branch's). The bound is

    |onnxruntime - MXNet| <= 8·eps32 · max(D, 1) · scale,    D = max over paths Σ cost(node)

``scale`` being the output's largest magnitude (or the codomain width of a saturating last op,
``verify.saturating_scales``). 8·eps32 = 16·u per unit: about ten times the typical
sqrt(2)·u·sqrt(n) two independent roundings of an n-term sum differ by, and orders of magnitude
below what a wrong op, padding or weight does (``tests/export/test_verify_bound.py`` plants both).
On the 71 PyTorch fixtures and the three PaddleOCR models MXNet's largest difference from
onnxruntime is at most 0.022 of the bound (``python scripts/f32_bound_margin.py``).

What it is not: a bound for ill-conditioned graphs (a difference of two nearly equal large
values, an Exp of logits in the hundreds), where rounding is amplified: such a graph may need
an explicit ``rtol``. An output far from zero compared with its spread (logits offset by a
large constant) is judged at its magnitude, where float32 really is that coarse.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.numpy_helper

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23, twice float32's unit roundoff u
UNIT = 8.0 * EPS32  # the bound per unit of path cost

_RECURRENT = {"LSTM": 4, "GRU": 3, "RNN": 1}  # gates per hidden unit in W's rows
_REDUCE = {"ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
           "ReduceLogSumExp", "ReduceProd"}
_WINDOW = {"AveragePool", "LpPool"}
_GLOBAL = {"GlobalAveragePool", "GlobalLpPool"}
_AXIS = {"Softmax", "LogSoftmax", "Hardmax", "CumSum", "LpNormalization"}  # along one axis
_NORMS = {"LayerNormalization", "InstanceNormalization", "GroupNormalization", "MeanVarianceNormalization"}
_TRANSCENDENTAL = {"Exp", "Log", "Tanh", "Sigmoid", "Erf", "Pow", "Softplus", "Softsign", "Gelu", "Elu",
                   "Selu", "Celu", "Mish", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh",
                   "Asinh", "Acosh", "Atanh", "Reciprocal", "BatchNormalization", "HardSwish", "HardSigmoid",
                   "DequantizeLinear", "QuantizeLinear"}
_INTERPOLATE = {"Resize", "Upsample", "GridSample", "RoiAlign"}
_ROUNDING = {"Add", "Sub", "Mul", "Div", "Sum", "Mean", "Sqrt", "PRelu", "LeakyRelu"}  # one rounding each
_EXP_INSIDE = {"Softmax", "LogSoftmax", "ReduceLogSumExp", "ReduceLogSum", "LayerNormalization",
               "InstanceNormalization", "GroupNormalization", "MeanVarianceNormalization", "LpNormalization",
               "ReduceL2"}  # a sum and a transcendental step (exp, log or rsqrt)


@dataclass(frozen=True)
class Budget:
    """One output's costliest path: ``depth`` = Σ cost (D above) and what the path holds."""

    depth: float
    contractions: int = 0
    reductions: int = 0
    transcendental: int = 0
    widest: int = 1  # the most terms one sum on the path adds

    def plus(self, cost: float, kind: str, terms: int = 1) -> "Budget":
        return Budget(self.depth + cost, self.contractions + (kind == "contraction"),
                      self.reductions + (kind == "reduction"), self.transcendental + (kind == "transcendental"),
                      max(self.widest, terms))

    def describe(self) -> str:
        return (f"D = {self.depth:.1f} along a path of {self.contractions} contraction(s) and {self.reductions} "
                f"reduction(s) of up to {self.widest} terms, {self.transcendental} transcendental op(s)")


def bound(budget: Budget, scale: float) -> float:
    """The absolute difference two correct float32 runs may show: 8·eps32·max(D, 1)·scale."""
    return UNIT * max(budget.depth, 1.0) * scale


def _dims(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Known sizes of the graph's tensors (0 where unknown); shape inference fills what it can."""
    try:
        model = onnx.shape_inference.infer_shapes(model)
    except Exception:  # an exotic graph onnxruntime runs but inference rejects: sizes from the file
        pass
    g = model.graph
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (*g.value_info, *g.input, *g.output) if v.type.HasField("tensor_type")}
    dims.update({t.name: list(t.dims) for t in g.initializer})
    return dims


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _size(values) -> int:
    return int(math.prod(v for v in values if v > 0)) if values else 1


def node_cost(node, dims: dict[str, list[int]]) -> tuple[float, str, int]:
    """(cost, kind, terms) of one node: sqrt(terms) for a sum, 1 for a transcendental op, 0 else."""
    op, shape = node.op_type, (lambda i: dims.get(node.input[i], []) if len(node.input) > i else [])
    terms, kind, extra = 0, "", 0.0
    if op in ("Conv", "ConvInteger", "QLinearConv"):
        terms, kind = _size(shape(3 if op == "QLinearConv" else 1)[1:]), "contraction"
    elif op == "ConvTranspose":
        w = shape(1)
        terms, kind = _size(w[:1] + w[2:]) // max(int(_attr(node, "group", 1)), 1), "contraction"
    elif op in ("MatMul", "MatMulInteger", "QLinearMatMul", "Gemm", "Einsum"):
        a = shape(0)
        b = shape(3 if op == "QLinearMatMul" else 1)
        if op == "Gemm" and _attr(node, "transA", 0):
            a = a[::-1]
        if op == "Gemm" and _attr(node, "transB", 0):
            b = b[::-1]
        k = (a[-1] if a else 0) or (b[-2] if len(b) >= 2 else 0) or max(a + b + [1])
        terms, kind = k, "contraction"
    elif op in _RECURRENT:
        x, w = shape(0), shape(1)
        steps = (x[0] if x else 0) or 1
        inner = (w[-1] if w else 1) + ((w[1] // _RECURRENT[op]) if len(w) > 1 else 1)
        return steps * math.sqrt(inner) + steps, "contraction", inner  # and a tanh/sigmoid per step
    elif op in _REDUCE:
        x = shape(0)
        axes = _attr(node, "axes")  # None also when given as an input (opset 18): every axis, the most
        terms = _size([x[a] for a in axes]) if axes is not None and x else _size(x)
        kind = "reduction"
    elif op in _WINDOW:
        terms, kind = _size(list(_attr(node, "kernel_shape", []))), "reduction"
    elif op in _GLOBAL:
        terms, kind = _size(shape(0)[2:]), "reduction"
    elif op in _AXIS:
        x = shape(0)
        axis = _attr(node, "axis", -1)
        terms, kind = (x[axis] if x and -len(x) <= axis < len(x) and x[axis] > 0 else 1), "reduction"
    elif op in _NORMS:
        x = shape(0)
        if op == "LayerNormalization":
            axis = _attr(node, "axis", -1)
            terms = _size(x[axis:]) if x else 1
        elif op == "GroupNormalization":
            terms = _size(x[1:]) // max(int(_attr(node, "num_groups", 1)), 1) if x else 1
        else:
            terms = _size(x[2:]) if x else 1
        kind = "reduction"
    elif op in _TRANSCENDENTAL:
        return 1.0, "transcendental", 1
    elif op in _INTERPOLATE:
        return _interpolation_cost(node, shape(0), dims.get(node.output[0], [])), "transcendental", 1
    elif op in _ROUNDING:
        return 0.125, "", 1
    if not kind:
        return 0.0, "", 1
    if op in _EXP_INSIDE:
        extra = 1.0
    terms = max(int(terms), 1)
    return math.sqrt(terms) + extra, kind, terms


def _interpolation_cost(node, x: list[int], y: list[int]) -> float:
    """Linear or cubic interpolation: each engine computes the float32 source coordinate its own
    way, so a weight is off by a few ulps of the coordinate (2**-21 below 8: 4·eps32), and a
    weight error e moves the output by up to 2e·max|x| per axis: 16·eps32·max|x| below 8, in
    proportion to the size above (cost max(2, size / 4) per resized axis; unknown sizes 2).
    Nearest picks the same pixel in both engines (the importer follows onnxruntime's rounding): 1."""
    mode = _attr(node, "mode", b"nearest" if node.op_type in ("Resize", "Upsample") else b"linear")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if node.op_type in ("Resize", "Upsample") and mode == "nearest":
        return 1.0
    axes = range(2, max(len(x), len(y)))
    return float(sum(max(2.0, max(x[a] if a < len(x) else 0, y[a] if a < len(y) else 0) / 4) for a in axes)) or 4.0


def _subgraph_cost(node, dims, consts: dict[str, np.ndarray]) -> float:
    """A control-flow node's cost: its body's total cost (every node of it counted as if in
    sequence) times the iterations: a Loop's constant trip count, a Scan's sequence length
    (unknown: 1)."""
    body = 0.0
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            body = max(body, sum(node_cost(n, dims)[0] for n in g.node))
    steps = 1
    if node.op_type == "Loop" and node.input and node.input[0] in consts:
        steps = int(np.asarray(consts[node.input[0]]).reshape(-1)[0])
    elif node.op_type == "Scan":
        seqs = [dims.get(i, []) for i in node.input[len(node.input) - int(_attr(node, "num_scan_inputs", 1)):]]
        steps = max([s[0] for s in seqs if s] + [1])
    return body * max(steps, 1)


def output_budgets(model: onnx.ModelProto) -> dict[str, Budget]:
    """Each graph output's costliest path (see the module's docstring)."""
    dims = _dims(model)
    g = model.graph
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer if len(t.dims) <= 1 and t.data_type == 7}
    consts.update({n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in g.node
                   if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
                   and n.attribute[0].t.data_type == 7})
    at: dict[str, Budget] = {}
    zero = Budget(0.0)
    for node in g.node:  # a valid ONNX graph lists nodes in topological order
        before = max((at.get(i, zero) for i in node.input if i), key=lambda b: b.depth, default=zero)
        cost, kind, terms = node_cost(node, dims)
        if node.op_type in ("Loop", "Scan", "If"):
            cost, kind = _subgraph_cost(node, dims, consts), "contraction"
        after = before.plus(cost, kind, terms) if cost else before
        for o in node.output:
            at[o] = after
    return {o.name: at.get(o.name, zero) for o in g.output}
