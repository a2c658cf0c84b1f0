"""numpy integer aliases (longlong, intc, int_, uintc, ulonglong, ...) convert like the
canonical dtypes: equal as dtypes but distinct classes, they used to miss tables keyed by
class (MXNet's own among them); onnxruntime hands folded int64 values back as longlong."""
from __future__ import annotations

import mxnet as mx
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from tests.onnx.opcheck import run_mx, run_ort

from gluontl.onnx import import_model
from gluontl.onnx.registry import canonical, canonical_dtype, carrier_dtype

I64 = [np.longlong, np.int_]  # ONNX index inputs are int64
I32_64 = [np.intc, np.longlong, np.int_]  # index inputs that may be int32 or int64
ALL_INT = [np.byte, np.ubyte, np.short, np.ushort, np.intc, np.uintc, np.longlong, np.int_,
           np.ulonglong, np.uint]


def a(values, t):
    out = np.array(values).astype(t)
    assert out.dtype.type is t  # the alias itself, not its canonical twin
    return out


def test_canonical_maps_aliases_by_value():
    assert canonical_dtype(np.longlong).type is np.int64
    assert canonical_dtype(np.intc).type is np.int32
    assert canonical_dtype(np.ulonglong).type is np.uint64
    assert canonical_dtype(np.uintc).type is np.uint32
    assert carrier_dtype(np.ulonglong).type is np.int64
    assert canonical(np.zeros(2, np.longlong)).dtype.type is np.int64
    for t in ALL_INT:
        mx.nd.array(np.zeros(2, carrier_dtype(t)), dtype=carrier_dtype(t))  # MXNet takes it


# (op, inputs (name -> callable(alias) -> array), attrs, consts, aliases, opset)
X = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 7.0
CASES = [
    ("Add", {"x": lambda t: a([[1, -2], [3, 4]], t), "y": lambda t: a([[5, 6], [-7, 8]], t)}, {}, ("y",), I32_64),
    ("Sub", {"x": lambda t: a([9, 2, 3], t), "y": lambda t: a([1, 2, 3], t)}, {}, ("y",), I32_64),
    ("Mul", {"x": lambda t: a([9, -2, 3], t), "y": lambda t: a([3], t)}, {}, ("y",), I32_64),
    ("Div", {"x": lambda t: a([9, 7, 30], t), "y": lambda t: a([2, 3, 4], t)}, {}, ("y",), I32_64),
    ("Equal", {"x": lambda t: a([1, 2, 3], t), "y": lambda t: a([1, 0, 3], t)}, {}, ("y",), I32_64),
    ("Less", {"x": lambda t: a([1, 2, 3], t), "y": lambda t: a([2, 2, 2], t)}, {}, ("y",), I32_64),
    ("Neg", {"x": lambda t: a([1, -2, 3], t)}, {}, ("x",), I32_64),
    ("Abs", {"x": lambda t: a([1, -2, 3], t)}, {}, ("x",), I32_64),
    ("Max", {"x": lambda t: a([1, -2, 3], t), "y": lambda t: a([0, 5, 1], t)}, {}, ("y",), I32_64),
    ("Where", {"c": lambda t: np.array([True, False, True]), "x": lambda t: a([1, 2, 3], t),
               "y": lambda t: a([7, 8, 9], t)}, {}, ("x", "y"), I32_64),
    ("Cast", {"x": lambda t: a([1, 2, 3, 100], t)}, {"to": onnx.TensorProto.FLOAT}, ("x",), ALL_INT),
    ("Gather", {"x": lambda t: X, "i": lambda t: a([[2, 0], [1, 1]], t)}, {"axis": 1}, ("i",), I32_64),
    ("Gather", {"x": lambda t: X, "i": lambda t: a([1, 0, 1], t)}, {"axis": 0}, ("x", "i"), I32_64),
    ("Expand", {"x": lambda t: X[:1], "s": lambda t: a([2, 1, 1, 1], t)}, {}, ("s",), I64),
    ("Expand", {"x": lambda t: a([[1], [2]], t), "s": lambda t: a([2, 3], np.longlong)}, {}, ("x", "s"), I32_64),
    ("Reshape", {"x": lambda t: X, "s": lambda t: a([0, -1], t)}, {}, ("s",), I64),
    ("Tile", {"x": lambda t: X, "r": lambda t: a([1, 2, 1], t)}, {}, ("r",), I64),
    ("Slice", {"x": lambda t: X, "b": lambda t: a([1, 0], t), "e": lambda t: a([3, 3], t),
               "ax": lambda t: a([1, 2], t)}, {}, ("b", "e", "ax"), I32_64),
    ("Unsqueeze", {"x": lambda t: X, "ax": lambda t: a([0], t)}, {}, ("ax",), I64),
    ("Squeeze", {"x": lambda t: X[:1], "ax": lambda t: a([0], t)}, {}, ("ax",), I64),
    ("ReduceSum", {"x": lambda t: X, "ax": lambda t: a([1], t)}, {}, ("ax",), I64),
    ("ConstantOfShape", {"s": lambda t: a([2, 3], t)}, {}, ("s",), I64),
    ("Range", {"s": lambda t: a(1, t), "l": lambda t: a(9, t), "d": lambda t: a(2, t)}, {}, ("s", "l", "d"), I32_64),
    ("Concat", {"x": lambda t: a([1, 2], t), "y": lambda t: a([3], t)}, {"axis": 0}, ("y",), I32_64),
    ("CumSum", {"x": lambda t: X, "ax": lambda t: a(1, t)}, {}, ("ax",), I32_64),
    ("TopK", {"x": lambda t: X, "k": lambda t: a([2], t)}, {}, ("k",), I64),
    ("Pad", {"x": lambda t: X, "p": lambda t: a([0, 1, 0, 0, 2, 1], t)}, {}, ("p",), I64),
    ("Split", {"x": lambda t: X, "sp": lambda t: a([1, 3], t)}, {"axis": 2}, ("sp",), I64),
]


def _case_id(case, t):
    return f"{case[0]}-{'-'.join(case[1])}-{np.dtype(t).type.__name__}-{t.__name__}"


@pytest.mark.parametrize("case,alias", [(c, t) for c in CASES for t in c[4]],
                         ids=[_case_id(c, t) for c in CASES for t in c[4]])
def test_converter_takes_integer_alias(case, alias):
    op, makers, attrs, consts, _ = case
    inputs = {n: f(alias) for n, f in makers.items()}
    n_out = 2 if op in ("TopK", "Split") else 1
    model, ref = run_ort(op, inputs, attrs, consts, n_outputs=n_out)
    got, _ = run_mx(model, inputs, consts)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):  # copies and integer arithmetic: exact
        assert g.shape == r.shape, (g.shape, r.shape)
        np.testing.assert_array_equal(g, r.astype(g.dtype) if r.dtype == np.bool_ else r)


def test_attention_mask_expand_of_folded_int64_imports():
    """BERT-style: a folded Range (onnxruntime returns it as longlong) expanded to the
    batch-dependent shape of input_ids, then compared with the token ids."""
    i64 = onnx.TensorProto.INT64
    nodes = [helper.make_node("Range", ["zero", "four", "one"], ["pos"], name="pos"),
             helper.make_node("Shape", ["ids"], ["ids_shape"], name="ids_shape"),
             helper.make_node("Expand", ["pos", "ids_shape"], ["pos_b"], name="expand_pos"),
             helper.make_node("Less", ["pos_b", "ids"], ["mask"], name="mask"),
             helper.make_node("Cast", ["mask"], ["maskf"], name="maskf", to=onnx.TensorProto.FLOAT)]
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("zero", 0), ("four", 4), ("one", 1))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", i64, ["N", 4])],
                              [helper.make_tensor_value_info("maskf", onnx.TensorProto.FLOAT, None)],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    block = import_model(model, input_shapes={"ids": (1, 4)})
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for b in (1, 2):
        ids = np.random.RandomState(b).randint(0, 5, size=(b, 4)).astype(np.int64)
        got = block(mx.nd.array(ids, dtype=np.int64)).asnumpy()
        np.testing.assert_array_equal(got, sess.run(None, {"ids": ids})[0])
