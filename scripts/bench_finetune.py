"""Fine-tuning step speed: gluontl against a minimal handwritten Gluon loop, in one process.

Usage: python scripts/bench_finetune.py [--quick] [--json rows.json] [--steps 7] [--warmup 2]

For each model, input size and regime (``full``; ``last_stage``: stage 4 + head train, the
rest frozen with BN statistics frozen; ``head_only``) the same hybridized (static) network,
batch and thread count are timed as
  * ``handwritten``: Trainer over the trainable parameters, autograd.record / backward / step;
  * ``step``: gluontl's ``Stepper`` (what ``finetune`` runs) on the whole network;
  * ``cache``: the Stepper on the trainable suffix, fed prefix features gathered from a
    feature cache (what epochs 2..N cost when transforms are deterministic);
  * ``prefix_ort``: the frozen prefix in onnxruntime every step, its output fed to the suffix
    (what random augmentation, which rules out a cache, costs);
  * ``forward``: inference forward only (the floor for a head-only step), timed on its own.
``ratio`` compares medians; ``ratio_of_fastest`` compares each mode's fastest step, which
other processes on a shared machine disturb least.
Rules go through gluontl's rule engine (presets). Timings are interleaved step by step, so
load from other processes hits all modes alike; each figure is the median of ``--steps``
after ``--warmup``. Ratios are more trustworthy than absolute images/s on a shared machine.
A last section runs ``finetune`` on the offline digits demo with the cache off and on and
compares epochs 2..N and the final metrics.
"""
from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gluontl.threads import configure

THREADS = configure()

import mxnet as mx  # noqa: E402  (after the thread pool is sized)
import numpy as np  # noqa: E402
from gluoncv.model_zoo import get_model  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

from gluontl.recipe import Rule, parse_recipe  # noqa: E402
from gluontl.rules import apply_plan, make_plan, trainable_params  # noqa: E402
from gluontl.tasks.classification import classify  # noqa: E402
from gluontl.data.cache import PER_STEP_MARGIN  # noqa: E402
from gluontl.train.loop import Stepper, finetune  # noqa: E402
from gluontl.data.prefix import OrtEngine, choose_engine, split_frozen_prefix  # noqa: E402

REGIMES = {"full": [], "last_stage": [{"preset": "freeze_until_stage", "until_stage": 3}],
           "head_only": [{"preset": "freeze_all_but_head"}]}
OPT = {"learning_rate": 0.01, "momentum": 0.9, "wd": 1e-4}
FT_SIZE = 224
QUICK = [("resnet18_v1", 224, "head_only", ("step", "cache")), ("resnet18_v1", 224, "full", ("step",)),
         ("mobilenetv2_1.0", 224, "head_only", ("step", "cache", "prefix_ort"))]


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the acceptance subset, in a few minutes")
    ap.add_argument("--models", nargs="+", default=["resnet18_v1", "mobilenetv2_1.0"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[112, 224])
    ap.add_argument("--regimes", nargs="+", default=list(REGIMES), choices=list(REGIMES))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--no-finetune", action="store_true", help="skip the end-to-end cache comparison")
    ap.add_argument("--json", type=Path, help="write the rows as a JSON list here")
    return ap.parse_args()


def _interleaved(runs: dict[str, Callable[[], object]], warmup: int, steps: int) -> dict[str, list[float]]:
    """Seconds per call of each run, calls interleaved round-robin (order reversed every
    other round, so no run always follows the same one)."""
    for run in runs.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for r in range(steps):
        for k in (list(runs) if r % 2 == 0 else list(reversed(runs))):
            run = runs[k]
            t0 = time.perf_counter()
            run()
            mx.nd.waitall()
            times[k].append(time.perf_counter() - t0)
    return times


def _network(model: str, size: int, regime: str, ctx: mx.Context):
    mx.random.seed(0)
    net = get_model(model, classes=10)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net(mx.nd.zeros((1, 3, size, size), ctx=ctx))
    rules = [Rule(**r) for r in REGIMES[regime]]
    plan = make_plan(net, rules, epoch=0, input_shape=(3, size, size))
    apply_plan(net, plan)
    net.hybridize(static_alloc=True, static_shape=True)
    return net, plan


def bench_case(model: str, size: int, regime: str, modes: tuple[str, ...], a: argparse.Namespace) -> list[dict]:
    ctx = mx.cpu()
    net, plan = _network(model, size, regime, ctx)
    rng = np.random.default_rng(0)
    x = mx.nd.array(rng.standard_normal((a.batch, 3, size, size)), ctx=ctx)
    y = mx.nd.array(rng.integers(0, 10, a.batch), ctx=ctx)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    fwd = functools.partial(classify, loss=loss_fn)  # what the classification task runs

    hand_trainer = gluon.Trainer([p for p in net.collect_params().values() if p.grad_req != "null"], "sgd", OPT)

    def handwritten() -> None:
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        hand_trainer.step(a.batch)

    def forward() -> None:
        with autograd.predict_mode():
            net(x).wait_to_read()

    stepper = Stepper(net, gluon.Trainer(list(trainable_params(net).values()), "sgd", OPT), fwd, [ctx])
    runs: dict[str, Callable[[], object]] = {"handwritten": handwritten, "step": lambda: stepper.step(x, y)}
    notes: dict[str, str] = {}
    if {"cache", "prefix_ort"} & set(modes) and regime != "full":
        split = split_frozen_prefix(net, plan, (3, size, size), ctx)
        split.suffix.hybridize(static_alloc=True, static_shape=True)
        suffix = Stepper(split.suffix, gluon.Trainer(list(trainable_params(split.suffix).values()), "sgd", OPT),
                         fwd, [ctx])
        probe = x.asnumpy()
        engine, notes["cache"] = choose_engine("auto", split.prefix, (3, size, size), ctx, probe)
        if "cache" in modes:
            t0 = time.perf_counter()
            feats = np.concatenate([engine(probe) for _ in range(4)])  # a 4-batch "dataset" of features
            notes["fill_img_per_s"] = f"{len(feats) / (time.perf_counter() - t0):.0f}"

            def cached() -> None:
                idx = rng.choice(len(feats), a.batch, replace=False)
                suffix.step(mx.nd.array(feats[idx], ctx=ctx), y)

            runs["cache"] = cached
        if "prefix_ort" in modes:
            ort_engine = engine if engine.name == "onnxruntime" else OrtEngine(split.prefix, (3, size, size), ctx)
            notes["prefix_ort"] = f"{notes['cache']}; per step, auto wants onnxruntime {PER_STEP_MARGIN}x faster"

            def prefix_ort() -> None:
                suffix.step(mx.nd.array(ort_engine(x.asnumpy()), ctx=ctx), y)

            runs["prefix_ort"] = prefix_ort
    # Forward alone, not interleaved: a static_alloc graph re-plans its memory whenever calls
    # switch between recording and predict mode, which would tax whichever step came next.
    # (after the steps: the first calls of a fresh process run slow for a while, which the steps absorb)
    times = _interleaved(runs, a.warmup, a.steps)
    times.update(_interleaved({"forward": forward}, a.warmup, a.steps))
    t = {k: statistics.median(v) for k, v in times.items()}
    ips = {k: a.batch / v for k, v in t.items()}
    rows = []
    for mode in modes:
        if mode not in ips:
            continue
        rows.append({"model": model, "size": size, "regime": regime, "mode": mode,
                     "augment": mode == "prefix_ort", "img_per_s": round(ips[mode], 2),
                     "handwritten_img_per_s": round(ips["handwritten"], 2),
                     "ratio": round(ips[mode] / ips["handwritten"], 3),
                     "ratio_of_fastest": round(min(times["handwritten"]) / min(times[mode]), 3),
                     "forward_img_per_s": round(ips["forward"], 2),
                     "step_over_forward": round(t[mode] / t["forward"], 3),
                     "note": notes.get(mode, "")})
        if mode == "cache":
            rows[-1]["fill_img_per_s"] = float(notes["fill_img_per_s"])
    return rows


def bench_finetune_cache(size: int = FT_SIZE, epochs: int = 3) -> dict:
    """Digits demo, head-only ResNet-18 with the demo's digits-0-4 backbone (made on first use,
    like ``recipes/resnet18_freeze.yaml``), cache off vs on."""
    out = {}
    root_dir = Path(__file__).resolve().parents[1]
    model = {"source": "zoo:resnet18_v1", "input_shape": [3, size, size], "restore": {"only": ["features.*"]},
             "weights": str(root_dir / ".cache/pretrain/digits04_resnet18_48px.params"),
             "weights_from": str(root_dir / "recipes/digits_pretrain.yaml")}
    with tempfile.TemporaryDirectory() as root:
        for mode in ("off", "on"):
            r = parse_recipe({"name": f"cache_{mode}", "model": model,
                              "surgery": {"head": {"classes": 3}}, "rules": REGIMES["head_only"],
                              "data": {"source": "demo:digits", "classes": ["5", "6", "7"],
                                       "batch_size": 32, "train_transform": {"resize": size},
                                       "val_transform": {"resize": size}},
                              "train": {"epochs": epochs, "lr": 0.1, "schedule": {"kind": "cosine"},
                                        "cache_features": mode}})
            res = finetune(r, runs_root=root, quiet=True)
            ep = [m for m in res.metrics if "epoch" in m]
            out[mode] = {"first_epoch_s": ep[0]["seconds"], "later_epoch_s": sum(e["seconds"] for e in ep[1:]),
                         "val_top1": ep[-1]["val_top1"], "val_loss": ep[-1]["val_loss"],
                         "log": json.loads((res.run_dir / "summary.json").read_text())["feature_cache"]["log"]}
    out["later_epochs_speedup"] = out["off"]["later_epoch_s"] / max(out["on"]["later_epoch_s"], 1e-9)
    out["same_metrics"] = bool(np.isclose(out["off"]["val_loss"], out["on"]["val_loss"], rtol=1e-4)
                               and out["off"]["val_top1"] == out["on"]["val_top1"])
    return out


def main() -> None:
    a = _parse()
    print(THREADS, file=sys.stderr)
    if a.quick:
        cases = QUICK
    else:
        cases = [(m, s, r, ("step",) if r == "full" else ("step", "cache", "prefix_ort"))
                 for m in a.models for s in a.sizes for r in a.regimes]
    rows = []
    head = (f"{'model':<16}{'size':>5} {'regime':<11}{'mode':<11}{'img/s':>8}{'hand':>8}{'ratio':>7}{'fwd':>8}"
            f"{'step/fwd':>9}{'fastest':>8}")
    print(head)
    for model, size, regime, modes in cases:
        for row in bench_case(model, size, regime, modes, a):
            rows.append(row)
            print(f"{row['model']:<16}{row['size']:>5} {row['regime']:<11}{row['mode']:<11}{row['img_per_s']:>8.1f}"
                  f"{row['handwritten_img_per_s']:>8.1f}{row['ratio']:>7.2f}{row['forward_img_per_s']:>8.1f}"
                  f"{row['step_over_forward']:>9.2f}{row['ratio_of_fastest']:>8.2f}  {row['note']}", flush=True)
    if not a.no_finetune:
        ft = bench_finetune_cache()
        print(f"finetune digits {FT_SIZE}px head-only, 3 epochs: epochs 2..N {ft['off']['later_epoch_s']:.2f}s "
              f"uncached vs {ft['on']['later_epoch_s']:.3f}s cached = {ft['later_epochs_speedup']:.0f}x; "
              f"final val_top1 "
              f"{ft['off']['val_top1']:.4f} vs {ft['on']['val_top1']:.4f}, val_loss {ft['off']['val_loss']:.5f} vs "
              f"{ft['on']['val_loss']:.5f} (same: {ft['same_metrics']}); {ft['on']['log']}")
        rows.append({"model": "resnet18_v1", "size": FT_SIZE, "regime": "head_only",
                     "mode": "finetune_epochs_2_to_n", "augment": False,
                     "img_per_s": None, "handwritten_img_per_s": None,
                     "ratio": round(ft["later_epochs_speedup"], 1), "note": "cached / uncached finetune, digits",
                     "finetune": ft})
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
