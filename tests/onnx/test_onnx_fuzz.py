"""Property-based fuzzing of the ONNX reader (issue 36): mutated real fixtures go through
``inspect_onnx`` (what ``gluontl inspect`` runs) and ``import_model`` in the fuzzing worker of
``tests/fuzzing.py`` (memory cap, a time bound per file, an audit hook). Only gluontl's own input
error escapes (``OnnxImportError``; the worker reports any other type as a crash), its message
names the file, and nothing outside the scratch folder is written, nor read outside it and the
Python installation.

Budget: ``GLUONTL_FUZZ_EXAMPLES`` examples per test (default 12, about 30 s in all on 2 cores).
"""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

from tests.fuzzing import fuzz, fuzz_settings

pytestmark = pytest.mark.fuzz

FIXTURES = Path(__file__).parent / "fixtures"
SMALL = ["squeezenet_legacy_op13.onnx", "xcit_lpi_legacy_op17.onnx", "batch_indexing_dynamo_op18.onnx"]
SECONDS = 60.0  # per file, inspect and import together (a loaded CI machine runs ~10x slower)
ALLOWED = ("OnnxImportError",)  # the input errors the ONNX reader may raise


def check(base: Path, data: bytes, extra: dict[str, bytes] | None = None) -> dict:
    """``data`` as ``m.onnx`` (and ``extra`` files beside it) through inspect and import."""
    r = fuzz("onnx", base, {"m.onnx": data, **(extra or {})}, seconds=SECONDS)["value"]
    for step in ("inspect", "import"):
        assert r[step] == "ok" or r[step] in ALLOWED, f"{step}: {r[step]}\n{r.get(step + '_message')}"
        if r[step] in ALLOWED:
            assert "m.onnx" in r[step + "_message"], r[step + "_message"]  # errors name the file
    return r


def fixture_bytes(i: int) -> bytes:
    return (FIXTURES / SMALL[i % len(SMALL)]).read_bytes()


FUZZ = fuzz_settings(12)


@FUZZ
@given(which=st.integers(0, 2), cut=st.floats(0, 1), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 7)),
                                                                     max_size=8))
def test_truncated_and_bit_flipped_files(tmp_path_factory, which, cut, flips):
    data = bytearray(fixture_bytes(which))
    for where, bit in flips:
        data[min(int(where * len(data)), len(data) - 1)] ^= 1 << bit
    check(tmp_path_factory.getbasetemp(), bytes(data[: max(1, int(len(data) * (1 - cut / 4)))] if cut > 0.5 else data))


HOSTILE_LOCATIONS = ["../../etc/passwd", "/etc/passwd", "w.bin", "sub/../w.bin", "", "nul\0byte", "\udcff.bin",
                     "a" * 5000, "w.bin/../../x"]
NAMES = st.text(st.characters(codec="utf-8"), min_size=0, max_size=30)


@FUZZ
@given(which=st.integers(0, 2), data=st.data())
def test_structural_mutations(tmp_path_factory, which, data):
    """Mutations the protobuf stays valid under: dims, dtypes, external data, names, depth."""
    m = onnx.load_from_string(fixture_bytes(which))
    g = m.graph
    kind = data.draw(st.sampled_from(["dims", "dtype", "external", "names", "deep", "outputs"]))
    inits = list(g.initializer)
    extra = {}
    if kind == "dims" and inits:
        t = inits[data.draw(st.integers(0, len(inits) - 1))]
        t.dims[:] = data.draw(st.lists(st.sampled_from([-2, -1, 0, 1, 3, 2 ** 31, 2 ** 40, 2 ** 62]), max_size=5))
    elif kind == "dtype" and inits:
        t = inits[data.draw(st.integers(0, len(inits) - 1))]
        t.data_type = data.draw(st.integers(0, 25))
    elif kind == "external" and inits:
        t = inits[data.draw(st.integers(0, len(inits) - 1))]
        extra["w.bin"] = bytes(data.draw(st.integers(0, 64)))
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value=data.draw(st.sampled_from(HOSTILE_LOCATIONS)).encode(
            "utf-8", "surrogatepass").decode("utf-8", "replace"))
        for key in data.draw(st.lists(st.sampled_from(["offset", "length"]), unique=True)):
            t.external_data.add(key=key, value=str(data.draw(st.sampled_from([-1, 0, 3, 2 ** 40, 2 ** 63]))))
    elif kind == "names":
        for n in g.node[: data.draw(st.integers(1, 5))]:
            n.name = data.draw(NAMES)
            if n.output:
                new = data.draw(NAMES)
                old = n.output[0]
                n.output[0] = new
                for other in g.node:
                    other.input[:] = [new if x == old else x for x in other.input]
                for o in g.output:
                    if o.name == old:
                        o.name = new
    elif kind == "deep":
        out = g.output[0].name
        depth = data.draw(st.integers(1, 3000))
        prev = out
        for k in range(depth):
            g.node.append(helper.make_node("Relu", [prev], [f"deep{k}"], name=f"deep{k}"))
            prev = f"deep{k}"
        g.output[0].name = prev
    elif kind == "outputs":
        first = g.output[0]
        for k in range(data.draw(st.integers(1, 5000))):
            g.node.append(helper.make_node("Identity", [first.name], [f"copy{k}"], name=f"copy{k}"))
            g.output.append(helper.make_tensor_value_info(f"copy{k}", first.type.tensor_type.elem_type, None))
    check(tmp_path_factory.getbasetemp(), m.SerializeToString(), extra)


@FUZZ
@given(which=st.integers(0, 2), name=st.binary(min_size=1, max_size=12))
def test_non_utf8_names(tmp_path_factory, which, name):
    """A node name replaced in the bytes by the same number of arbitrary (often non-UTF-8) bytes."""
    m = onnx.load_from_string(fixture_bytes(which))
    target = m.graph.node[0].name or "x"
    m.graph.node[0].name = target
    data = m.SerializeToString()
    raw = target.encode()
    new = (name * (len(raw) // len(name) + 1))[: len(raw)]
    check(tmp_path_factory.getbasetemp(), data.replace(raw, new, 1))
