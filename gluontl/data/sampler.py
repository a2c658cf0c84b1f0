"""The order of an epoch and its shards, for a run that must replay exactly.

The order is a pure function of ``(seed, epoch)``, so batches do not depend on the worker count
and a run resumes mid-epoch by ``set_epoch(e); skip(k)`` (checkpoints of existing runs rely on
this order: it must never change). Distributed workers take shards of that one order cut to the
same number of batches each, because a synchronous job hangs as soon as one worker has a step
the others lack.
"""
from __future__ import annotations

from typing import Iterator, Literal

import numpy as np
from mxnet import gluon

_ORDER_TAG = 0x0DE4  # keeps the order stream apart from the per-sample streams
LastBatch = Literal["keep", "discard"]


class EpochSampler(gluon.data.Sampler):
    """Batch sampler of ``(index, epoch)`` keys; the order depends only on ``(seed, epoch)``.

    ``set_epoch(e)`` before iterating; ``skip(k)`` makes the next iteration start at batch k
    (resume mid-epoch). ``len()`` is the number of batches the next iteration yields.

    ``shard(rank, workers)``: worker ``rank`` takes every ``workers``-th item of the epoch's
    trained order, so every worker runs the same number of steps (a synchronous job hangs
    otherwise) and the workers' batch ``b`` together are batch ``b`` of one process with
    ``workers × batch_size``.

    ``last_batch``: ``discard`` trains whole steps of ``workers × batch_size`` only and leaves
    the rest of the order out (``left_out()``, another set each epoch); ``keep`` trains the rest
    as a smaller last step, split over the workers, when it gives each at least one item.
    """

    def __init__(self, n: int, batch_size: int, *, seed: int, shuffle: bool = True,
                 last_batch: LastBatch = "keep") -> None:
        if last_batch not in ("keep", "discard"):
            raise ValueError(f"last_batch must be 'keep' or 'discard', got {last_batch!r}")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.shuffle, self.last_batch = shuffle, last_batch
        self.epoch = 0
        self._skip = 0
        self.rank, self.workers = 0, 1

    def shard(self, rank: int, workers: int) -> None:
        if not 0 <= rank < workers:
            raise ValueError(f"rank {rank} is not one of {workers} workers")
        self.rank, self.workers = rank, workers

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def skip(self, batches: int) -> None:
        self._skip = batches

    def order(self, epoch: int | None = None) -> np.ndarray:
        """The sample indices of ``epoch`` (default: the current one), in visiting order."""
        epoch = self.epoch if epoch is None else epoch
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([_ORDER_TAG, self.seed % 2**64, epoch]).permutation(self.n)

    def _trained(self) -> int:
        """How many items of the epoch's order are trained (its head): a worker without an item in
        the last step would hang the others, so ``keep`` leaves out a rest smaller than the job."""
        step = self.batch_size * self.workers
        full, rest = divmod(self.n, step)
        return full * step + (rest if self.last_batch == "keep" and rest >= self.workers else 0)

    def left_out(self) -> int:
        """Items of every epoch that no worker trains on: the tail of that epoch's order."""
        return self.n - self._trained()

    def batches_per_epoch(self) -> int:
        return -(-self._trained() // (self.batch_size * self.workers))

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        order, start, epoch = self.order(), self._skip, self.epoch
        order = order[:self._trained()][self.rank::self.workers]
        self._skip = 0
        for b in range(start, self.batches_per_epoch()):
            yield [(int(i), epoch) for i in order[b * self.batch_size:(b + 1) * self.batch_size]]

    def __len__(self) -> int:
        return max(0, self.batches_per_epoch() - self._skip)
