import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.helpers import assert_f32_close
from tests.onnx.opcheck import check, check_grad, run_mx, run_ort

from gluontl.errors import OnnxImportError
from gluontl.onnx import import_model, registry
from gluontl.onnx.registry import Tensor



def f(*shape):
    return np.random.randn(*shape).astype("f")


def summed(eq, arrays):
    """Products summed into one Einsum output: the sizes of the indices it sums out."""
    ins, _, out = eq.partition("->")
    sizes = {}
    for t, a in zip(ins.split(","), arrays):
        letters = t.replace("...", "")  # an ellipsis takes the leading axes
        sizes.update(zip(letters, a.shape[a.ndim - len(letters):]))
    if "->" not in eq:  # implicit output: the indices that appear once
        out = "".join(c for c in sizes if ins.count(c) == 1)
    return int(np.prod([n for c, n in sizes.items() if c not in out]))


def _convert(op, inputs, attrs, consts, opset):
    model, _ = run_ort(op, inputs, attrs, consts, opset)
    node = registry.node_from_proto(model.graph.node[0], opset)
    tensors = [Tensor(n, mx.sym.var(n), const=a if n in consts else None, shape=a.shape)
               for n, a in inputs.items() if a is not None]
    return registry.get(op, opset)(node, tensors)


@pytest.mark.parametrize("attrs,c_shape,opset", [
    ({"transB": 1}, (6,), 13),
    ({}, (6,), 9),
    ({"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, (4, 6), 13),
    ({"alpha": 2.0}, (1, 6), 11),
    ({"beta": 0.5}, (4, 1), 11),
    ({"transB": 1}, None, 11),
])
def test_gemm(attrs, c_shape, opset):
    a = f(3, 4) if attrs.get("transA") else f(4, 3)
    b = f(6, 3) if attrs.get("transB") else f(3, 6)
    inputs = {"a": a, "b": b, "c": None if c_shape is None else f(*c_shape)}
    check("Gemm", inputs, attrs, consts={"b", "c"}, opset=opset, grad=True, terms=3 + 1)


def test_gemm_dense_layer_is_one_fully_connected():
    inputs = {"a": f(4, 3), "w": f(6, 3), "b": f(6)}
    sym = _convert("Gemm", inputs, {"transB": 1}, {"w", "b"}, 13)
    ops = [n["op"] for n in __import__("json").loads(sym.tojson())["nodes"] if n["op"] != "null"]
    assert ops == ["FullyConnected"] and sym.name == "gemm_node"
    assert sym.list_arguments() == ["a", "w", "b"]


def test_gemm_runtime_weight():
    check("Gemm", {"a": f(4, 3), "b": f(3, 5), "c": f(5)}, {"alpha": 0.5}, opset=13, grad=True, terms=3 + 1)


@pytest.mark.parametrize("a_shape,b_shape,consts", [
    ((4, 3), (3, 5), {"b"}),
    ((2, 7, 3), (3, 5), {"b"}),          # dense layer over a sequence
    ((2, 7, 3), (2, 3, 5), set()),      # batch matmul
    ((2, 2, 7, 3), (2, 2, 3, 5), set()),
    ((2, 1, 7, 3), (3, 3, 5), set()),   # batch broadcasting both ways
    ((7, 3), (2, 3, 5), set()),
    ((3,), (3, 5), {"b"}),
    ((2, 7, 3), (3,), set()),
    ((4, 3), (3, 5), set()),
])
def test_matmul(a_shape, b_shape, consts):
    check("MatMul", {"a": f(*a_shape), "b": f(*b_shape)}, consts=consts, opset=13, grad=True, terms=3)


def test_matmul_constant_weight_is_fully_connected():
    sym = _convert("MatMul", {"a": f(2, 7, 3), "w": f(3, 5)}, {}, {"w"}, 13)
    ops = {n["op"] for n in __import__("json").loads(sym.tojson())["nodes"]}
    assert "FullyConnected" in ops and "batch_dot" not in ops


@pytest.mark.parametrize("eq,shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhid,bhjd->bhij", [(2, 3, 4, 6), (2, 3, 5, 6)]),
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ij->ji", [(3, 4)]),
    ("bij->bj", [(2, 3, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("bi,bj->bij", [(2, 3), (2, 4)]),
    ("ijk,ikl,ilm->ijm", [(2, 3, 4), (2, 4, 5), (2, 5, 3)]),
    ("bnd,dh->bhn", [(2, 3, 4), (4, 5)]),
])
def test_einsum(eq, shapes):
    inputs = {f"x{i}": f(*s) for i, s in enumerate(shapes)}
    check("Einsum", inputs, {"equation": eq}, opset=12, grad=True, terms=summed(eq, inputs.values()),
          depth=len(shapes) - 1 or 1)


def test_einsum_diagonal_is_clear_error():
    with pytest.raises(OnnxImportError, match="einsum_node.*diagonal"):
        _convert("Einsum", {"x": f(3, 3)}, {"equation": "ii->i"}, set(), 12)


def test_einsum_with_free_batch_size():
    a, b = f(2, 3, 4, 6), f(2, 3, 5, 6)
    model, _ = run_ort("Einsum", {"a": a, "b": b}, {"equation": "bhid,bhjd->bhij"}, set(), 12)
    node = registry.node_from_proto(model.graph.node[0], 12)
    tensors = [Tensor("a", mx.sym.var("a"), shape=(None, 3, 4, 6)),
               Tensor("b", mx.sym.var("b"), shape=(None, 3, 5, 6))]
    sym = registry.get("Einsum", 12)(node, tensors)
    got = sym.eval(a=mx.nd.array(a), b=mx.nd.array(b))[0].asnumpy()
    assert_f32_close(got, np.einsum("bhid,bhjd->bhij", a, b), terms=6)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.data())
def test_einsum_random_equations(data):
    """Random two/three-operand equations (batch, contracted, kept and summed indices) vs numpy."""
    letters = "abcdef"
    sizes = {c: data.draw(st.integers(1, 4)) for c in letters}
    n_ops = data.draw(st.integers(1, 3))
    terms = [data.draw(st.lists(st.sampled_from(letters), min_size=1, max_size=3, unique=True)) for _ in range(n_ops)]
    used = sorted(set().union(*terms))
    out = data.draw(st.lists(st.sampled_from(used), max_size=3, unique=True)) if used else []
    if not out:
        out = used[:1]
    eq = ",".join("".join(t) for t in terms) + "->" + "".join(out)
    inputs = {f"x{i}": f(*[sizes[c] for c in t]) for i, t in enumerate(terms)}
    model, _ = run_ort("Einsum", inputs, {"equation": eq}, set(), 12)
    got, grads = run_mx(model, inputs, set(), 12, grad=True)
    assert_f32_close(got[0], np.einsum(eq, *inputs.values()), terms=summed(eq, inputs.values()), depth=n_ops,
                     err_msg=eq)
    assert all(np.isfinite(g).all() for g in grads.values())


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.data())
def test_matmul_random_broadcasts(data):
    m, k, n = (data.draw(st.integers(1, 4)) for _ in range(3))
    batch = data.draw(st.lists(st.integers(1, 3), max_size=2))
    a_batch = [d if data.draw(st.booleans()) else 1 for d in batch][data.draw(st.integers(0, len(batch))):]
    b_batch = [d if data.draw(st.booleans()) else 1 for d in batch][data.draw(st.integers(0, len(batch))):]
    a_shape = tuple(a_batch) + (m, k) if data.draw(st.booleans()) else (k,)  # vectors have no batch axes
    b_shape = tuple(b_batch) + (k, n) if data.draw(st.booleans()) else (k,)
    if len(a_shape) == 1 and len(b_shape) == 1:
        return  # a rank-0 result, carried as shape (1,) on the MXNet side
    consts = {"b"} if len(b_shape) == 2 else set()
    check("MatMul", {"a": f(*a_shape), "b": f(*b_shape)}, consts=consts, opset=13, grad=True, terms=k)


@pytest.mark.parametrize("op,inputs,attrs,opset", [  # inputs drawn in the test, from its seeded RNG
    ("Gemm", lambda: {"a": f(3, 2), "b": f(3, 4), "c": f(2, 1)}, {"transA": 1, "alpha": 0.5, "beta": 2.0}, 13),
    ("MatMul", lambda: {"a": f(2, 1, 3, 2), "b": f(3, 2, 2)}, {}, 13),
    ("Einsum", lambda: {"a": f(2, 3, 2), "b": f(2, 2, 3)}, {"equation": "bij,bjk->bki"}, 12),
    ("Einsum", lambda: {"a": f(2, 3), "b": f(3, 2), "c": f(2, 2)}, {"equation": "ij,jk,kl->il"}, 12),
], ids=lambda v: v if isinstance(v, str) else "")
def test_linear_gradients_match_central_differences(op, inputs, attrs, opset):
    check_grad(op, inputs(), attrs, opset=opset)


@pytest.mark.parametrize("stored", [False, True])
def test_gemm_scalar_bias_as_a_rank0_input_or_initializer(stored):
    """ONNX lets C be a scalar; fed as a shape () NDArray, as onnx's own data has it."""
    inputs = {"a": f(2, 3), "b": f(3, 4), "c": np.array(3.14, np.float32)}
    consts = {"c"} if stored else set()
    model, ref = run_ort("Gemm", inputs, {"alpha": 0.5, "beta": 2.0}, consts, 13)
    block = import_model(model)
    feed = [mx.nd.array(v) for k, v in inputs.items() if k not in consts]
    assert_f32_close(block(*feed).asnumpy(), ref[0], terms=3 + 1)
