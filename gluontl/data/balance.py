"""Imbalanced classes: class-balanced and square-root sampling (``data.sampler``) and the per-class
loss weights of ``train.loss.class_weights: balanced``.

A sampled epoch draws as many images as the train split has, in class quotas: class ``c`` gets
share ``s_c`` (balanced: ``1 / K``; sqrt: ``sqrt(n_c) / sum sqrt(n)``, Mahajan et al. 2018) and
``round(N s_c)`` draws, rounded by largest remainder so the quotas sum to ``N`` exactly. Within a
class the draws walk fresh permutations of its images (a minority class is repeated as evenly as
its quota allows, a majority class shows another subset each epoch), then the whole epoch is
shuffled. Everything comes from one generator seeded by ``(seed, epoch)``, so the order is a pure
function of them like :class:`EpochSampler`'s, and ``skip``, ``shard`` and ``last_batch`` work
on it unchanged (resume mid-epoch, equal shards). An image drawn twice in one epoch gets the same
``(index, epoch)`` key, hence the same augmentation (and the same cached view).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from ..errors import DataError
from .sampler import EpochSampler, LastBatch

_CLASS_TAG = 0xBA1A  # keeps the class sampler's stream apart from the uniform order's


def class_shares(counts: np.ndarray, mode: str) -> np.ndarray:
    """The share of an epoch's draws each class gets under ``mode`` (uniform: its own share)."""
    counts = np.asarray(counts, np.float64)
    if mode == "uniform":
        return counts / counts.sum()
    if mode == "balanced":
        return np.full(len(counts), 1.0 / len(counts))
    if mode == "sqrt":
        root = np.sqrt(counts)
        return root / root.sum()
    raise ValueError(f"unknown sampler {mode!r}")


def quotas(n: int, shares: np.ndarray) -> np.ndarray:
    """``n`` draws split by ``shares``: floors, then one more for the largest remainders (ties: the
    lower class index), so the quotas sum to ``n``."""
    exact = np.asarray(shares, np.float64) * n
    out = np.floor(exact).astype(np.int64)
    extra = n - int(out.sum())
    out[np.argsort(-(exact - out), kind="stable")[:extra]] += 1
    return out


def require_every_class(counts: np.ndarray, class_names: Sequence[str], key: str, setting: str, where: str) -> None:
    """A sampler or weight that boosts each class needs an image of each (else: DataError naming ``key``)."""
    empty = [class_names[i] for i in np.flatnonzero(np.asarray(counts) == 0)]
    if empty:
        raise DataError(f"{key}: {setting} weights every class by its own images, but class(es) "
                        f"{', '.join(repr(c) for c in empty)} have no image in {where}. Add images of them, drop "
                        f"them from data.classes, or set {key} back to its default.")


class ClassSampler(EpochSampler):
    """:class:`EpochSampler` whose epoch order draws classes by quota (module docstring)."""

    def __init__(self, labels: np.ndarray, batch_size: int, *, mode: str, seed: int,
                 num_classes: int, last_batch: LastBatch = "keep") -> None:
        labels = np.asarray(labels).astype(np.int64)
        super().__init__(len(labels), batch_size, seed=seed, shuffle=True, last_batch=last_batch)
        self.mode = mode
        self.counts = np.bincount(labels, minlength=num_classes)
        self.shares = class_shares(self.counts, mode)
        self.quota = quotas(len(labels), self.shares)
        self.members = [np.flatnonzero(labels == c) for c in range(num_classes)]

    def order(self, epoch: int | None = None) -> np.ndarray:
        epoch = self.epoch if epoch is None else epoch
        rng = np.random.default_rng([_CLASS_TAG, self.seed % 2**64, epoch])
        drawn = []
        for members, q in zip(self.members, self.quota):
            if q == 0:
                continue
            rounds = -(-int(q) // len(members))
            drawn.append(np.concatenate([rng.permutation(members) for _ in range(rounds)])[:q])
        return rng.permutation(np.concatenate(drawn)) if drawn else np.arange(0)

    def describe(self, class_names: Sequence[str]) -> str:
        """The per-class sampling weights, as the plan shows them."""
        per = ", ".join(f"{name} {share:.3f} ({int(n)} image{'s' * (int(n) != 1)}, {q} draws)"
                        for name, share, n, q in zip(class_names, self.shares, self.counts, self.quota))
        return f"data.sampler {self.mode}: per-class sampling weights (share of each epoch's draws): {per}"


def class_sampler(labels: np.ndarray, class_names: Sequence[str], *, mode: str, batch_size: int, seed: int,
                  last_batch: LastBatch, where: str) -> ClassSampler:
    """The train split's sampler for ``data.sampler: mode`` (balanced, sqrt), checked: every class needs an image."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise DataError(f"data.sampler: {mode} samples by one class per image; these labels have shape "
                        f"{labels.shape}. Use data.sampler: uniform.")
    counts = np.bincount(labels.astype(np.int64), minlength=len(class_names))
    require_every_class(counts, class_names, "data.sampler", mode, where)
    return ClassSampler(labels, batch_size, mode=mode, seed=seed, num_classes=len(class_names), last_batch=last_batch)


def plan_notes(recipe, train_split: Callable[[], Any]) -> list[str]:
    """The plan's lines for data.sampler and class_weights: balanced, from the train split as
    ``train_split()`` lists it (called only when one of them is set)."""
    spec, loss = recipe.data, recipe.train.loss
    balanced_loss = loss is not None and loss.class_weights == "balanced"
    if spec is None or (spec.sampler == "uniform" and not balanced_loss):
        return []
    ds = train_split()
    names, where = list(ds.class_names), f"the train split '{spec.train}' of {spec.source}"
    lines = []
    if spec.sampler != "uniform":
        sampler = class_sampler(ds.labels, names, mode=spec.sampler, batch_size=spec.batch_size, seed=0,
                                last_batch="keep", where=where)
        lines.append(sampler.describe(names) + " (as listed: finetune leaves out bad images)")
    if balanced_loss:
        counts = np.bincount(np.asarray(ds.labels).astype(np.int64), minlength=len(names))
        weights = loss_class_weights("balanced", counts, names, where)
        lines.append("train.loss.class_weights balanced: " + ", ".join(f"{n} {w:.3f}" for n, w in zip(names, weights)))
    return lines


def loss_class_weights(setting: str | list[float], counts: np.ndarray, class_names: Sequence[str],
                       where: str) -> np.ndarray | None:
    """``train.loss.class_weights`` as one float per class (None: none); balanced is scikit-learn's
    ``N / (K n_c)``, which averages 1 over the split's images so the loss keeps its scale."""
    counts = np.asarray(counts, np.int64)
    if isinstance(setting, list):
        if len(setting) != len(class_names):
            raise DataError(f"train.loss.class_weights lists {len(setting)} weights but the data has "
                            f"{len(class_names)} classes ({', '.join(class_names[:10])}); give one weight per "
                            f"class, in this order, or class_weights: balanced.")
        return np.asarray(setting, np.float64)
    if setting == "none":
        return None
    require_every_class(counts, class_names, "train.loss.class_weights", setting, where)
    return counts.sum() / (len(counts) * counts.astype(np.float64))


__all__ = ["ClassSampler", "class_sampler", "class_shares", "loss_class_weights", "plan_notes", "quotas",
           "require_every_class"]
