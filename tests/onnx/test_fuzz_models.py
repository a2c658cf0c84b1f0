"""Hostile ONNX files: a seeded mutator over real model bytes. Every case either imports or
raises one OnnxImportError — never another exception, never a hang."""
import random

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from gluontl.errors import GluontlError
from gluontl.onnx import import_model


@pytest.fixture(scope="module")
def real_bytes(tmp_path_factory):
    """A small real CNN exported by mx.onnx (conv, BN, relu, pool, dense)."""
    d = tmp_path_factory.mktemp("fz")
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, padding=1), mx.gluon.nn.BatchNorm(), mx.gluon.nn.Activation("relu"),
            mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(3))
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 3, 8, 8)))
    net.export(str(d / "m"))
    sym, arg, aux = mx.model.load_checkpoint(str(d / "m"), 0)
    path = mx.onnx.export_model(sym, {**arg, **aux}, [(1, 3, 8, 8)], [np.float32], str(d / "m.onnx"))
    return open(path, "rb").read()


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(4)
    if kind == 0:  # flip bytes
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif kind == 1:  # truncate
        b = b[: rng.randrange(len(b))]
    elif kind == 2:  # duplicate a slice
        i = rng.randrange(len(b))
        b[i:i] = b[i: i + rng.randint(1, 64)]
    else:  # delete a slice
        i = rng.randrange(len(b))
        del b[i: i + rng.randint(1, 64)]
    return bytes(b)


@pytest.mark.parametrize("seed", range(60))
def test_mutated_model_gives_clean_error_or_imports(real_bytes, tmp_path, seed):
    rng = random.Random(seed)
    data = real_bytes
    for _ in range(rng.randint(1, 3)):
        data = mutate(data, rng)
    path = tmp_path / "fuzz.onnx"
    path.write_bytes(data)
    try:
        block = import_model(str(path))
    except GluontlError as e:
        assert str(path) in str(e) or "fuzz.onnx" in str(e), str(e)
        return
    block(mx.nd.zeros((1, 3, 8, 8)))  # an accepted file must also run


def _graph(nodes, inputs, outputs, inits=(), opset=13):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


X = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
Y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])


@pytest.mark.parametrize("case", ["cycle", "dangling", "unknown_domain", "absurd_dims", "escaping_external",
                                  "wrong_dtype_initializer", "empty_file", "not_protobuf"])
def test_hostile_structures(tmp_path, case):
    path = tmp_path / f"{case}.onnx"
    if case == "cycle":
        m = _graph([helper.make_node("Relu", ["b"], ["a"], name="n1"), helper.make_node("Relu", ["a"], ["b"], name="n2"),
                    helper.make_node("Add", ["x", "b"], ["y"], name="n3")], [X], [Y])
    elif case == "dangling":
        m = _graph([helper.make_node("Add", ["x", "ghost"], ["y"], name="n")], [X], [Y])
    elif case == "unknown_domain":
        m = _graph([helper.make_node("Frobnicate", ["x"], ["y"], name="n", domain="com.example")], [X], [Y])
        m.opset_import.append(helper.make_opsetid("com.example", 1))
    elif case == "absurd_dims":
        big = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[1 << 20, 1 << 20])
        m = _graph([helper.make_node("Add", ["x", "w"], ["y"], name="n")], [X], [Y], [big])
    elif case == "escaping_external":
        t = numpy_helper.from_array(np.ones((1, 4), "f"), "w")
        t.ClearField("raw_data")
        t.data_location = onnx.TensorProto.EXTERNAL
        t.external_data.add(key="location", value="../../etc/passwd")
        m = _graph([helper.make_node("Add", ["x", "w"], ["y"], name="n")], [X], [Y], [t])
    elif case == "wrong_dtype_initializer":
        t = numpy_helper.from_array(np.ones((1, 4), "int64"), "w")
        m = _graph([helper.make_node("Add", ["x", "w"], ["y"], name="n")], [X], [Y], [t])
    if case == "empty_file":
        path.write_bytes(b"")
    elif case == "not_protobuf":
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    else:
        path.write_bytes(m.SerializeToString())
    with pytest.raises(GluontlError) as e:
        import_model(str(path))
    assert str(path) in str(e.value) or path.name in str(e.value)
