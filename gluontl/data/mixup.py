"""Mixup and CutMix on training batches, with timm's semantics (``timm.data.Mixup``) and soft targets.

A batch is mixed with itself reversed (image i with image N-1-i): by the whole batch (``mode: batch``,
one lambda), by pairs (``pair``: i and N-1-i swap with one lambda) or by image (``elem``). Lambda
is drawn from Beta(alpha, alpha) of the chosen kind; a CutMix box has sides ``sqrt(1 - lambda)`` of
the input's, centred uniformly and clipped at the edges, and with ``correct_lam`` lambda becomes the
share of the image left uncovered. Targets are timm's ``mixup_target``: one-hot rows smoothed by
``label_smoothing`` (``1 - s + s/C`` on the class, ``s/C`` elsewhere), mixed by the same lambdas.

Every draw comes from a generator seeded by (seed, epoch, batch index), so a batch is mixed the
same way after a resume, whichever worker or context computes it.

Without the feature cache the images are mixed (before a per-step prefix engine, if one runs).
With it, the cached features of the frozen prefix are mixed — mixing after the prefix, as
docs/classification.md explains: the pairs change every step, so mixed images would need the
prefix every step, which is what the cache saves. CutMix then cuts boxes from the prefix's feature
map (its lambda corrected to the box's share of the map); on flat (N, D) features it is refused.
"""
from __future__ import annotations

from typing import Any, Iterator

import mxnet as mx
import numpy as np

from ..errors import TrainError
from ..recipe import MixupSpec

_MIX_TAG = 0x4D1C  # keeps mixing streams apart from the per-sample and loader streams


def mix_rng(seed: int, epoch: int, batch: int) -> np.random.Generator:
    return np.random.default_rng([_MIX_TAG, seed % 2**64, epoch, batch])


def mixup_target(labels: np.ndarray, num_classes: int, lam: float | np.ndarray, smoothing: float) -> np.ndarray:
    """timm's soft targets: smoothed one-hot rows mixed with the reversed batch's by ``lam`` (scalar or per row)."""
    off = smoothing / num_classes
    y1 = np.full((len(labels), num_classes), off, np.float64)
    y1[np.arange(len(labels)), labels.astype(np.int64)] = 1.0 - smoothing + off
    lam = np.asarray(lam, np.float64).reshape(-1, 1) if np.ndim(lam) else lam
    return (y1 * lam + y1[::-1] * (1.0 - lam)).astype(np.float32)


def rand_box(h: int, w: int, lam: float, rng: np.random.Generator) -> tuple[int, int, int, int]:
    """A CutMix box (y0, y1, x0, x1): sides ``int(side * sqrt(1 - lam))`` about a uniform centre, clipped."""
    ratio = np.sqrt(1.0 - lam)
    ch, cw = int(h * ratio), int(w * ratio)
    cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
    return (int(np.clip(cy - ch // 2, 0, h)), int(np.clip(cy + ch // 2, 0, h)),
            int(np.clip(cx - cw // 2, 0, w)), int(np.clip(cx + cw // 2, 0, w)))


def box_and_lam(h: int, w: int, lam: float, rng: np.random.Generator, correct: bool
                ) -> tuple[tuple[int, int, int, int], float]:
    box = rand_box(h, w, lam, rng)
    if correct:
        lam = 1.0 - (box[1] - box[0]) * (box[3] - box[2]) / float(h * w)
    return box, lam


def _draw(spec: MixupSpec, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-item (lambda, use_cutmix) for ``n`` items: timm's ``_params_per_elem`` (n = 1: per batch)."""
    lam, cut = np.ones(n), np.zeros(n, bool)
    if spec.mixup_alpha > 0 and spec.cutmix_alpha > 0:
        cut = rng.random(n) < spec.switch_prob
        mix = np.where(cut, rng.beta(spec.cutmix_alpha, spec.cutmix_alpha, n),
                       rng.beta(spec.mixup_alpha, spec.mixup_alpha, n))
    elif spec.mixup_alpha > 0:
        mix = rng.beta(spec.mixup_alpha, spec.mixup_alpha, n)
    else:
        cut = np.ones(n, bool)
        mix = rng.beta(spec.cutmix_alpha, spec.cutmix_alpha, n)
    apply = rng.random(n) < spec.prob
    return np.where(apply, mix, lam), cut & apply


def mix_batch(x: np.ndarray, labels: np.ndarray, spec: MixupSpec, num_classes: int, smoothing: float,
              rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mixed batch, soft targets, per-image lambda as used) for ``x`` (N, ...) and integer ``labels``."""
    x = np.array(x, np.float32, copy=True)
    orig = x.copy()
    n = len(x)
    spatial = x.ndim == 4

    def cut_ok(cut: bool) -> None:
        if cut and not spatial:
            raise TrainError(f"train.mixup.cutmix_alpha: CutMix cuts boxes from (N, C, H, W) batches, but this "
                             f"one is {x.shape} (flat features of the frozen prefix). Set cutmix_alpha: 0, or cut "
                             f"the model earlier so the prefix ends in a feature map.")

    lams = np.ones(n)
    if spec.mode == "batch":
        (lam,), (cut,) = _draw(spec, rng, 1)
        cut_ok(cut)
        if lam != 1.0:
            if cut:
                (y0, y1, x0, x1), lam = box_and_lam(x.shape[2], x.shape[3], lam, rng, spec.correct_lam)
                x[:, :, y0:y1, x0:x1] = orig[::-1][:, :, y0:y1, x0:x1]
            else:
                x = orig * np.float32(lam) + orig[::-1] * np.float32(1.0 - lam)
        lams[:] = lam
    else:
        half = n // 2 if spec.mode == "pair" else n
        lam_d, cut_d = _draw(spec, rng, half)
        for i in range(half):
            j, lam = n - 1 - i, float(lam_d[i])
            if lam == 1.0:
                continue
            cut_ok(bool(cut_d[i]))
            if cut_d[i]:
                (y0, y1, x0, x1), lam = box_and_lam(x.shape[2], x.shape[3], lam, rng, spec.correct_lam)
                x[i, :, y0:y1, x0:x1] = orig[j, :, y0:y1, x0:x1]
                if spec.mode == "pair":
                    x[j, :, y0:y1, x0:x1] = orig[i, :, y0:y1, x0:x1]
            else:
                x[i] = orig[i] * np.float32(lam) + orig[j] * np.float32(1.0 - lam)
                if spec.mode == "pair":
                    x[j] = orig[j] * np.float32(lam) + orig[i] * np.float32(1.0 - lam)
            lams[i] = lam
            if spec.mode == "pair":
                lams[j] = lam
    return x, mixup_target(labels, num_classes, lams, smoothing), lams


class MixedFeed:
    """A training feed whose batches are mixed (soft targets, (N, classes)); all else is the inner feed's."""

    def __init__(self, inner: Any, spec: MixupSpec, num_classes: int, smoothing: float, seed: int) -> None:
        self.inner, self.spec, self.num_classes, self.smoothing, self.seed = inner, spec, num_classes, smoothing, seed

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def train_batches(self, epoch: int, skip: int) -> Iterator[tuple[mx.nd.NDArray, mx.nd.NDArray]]:
        inner = self.inner
        per_step = inner.cache is None and inner.engine is not None  # images mixed, then the prefix engine
        batches = inner.loaders.train_epoch(epoch, skip_batches=skip) if per_step else \
            inner.train_batches(epoch, skip)
        for i, (x, y) in enumerate(batches, start=skip):
            xm, target, _ = mix_batch(x.asnumpy(), y.asnumpy(), self.spec, self.num_classes, self.smoothing,
                                      mix_rng(self.seed, epoch, i))
            if per_step:
                xm = inner.engine(xm)
            yield mx.nd.array(xm, ctx=x.context), mx.nd.array(target, ctx=y.context)
