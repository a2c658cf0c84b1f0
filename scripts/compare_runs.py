"""Whether two run folders computed the same thing: their ``metrics.jsonl`` rows without the
timing keys, and the SHA-256 of ``checkpoints/best.params``. For "bit-identical before/after"
checks of a change to the loop (the demos of main against a branch's).

Usage: python scripts/compare_runs.py RUN_A RUN_B

Prints each difference (the first 10 rows that differ, key by key) and exits 1 if there is
any, 2 if a folder lacks a file, 0 if both agree. Rows compare as parsed JSON, so floats must
be equal to the last bit; the timing keys (``seconds``, ``img_per_s``) are left out.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

TIMING = ("seconds", "img_per_s")


def rows(run: Path) -> list[dict]:
    out = []
    for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            out.append({k: v for k, v in row.items() if k not in TIMING})
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def compare(a: Path, b: Path) -> list[str]:
    """The differences between run folders ``a`` and ``b``, as lines (empty: the same)."""
    diffs = []
    ra, rb = rows(a), rows(b)
    if len(ra) != len(rb):
        diffs.append(f"metrics.jsonl: {len(ra)} rows in {a}, {len(rb)} in {b}")
    shown = 0
    for i, (x, y) in enumerate(zip(ra, rb), 1):
        if x != y and shown < 10:
            shown += 1
            keys = [k for k in dict.fromkeys([*x, *y]) if x.get(k, "<missing>") != y.get(k, "<missing>")]
            diffs.append(f"metrics.jsonl row {i}: " + "; ".join(
                f"{k}: {x.get(k, '<missing>')!r} vs {y.get(k, '<missing>')!r}" for k in keys))
    ha, hb = sha256(a / "checkpoints" / "best.params"), sha256(b / "checkpoints" / "best.params")
    if ha != hb:
        diffs.append(f"checkpoints/best.params SHA-256: {ha} vs {hb}")
    return diffs


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    a, b = map(Path, argv)
    for run in (a, b):
        for name in ("metrics.jsonl", "checkpoints/best.params"):
            if not (run / name).is_file():
                print(f"{run / name} does not exist: is {run} a finished run folder?", file=sys.stderr)
                return 2
    diffs = compare(a, b)
    for line in diffs:
        print(line)
    if not diffs:
        print(f"same: {len(rows(a))} metrics.jsonl rows (without {', '.join(TIMING)}) and best.params SHA-256 "
              f"{sha256(a / 'checkpoints' / 'best.params')}")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
