"""The ELPV demo with each frozen-prefix engine, back to back on one machine state:
onnxruntime float, onnxruntime int8, OpenVINO float, OpenVINO int8 (issue 38). Each is one
``scripts/bench_demo.py`` run (finetune + evaluate, two processes) with ``--set
train.prefix_engine=ENGINE``; the table gives cache-fill seconds, whole-job seconds, CPU seconds
and val top-1 / balanced accuracy, each engine's log line saying what ran (an int8 engine whose
agreement check failed runs its float one, and says so).

Usage: python scripts/bench_prefix_engines.py [--code DIR] [--engines onnxruntime,openvino,...] [--json out.json]
                                             [--set KEY=VALUE ...]

Ratios are against the first engine listed (onnxruntime float by default), run in the same
invocation. ``--set`` goes to every finetune (``--set train.epochs=1``: a smoke run, the cache
fill whole and one suffix epoch); ``--recipe`` runs another classification recipe (a smoke run:
``--recipe recipes/resnet18_freeze.yaml``, its pretrained backbone made once by its weights_from).

Needs OpenVINO (and NNCF for openvino-int8) in this Python: the [openvino] and [openvino-int8]
extras. ``--code DIR``: the checkout to run (its recipe schema must list the openvino engines).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINES = ("onnxruntime", "onnxruntime-int8", "openvino", "openvino-int8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", type=Path, default=ROOT)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--set", dest="sets", action="append", default=[], help="passed to every finetune")
    ap.add_argument("--recipe", type=Path, default=None, help="another classification recipe than the ELPV demo's "
                    "(a smoke run: recipes/resnet18_freeze.yaml)")
    args = ap.parse_args()
    results = []
    for engine in args.engines.split(","):
        with tempfile.TemporaryDirectory(prefix=f"bench-prefix-{engine}-") as d:
            out = Path(d) / "res.json"
            subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_demo.py"), "--code", str(args.code),
                            "--runs", str(Path(d) / "runs"), "--json", str(out),
                            *[a for x in args.sets for a in ("--set", x)],
                            *(["--recipe", str(args.recipe.resolve())] if args.recipe else []),
                            "--set", f"train.prefix_engine={engine}"], check=True)
            res = json.loads(out.read_text())
        res.pop("evaluate_out", None)
        results.append({"asked": engine, **res})
    base = results[0]
    for r in results:  # > 1: faster than the first engine
        r["cache_fill_speedup"] = round(base["cache_fill"] / r["cache_fill"], 3) if r["cache_fill"] else None
        r["job_speedup"] = round(base["wall"] / r["wall"], 3)
    print(f"{'asked':18} {'ran':18} {'cache fill s':>12} {'job s':>7} {'CPU s':>7} {'top-1':>7} {'balanced':>8} "
          f"{'fill x':>7} {'job x':>6}  (x: speed-up against {base['asked']})")
    for r in results:
        fill_x = f"{r['cache_fill_speedup']:.2f}" if r["cache_fill_speedup"] else "-"
        print(f"{r['asked']:18} {r['prefix_engine']:18} {r['cache_fill']:12.1f} {r['wall']:7.1f} {r['cpu']:7.1f} "
              f"{r['val_top1']:7.4f} {r['val_balanced_acc']:8.4f} {fill_x:>7} {r['job_speedup']:6.2f}")
    for r in results:
        print(f"{r['asked']}: {r['engine_log']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
