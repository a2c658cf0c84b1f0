"""What data parallelism costs on one machine: N workers x 1 thread (``gluontl launch``, MXNet's
parameter server on loopback) against 1 worker x N threads, same recipe, same global batch.

Usage: python scripts/bench_dist.py [--recipe R] [--batch 16] [--steps 30] [--warmup 5] [--set K=V ...]

Both are real ``gluontl finetune`` jobs, stopped after ``--steps`` optimizer steps. images/s is the
median of the per-step ``img_per_s`` rows of metrics.jsonl (global images over the step's wall time,
which for the workers includes the parameter-server round trip) after ``--warmup`` steps, so set-up
(model, data check, feature cache) is left out; wall time is printed as well. ``--batch`` is the
per-worker batch: the single process gets workers x batch. ratio = distributed / single.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run(cmd: list[str], threads: int | None, runs: Path) -> tuple[float, float]:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    (run,) = runs.iterdir()
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["img_per_s"] for r in rows if "img_per_s" in r and r["step"] > ARGS.warmup), wall


def main() -> None:
    gl = [sys.executable, "-m", "gluontl"]
    common = ["--recipe", ARGS.recipe, "-q", "--stop-after-steps", str(ARGS.steps), "--set", "train.log_every=1",
              *[a for s in ARGS.set for a in ("--set", s)]]
    n = ARGS.workers
    with tempfile.TemporaryDirectory() as tmp:
        single_runs, dist_runs = Path(tmp, "single"), Path(tmp, "dist")
        single = _run([*gl, "finetune", *common, "--runs", str(single_runs), "--set",
                       f"data.batch_size={n * ARGS.batch}"], n, single_runs)
        dist = _run([*gl, "launch", "-n", str(n), "--", "finetune", *common, "--runs", str(dist_runs), "--set",
                     f"data.batch_size={ARGS.batch}", "--set", "train.distributed.backend=kvstore"], None, dist_runs)
    print(f"recipe {ARGS.recipe}, global batch {n * ARGS.batch}, {ARGS.steps} steps "
          f"(median of steps > {ARGS.warmup}); extra: {' '.join(ARGS.set) or 'none'}")
    print(f"1 worker x {n} threads:  {single[0]:8.1f} img/s  (job wall time {single[1]:.0f} s)")
    print(f"{n} workers x 1 thread:  {dist[0]:8.1f} img/s  (job wall time {dist[1]:.0f} s)")
    print(f"ratio distributed/single: {dist[0] / single[0]:.3f} (img/s), {single[1] / dist[1]:.3f} (wall)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="recipes/elpv_efficientnet_lite0.yaml")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=16, help="per-worker batch")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--set", action="append", default=[], help="recipe override for both jobs")
    ARGS = p.parse_args()
    main()
