"""Detection step speed: gluontl's step against a minimal handwritten GluonCV loop, in one process.

Usage: python scripts/bench_detect.py [--models ssd_300_mobilenet0.25_custom yolo3_mobilenet0.25_custom]
       [--size 128] [--batch 8] [--steps 9] [--warmup 3]

For each detector, two copies of the same hybridized (static) network, built and restored by
gluontl's detection task, train on the same batch of real demo images (``demo:digits_det``):
  * ``handwritten``: what GluonCV's training scripts do per step, targets made per batch
    (SSD: ``SSDTargetGenerator`` + ``SSDMultiBoxLoss``, ``trainer.step(1)``; YOLOv3: the prefetch
    target generator + the loss inside the net, ``trainer.step(batch)``);
  * ``gluontl``: the loop's ``Stepper`` with the detection task's forward (what ``finetune`` runs).
Steps are interleaved (see bench_finetune), ``ratio`` = handwritten median time / gluontl median
time (> 1: gluontl faster); ``ratio_of_fastest`` compares the fastest steps, which other processes
on a shared machine disturb least. The acceptance asks for a ratio >= 0.97.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_finetune import THREADS, _interleaved  # noqa: E402  (sizes the thread pool before mxnet)

import mxnet as mx  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402

from gluontl.recipe import parse_recipe  # noqa: E402
from gluontl.rules import trainable_params  # noqa: E402
from gluontl.tasks.detection import Detection  # noqa: E402
from gluontl.train.loop import Stepper  # noqa: E402

OPT = {"learning_rate": 0.001, "momentum": 0.9, "wd": 5e-4}


def _setup(model: str, size: int, batch: int):
    recipe = parse_recipe({"name": "bench", "task": "detection",
                           "model": {"source": f"zoo:{model}", "input_shape": [3, size, size]},
                           "data": {"source": "demo:digits_det", "classes": ["0", "1", "2", "3", "4"],
                                    "batch_size": batch}}, origin="bench_detect")
    task = Detection()
    prep, loaders = task.setup(recipe, mx.cpu(), seed=0)
    x, y = next(iter(loaders.train_epoch(0)))
    prep.block.hybridize(static_alloc=True, static_shape=True)
    return task, prep.block, x, y


def bench(model: str, size: int, batch: int, warmup: int, steps: int) -> dict:
    mx.random.seed(0)
    task, mine, x, y = _setup(model, size, batch)
    _, hand, _, _ = _setup(model, size, batch)
    hand_trainer = gluon.Trainer(list(trainable_params(hand).values()), "sgd", OPT)
    stepper = Stepper(mine, gluon.Trainer(list(trainable_params(mine).values()), "sgd", OPT), task.forward,
                      [mx.cpu()])
    if task.family == "ssd":
        from gluoncv.loss import SSDMultiBoxLoss
        from gluoncv.model_zoo.ssd.target import SSDTargetGenerator

        target_gen = SSDTargetGenerator(iou_thresh=0.5, stds=(0.1, 0.1, 0.2, 0.2), negative_mining_ratio=-1)
        mbox = SSDMultiBoxLoss()  # hard negatives are mined here, as in GluonCV's train_ssd.py

        def handwritten() -> None:
            with autograd.record():
                cls_pred, box_pred, anchors = hand(x)
                with autograd.pause():
                    cls_t, box_t, _ = target_gen(anchors, None, y[:, :, :4], y[:, :, 4:5])
                sum_loss, _, _ = mbox([cls_pred], [box_pred], [cls_t], [box_t])
            autograd.backward(sum_loss)
            hand_trainer.step(1)
            sum_loss[0].asnumpy()
    else:
        targets = task.targets  # the generator itself is GluonCV's; built once per input size

        def handwritten() -> None:
            with autograd.record():
                with autograd.pause():
                    fixed = targets(y)
                losses = hand(x, y[:, :, :4], *fixed)
                total = losses[0] + losses[1] + losses[2] + losses[3]
            autograd.backward(total)
            hand_trainer.step(batch)
            total.asnumpy()

    times = _interleaved({"handwritten": handwritten, "gluontl": lambda: stepper.step(x, y)}, warmup, steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"model": model, "size": size, "batch": batch, "gluontl_img_per_s": round(batch / med["gluontl"], 2),
            "handwritten_img_per_s": round(batch / med["handwritten"], 2),
            "ratio": round(med["handwritten"] / med["gluontl"], 3),
            "ratio_of_fastest": round(min(times["handwritten"]) / min(times["gluontl"]), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["ssd_300_mobilenet0.25_custom", "yolo3_mobilenet0.25_custom"])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    print(THREADS, file=sys.stderr)
    print(f"{'model':<32}{'size':>5}{'batch':>6}{'gluontl':>9}{'hand':>8}{'ratio':>7}{'fastest':>8}  (img/s)")
    for model in a.models:
        r = bench(model, a.size, a.batch, a.warmup, a.steps)
        print(f"{r['model']:<32}{r['size']:>5}{r['batch']:>6}{r['gluontl_img_per_s']:>9.1f}"
              f"{r['handwritten_img_per_s']:>8.1f}{r['ratio']:>7.3f}{r['ratio_of_fastest']:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
