"""Issue 40's restart measurement on a README recipe: ``gluontl launch --max-restarts 2 -n 2 --
finetune --recipe R`` with worker 1 killed (SIGKILL) after rank 0's epoch-2 line and again after
the restarted job's epoch-4 line must end exit 0 with the uninterrupted run's weights.

Usage: python scripts/restart_recipe.py [--recipe recipes/resnet18_freeze.yaml] [--kill-at 2 4] [--keep DIR]

Runs in the current folder (the recipe's ``weights_from`` pretrain is made there once, by the first
launch, under .cache/); the run folders go to a temporary folder (or ``--keep DIR``). First the
uninterrupted job, then the killed one; prints each job's wall time, the restarts record and the
SHA-256 of ``best.params`` and ``last.params`` of both runs, and exits 1 when they differ.
Set OMP_NUM_THREADS=1 on a shared machine (the launcher otherwise splits the cores).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gluontl.runfolder import RunFolder


def _children(root: int) -> list[int]:
    """Every process below ``root`` now."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parent[int(name)] = int(Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    found, todo = [], [root]
    while todo:
        p = todo.pop()
        kids = [c for c, up in parent.items() if up == p]
        found += kids
        todo += kids
    return found


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(v.decode(errors="replace").partition("=")[::2] for v in raw.split(b"\0") if v)


def _launch(args: list[str], kill_at: list[int], epochs: int) -> tuple[int, float, list[int]]:
    """Runs ``gluontl launch ARGS``; after rank 0's line ``epoch K/epochs`` for each K of
    ``kill_at`` in turn, SIGKILL to worker 1. Returns the exit code, wall time and killed PIDs."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "gluontl", "launch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)], daemon=True).start()
    killed, todo = [], list(kill_at)
    while (line := lines.get()) is not None:
        sys.stdout.write(line)
        if todo and re.match(rf"^\[worker \d\] epoch {todo[0]}/{epochs}\b", line):
            worker = [p for p in _children(proc.pid) if _environ(p).get("DMLC_ROLE") == "worker"
                      and _environ(p).get("GLUONTL_LAUNCH_INDEX") == "1"]
            if len(worker) == 1:
                os.kill(worker[0], signal.SIGKILL)
                killed.append(worker[0])
                print(f"restart_recipe: killed worker 1 (pid {worker[0]}) after epoch {todo[0]}", flush=True)
            todo.pop(0)
    code = proc.wait()
    return code, time.perf_counter() - t0, killed


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default="recipes/resnet18_freeze.yaml")
    p.add_argument("--kill-at", type=int, nargs="+", default=[2, 4])
    p.add_argument("--keep", type=Path, help="put the run folders here instead of a temporary folder")
    a = p.parse_args()
    import yaml

    recipe = yaml.safe_load(Path(a.recipe).read_text())
    epochs, weights = recipe["train"]["epochs"], recipe.get("model", {}).get("weights")
    made = bool(weights) and not Path(weights).exists()  # the first launch makes it: in its wall time
    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep or Path(tmp)
        common = ["-n", "2", "--", "finetune", "--recipe", a.recipe, "-q"]
        full = _launch([*common[:-1], "--runs", str(root / "full"), "-q"], [], epochs)
        killed = _launch(["--max-restarts", str(len(a.kill_at)), "--restart-delay", "0", *common[:-1], "--runs",
                          str(root / "killed"), "-q"], a.kill_at, epochs)
        (ra,), (rb,) = (root / "full").iterdir(), (root / "killed").iterdir()
        restarts = RunFolder(rb).restarts_path
        rows = [json.loads(x) for x in restarts.read_text().splitlines()] if restarts.is_file() else []
        print(f"\nrecipe {a.recipe}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
        print(f"uninterrupted: exit {full[0]}, {full[1]:.0f} s wall"
              + (f" (with making {weights} first)" if made else ""))
        print(f"killed at epochs {a.kill_at} (pids {killed[2]}): exit {killed[0]}, {killed[1]:.0f} s wall, "
              f"{len(rows)} restart(s) from steps {[r['from_step'] for r in rows]} "
              f"(epochs {[r['from_epoch'] for r in rows]})")
        same = True
        for tag in ("best", "last"):
            x, y = _sha(RunFolder(ra).checkpoint_params(tag)), _sha(RunFolder(rb).checkpoint_params(tag))
            same &= x == y
            print(f"{tag}.params SHA-256: uninterrupted {x}, killed {y}: {'equal' if x == y else 'DIFFERENT'}")
        ok = full[0] == 0 and killed[0] == 0 and same and len(rows) == len(a.kill_at)
        print("result:", "exit 0 with the uninterrupted run's weights" if ok else "FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
