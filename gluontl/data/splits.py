"""The automatic train/val hold-out every dataset and demo shares: a pure function of the labels,
the fraction and a fixed seed, so a split never moves with the run seed."""
from __future__ import annotations

import numpy as np

SPLIT_SEED = 20240607  # hold-out splits must not move when the run seed changes


def stratified_holdout(labels: np.ndarray, val_fraction: float, seed: int = SPLIT_SEED) -> np.ndarray:
    """Boolean mask of the val items: ``round(val_fraction * n_c)`` per class, but at least one
    (so val sees every class) and at least one left for training; depends only on the labels, the
    fraction and ``seed``."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(labels), bool)
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        n_val = min(max(round(val_fraction * len(idx)), 1), len(idx) - 1)
        mask[rng.permutation(idx)[:n_val]] = True
    return mask
