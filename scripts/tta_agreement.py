"""evaluate --tta flip against the mean of its two single views, on a finished classifier run.

Usage: python scripts/tta_agreement.py runs/NAME [--split val]

Prints the largest difference between the probabilities `gluontl evaluate RUN --tta flip` averaged
and the mean of the two single-view probabilities computed here by hand (the loaded checkpoint on
the split's images and on their mirror images), plus both evaluations' headline lines.
"""
from __future__ import annotations

import argparse

import mxnet as mx
import numpy as np

from gluontl.data.datasets import load_split
from gluontl.train.runs import evaluate_report, load_run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--split", default="val")
    args = ap.parse_args()
    recipe, net = load_run(args.run)
    ds = load_split(recipe.data, args.split)
    multi = recipe.task == "multilabel"
    act = mx.nd.sigmoid if multi else (lambda z: mx.nd.softmax(z, axis=1))
    views = []
    with mx.autograd.predict_mode():
        for flip in (False, True):
            out = []
            for i in range(0, len(ds), 32):
                x = np.stack([ds[j][0] for j in range(i, min(i + 32, len(ds)))])
                out.append(act(net(mx.nd.array(x[..., ::-1].copy() if flip else x))).asnumpy().astype(np.float64))
            views.append(np.concatenate(out))
    mean = (views[0] + views[1]) / 2
    plain, tta = evaluate_report(args.run, args.split), evaluate_report(args.run, args.split, tta="flip")
    if multi:
        print(f"max |tta probs - mean of the two views| = {np.max(np.abs(tta.values['probs'] - mean)):.2e}")
    else:
        print(f"top-1 of the mean of the two views {np.mean(mean.argmax(1) == ds.labels):.4f}; "
              f"evaluate --tta flip top-1 {tta.values['val_top1']:.4f}")
    print("without tta: " + plain.lines[0])
    print("with tta:    " + tta.lines[0])


if __name__ == "__main__":
    main()
