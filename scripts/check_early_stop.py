"""Check an early-stopped run against Lightning's EarlyStopping rule, worked out here by hand from
the run's own ``metrics.jsonl`` (none of gluontl's callback code is used), and that its export is
the best checkpoint's weights.

Usage: python scripts/check_early_stop.py RUN MONITOR PATIENCE [--mode max|min] [--min-delta D]

Lightning's rule, counted in validations: a value improves when it beats the best so far by more
than ``min_delta``; otherwise the wait grows, and the run stops once it reaches ``patience``.
Checks: the last epoch row is the epoch the rule stops at, ``summary.json`` and the run card say
that epoch, ``checkpoints/best.json`` is the best epoch (first of ties) by the run's ``train.select``,
and an ONNX file in ``RUN/export`` holds the arrays in which best.params differs from last.params
(and none of last's). Exit 1 on a failed check.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path


def stop_epoch(values: list[tuple[int, float]], patience: int, mode: str, min_delta: float) -> int | None:
    best, wait = None, 0
    for epoch, v in values:
        if best is None or (v > best + min_delta if mode == "max" else v < best - min_delta):
            best, wait = v, 0
        else:
            wait += 1
            if wait >= patience:
                return epoch
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("monitor")
    ap.add_argument("patience", type=int)
    ap.add_argument("--mode", default="max")
    ap.add_argument("--min-delta", type=float, default=0.0)
    a = ap.parse_args()
    rows = [json.loads(line) for line in (a.run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    epochs = [r for r in rows if "epoch" in r]
    values = [(r["epoch"], r[a.monitor]) for r in epochs if a.monitor in r]
    want = stop_epoch(values, a.patience, a.mode, a.min_delta)
    summary = json.loads((a.run / "summary.json").read_text())
    card = json.loads((a.run / "preprocess.json").read_text())
    best_json = json.loads((a.run / "checkpoints" / "best.json").read_text())
    select = best_json["best"]["select"]  # train.select: losses are better lower, the rest higher
    sign = -1 if select.endswith("loss") else 1
    best_epoch = max((r for r in epochs if select in r), key=lambda r: (sign * r[select], -r["epoch"]))["epoch"]
    print(f"{a.monitor} by epoch: " + ", ".join(f"{e}: {v:.4f}" for e, v in values))
    checks = {
        f"the rule stops after epoch {want}; the last row is epoch {epochs[-1]['epoch']}": epochs[-1]["epoch"] == want,
        f"summary.json stopped: {summary.get('stopped')}": (summary.get("stopped") or {}).get("epoch") == want,
        f"run card stopped: {card.get('stopped')}": (card.get("stopped") or {}).get("epoch") == want,
        f"best {select} epoch by hand {best_epoch}; best.json epoch {best_json.get('epoch')}": best_json.get("epoch") == best_epoch,
    }
    checks.update(_export_is_best(a.run))
    for text, ok in checks.items():
        print(("ok    " if ok else "FAIL  ") + text)
    return 0 if all(checks.values()) else 1


def _export_is_best(run: Path) -> dict[str, bool]:
    import mxnet as mx
    import onnx
    from onnx import numpy_helper

    def digest(a) -> str:
        return hashlib.sha256(a.astype(a.dtype.newbyteorder("<")).tobytes()).hexdigest()

    best = {k: v.asnumpy() for k, v in mx.nd.load(str(run / "checkpoints" / "best.params")).items()}
    last = {k: v.asnumpy() for k, v in mx.nd.load(str(run / "checkpoints" / "last.params")).items()}
    differ = [k for k in best if k in last and not (best[k] == last[k]).all()]
    files = sorted((run / "export").glob("*.onnx"))
    out = {f"an ONNX export in {run / 'export'}: {[f.name for f in files]}": bool(files)}
    for f in files:
        if ".int8" in f.name:
            continue
        held = {digest(numpy_helper.to_array(t)) for t in onnx.load(str(f)).graph.initializer}
        found_best = [k for k in differ if digest(best[k]) in held]
        found_last = [k for k in differ if digest(last[k]) in held]
        out[f"{f.name}: holds {len(found_best)} of the {len(differ)} arrays where best differs from last "
            f"({', '.join(found_best[:3])}...), {len(found_last)} of last's"] = bool(found_best) and not found_last
    return out


if __name__ == "__main__":
    sys.exit(main())
