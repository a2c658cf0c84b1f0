"""Where the main demo's time goes: `gluontl finetune` on the ELPV recipe, then `gluontl evaluate`
of its run, as scripts/demo.sh runs them (two processes), split as issue #22 splits it.

Usage: python scripts/bench_demo.py [--code DIR] [--runs DIR] [--json out.json] [--set KEY=VALUE ...]

  * cache fill: the frozen prefix's passes over the cached views and val, image decoding included
    (``summary.json`` ``feature_cache.cache_fill_seconds``);
  * suffix training: the epochs (``metrics.jsonl`` ``seconds``) less the cache fill;
  * everything else: both processes' wall time less the epochs (imports, model load and check,
    plan, agreement probe, guards, export with verification, evaluate).

``--code DIR`` runs another checkout of gluontl (e.g. the commit before a change, from
``git archive``), so before and after can run back to back on the same machine state. CPU
seconds (user + system of both processes) are printed beside wall seconds, and split into the
epochs and everything else (the finetune process is sampled every 0.2 s, its epoch ends seen as
their metrics rows appear): on a shared machine they move far less than wall time. The demo's accuracy and balanced accuracy come from evaluate.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads, waited-for children) of a running process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _timed(cmd: list[str], env: dict[str, str], cwd: Path, metrics: Path | None = None
           ) -> tuple[float, float, str, list[tuple[float, float, int]]]:
    """Wall seconds, CPU seconds (user + system, children included) and stdout of ``cmd``, and
    samples (wall, CPU, epoch rows in ``metrics`` DIR/*/metrics.jsonl so far) every 0.2 s: when
    an epoch's row appears its end is known, so the CPU seconds of the epochs can be told apart
    from the rest, on any checkout (the run records wall time only)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    samples = []
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, text=True, cwd=cwd)
        while proc.poll() is None:
            rows = 0
            if metrics is not None:
                rows = sum(f.read_text().count('"epoch": ') for f in metrics.glob("*/metrics.jsonl"))
            try:
                samples.append((time.perf_counter() - t0, _cpu(proc.pid), rows))
            except (OSError, IndexError, ValueError):  # it ended between poll and read
                break
            time.sleep(0.2)
        if proc.wait() != 0:
            raise subprocess.CalledProcessError(proc.returncode, cmd)
        out.seek(0)
        text = out.read()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), text, samples


def _epoch_cpu(samples: list[tuple[float, float, int]], seconds: list[float]) -> float:
    """CPU seconds spent inside the epochs: epoch k ends at the first sample that sees its row
    and began ``seconds[k]`` earlier; CPU at those moments is interpolated between samples."""
    import numpy as np

    wall, cpu, rows = (np.array(c, dtype=float) for c in zip(*samples))
    total = 0.0
    for k, s in enumerate(seconds):
        end = wall[np.argmax(rows >= k + 1)] if (rows >= k + 1).any() else wall[-1]
        total += float(np.interp(end, wall, cpu) - np.interp(end - s, wall, cpu))
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="the gluontl checkout to run (default: this one)")
    ap.add_argument("--runs", type=Path, default=None, help="where the run folder goes (default: a temp folder)")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    ap.add_argument("--set", dest="sets", action="append", default=[], help="passed to finetune")
    ap.add_argument("--recipe", type=Path, default=None, help="another classification recipe (default: the "
                    "checkout's recipes/elpv_efficientnet_lite0.yaml)")
    args = ap.parse_args()
    code = args.code.resolve()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(code), os.environ.get("PYTHONPATH")])))
    env.setdefault("GLUONTL_HOME", str(Path.home() / ".cache" / "gluontl"))
    runs = (args.runs or Path(tempfile.mkdtemp(prefix="bench-demo-"))).resolve()
    recipe = args.recipe.resolve() if args.recipe else code / "recipes" / "elpv_efficientnet_lite0.yaml"
    sets = [a for s in args.sets for a in ("--set", s)]
    ft_wall, ft_cpu, out, samples = _timed([sys.executable, "-m", "gluontl", "finetune", "--recipe", str(recipe),
                                            "--runs", str(runs), "-q", *sets], env, code, runs)
    run = Path(re.findall(r"^done: .*; run folder (.*)$", out, re.M)[-1])
    ev_wall, ev_cpu, ev_out, _ = _timed([sys.executable, "-m", "gluontl", "evaluate", str(run)], env, code)
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    seconds = [r["seconds"] for r in rows if "epoch" in r]
    epochs, epochs_cpu = sum(seconds), _epoch_cpu(samples, seconds)
    fill = summary["feature_cache"]["cache_fill_seconds"] or 0.0
    wall = ft_wall + ev_wall
    top1 = float(re.search(r"top-1 ([\d.]+)", ev_out).group(1))
    balanced = float(re.search(r"balanced accuracy ([\d.]+)", ev_out).group(1))
    res = {"code": str(code), "sets": args.sets, "prefix_engine": summary["feature_cache"]["prefix_engine"],
           "engine_log": summary["feature_cache"]["log"], "val_top1": top1, "val_balanced_acc": balanced,
           "wall": round(wall, 1), "cpu": round(ft_cpu + ev_cpu, 1), "finetune_wall": round(ft_wall, 1),
           "evaluate_wall": round(ev_wall, 1), "cache_fill": round(fill, 1), "suffix_training": round(epochs - fill, 1),
           "everything_else": round(wall - epochs, 1), "finetune_cpu": round(ft_cpu, 1),
           "evaluate_cpu": round(ev_cpu, 1), "epochs_cpu": round(epochs_cpu, 1),
           "everything_else_cpu": round(ft_cpu - epochs_cpu + ev_cpu, 1), "evaluate_out": ev_out, "run": str(run)}
    print(f"{res['prefix_engine']}: val top-1 {top1:.4f}, balanced {balanced:.4f}; wall {wall:.1f} s (CPU "
          f"{res['cpu']} s): cache fill {fill:.1f} s ({fill / wall:.0%}), suffix training {epochs - fill:.1f} s "
          f"({(epochs - fill) / wall:.0%}), everything else {wall - epochs:.1f} s ({(wall - epochs) / wall:.0%}; "
          f"finetune {ft_wall - epochs:.1f} s, evaluate {ev_wall:.1f} s)")
    print(f"CPU seconds: epochs {epochs_cpu:.1f}, everything else {res['everything_else_cpu']:.1f} (finetune "
          f"{ft_cpu - epochs_cpu:.1f}, evaluate {ev_cpu:.1f})")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
