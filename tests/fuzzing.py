"""The fuzzing harness: a reader runs on a mutated input in a worker process with a memory cap
(``resource.setrlimit``) and a time bound, and may only return or raise gluontl's own input error
(``GluontlError``), writing nothing outside the scratch folder it was given and reading nothing
outside it but the Python installation (a model's external data at /etc/passwd is the bug).

The worker is one long-lived subprocess (importing gluontl, MXNet and onnxruntime once, not per
example); a reader that kills it, overruns its time (it is then killed) or its memory
(MemoryError, or the kernel's kill) is the failure the fuzz test reports, and the next example
gets a fresh worker. File access is watched with an audit hook (``sys.addaudithook``): an
``open`` for writing, a mkdir, rename, remove or link outside the scratch folder is reported, and
so is an ``open`` for reading or a directory listing outside scratch, the installation
(``sys.prefix``, ``sys.path``, /usr) and /proc, /sys, /dev. The answers go back on a duplicate of
the worker's first stdout, and fd 1 goes to /dev/null before anything is imported: what a library
prints (MXNet does) cannot garble them.

Budget: each fuzz test runs ``examples(n)`` inputs, ``n`` in CI (all fuzz tests together about a
minute on 2 cores); ``GLUONTL_FUZZ_EXAMPLES=N`` runs N each, with a fresh random seed instead of
the fixed one (``scripts/fuzz.sh``).

Mutations (:func:`mutated`) start from a REAL file of the reader's format and apply 1-4 of:
truncation, bit flips, byte deletion/insertion/duplication, and hostile snippets (aliases, deep
nesting, huge numbers, wrong types, unicode, NUL, non-UTF-8 bytes).
"""
from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

TESTS = Path(__file__).resolve().parent
EXAMPLES = int(os.environ.get("GLUONTL_FUZZ_EXAMPLES", "0") or 0)
MEMORY_BYTES = 1 << 30  # on top of what the worker holds after importing gluontl and MXNet
SECONDS = 30.0  # per reader call; a reader is linear in its input, and inputs here are kilobytes
STARTUP_SECONDS = 300.0  # importing gluontl and MXNet in the worker, on a loaded machine


def examples(ci: int) -> int:
    """How many inputs a fuzz test runs: ``ci`` unless GLUONTL_FUZZ_EXAMPLES says otherwise."""
    return EXAMPLES or ci


def fuzz_settings(ci: int) -> settings:
    """Hypothesis settings of a fuzz test: a fixed seed in CI, random ones in a long run."""
    return settings(max_examples=examples(ci), deadline=None, derandomize=not EXAMPLES, database=None,
                    suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------- mutations

HOSTILE = [
    b"&a [1, 2]\n", b"*a", b"!!python/object/apply:os.system ['true']", b"!!binary aGk=", b"!!set {a}",
    b"[" * 300, b"{" * 300, b"]" * 50, b"9" * 5000, b"1e999999", b"-1", b"0", b"NaN", b".inf", b"null", b"true",
    b'"\\ud800"', b"\xff\xfe", b"\x00", "é😀\u202e".encode(), b'{"a": ', b"[]", b"{}", b'"x"', b"1.5",
    b"<!ENTITY a \"aaaaaaaaaa\">", b"&a;", b"<![CDATA[", b"\n" * 40, b" " * 200, b"\t", b"#",
]


@st.composite
def mutated(draw, seed: bytes, extra: tuple[bytes, ...] = ()) -> bytes:
    """``seed`` (the bytes of a real file) after 1-4 random mutations."""
    data = bytearray(seed)
    snippets = HOSTILE + list(extra)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["truncate", "flip", "delete", "insert", "snippet", "duplicate", "replace"]))
        at = draw(st.integers(0, len(data)))
        if kind == "truncate":
            del data[at:]
        elif kind == "flip" and data:
            i = min(at, len(data) - 1)
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 16))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "snippet":
            data[at:at] = draw(st.sampled_from(snippets))
        elif kind == "duplicate":
            part = data[at:at + draw(st.integers(1, 64))]
            data[at:at] = part * draw(st.integers(1, 8))
        elif kind == "replace" and data:  # a token swapped for a snippet keeps the rest well formed
            end = min(len(data), at + draw(st.integers(1, 8)))
            data[at:end] = draw(st.sampled_from(snippets))
    return bytes(data)


def bomb_png(w: int = 30000, h: int = 30000) -> bytes:
    """A valid 1-bit grey PNG of ``w`` x ``h`` zero pixels: ~110 kB on disk for 30000 x 30000, 900
    million pixels once decoded (a decompression bomb), written chunk by chunk as the format says."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    pack = zlib.compressobj(9)
    row = b"\0" * (1 + (w + 7) // 8)  # filter byte 0, then the row's bits
    idat = b"".join(pack.compress(row) for _ in range(h)) + pack.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


NAMES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=12),
    st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\x00" not in b).map(os.fsdecode),
).filter(lambda n: n not in (".", "..") and len(os.fsencode(n)) < 200)
"""File names: any unicode, and bytes that are not UTF-8 (as Python sees them: surrogate escapes)."""


# ---------------------------------------------------------------- the worker

class Worker:
    """One subprocess that runs readers on request, under the memory cap."""

    def __init__(self, tmp: Path) -> None:
        # the checkout holding these tests comes first (the worker reads with the gluontl under
        # test); tests/ itself is not on the path, or tests/onnx would shadow the onnx package.
        # TMPDIR is the test's own temp folder ``tmp``: what the worker's libraries put in the temp
        # folder (tempfile's first call probes it with a file: portalocker's does at import) stays there.
        # GLUONTL_HOME is an empty folder of its own: what a reader finds there must not depend on which
        # tests ran before (a recipe naming the EfficientNet-Lite0 file under it reads that file once
        # training has made it)
        path = (str(TESTS.parent), os.environ.get("PYTHONPATH"))
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp),
               "GLUONTL_HOME": str(tmp / "gluontl_home"),
               "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        self.proc = subprocess.Popen([sys.executable, "-c", "from tests import fuzzing; fuzzing.serve()"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     cwd=str(TESTS.parent))
        self.buffer = b""
        ready = self._answer(STARTUP_SECONDS)  # imports are not the reader's time
        assert ready == {"outcome": "ready"}, f"the fuzzing worker did not start: {ready}"

    def call(self, target: str, scratch: Path, args: list[Any], seconds: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps({"target": target, "scratch": os.fsencode(scratch).hex(),
                                              "args": args}).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"outcome": "died", "message": f"worker exited with {self.proc.wait()}"}
        return self._answer(seconds)

    def _answer(self, seconds: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        while b"\n" not in self.buffer:
            if not sel.select(timeout=seconds):
                self.proc.kill()
                return {"outcome": "timeout", "message": f"no answer within {seconds:.0f} s"}
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return {"outcome": "died", "message": f"worker exited with {self.proc.wait()} (killed by the "
                                                      f"memory cap or a crash in native code)"}
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        if self.alive():
            self.proc.kill()
            self.proc.wait()


_worker: Worker | None = None


def run_reader(target: str, scratch: Path, *args: Any, seconds: float = SECONDS) -> dict[str, Any]:
    """Run ``TARGETS[target](scratch, *args)`` in the worker: ``{"outcome": "ok" | "input_error" |
    "crash" | "timeout" | "died", "error": type, "message": ..., "writes": [paths outside scratch]}``."""
    global _worker
    if _worker is None or not _worker.alive():
        _worker = Worker(scratch.parent)
        atexit.register(_worker.close)
    result = _worker.call(target, scratch, list(args), seconds)
    if result["outcome"] in ("timeout", "died"):
        _worker.close()
        _worker = None
    return result


def fuzz(target: str, base: Path, files: dict[str, bytes], *args: Any, seconds: float = SECONDS) -> dict[str, Any]:
    """Write ``files`` (relative path → bytes; a path may hold any name) into a fresh scratch folder
    under ``base``, run ``target`` on it and :func:`check` the result; the folder is removed after.
    What the target returned (JSON) is the result's ``"value"``."""
    import shutil
    import tempfile

    scratch = Path(tempfile.mkdtemp(dir=base))
    try:
        for rel, data in files.items():
            path = scratch / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        result = run_reader(target, scratch, *args, seconds=seconds)
        check(result, f"{target} on {sorted(files)}")
        return result
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check(result: dict[str, Any], what: str = "") -> None:
    """The fuzz property: the reader returned, or raised gluontl's input error; it wrote nothing
    outside its scratch folder and read nothing outside it and the installation."""
    assert result["outcome"] in ("ok", "input_error"), f"{what}: {result}"
    assert not result.get("writes"), f"{what}: wrote outside the scratch folder: {result['writes']}"
    assert not result.get("reads"), f"{what}: read outside the scratch folder: {result['reads']}"


# ---------------------------------------------------------------- inside the worker

def serve() -> None:
    """The worker's loop: the answer channel, the memory cap, the audit hook, then one request per line."""
    import resource
    import traceback

    out = os.fdopen(os.dup(1), "wb")
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # prints (MXNet's, at import too) must not garble the answers
    sys.stdout = open(os.devnull, "w")

    import gluontl.errors

    import_all()
    with open("/proc/self/statm") as fh:
        held = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (held + MEMORY_BYTES, held + MEMORY_BYTES))
    out.write(b'{"outcome": "ready"}\n')
    out.flush()
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *sys.path) if p}
    state: dict[str, Any] = {"scratch": None, "writes": [], "reads": [],
                             "readable": sorted(installed | {"/proc", "/sys", "/dev", "/usr"})}
    sys.addaudithook(lambda event, args: _audit(state, event, args))
    for line in sys.stdin.buffer:
        request = json.loads(line)
        state["scratch"] = os.path.realpath(os.fsdecode(bytes.fromhex(request["scratch"])))
        state["writes"], state["reads"] = [], []
        try:
            value = TARGETS[request["target"]](Path(state["scratch"]), *request["args"])
            answer = {"outcome": "ok", "value": value}
        except gluontl.errors.GluontlError as e:
            answer = {"outcome": "input_error", "error": type(e).__name__, "message": _printable(str(e))}
        except BaseException as e:  # the finding: anything else
            answer = {"outcome": "crash", "error": type(e).__name__, "message": _printable(str(e))[:2000],
                      "traceback": _printable(traceback.format_exc())[-4000:]}
        answer["writes"], answer["reads"] = state["writes"][:10], state["reads"][:10]
        state["scratch"] = None
        out.write(json.dumps(answer).encode() + b"\n")
        out.flush()


def _printable(text: str) -> str:
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {"os.mkdir": 1, "os.remove": 1, "os.rmdir": 1, "os.rename": 2, "os.link": 2, "os.symlink": 2,
                "os.truncate": 1, "os.chmod": 1, "shutil.rmtree": 1, "shutil.move": 2, "shutil.copyfile": 2}


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _audit(state: dict[str, Any], event: str, args: tuple) -> None:
    scratch = state["scratch"]
    if scratch is None:
        return
    if event in ("open", "os.listdir", "os.scandir"):
        path = args[0]
        writing = event == "open" and (
            (isinstance(args[1], str) and any(c in args[1] for c in "wax+"))
            or (args[1] is None and isinstance(args[2], int) and args[2] & _WRITE_FLAGS))
        if not writing:
            if isinstance(path, int) or path is None:
                return
            real = os.path.realpath(os.fsdecode(path))
            if not any(_inside(real, root) for root in (scratch, *state["readable"])):
                state["reads"].append(_printable(real))
            return
        paths = [path]
    elif event in _PATH_EVENTS:
        paths = list(args[:_PATH_EVENTS[event]])
        if event in ("os.rename", "os.link", "os.symlink", "shutil.move", "shutil.copyfile"):
            paths = paths[1:]  # the destination is what is written
    else:
        return
    for p in paths:
        if isinstance(p, int) or p is None:
            continue
        real = os.path.realpath(os.fsdecode(p))
        if real != os.devnull and not _inside(real, scratch):
            state["writes"].append(_printable(real))


def import_all() -> None:
    """Every reader's module, imported before the memory cap (MXNet maps much at import)."""
    import gluontl.data.cache  # noqa: F401
    import gluontl.data.card  # noqa: F401
    import gluontl.data.checkpoint  # noqa: F401
    import gluontl.data.multilabel  # noqa: F401
    import gluontl.detect.formats  # noqa: F401
    import gluontl.dist.launch  # noqa: F401
    import gluontl.onnx  # noqa: F401
    import gluontl.recipe  # noqa: F401
    import gluontl.segment.formats  # noqa: F401
    import gluontl.train.logs  # noqa: F401
    import gluoncv.model_zoo  # noqa: F401  (a recipe's zoo: name is checked against its list)
    import onnxruntime  # noqa: F401  (constant folding in the ONNX importer)
    import tensorboardX  # noqa: F401


# Each target reads the file(s) a fuzz test wrote into ``root`` the way gluontl reads them.

def _recipe(root: Path) -> None:
    from gluontl.recipe import load_recipe

    load_recipe(root / "recipe.yaml")


def _yolo_card(root: Path) -> None:
    from gluontl.detect.formats import yolo_names

    names = yolo_names(root)
    assert isinstance(names, list) and all(isinstance(n, str) for n in names)


def _yolo_labels(root: Path) -> None:
    from gluontl.detect.formats import read_yolo

    read_yolo(root / "images", root / "labels", 3)


def _voc_xml(root: Path) -> None:
    from gluontl.detect.formats import read_voc_xml

    read_voc_xml(root / "Annotations" / "a.xml", root / "JPEGImages")


def _coco(root: Path) -> None:
    from gluontl.detect.formats import read_coco

    read_coco(root / "instances.json", root / "images")


def _class_folder(root: Path) -> None:
    from gluontl.data.datasets import load_split
    from gluontl.readers import name_bytes
    from gluontl.recipe import DataSpec

    ds = load_split(DataSpec(source=f"folder:{root / 'data'}", train_transform={"resize": 8},
                             val_transform={"resize": 8}, on_bad_image="skip"), "train")
    name_bytes("\n".join(ds.name(i) for i in range(len(ds))))  # what the feature cache's key hashes
    for i in range(len(ds)):
        ds[i]


def _label_file(root: Path, name: str) -> dict[str, list[int]]:
    """Both splits of a label list (``labels:`` multi-label CSV/JSON, ``list:`` single-label CSV) in
    ``root``, every listed image loaded: ``{split: [images, classes]}``."""
    import numpy as np

    from gluontl.data.datasets import load_split
    from gluontl.recipe import DataSpec

    scheme = "list" if name.startswith("list") else "labels"
    spec = DataSpec(source=f"{scheme}:{root / name}", batch_size=2, val_fraction=0.25, on_bad_image="skip",
                    train_transform={"resize": 8}, val_transform={"resize": 8})
    out = {}
    for split in ("train", "val"):
        ds = load_split(spec, split)
        values = {0, 1} if scheme == "labels" else set(range(len(ds.class_names)))  # multi-hot, or class indices
        assert len(ds.labels) == len(ds) and set(np.unique(ds.labels).tolist()) <= values
        if scheme == "labels":
            assert ds.labels.shape == (len(ds), len(ds.class_names))
        for i in range(len(ds)):
            ds[i]
        out[split] = [len(ds), len(ds.class_names)]
    return out


def _mask(root: Path) -> None:
    from gluontl.segment.formats import read_mask

    read_mask(root / "mask.png", 3)


def _image(root: Path) -> None:
    from gluontl.data.transforms import decode_image, load_image

    load_image(root / "image.png")
    decode_image((root / "image.png").read_bytes(), "image.png")


def _metrics(root: Path, resume_step: int) -> None:
    from gluontl.train.logs import MetricsLog, read_metrics

    read_metrics(root / "metrics.jsonl")
    MetricsLog(root, resume_step=resume_step).close()


def _checkpoint(root: Path) -> None:
    import mxnet as mx

    from gluontl.data import checkpoint

    net = mx.gluon.nn.Dense(2, in_units=3, prefix="dense0_")
    net.initialize()
    trainer = mx.gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9})
    checkpoint.load(root / "checkpoints", "last")
    checkpoint.restore_into(root / "checkpoints", "last", net, trainer, mx.cpu())


def _card(root: Path) -> None:
    from gluontl.data.card import stored_card
    from gluontl.data.transforms import load_preprocess
    from gluontl.recipe import load_recipe

    load_preprocess(root / "preprocess.json")
    stored_card(root, load_recipe(root / "recipe.yaml"))


def _cache_record(root: Path, record: dict[str, Any]) -> None:
    import numpy as np

    from gluontl.data.cache import stored_features

    out = stored_features(root, "train", record, np.dtype("float32"))
    if out is not None:
        assert out.shape == (record["rows"], *record["row_shape"])
        np.asarray(out).sum()


def _hosts(root: Path) -> None:
    from gluontl.dist.launch import read_hosts

    read_hosts(root / "hosts")


def _export_meta(root: Path) -> None:
    from gluontl.data.transforms import load_preprocess, onnx_card

    load_preprocess(root / "model.onnx")
    onnx_card(root / "model.onnx")
    load_preprocess(root / "model-preprocess.json")


def _onnx(root: Path) -> dict[str, str]:
    """``inspect_onnx`` (what ``gluontl inspect`` runs), then ``import_model`` whatever inspect said:
    the error type and message of each step (ok: "ok"); any other exception is the crash."""
    from gluontl.errors import GluontlError
    from gluontl.onnx import import_model, inspect_onnx

    path = str(root / "m.onnx")
    steps: dict[str, str] = {}
    for step, fn in (("inspect", inspect_onnx), ("import", import_model)):
        try:
            fn(path)
            steps[step] = "ok"
        except GluontlError as e:
            steps[step], steps[step + "_message"] = type(e).__name__, _printable(str(e))
    return steps


TARGETS = {"recipe": _recipe, "yolo_card": _yolo_card, "yolo_labels": _yolo_labels, "voc_xml": _voc_xml,
           "coco": _coco, "class_folder": _class_folder, "mask": _mask, "image": _image, "metrics": _metrics,
           "checkpoint": _checkpoint, "card": _card, "cache_record": _cache_record, "hosts": _hosts,
           "export_meta": _export_meta, "onnx": _onnx,
           "label_file": _label_file}
