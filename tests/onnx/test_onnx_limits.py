"""ONNX graph limits and the checks ``inspect`` shares with import (issue 36): a corrupt or
oversized file is refused by name, by both, before any weight is read; a graph with thousands
of outputs builds without MXNet's cubic common-subexpression pass."""
from __future__ import annotations

import os

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import gluontl.onnx.importer as importer
from gluontl.errors import OnnxImportError
from gluontl.onnx import import_model
from tests.helpers import run_cli


def conv_model(w: np.ndarray, dims=None) -> onnx.ModelProto:
    t = numpy_helper.from_array(w, "w")
    if dims is not None:
        t.dims[:] = dims
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [t])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def external(d, *, location="w.bin", offset=None, length=None, data=None) -> None:
    """m.onnx whose weight w (2x3x1x1 float32, 24 bytes) is in external data."""
    m = conv_model(np.arange(6, dtype=np.float32).reshape(2, 3, 1, 1))
    w = m.graph.initializer[0]
    (d / "w.bin").write_bytes(w.raw_data if data is None else data)
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        if v is not None:
            w.external_data.add(key=k, value=str(v))
    onnx.save(m, str(d / "m.onnx"))


def outputs_model(n: int) -> onnx.ModelProto:
    """x -> n outputs, each Relu/Sigmoid/Neg/Abs of x: every fourth node computes the same."""
    ops = ["Relu", "Sigmoid", "Neg", "Abs"]
    g = helper.make_graph([helper.make_node(ops[i % 4], ["x"], [f"y{i}"], name=f"n{i}") for i in range(n)], "many",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["N", 4]) for i in range(n)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _renamed(m: onnx.ModelProto, old: str, new: str) -> onnx.ModelProto:
    for n in m.graph.node:
        n.name = new if n.name == old else n.name
    return m


CASES = {
    "negative dims": (lambda d: onnx.save(conv_model(np.zeros((2, 3, 1, 1), np.float32), [-2, 3, 1, 1]),
                                          str(d / "m.onnx")), ["initializer 'w'", "impossible dims [-2, 3, 1, 1]"]),
    "absurd dims": (lambda d: onnx.save(conv_model(np.zeros((2, 3, 1, 1), np.float32), [2 ** 40, 3, 1, 1]),
                                        str(d / "m.onnx")), ["initializer 'w'", "impossible dims"]),
    "outputs": (lambda d: onnx.save(outputs_model(4097), str(d / "m.onnx")),  # the documented limit is 4,096
                ["4,097 graph outputs", "limit of 4,096"]),
    "external absolute": (lambda d: external(d, location="/etc/passwd"), ["'/etc/passwd' outside the model's folder"]),
    "external parent": (lambda d: external(d, location="../../etc/passwd"), ["outside the model's folder"]),
    "external past the end": (lambda d: external(d, offset=16, length=24), ["24 bytes at offset 16", "has 24 bytes"]),
    "external huge length": (lambda d: external(d, length=2 ** 62), [f"{2 ** 62:,} bytes at offset 0"]),
    "external short file": (lambda d: external(d, data=b"\0" * 20), ["20 bytes at offset 0", "needs 24"]),
    "external negative offset": (lambda d: external(d, offset=-8, length=24), ["offset -8"]),
    "external malformed offset": (lambda d: external(d, offset="12abc"), ["malformed external data"]),
    "control character": (lambda d: onnx.save(_renamed(outputs_model(2), "n0", "n\x1f0"), str(d / "m.onnx")),
                          ["node name 'n\\x1f0' contains control characters"]),  # was a JSONDecodeError
    "non-UTF-8 name": (lambda d: (d / "m.onnx").write_bytes(
        _renamed(outputs_model(2), "n0", "NODENAME").SerializeToString().replace(b"NODENAME", b"\xffODENAME")),
                       ["node name b'\\xffODENAME' is not UTF-8"]),  # was a TypeError (str pattern on bytes)
    "external missing": (lambda d: (external(d), os.remove(d / "w.bin")), ["'w.bin'", "is missing"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_inspect_and_import_refuse_by_name(case, refused_twice):
    make, words = CASES[case]
    _, refused, out, _ = refused_twice(make)
    problem = out.splitlines()[1].strip()
    assert problem == str(refused)
    for w in words:
        assert w in problem, problem


def test_initializer_bytes_over_free_memory_refused_before_reading(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "m.onnx")
    onnx.save(conv_model(np.zeros((64, 3, 1, 1), np.float32)), path)  # 768 bytes of weights
    monkeypatch.setattr(importer, "available_memory", lambda: 700)
    with pytest.raises(OnnxImportError, match="need 768 bytes, more than the 700 bytes of memory available"):
        import_model(path)
    code, out, _ = run_cli(capsys, "inspect", path)
    assert code == 2 and "need 768 bytes" in out.splitlines()[1]
    monkeypatch.setattr(importer, "available_memory", lambda: 768)
    import_model(path)


@pytest.mark.parametrize("limit, words", [("MAX_NODES", "2 nodes, over gluontl's limit of 1"),
                                          ("MAX_PROTO_BYTES", "over protobuf's limit of 1 ")])
def test_node_and_file_size_limits(limit, words, tmp_path, monkeypatch):
    path = str(tmp_path / "m.onnx")
    onnx.save(outputs_model(2), path)
    monkeypatch.setattr(importer, limit, 1)
    with pytest.raises(OnnxImportError, match=words.replace("(", r"\(")) as e:
        import_model(path)
    assert path in str(e.value)


def test_external_data_inside_the_folder_still_imports(tmp_path):
    external(tmp_path, offset=0, length=24)
    block = import_model(str(tmp_path / "m.onnx"))
    x = np.random.RandomState(0).rand(1, 3, 4, 4).astype(np.float32)
    want = np.einsum("oc,nchw->nohw", np.arange(6, dtype=np.float32).reshape(2, 3), x)
    np.testing.assert_allclose(block(mx.nd.array(x)).asnumpy(), want, rtol=1e-6, atol=1e-6)


class _Spy(mx.ndarray.CachedOp):
    """The real CachedOp, recording whether MXNet's common-subexpression pass was on each time
    it built a graph (at construction and at the first call per context)."""
    passes: list[str] = []

    def __init__(self, sym, flags=()):
        _Spy.passes.append(os.environ.get("MXNET_ELIMINATE_COMMON_EXPR", "1"))
        super().__init__(sym, flags)

    def __call__(self, *args, **kwargs):
        _Spy.passes.append(os.environ.get("MXNET_ELIMINATE_COMMON_EXPR", "1"))
        return super().__call__(*args, **kwargs)


def test_many_outputs_build_without_the_cubic_pass(tmp_path, monkeypatch):
    """1,000 outputs, 996 of them copies of an earlier node: MXNet's pass over them took 74 s
    at 1,000 outputs (issue 36). The block builds and runs with the pass off, and restores it."""
    path = str(tmp_path / "m.onnx")
    onnx.save(outputs_model(1000), path)
    monkeypatch.setattr(mx.ndarray, "CachedOp", _Spy)
    _Spy.passes = []
    block = import_model(path)
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(2, 4)
    out = block(mx.nd.array(x))
    assert _Spy.passes and set(_Spy.passes) == {"0"}, _Spy.passes  # main: "1" (the pass ran)
    assert "MXNET_ELIMINATE_COMMON_EXPR" not in os.environ
    refs = [np.maximum(x, 0), 1 / (1 + np.exp(-x)), -x, np.abs(x)]
    assert len(out) == 1000
    for i in (0, 1, 2, 3, 998, 999):
        np.testing.assert_allclose(out[i].asnumpy(), refs[i % 4], rtol=1e-6, atol=1e-7)


def test_few_copies_keep_the_pass(tmp_path, monkeypatch):
    path = str(tmp_path / "m.onnx")
    onnx.save(outputs_model(40), path)
    monkeypatch.setattr(mx.ndarray, "CachedOp", _Spy)
    _Spy.passes = []
    import_model(path)(mx.nd.ones((1, 4)))
    assert _Spy.passes and set(_Spy.passes) == {"1"}


def test_converter_refusals_name_the_file(tmp_path):
    """A converter's refusal names its node; import adds the file (found by test_onnx_fuzz)."""
    path = str(tmp_path / "m.onnx")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 0])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 0])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    with pytest.raises(OnnxImportError, match="Relu node 'r'") as e:
        import_model(path)
    assert str(e.value).startswith(f"'{path}': ")


def test_unicode_names_import(tmp_path):
    """A convolution fed by a reshape makes import rewrite MXNet's graph JSON; names outside
    ASCII ('卷积', U+0080) reached MXNet as \\u escapes it cannot read (found by test_onnx_fuzz)."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3, 1, 1)
    g = helper.make_graph(
        [helper.make_node("Reshape", ["x", "shape"], ["x4"], name="reshape\u0080"),
         helper.make_node("Conv", ["x4", "卷积.weight"], ["y"], name="卷积")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2, 2])],
        [numpy_helper.from_array(np.array([1, 3, 2, 2], np.int64), "shape"), numpy_helper.from_array(w, "卷积.weight")])
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    block = import_model(path)
    x = np.arange(12, dtype=np.float32).reshape(1, 12)
    want = np.einsum("oc,nchw->nohw", w.reshape(2, 3), x.reshape(1, 3, 2, 2))
    np.testing.assert_array_equal(block(mx.nd.array(x)).asnumpy(), want)  # integer-valued: exact
    assert "卷积.weight" in block.collect_params()


def test_shape_of_an_empty_input_is_refused(tmp_path):
    """Shape('') — an output renamed to '' with its readers (found by test_onnx_fuzz): was a KeyError."""
    path = str(tmp_path / "m.onnx")
    g = helper.make_graph([helper.make_node("Relu", ["x"], [""], name="r"),
                           helper.make_node("Shape", [""], ["s"], name="shape"),
                           helper.make_node("Relu", ["x"], ["y"], name="r2")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    with pytest.raises(OnnxImportError, match="Shape node 'shape'.*has no tensor name") as e:
        import_model(path)
    assert path in str(e.value)
