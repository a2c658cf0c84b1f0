"""Property-based fuzzing of the ONNX reader (issue 36): mutated real fixtures go through
``inspect_onnx`` (what ``gluontl inspect`` runs) and ``import_model`` in a worker process with a
memory bound (RLIMIT_AS) and a time bound per file. Only gluontl's own input error escapes
(``OnnxImportError``, a ``GluontlError``; the worker reports any other type as a failure), and
no file outside the scratch folder is opened (an audit hook in the worker).

Budget: ``GLUONTL_FUZZ_EXAMPLES`` examples per test (default 12, about 30 s in all on 2 cores).
The worker below is this file's own; the lead will unify it with ``tests/fuzzing.py``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

pytestmark = pytest.mark.fuzz

FIXTURES = Path(__file__).parent / "fixtures"
SMALL = ["squeezenet_legacy_op13.onnx", "xcit_lpi_legacy_op17.onnx", "batch_indexing_dynamo_op18.onnx"]
EXAMPLES = int(os.environ.get("GLUONTL_FUZZ_EXAMPLES", "12"))
MEMORY = 3 << 30  # RLIMIT_AS of the worker: MXNet and onnxruntime map ~1.5 GB at start
SECONDS = 60  # per file, inspect and import together (a loaded CI machine runs ~10x slower)
ALLOWED = ("OnnxImportError",)  # the input errors the ONNX reader may raise

WORKER = textwrap.dedent(r'''
    import json, os, resource, sys, traceback
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))
    results = os.fdopen(os.dup(1), "w")  # what libraries print (MXNet does) goes to stderr instead
    os.dup2(2, 1)
    scratch = os.path.realpath(sys.argv[1])
    import mxnet
    from gluontl.errors import GluontlError
    from gluontl.onnx import import_model, inspect_onnx
    # reads of the installation (Python, libraries, /usr: platform reads /usr/lib/os-release) are
    # fine; a model's data elsewhere (/etc/passwd, ../..) is not, nor any write outside scratch
    readable = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, *sys.path} if p) + (
        "/proc/", "/sys/", "/dev/", "/usr/", scratch)
    state = {"on": False, "outside": []}

    def audit(event, args):
        if state["on"] and event in ("open", "os.remove", "os.rename", "os.mkdir", "shutil.rmtree"):
            path = args[0]
            if isinstance(path, int) or path is None:
                return
            full = os.path.realpath(os.fsdecode(path))
            writes = event != "open" or any(c in str(args[1] or "") for c in "wax+") or (
                isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            if not full.startswith(scratch if writes else readable):
                state["outside"].append(f"{event} {full}{' (write)' if writes else ''}")

    sys.addaudithook(audit)
    print("ready", file=results, flush=True)
    for line in sys.stdin:
        path = line.rstrip("\n")
        result = {"outside": []}
        state["on"], state["outside"] = True, []
        for step, fn in (("inspect", lambda: inspect_onnx(path)), ("import", lambda: import_model(path))):
            try:
                fn()
                result[step] = "ok"
            except GluontlError as e:
                result[step] = type(e).__name__
                result[step + "_message"] = str(e)
            except BaseException as e:
                result[step] = "CRASH " + type(e).__name__
                result[step + "_message"] = traceback.format_exc()[-2000:]
        state["on"] = False
        result["outside"] = state["outside"]
        print(json.dumps(result), file=results, flush=True)
''').replace("MEMORY", str(MEMORY))


class Worker:
    """One process for many files, so each example does not pay MXNet's import."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
        self.proc = subprocess.Popen([sys.executable, "-c", WORKER, str(scratch)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=scratch)
        assert self.proc.stdout.readline().strip() == "ready"

    def run(self, data: bytes, name: str = "m.onnx") -> dict:
        path = self.scratch / name
        path.write_bytes(data)
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], SECONDS)
        if not ready:
            self.proc.kill()
            raise AssertionError(f"the reader ran over {SECONDS} s on {path}")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"the worker died (exit {self.proc.wait()}) on {path}: over the memory bound?")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = Worker(tmp_path_factory.mktemp("onnxfuzz"))
    yield w
    w.close()


def check(worker: Worker, data: bytes) -> dict:
    if worker.proc.poll() is not None:  # killed by an earlier time-out: start another
        worker.__init__(worker.scratch)
    r = worker.run(data)
    for step in ("inspect", "import"):
        assert r[step] == "ok" or r[step] in ALLOWED, f"{step}: {r[step]}\n{r.get(step + '_message')}"
        if r[step] in ALLOWED:
            assert "m.onnx" in r[step + "_message"], r[step + "_message"]  # errors name the file
    assert not r["outside"], r["outside"]
    return r


def fixture_bytes(i: int) -> bytes:
    return (FIXTURES / SMALL[i % len(SMALL)]).read_bytes()


FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])


@FUZZ
@given(which=st.integers(0, 2), cut=st.floats(0, 1), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 7)),
                                                                     max_size=8))
def test_truncated_and_bit_flipped_files(worker, which, cut, flips):
    data = bytearray(fixture_bytes(which))
    for where, bit in flips:
        data[min(int(where * len(data)), len(data) - 1)] ^= 1 << bit
    check(worker, bytes(data[: max(1, int(len(data) * (1 - cut / 4)))] if cut > 0.5 else data))


HOSTILE_LOCATIONS = ["../../etc/passwd", "/etc/passwd", "w.bin", "sub/../w.bin", "", "nul\0byte", "\udcff.bin",
                     "a" * 5000, "w.bin/../../x"]
NAMES = st.text(st.characters(codec="utf-8"), min_size=0, max_size=30)


@FUZZ
@given(which=st.integers(0, 2), data=st.data())
def test_structural_mutations(worker, which, data):
    """Mutations the protobuf stays valid under: dims, dtypes, external data, names, depth."""
    m = onnx.load_from_string(fixture_bytes(which))
    g = m.graph
    kind = data.draw(st.sampled_from(["dims", "dtype", "external", "names", "deep", "outputs"]))
    inits = list(g.initializer)
    if kind == "dims" and inits:
        t = inits[data.draw(st.integers(0, len(inits) - 1))]
        t.dims[:] = data.draw(st.lists(st.sampled_from([-2, -1, 0, 1, 3, 2 ** 31, 2 ** 40, 2 ** 62]), max_size=5))
    elif kind == "dtype" and inits:
        t = inits[data.draw(st.integers(0, len(inits) - 1))]
        t.data_type = data.draw(st.integers(0, 25))
    elif kind == "external" and inits:
        t = inits[data.draw(st.integers(0, len(inits) - 1))]
        (worker.scratch / "w.bin").write_bytes(bytes(data.draw(st.integers(0, 64))))
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
    check(worker, m.SerializeToString())


@FUZZ
@given(which=st.integers(0, 2), name=st.binary(min_size=1, max_size=12))
def test_non_utf8_names(worker, which, name):
    """A node name replaced in the bytes by the same number of arbitrary (often non-UTF-8) bytes."""
    m = onnx.load_from_string(fixture_bytes(which))
    target = m.graph.node[0].name or "x"
    m.graph.node[0].name = target
    data = m.SerializeToString()
    raw = target.encode()
    new = (name * (len(raw) // len(name) + 1))[: len(raw)]
    check(worker, data.replace(raw, new, 1))
