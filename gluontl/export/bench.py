"""``gluontl bench``: latency and throughput of exports, float against int8: ONNX files in
onnxruntime, symbol/params pairs in MXNet (oneDNN).

Sessions run as a deployment runs them (onnxruntime: every graph optimization, so an int8 file's
QDQ pairs fuse into integer kernels; MXNet: a hybridized static graph). Every engine runs on the
same ``threads``: onnxruntime's intra-op threads, and MXNet's OpenMP threads, which are fixed when
MXNet starts, so symbol files are timed in a child process started with OMP_NUM_THREADS=threads
(comparing MXNet on 2 threads with onnxruntime on 1 once printed a 59x int8 "speed-up").
Warm-up runs are left out; each figure is the median of the timed runs, with the 10th-90th
percentile range as its spread, because a shared machine's noise is one-sided (a run is slowed by
others, never sped up). Runs are added, ``repeat`` at a time, until that spread is within
``MAX_SPREAD`` of the median or ``MAX_ROUNDS`` rounds are done; a figure whose spread stayed wider
is marked noisy, and a speed-up from one is not given as a number.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
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
from gluontl.runfolder import RunFolder

INT8_SUFFIX = ".int8.onnx"
SUFFIXES = ((INT8_SUFFIX, ".onnx"), ("-int8-symbol.json", "-symbol.json"), (".int8.xml", ".xml"))  # (int8, float)
IR_FOLDER = "-openvino"  # an OpenVINO IR is NAME-openvino/NAME.xml (+ .bin), its int8 NAME.int8-openvino/NAME.int8.xml
_WARMUP = 3
MAX_SPREAD = 0.10  # (p90 - p10) / median that counts as a steady figure
MAX_ROUNDS = 5  # rounds of ``repeat`` timed runs before a figure is called noisy


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
    name = path.name[: -len(cut)] + add
    if flt == ".xml":  # each IR in its own folder, named as its file
        return path.parent.parent / f"{name[: -len('.xml')]}{IR_FOLDER}" / name
    return path.with_name(name)


def find_models(target: Path, require_int8: bool) -> list[tuple[Path | None, Path | None]]:
    """(float, int8) pairs of a file, of the .onnx and -symbol.json files and IR folders
    (NAME-openvino/NAME.xml) of a folder, or of a run's export/."""
    if target.is_dir() and RunFolder(target).is_run():
        target = RunFolder(target).export_dir
    if target.is_dir() and target.name.endswith(IR_FOLDER) and any(target.glob("*.xml")):
        files = sorted(target.glob("*.xml"))
    elif target.is_dir():
        files = sorted(f for f in target.iterdir() if f.is_file() and _kind(f) and f.suffix != ".xml")
        files += sorted(target.glob(f"*{IR_FOLDER}/*.xml"))
    elif target.is_file() and _kind(target):
        files = [target]
    else:
        raise ExportError(f"'{target}' is not an .onnx or -symbol.json file, a folder of them or a run folder "
                          f"(runs/NAME, whose {RunFolder.EXPORT}/ is benched); pass one of those.")
    if any(f.suffix == ".xml" for f in files):
        from gluontl.export.openvino_ir import ir_xml

        for f in files:
            if f.suffix == ".xml":
                ir_xml(f)  # its .bin is there (else one paragraph), before any model is timed
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


def time_runs(run: Callable[[], Any], repeat: int, clock: Callable[[], float] = time.perf_counter,
              max_spread: float = MAX_SPREAD, max_rounds: int = MAX_ROUNDS) -> dict[str, Any]:
    """Milliseconds per call of ``run`` after the warm-up calls: rounds of ``repeat`` timed calls
    until the p10-p90 spread is within ``max_spread`` of the median (``steady``) or ``max_rounds``
    rounds are done (not steady: the machine was too noisy to tell)."""
    for _ in range(_WARMUP):
        run()
    times: list[float] = []
    for _ in range(max_rounds):
        for _ in range(repeat):
            start = clock()
            run()
            times.append(1000 * (clock() - start))
        t = np.asarray(times)
        median, p10, p90 = float(np.median(t)), float(np.percentile(t, 10)), float(np.percentile(t, 90))
        spread = (p90 - p10) / median if median > 0 else 0.0
        if spread <= max_spread:
            break
    return {"median_ms": median, "p10_ms": p10, "p90_ms": p90, "min_ms": float(t.min()), "max_ms": float(t.max()),
            "runs": len(times), "spread": spread, "steady": spread <= max_spread}


def bench_file(path: Path, batches: Sequence[int], threads: int, repeat: int) -> list[dict[str, Any]]:
    if path.name.endswith("-symbol.json"):
        return _bench_symbol_with(path, batches, threads, repeat)
    if path.suffix == ".xml":
        return bench_ir(path, batches, threads, repeat)
    try:
        session = deploy_session(path, threads)
    except Exception as err:  # onnxruntime's errors share no base class
        raise ExportError(f"onnxruntime cannot load '{path}' ({short_reason(err)}); re-export it.") from None
    rows = []
    for b in batches:
        feeds = _inputs(session, path, b)
        stats = time_runs(lambda: session.run(None, feeds), repeat)
        rows.append({"file": str(path), "batch": b, **stats, "images_per_s": 1000 * b / stats["median_ms"],
                     "threads": session.get_session_options().intra_op_num_threads})
    return rows


def bench_ir(path: Path, batches: Sequence[int], threads: int, repeat: int) -> list[dict[str, Any]]:
    """An OpenVINO IR compiled for the CPU on ``threads`` inference threads (float32 precision
    for a float IR, as it was verified; an int8 IR runs its integer kernels)."""
    from gluontl.export import openvino_ir

    ov = openvino_ir.require()
    xml = openvino_ir.ir_xml(path)
    try:
        net = openvino_ir.compiled(ov.Core().read_model(str(xml)), threads)
    except Exception as err:
        raise ExportError(f"OpenVINO cannot load '{xml}' ({short_reason(err)}); re-export it.") from None
    shape = list(net.input(0).get_partial_shape())
    if any(not d.is_static for d in shape[1:]):
        raise ExportError(f"'{xml}' has free input sizes besides the batch; bench feeds fixed shapes.")
    rows = []
    for b in batches:
        x = np.random.default_rng(0).standard_normal([b, *(d.get_length() for d in shape[1:])]).astype(np.float32)
        request = net.create_infer_request()
        stats = time_runs(lambda: request.infer({0: x}), repeat)
        rows.append({"file": str(xml), "batch": b, **stats, "images_per_s": 1000 * b / stats["median_ms"],
                     "threads": threads})
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
        rows.append({"file": str(path), "batch": b, **stats, "images_per_s": 1000 * b / stats["median_ms"],
                     "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None})  # as this MXNet started
    return rows


def _bench_symbol_with(path: Path, batches: Sequence[int], threads: int, repeat: int) -> list[dict[str, Any]]:
    """:func:`bench_symbol` in a child process whose MXNet starts with OMP_NUM_THREADS=``threads``
    (this process's MXNet kept the thread count it started with)."""
    here = str(Path(__file__).resolve().parents[2])  # the child imports this gluontl
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MXNET_CPU_WORKER_NTHREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    args = [sys.executable, "-m", "gluontl.export.bench", str(path), ",".join(map(str, batches)), str(repeat)]
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise ExportError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else
                          f"timing '{path}' in MXNet failed (exit {done.returncode}); run `gluontl bench {path}` "
                          f"again.")
    return json.loads(done.stdout)


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
            entry["speedup_steady"] = {str(f["batch"]): f["steady"] and q["steady"]
                                       for f, q in zip(entry["float"]["runs"], entry["int8"]["runs"])}
            entry["size_ratio"] = entry["float"]["bytes"] / entry["int8"]["bytes"]
        results.append(entry)
    _against_float_onnx(results)
    report = {"cpu": {**cpu.flag_summary(flags), "described": cpu.describe(flags)}, "threads": threads,
              "repeat": repeat, "warmup": _WARMUP, "max_spread": MAX_SPREAD, "max_rounds": MAX_ROUNDS,
              "onnxruntime": ort.__version__, "session": "CPUExecutionProvider, all graph optimizations",
              "models": results}
    if any(Path(e[k]["file"]).name.endswith("-symbol.json") for e in results for k in ("float", "int8") if k in e):
        report["mxnet"] = {"version": mx.__version__, "omp_threads": threads,
                           "graph": "SymbolBlock hybridized (static_alloc, static_shape), in a child process "
                                    "started with OMP_NUM_THREADS=threads"}
    if any(Path(e[k]["file"]).suffix == ".xml" for e in results for k in ("float", "int8") if k in e):
        from gluontl.export import openvino_ir

        report["openvino"] = openvino_ir.require().__version__
    run = RunFolder(target)
    folder = run.export_dir if run.is_run() else target if target.is_dir() else target.parent
    path = write_text(Path(out) if out else folder / RunFolder.BENCH, json.dumps(report, indent=1), ExportError)
    return report, path


def _against_float_onnx(results: list[dict[str, Any]]) -> None:
    """Each run's speed against the float ONNX file of the same name in onnxruntime (the baseline
    every deployment has), as ``vs_onnx`` (its median / this median), where that file was benched."""
    def stem(file: str) -> str:
        p = Path(file)
        for int8, flt in SUFFIXES:
            for end in (int8, flt):
                if p.name.endswith(end):
                    return p.name[: -len(end)]
        return p.name

    base = {stem(e["float"]["file"]): {r["batch"]: r["median_ms"] for r in e["float"]["runs"]}
            for e in results if "float" in e and e["float"]["file"].endswith(".onnx")}
    for entry in results:
        for kind in ("float", "int8"):
            for r in entry.get(kind, {}).get("runs", []):
                ms = base.get(stem(r["file"]), {}).get(r["batch"])
                if ms is not None:
                    r["vs_onnx"] = ms / r["median_ms"]


def table(report: dict[str, Any]) -> str:
    """The report as aligned text: one row per file and batch, the int8 speed-up beside int8 rows."""
    engines = f"onnxruntime {report['onnxruntime']}"
    if "openvino" in report:
        engines += f", OpenVINO {report['openvino']}"
    if "mxnet" in report:
        engines += f" and MXNet {report['mxnet']['version']}"
    lines = [f"CPU: {report['cpu']['described']}; {engines}, each on {report['threads']} thread(s); medians of "
             f"{report['repeat']} runs after {report['warmup']} warm-up runs, more (up to {report['max_rounds']} "
             f"rounds) until the p10-p90 spread is within {100 * report['max_spread']:.0f} % of the median"]
    header = ("file", "batch", "median ms", "p10-p90 ms", "spread", "runs", "images/s", "int8 speed-up",
              "vs float ONNX")
    rows, noisy = [], []
    for entry in report["models"]:
        for kind in ("float", "int8"):
            if kind not in entry:
                continue
            for r in entry[kind]["runs"]:
                ratio = entry.get("speedup", {}).get(str(r["batch"])) if kind == "int8" else None
                steady = entry.get("speedup_steady", {}).get(str(r["batch"]), True)
                if not r["steady"]:
                    noisy.append(f"{Path(r['file']).name} batch {r['batch']}")
                rows.append((Path(r["file"]).name, str(r["batch"]), f"{r['median_ms']:.2f}",
                             f"{r['p10_ms']:.2f}-{r['p90_ms']:.2f}", f"{100 * r['spread']:.0f} %"
                             + ("" if r["steady"] else " noisy"), str(r["runs"]), f"{r['images_per_s']:.1f}",
                             "" if not ratio else f"{ratio:.2f}x" if steady else f"? ({ratio:.2f}x, noisy)",
                             f"{r['vs_onnx']:.2f}x" if "vs_onnx" in r else ""))
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if noisy:
        lines.append(f"too noisy to tell: {', '.join(noisy)} kept a p10-p90 spread above "
                     f"{100 * report['max_spread']:.0f} % of the median after {report['max_rounds']} rounds (other "
                     f"work on this machine); its times and any speed-up from them are not reliable. Bench again "
                     f"on a quiet machine, or with more --repeat.")
    for entry in report["models"]:
        if "size_ratio" in entry:
            lines.append(f"{Path(entry['int8']['file']).name}: {entry['int8']['bytes']:,} bytes, "
                         f"the float file is {entry['size_ratio']:.2f}x its size")
    return "\n".join(lines)


def _main(argv: list[str]) -> int:
    """``python -m gluontl.export.bench SYMBOL_JSON BATCHES REPEAT``: :func:`bench_symbol`'s rows as
    JSON, in the process :func:`_bench_symbol_with` starts with the thread count it wants."""
    try:
        rows = bench_symbol(Path(argv[0]), [int(b) for b in argv[1].split(",")], int(argv[2]))
    except ExportError as err:
        print(str(err).replace("\n", " "), file=sys.stderr)
        return 2
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
