"""What data parallelism costs on one machine: N workers x 1 thread (``gluontl launch``, MXNet's
parameter server on loopback) against 1 worker x N threads, same recipe, same global batch.

Usage: python scripts/bench_dist.py [--recipe R] [--batch 16] [--steps 30] [--warmup 5] [--set K=V ...] [--two-host]

Both are real ``gluontl finetune`` jobs, stopped after ``--steps`` optimizer steps. images/s is the
median of the per-step ``img_per_s`` rows of metrics.jsonl (global images over the step's wall time,
which for the workers includes the parameter-server round trip) after ``--warmup`` steps, so set-up
(model, data check, feature cache) is left out; wall time is printed as well. ``--batch`` is the
per-worker batch: the single process gets workers x batch. ratio = distributed / single.

``--two-host`` (root, network namespaces: tests/dist/netns.py makes the hosts, as the multi-host
tests do) adds the same distributed job across two hosts: 3 namespaces on a bridge (veth pairs),
the launcher and scheduler on the third, a worker on each of the other two through the real ssh
path (``--hosts``, ``HOST cpus=1``: one thread each, as on loopback), once over the unlimited veth,
then with a ``tc tbf`` link of 1 Gbit/s and of 100 Mbit/s out of each worker host; each row's
ratio is two-host / loopback.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the multi-host tests' namespaces
from tests.dist import netns  # noqa: E402

LINKS = (None, "1gbit", "100mbit")  # tc tbf rates out of each worker host; None: the bare veth


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


def _two_host(cluster: "netns.Cluster", args: list[str], runs: Path, rate: str | None) -> tuple[float, float]:
    """The launch across the namespaces: the launcher on the third host, ``args`` after --hosts."""
    hosts = runs.parent / f"hosts-{runs.name}"
    hosts.write_text("".join(f"{cluster.address[h]} cpus=1\n" for h in cluster.hosts[:2]))
    if rate is not None:  # burst: at least rate / HZ bytes, or tbf cannot reach its rate
        for h in cluster.hosts[:2]:
            cluster.exec(h, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", rate, "burst", "256kb",
                         "latency", "50ms")
    try:
        return _run(["ip", "netns", "exec", cluster.hosts[2], sys.executable, "-m", "gluontl", "launch", "--hosts",
                     str(hosts), "--ssh", cluster.ssh(), *args], None, runs)
    finally:
        if rate is not None:
            for h in cluster.hosts[:2]:
                cluster.exec(h, "tc", "qdisc", "del", "dev", "eth0", "root")


def main() -> None:
    gl = [sys.executable, "-m", "gluontl"]
    common = ["--recipe", ARGS.recipe, "-q", "--stop-after-steps", str(ARGS.steps), "--set", "train.log_every=1",
              *[a for s in ARGS.set for a in ("--set", s)]]
    n = ARGS.workers
    with tempfile.TemporaryDirectory() as tmp:
        single_runs, dist_runs = Path(tmp, "single"), Path(tmp, "dist")
        single = _run([*gl, "finetune", *common, "--runs", str(single_runs), "--set",
                       f"data.batch_size={n * ARGS.batch}"], n, single_runs)
        job = ["-n", str(n), "--", "finetune", *common, "--set", f"data.batch_size={ARGS.batch}", "--set",
               "train.distributed.backend=kvstore"]
        dist = _run([*gl, "launch", *job, "--runs", str(dist_runs)], None, dist_runs)
        two = {}
        if ARGS.two_host:
            cluster = netns.Cluster(Path(tmp), {"PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                                                "GLUONTL_HOME": os.environ.get("GLUONTL_HOME", "")})
            try:
                for rate in LINKS:
                    runs = Path(tmp, f"two-{rate or 'veth'}")
                    two[rate] = _two_host(cluster, [*job, "--runs", str(runs)], runs, rate)
            finally:
                cluster.close()
    print(f"recipe {ARGS.recipe}, global batch {n * ARGS.batch}, {ARGS.steps} steps "
          f"(median of steps > {ARGS.warmup}); extra: {' '.join(ARGS.set) or 'none'}")
    print(f"1 worker x {n} threads:  {single[0]:8.1f} img/s  (job wall time {single[1]:.0f} s)")
    print(f"{n} workers x 1 thread:  {dist[0]:8.1f} img/s  (job wall time {dist[1]:.0f} s)")
    print(f"ratio distributed/single: {dist[0] / single[0]:.3f} (img/s), {single[1] / dist[1]:.3f} (wall)")
    for rate, (ips, wall) in two.items():
        link = f"tbf {rate}" if rate else "veth, unlimited"
        print(f"{n} workers on 2 hosts ({link}): {ips:8.1f} img/s  (job wall time {wall:.0f} s); ratio to loopback "
              f"{ips / dist[0]:.3f} (img/s), {dist[1] / wall:.3f} (wall)")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="recipes/elpv_efficientnet_lite0.yaml")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=16, help="per-worker batch")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--set", action="append", default=[], help="recipe override for both jobs")
    p.add_argument("--two-host", action="store_true", help="add the distributed job over two network namespaces "
                   "(root; unlimited veth, tbf 1 Gbit/s, tbf 100 Mbit/s)")
    ARGS = p.parse_args()
    if ARGS.two_host and (why := netns.unavailable()):
        sys.exit(f"--two-host: {why}")
    main()
