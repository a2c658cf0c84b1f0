"""An exponential moving average of the trained weights (timm's ``ModelEma``), validated, checkpointed
and exported beside the weights themselves.

Only parameters that train are averaged (from the value they have when they start training);
frozen ones are the model's, so a frozen backbone costs no memory and stays bit-identical. The
average is not a second network: it is swapped into the model's own arrays to be evaluated or
saved (:meth:`Ema.applied`) and the weights are put back bit for bit, so the feature-cache
suffix, hybridized graphs and every context's copy see it without being rebuilt.

BatchNorm statistics are not averaged. ``batch_norm: copy`` evaluates the average with the
model's statistics; ``recompute`` runs the first ``recompute_batches`` training batches of the
epoch through the averaged weights in training mode first (MXNet's oneDNN BatchNorm updates its
running statistics in the backward pass, so each batch runs forward and backward; the gradients
are discarded).
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, Callable, Iterable, Iterator

import mxnet as mx
from mxnet import autograd

from ..errors import TrainError
from ..naming import named_params
from ..recipe import EmaSpec
from ..rules import trainable_params


class Ema:
    def __init__(self, spec: EmaSpec) -> None:
        self.spec = spec
        self.updates = 0  # optimizer steps averaged so far: the t of the warmup
        self.avg: dict[str, mx.nd.NDArray] = {}  # structural name -> average, on the weight's first context

    def decay(self) -> float:
        """The decay of the next update: ``min(decay, (1 + t) / (10 + t))`` with warmup."""
        t = self.updates
        return min(self.spec.decay, (1 + t) / (10 + t)) if self.spec.warmup else self.spec.decay

    def track(self, net) -> None:
        """Average every parameter that trains now and is not averaged yet, starting from its value."""
        for name, p in trainable_params(net).items():
            if name not in self.avg:
                self.avg[name] = p.list_data()[0].copy()

    def update(self, net) -> None:
        """After an optimizer step: ``avg += (1 - d) * (w - avg)``."""
        keep = 1.0 - self.decay()
        entries = named_params(net)
        for name, avg in self.avg.items():
            avg += (entries[name].param.list_data()[0] - avg) * keep
        self.updates += 1

    def line(self) -> str:
        """What the plan says about the average."""
        s = self.spec
        decay = f"min({s.decay}, (1+t)/(10+t)) at step t" if s.warmup else f"{s.decay}"
        bn = ("copied from the model" if s.batch_norm == "copy" else
              f"recomputed with the averaged weights on {s.recompute_batches} training batches each epoch")
        return f"ema: {len(self.avg)} trained parameters averaged, decay {decay}; BatchNorm statistics {bn}"

    def record(self) -> dict[str, Any]:
        return {"format": 1, "updates": self.updates, "names": sorted(self.avg)}

    def arrays(self) -> dict[str, mx.nd.NDArray]:
        return {n: a.copyto(mx.cpu()) for n, a in self.avg.items()}

    def load(self, record: Any, arrays: dict[str, mx.nd.NDArray], net, where: str) -> None:
        """A checkpoint's average (:meth:`record` and :meth:`arrays`), checked against ``net``."""
        entries = named_params(net)
        ok = isinstance(record, dict) and record.get("format") == 1 and type(record.get("updates")) is int \
            and record["updates"] >= 0 and record.get("names") == sorted(arrays)
        bad = [n for n, a in arrays.items() if n not in entries or a.shape != entries[n].param.list_data()[0].shape]
        if not ok or bad:
            raise TrainError(f"Checkpoint {where} has an ema record that does not fit this model"
                             f"{f' ({bad[0]})' if bad else ''}; it was edited by hand or written by something "
                             f"other than gluontl. Refusing it; start a new run from its weights with --init-from.")
        self.updates = record["updates"]
        self.avg = {n: a.as_in_context(entries[n].param.list_data()[0].context).copy() for n, a in arrays.items()}

    @contextlib.contextmanager
    def applied(self, net, aux: Iterable[str] = ()) -> Iterator[None]:
        """The average in the model's arrays (every context's copy) inside the block; on leaving,
        the weights and the ``aux`` arrays (BatchNorm statistics a recompute moves) the model had,
        bit for bit."""
        entries = named_params(net)
        moved = [*self.avg, *aux]
        saved = {n: entries[n].param.list_data()[0].copy() for n in moved}
        try:
            for name, avg in self.avg.items():
                for copy in entries[name].param.list_data():
                    copy[:] = avg
            yield
        finally:
            for name, value in saved.items():
                for copy in entries[name].param.list_data():
                    copy[:] = value
            mx.nd.waitall()

    def recompute_bn(self, net, params: Iterable, forward: Callable, batches: Iterable, ctxs: list[mx.Context],
                     split: Callable, seed: int) -> None:
        """Inside :meth:`applied`: the running statistics of the averaged weights, from the first
        ``recompute_batches`` of ``batches`` (no-op under ``batch_norm: copy``)."""
        if self.spec.batch_norm != "recompute":
            return
        for i, (x, y) in enumerate(itertools.islice(batches, self.spec.recompute_batches)):
            mx.random.seed((seed + i) % 2**31)  # dropout draws the same in a resumed run
            xs, ys = split(x, ctxs), split(y, ctxs)
            for xi in xs:  # so the backward reaches every BatchNorm, frozen layers before it or not
                xi.attach_grad()
            with autograd.record():
                losses, _ = forward(net, xs, ys)
            autograd.backward(losses)
        mx.nd.waitall()
        for p in params:  # the step's gradients belong to the optimizer's next step, not to these batches
            p.zero_grad()

