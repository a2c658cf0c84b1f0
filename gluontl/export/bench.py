"""``gluontl bench``: latency and throughput of exports, float against int8: ONNX files in
onnxruntime, symbol/params pairs in MXNet (oneDNN).

Sessions run as a deployment runs them (onnxruntime: every graph optimization, so an int8 file's
QDQ pairs fuse into integer kernels; MXNet: a hybridized static graph, its OpenMP threads fixed
when it started, OMP_NUM_THREADS). Warm-up runs are left out; each figure is the median over
``repeat`` timed runs, with the 10th-90th percentile range as its spread, because a shared
machine's noise is one-sided (a run is slowed by others, never sped up).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import mxnet as mx
import numpy as np
import onnxruntime as ort

from gluontl.atomic import write_text
from gluontl.errors import ExportError, short_reason
from gluontl.export import cpu
from gluontl.export.quantize_mx import load_symbol, model_bytes, params_of
from gluontl.export.verify import deploy_session

INT8_SUFFIX = ".int8.onnx"
SUFFIXES = ((INT8_SUFFIX, ".onnx"), ("-int8-symbol.json", "-symbol.json"))  # (int8, float) endings
_WARMUP = 3


def _kind(path: Path) -> tuple[str, str, bool] | None:
    """(int8 ending, float ending, is int8) of a model file's name; None for other files."""
    for int8, flt in SUFFIXES:
        if path.name.endswith(int8):
            return int8, flt, True
        if path.name.endswith(flt):
            return int8, flt, False
    return None


def partner(path: Path) -> Path:
    """The float file of an int8 one and the other way round (``m.onnx`` / ``m.int8.onnx``,
    ``m-symbol.json`` / ``m-int8-symbol.json``)."""
    int8, flt, is_int8 = _kind(path)  # type: ignore[misc]
    cut, add = (int8, flt) if is_int8 else (flt, int8)
    return path.with_name(path.name[: -len(cut)] + add)


def find_models(target: Path, require_int8: bool) -> list[tuple[Path | None, Path | None]]:
    """(float, int8) pairs of a file, of the .onnx and -symbol.json files of a folder, or of a run's export/."""
    if target.is_dir() and (target / "recipe.yaml").is_file():
        target = target / "export"
    if target.is_dir():
        files = sorted(f for f in target.iterdir() if _kind(f))
    elif target.is_file() and _kind(target):
        files = [target]
    else:
        raise ExportError(f"'{target}' is not an .onnx or -symbol.json file, a folder of them or a run folder "
                          f"(runs/NAME, whose export/ is benched); pass one of those.")
    pairs: dict[Path, list[Path | None]] = {}
    for f in files:
        is_int8 = _kind(f)[2]  # type: ignore[index]
        base = partner(f) if is_int8 else f
        pair = pairs.setdefault(base, [None, None])
        pair[int(is_int8)] = f
        if partner(f).is_file():
            pair[int(not is_int8)] = partner(f)
    if not pairs:
        raise ExportError(f"'{target}' holds no .onnx or -symbol.json file; export a run first (`gluontl export "
                          f"runs/NAME --int8`).")
    if require_int8:
        lacking = [str(p) for p, (f, q) in pairs.items() if q is None]
        if lacking:
            raise ExportError(f"--int8: {', '.join(lacking)} has no int8 partner (NAME{INT8_SUFFIX} or "
                              f"NAME-int8-symbol.json beside it); make it with `gluontl export runs/NAME --int8 "
                              f"--out FOLDER`, or drop --int8.")
    return [tuple(p) for p in pairs.values()]  # type: ignore[misc]


def _inputs(session: ort.InferenceSession, path: Path, batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for inp in session.get_inputs():
        dims = list(inp.shape)
        if dims and not isinstance(dims[0], int):
            dims[0] = batch
        if not all(isinstance(d, int) for d in dims):
            raise ExportError(f"'{path}' input {inp.name} has shape {inp.shape} with free sizes besides the batch; "
                              f"bench feeds fixed shapes. Export the model at a fixed input size.")
        if dims and dims[0] != batch:
            raise ExportError(f"'{path}' takes a fixed batch of {dims[0]} (input {inp.name}); pass --batch {dims[0]}.")
        dtype = np.float32 if inp.type == "tensor(float)" else None
        if dtype is None:
            raise ExportError(f"'{path}' input {inp.name} is {inp.type}; bench feeds float32 tensors only.")
        feeds[inp.name] = rng.standard_normal(dims).astype(dtype)
    return feeds


def time_runs(run: Callable[[], Any], repeat: int, clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Milliseconds per call of ``run`` over ``repeat`` timed calls after the warm-up ones."""
    for _ in range(_WARMUP):
        run()
    times = []
    for _ in range(repeat):
        start = clock()
        run()
        times.append(1000 * (clock() - start))
    t = np.asarray(times)
    return {"median_ms": float(np.median(t)), "p10_ms": float(np.percentile(t, 10)),
            "p90_ms": float(np.percentile(t, 90)), "min_ms": float(t.min()), "max_ms": float(t.max())}


def bench_file(path: Path, batches: Sequence[int], threads: int, repeat: int) -> list[dict[str, Any]]:
    if path.name.endswith("-symbol.json"):
        return bench_symbol(path, batches, repeat)
    try:
        session = deploy_session(path, threads)
    except Exception as err:  # onnxruntime's errors share no base class
        raise ExportError(f"onnxruntime cannot load '{path}' ({short_reason(err)}); re-export it.") from None
    rows = []
    for b in batches:
        feeds = _inputs(session, path, b)
        stats = time_runs(lambda: session.run(None, feeds), repeat)
        rows.append({"file": str(path), "batch": b, **stats, "images_per_s": 1000 * b / stats["median_ms"]})
    return rows


def bench_symbol(path: Path, batches: Sequence[int], repeat: int) -> list[dict[str, Any]]:
    """A symbol/params pair in MXNet, fed the input its run card (``NAME-preprocess.json``) records."""
    float_json = partner(path) if _kind(path)[2] else path  # type: ignore[index]
    card = float_json.with_name(float_json.name[: -len("-symbol.json")] + "-preprocess.json")
    try:
        record = json.loads(card.read_text(encoding="utf-8"))["preprocess"]
        name, shape = record["input"]["name"], record["input"]["shape"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ExportError(f"bench feeds '{path}' the input its run card {card.name} records, which cannot be read "
                          f"({short_reason(err)}); export the run again (a bare model's symbol files have no "
                          f"card).") from None
    try:
        block = load_symbol(path, params_of(path), name)
        block.hybridize(static_alloc=True, static_shape=True)
    except (OSError, AssertionError, mx.base.MXNetError) as err:
        raise ExportError(f"MXNet cannot load '{path}' ({short_reason(err)}); re-export it.") from None
    rows = []
    for b in batches:
        x = mx.nd.array(np.random.default_rng(0).standard_normal([b, *shape[1:]]).astype(np.float32))

        def run() -> None:
            out = block(x)
            for o in out if isinstance(out, (list, tuple)) else [out]:
                o.wait_to_read()

        stats = time_runs(run, repeat)
        rows.append({"file": str(path), "batch": b, **stats, "images_per_s": 1000 * b / stats["median_ms"]})
    return rows


def bench(target: str | Path, *, int8: bool = False, batches: Sequence[int] = (1, 32), threads: int = 1,
          repeat: int = 20, out: str | Path | None = None) -> tuple[dict[str, Any], Path]:
    """Time every model of ``target`` (see ``find_models``); the report and the JSON file written
    (``out``, default ``bench.json`` beside the models)."""
    if not batches or min(batches) < 1 or threads < 1 or repeat < 1:
        raise ExportError(f"bench needs batch sizes >= 1 (got {list(batches)}), --threads >= 1 (got {threads}) and "
                          f"--repeat >= 1 (got {repeat}).")
    target = Path(target)
    pairs = find_models(target, int8)
    flags = cpu.cpu_flags()
    results = []
    for float_path, int8_path in pairs:
        entry: dict[str, Any] = {}
        for kind, path in (("float", float_path), ("int8", int8_path)):
            if path is not None:
                entry[kind] = {"file": str(path), "bytes": model_bytes(path),
                               "runs": bench_file(path, batches, threads, repeat)}
        if "float" in entry and "int8" in entry:
            entry["speedup"] = {str(f["batch"]): f["median_ms"] / q["median_ms"]
                                for f, q in zip(entry["float"]["runs"], entry["int8"]["runs"])}
            entry["size_ratio"] = entry["float"]["bytes"] / entry["int8"]["bytes"]
        results.append(entry)
    report = {"cpu": {**cpu.flag_summary(flags), "described": cpu.describe(flags)}, "threads": threads,
              "repeat": repeat, "warmup": _WARMUP, "onnxruntime": ort.__version__,
              "session": "CPUExecutionProvider, all graph optimizations", "models": results}
    if any(Path(e[k]["file"]).name.endswith("-symbol.json") for e in results for k in ("float", "int8") if k in e):
        report["mxnet"] = {"version": mx.__version__, "omp_threads": os.environ.get("OMP_NUM_THREADS", "default"),
                           "graph": "SymbolBlock hybridized (static_alloc, static_shape); threads from "
                                    "OMP_NUM_THREADS at start, not --threads"}
    folder = target / "export" if (target / "recipe.yaml").is_file() else target if target.is_dir() else target.parent
    path = write_text(Path(out) if out else folder / "bench.json", json.dumps(report, indent=1), ExportError)
    return report, path


def table(report: dict[str, Any]) -> str:
    """The report as aligned text: one row per file and batch, the int8 speed-up beside int8 rows."""
    engines = f"onnxruntime {report['onnxruntime']}, {report['threads']} thread(s)"
    if "mxnet" in report:
        engines += f"; MXNet {report['mxnet']['version']}, OMP_NUM_THREADS={report['mxnet']['omp_threads']}"
    lines = [f"CPU: {report['cpu']['described']}; {engines}, median of {report['repeat']} runs after "
             f"{report['warmup']} warm-up runs"]
    header = ("file", "batch", "median ms", "p10-p90 ms", "images/s", "int8 speed-up")
    rows = []
    for entry in report["models"]:
        for kind in ("float", "int8"):
            if kind not in entry:
                continue
            for r in entry[kind]["runs"]:
                ratio = entry.get("speedup", {}).get(str(r["batch"])) if kind == "int8" else None
                rows.append((Path(r["file"]).name, str(r["batch"]), f"{r['median_ms']:.2f}",
                             f"{r['p10_ms']:.2f}-{r['p90_ms']:.2f}", f"{r['images_per_s']:.1f}",
                             f"{ratio:.2f}x" if ratio else ""))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    for entry in report["models"]:
        if "size_ratio" in entry:
            lines.append(f"{Path(entry['int8']['file']).name}: {entry['int8']['bytes']:,} bytes, "
                         f"the float file is {entry['size_ratio']:.2f}x its size")
    return "\n".join(lines)
