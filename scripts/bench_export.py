"""Time onnxruntime on mx.onnx's raw export vs gluontl's lean export, and MXNet itself.

Usage: python scripts/bench_export.py [--repeats 10] [--threads N] [--json rows.json]

Everything runs in one process on random-init zoo models (224x224, batch 1 and 32); the
three timings of a row are interleaved run by run, so they share the machine state.
Medians (and minima) of ``--repeats`` runs after warm-up; absolute numbers are noisy when
other work shares the CPU, ratios less so.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet18_v1", "mobilenetv2_1.0"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", type=Path, help="write the rows as a JSON list here")
    return ap.parse_args()


def _time_ms(runs: dict[str, Callable[[], object]], warmup: int, repeats: int) -> dict[str, list[float]]:
    """Wall times of each run; runs are interleaved round-robin so that load from other
    processes hits all of them alike and their ratios stay meaningful."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for key, run in runs.items():
            start = time.perf_counter()
            run()
            times[key].append(1000 * (time.perf_counter() - start))
    return times


def main() -> None:
    args = _parse()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # read by MXNet at import
    import gluontl  # noqa: F401  (numpy's removed aliases, before mxnet)
    import mxnet as mx
    import numpy as np
    import onnxruntime as ort
    from mxnet.gluon.model_zoo import vision

    from gluontl.export import export_onnx

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3  # mx.onnx raw files trigger one warning per weight input
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            net = vision.get_model(name, classes=1000)
            net.initialize(mx.init.Xavier())
            net.hybridize(static_alloc=True, static_shape=True)
            shape = (1, 3, args.size, args.size)
            net(mx.nd.zeros(shape))
            net.export(f"{tmp}/{name}")
            raw = f"{tmp}/{name}-raw.onnx"
            mx.onnx.export_model(f"{tmp}/{name}-symbol.json", f"{tmp}/{name}-0000.params", [shape], np.float32,
                                 raw, dynamic=True, dynamic_input_shapes=[(None, *shape[1:])])
            lean = export_onnx(net, f"{tmp}/{name}-lean.onnx", {"data": shape})
            sessions = {k: ort.InferenceSession(str(p), opts, providers=["CPUExecutionProvider"])
                        for k, p in (("raw", raw), ("lean", lean))}
            for batch in args.batches:
                x = np.random.RandomState(batch).uniform(-1, 1, (batch, *shape[1:])).astype(np.float32)
                xs = mx.nd.array(x)
                feeds = {k: {s.get_inputs()[0].name: x} for k, s in sessions.items()}
                outs = {k: s.run(None, feeds[k])[0] for k, s in sessions.items()}
                ref = net(xs).asnumpy()
                ms = _time_ms({"mxnet": lambda: net(xs).asnumpy(),
                                 "ort_raw": lambda: sessions["raw"].run(None, feeds["raw"]),
                                 "ort_lean": lambda: sessions["lean"].run(None, feeds["lean"])},
                                args.warmup, args.repeats)
                # Medians are the headline; minima are what the CPU can do when nothing interferes.
                row = {"model": name, "batch": batch, "threads": args.threads, "repeats": args.repeats,
                       **{f"{k}_ms": statistics.median(v) for k, v in ms.items()},
                       **{f"{k}_min_ms": min(v) for k, v in ms.items()},
                       "lean_rel_err": float(np.linalg.norm(outs["lean"] - ref) / np.linalg.norm(ref)),
                       "raw_rel_err": float(np.linalg.norm(outs["raw"] - ref) / np.linalg.norm(ref))}
                row["raw_over_lean"] = row["ort_raw_ms"] / row["ort_lean_ms"]
                row["mxnet_over_lean"] = row["mxnet_ms"] / row["ort_lean_ms"]
                row["raw_over_lean_min"] = row["ort_raw_min_ms"] / row["ort_lean_min_ms"]
                rows.append(row)
                print(f"{name:16s} b={batch:<3d} mxnet {row['mxnet_ms']:8.1f} ms  ort raw {row['ort_raw_ms']:8.1f} ms  "
                      f"ort lean {row['ort_lean_ms']:8.1f} ms  raw/lean {row['raw_over_lean']:5.2f}x "
                      f"(of minima {row['raw_over_lean_min']:5.2f}x)  "
                      f"mxnet/lean {row['mxnet_over_lean']:5.2f}x  (rel err raw {row['raw_rel_err']:.1e}, "
                      f"lean {row['lean_rel_err']:.1e})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
