"""What a sweep costs against one fine-tune (issue 34), in one process: a plain `gluontl finetune`
of the ELPV demo recipe (wall time T), then a 16-trial TPE sweep with the median pruner over lr, wd,
views, label smoothing and two cut points, its trials sharing one frozen-prefix cache.

Usage: python scripts/bench_sweep.py [--recipe recipes/elpv_efficientnet_lite0.yaml] [--trials 16]
                                     [--out DIR] [--json out.json]

Prints both wall times and their ratio (required <= 5), the plain run's and the sweep's best value
(required: sweep >= plain), the prefix passes (images through the frozen prefix; required <= (train
images x views + val images) x cuts) and peak RSS after the plain run and after the sweep (required:
sweep <= 2 x plain). Needs $GLUONTL_HOME/models/efficientnet_lite0_imagenet.onnx (scripts/demo.sh).
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CUTS = [  # the recipe's own cut (blocks.15, conv_head and the head train), and a deeper one (conv_head and the head)
    [{"match": "*", "grad_req": "null"}, {"type": "BatchNorm", "bn": "frozen"},
     {"match": ["blocks.15.*", "conv_head.*", "head.*"], "grad_req": "write"}],
    [{"match": "*", "grad_req": "null"}, {"type": "BatchNorm", "bn": "frozen"},
     {"match": ["conv_head.*", "head.*"], "grad_req": "write"}]]
SPACE = {"train.lr": {"log_uniform": [2e-4, 5e-3]}, "train.wd": {"log_uniform": [1e-6, 1e-3]},
         "train.cache_views": {"choice": [2, 4]}, "train.label_smoothing": {"uniform": [0.0, 0.2]},
         "rules": {"choice": CUTS}}


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recipe", default=str(ROOT / "recipes" / "elpv_efficientnet_lite0.yaml"))
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--space", default=None, help="a space YAML file instead of the built-in one (whose cut "
                    "points are the ELPV recipe's)")
    ap.add_argument("--out", default=None, help="folder for runs/ and sweeps/ (default: a temp folder)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import gluontl
    from gluontl.api import finetune
    from gluontl.recipe import load_recipe

    from gluontl.readers import read_yaml

    out = Path(args.out or tempfile.mkdtemp(prefix="bench_sweep-"))
    recipe = load_recipe(args.recipe)
    space = SPACE if args.space is None else read_yaml(args.space, ValueError, "the space")
    select = recipe.train.select
    start = time.perf_counter()
    plain = finetune(recipe, runs_root=out / "runs", quiet=True)
    t_plain = time.perf_counter() - start
    rss_plain = peak_rss_mib()
    plain_value = plain.best[select]
    print(f"plain fine-tune: {t_plain:.1f}s, best {select} {plain_value:.4f}, peak RSS {rss_plain:.0f} MiB", flush=True)

    start = time.perf_counter()
    result = gluontl.sweep(recipe, space, trials=args.trials, root=out / "sweeps", sampler="tpe", pruner="median")
    t_sweep = time.perf_counter() - start
    rss_sweep = peak_rss_mib()
    summary = json.loads((plain.run_dir / "summary.json").read_text())
    train_images = json.loads((plain.run_dir / "preprocess.json").read_text()).get("train_images")
    cuts = len({json.dumps(c) for c in space["rules"]["choice"]}) if "rules" in space else 1
    views = max(space["train.cache_views"]["choice"]) if "train.cache_views" in space else \
        max(recipe.train.cache_views, 1)
    rows = [r for r in result.table]
    passes_log = [json.loads(line) for line in (result.folder / "features" / "passes.jsonl").read_text().splitlines()]
    n_train = max((p["rows"] for p in passes_log if p["what"].startswith("train")), default=0)
    n_val = max((p["rows"] for p in passes_log if p["what"] == "val"), default=0)
    bound = (n_train * views + n_val) * cuts
    states = {s: sum(r["state"] == s for r in rows) for s in ("COMPLETE", "PRUNED", "FAIL")}
    report = {"plain_seconds": round(t_plain, 1), "sweep_seconds": round(t_sweep, 1),
              "ratio": round(t_sweep / t_plain, 2), "plain_best": plain_value, "sweep_best": result.best_value,
              "prefix_passes": result.prefix_passes, "passes_bound": bound, "train_images": n_train or train_images,
              "val_images": n_val, "trials": states, "peak_rss_plain_mib": round(rss_plain),
              "peak_rss_after_sweep_mib": round(rss_sweep), "rss_ratio": round(rss_sweep / rss_plain, 2),
              "plain_cache_fill_seconds": (summary.get("feature_cache") or {}).get("cache_fill_seconds"),
              "sweep_folder": str(result.folder)}
    print(f"sweep: {args.trials} trials ({states['COMPLETE']} complete, {states['PRUNED']} pruned, "
          f"{states['FAIL']} failed) in {t_sweep:.1f}s")
    print(f"ratio sweep/plain: {t_sweep / t_plain:.2f} (required <= 5)")
    print(f"best {select}: sweep {result.best_value:.4f} vs plain {plain_value:.4f} (required sweep >= plain)")
    print(f"prefix passes: {result.prefix_passes} images (bound ({n_train} x {views} + {n_val}) x {cuts} = {bound})")
    print(f"peak RSS: plain {rss_plain:.0f} MiB, after the sweep {rss_sweep:.0f} MiB "
          f"(ratio {rss_sweep / rss_plain:.2f}, required <= 2)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
