"""``gluontl lr-find``: fastai's learning-rate range test (Leslie Smith's, as ``Learner.lr_find``).

Optimizer step i of n trains at ``start · (end/start)^(i/n)``; the loss is smoothed as fastai's
Recorder smooths it, ``avg = β·avg + (1-β)·loss`` with β = 0.98 and bias correction
``avg / (1 - β^(i+1))``, and the test stops once the smoothed loss passes 4× its minimum (or is
not finite). Suggestions are made on the curve without its first tenth and last five points:
``valley`` (fastai's default: halfway into the longest run of decreasing loss, found as a
longest decreasing subsequence), ``steep`` (where the loss falls fastest per unit of log lr) and
``minimum`` (a tenth of the lr at the lowest smoothed loss, fastai's ``Minimum``). ``minimum`` is
the one suggested (and what ``train.lr: auto`` trains with): on least squares, whose best
plain-SGD lr is 1/L, minimum and steep land within 3× of 1/L while valley is far too cautious
(about 1/500 of 1/L: that loss falls from the first step on; tests/train/test_lrfind.py).

It trains the recipe's model in memory from the weights the recipe names, fed as finetune feeds
it (with a frozen prefix, from the same feature cache, of which it computes only the first
augmented view), and writes only a plot and a JSON record: no checkpoint, no weights.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import mxnet as mx
import numpy as np

from ..atomic import atomic_write, write_text
from ..console import bars_on, say
from ..errors import TrainError
from ..recipe import Recipe
from ..runfolder import RunFolder

BETA = 0.98
DIVERGED = 4.0


@dataclasses.dataclass
class Found:
    lrs: list[float]
    losses: list[float]  # smoothed, bias-corrected
    raw: list[float]
    valley: float
    steep: float
    minimum: float
    stopped: str  # why the test ended
    seconds: float = 0.0
    feed: dict[str, Any] | None = None  # the feed's summary: the cache, its fill time
    plot: Path | None = None
    record: Path | None = None

    @property
    def suggested(self) -> float:
        return self.minimum

    def to_json(self) -> dict[str, Any]:
        return {"suggested": self.suggested, "method": "minimum", "valley": self.valley, "steep": self.steep,
                "minimum": self.minimum,
                "stopped": self.stopped, "seconds": round(self.seconds, 3), "lrs": self.lrs, "losses": self.losses,
                "raw_losses": self.raw, "feature_cache": self.feed, "plot": str(self.plot) if self.plot else None}


def ramp(start: float, end: float, steps: int, i: int) -> float:
    return start * (end / start) ** (i / steps)


def sweep(step: Callable[[float], float], steps: int, start: float, end: float) -> Found:
    """Run ``step(lr) -> loss`` (one optimizer step at ``lr``, its mean loss) along the ramp."""
    lrs, losses, raw = [], [], []
    avg, best, stopped = 0.0, math.inf, f"all {steps} steps"
    for i in range(steps):
        lr = ramp(start, end, steps, i)
        loss = step(lr)
        avg = BETA * avg + (1 - BETA) * loss
        smooth = avg / (1 - BETA ** (i + 1))
        lrs.append(lr)
        raw.append(loss)
        losses.append(smooth)
        if not math.isfinite(smooth) or smooth > DIVERGED * best:
            stopped = f"diverged at step {i + 1} (lr {lr:.3g}): smoothed loss {smooth:.4g} > {DIVERGED:g}× its minimum"
            break
        best = min(best, smooth)
    return suggest(lrs, losses, raw, steps, stopped)


def suggest(lrs: list[float], losses: list[float], raw: list[float], steps: int, stopped: str) -> Found:
    lo = steps // 10
    x, y = np.array(lrs[lo:-5]), np.array(losses[lo:-5])
    if len(y) < 3:  # sweep stops at the first non-finite loss, which the last five leave out
        raise TrainError(f"lr-find: the loss {stopped} after {len(lrs)} steps, leaving {max(len(y), 0)} points to "
                         f"suggest from (the first tenth and the last five are left out). Lower --end, or raise "
                         f"--steps, so the range test sees the loss fall before it diverges.")
    return Found(lrs, losses, raw, float(x[valley(y)]), float(x[steep(x, y)]), float(x[np.argmin(y)]) / 10, stopped)


def valley(losses: np.ndarray) -> int:
    """fastai's valley: the longest decreasing subsequence, and the point halfway into it
    (a third plus a sixth of its length after its start)."""
    n = len(losses)
    run = [1] * n  # the longest decreasing subsequence ending at i
    start = end = 0
    for i in range(1, n):
        for j in range(i):
            if losses[i] < losses[j] and run[i] < run[j] + 1:
                run[i] = run[j] + 1
            if run[end] < run[i]:
                end, start = i, i - run[i]
    third = (end - start) / 3
    return start + int(third) + int(third / 2)


def steep(lrs: np.ndarray, losses: np.ndarray) -> int:
    """The point where the loss falls fastest against log lr."""
    return int(np.argmin(np.diff(losses) / np.diff(np.log(lrs))))


def figure(found: Found, title: str):
    """The range test's matplotlib Figure (open: :func:`plot` saves and closes it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter

    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.plot(found.lrs, found.raw, lw=0.6, alpha=0.4, label="loss")
    ax.plot(found.lrs, found.losses, lw=1.5, label=f"smoothed (β {BETA})")
    for name, lr, mark in (("valley", found.valley, "o"), ("steep", found.steep, "s"),
                           ("minimum", found.minimum, "^")):
        ax.plot([lr], [np.interp(np.log(lr), np.log(found.lrs), found.losses)], mark, label=f"{name} {lr:.2g}")
    lo, hi = min(found.losses), max(found.losses)
    pad = 0.1 * (hi - lo) or 0.1 * abs(hi) or 1.0
    ax.set_ylim(lo - pad, hi + pad)  # the smoothed curve fills the plot; raw spikes past it are cut
    ax.set(xscale="log", xlabel="learning rate", ylabel="training loss", title=title)
    ax.xaxis.set_major_formatter(LogFormatter())  # 1e-05, not mathtext (whose fonts a lean install may lack)
    ax.legend()
    fig.tight_layout()
    return fig


def plot(found: Found, path: Path, title: str) -> Path:
    import matplotlib.pyplot as plt

    fig = figure(found, title)
    out = atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110), TrainError)
    plt.close(fig)
    return out


def lr_find(recipe: Recipe, *, runs_root: str | Path = "runs", steps: int = 100, start: float = 1e-7,
            end: float = 10.0, quiet: bool = False) -> Found:
    """The range test on ``recipe``'s model and training data; plot and record in
    ``runs_root/NAME-lr-find/``."""
    from ..dist.backend import Backend
    from ..pipeline import with_input_name
    from ..tasks import get_task
    from .loop import Stepper, finetune, make_trainer, parse_ctx, seed_all, step_seed
    from .weights import ensure_weights

    if not (0 < start < end) or steps < 20:
        raise TrainError(f"lr-find needs 0 < --start < --end and --steps of 20 or more (got start {start:g}, end "
                         f"{end:g}, steps {steps}): fewer steps leave nothing to suggest from.")
    if recipe.data is None:
        raise TrainError("The recipe has no data: section; lr-find trains on the training data "
                         "(e.g. data: {source: demo:digits}).")
    t = recipe.train
    ctxs = parse_ctx(t.ctx)
    ensure_weights(recipe, finetune, quiet=quiet)  # model.weights_from: made on first use, as finetune does
    recipe = with_input_name(recipe)
    out = Path(runs_root) / f"{recipe.name}-lr-find"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TrainError(f"Cannot create '{out}' for lr-find's plot: {e.strerror}. Pick a writable place with "
                         f"--runs DIR.") from None
    began = time.perf_counter()
    seed_all(t.seed)
    task = get_task(recipe)
    prep, loaders = task.setup(recipe, ctxs[0], seed=t.seed)
    net = prep.block
    if len(ctxs) > 1:
        net.collect_params().reset_ctx(ctxs)
    trainer = make_trainer(net, recipe.model_copy(update={"train": t.model_copy(update={"lr": start})}), Backend())
    if t.hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    feed = task.feed(net, prep.plan, recipe, loaders, ctxs[0], RunFolder(out).feature_cache_dir(), not bars_on(quiet),
                     None)
    say(quiet, feed.log)
    stepper = Stepper(feed.net, trainer, task.forward, ctxs)
    n_batches = loaders.train_sampler.batches_per_epoch()

    # every pass over the data trains on the cache's first view (epoch e of the loop trains on view
    # e % views), in a new order: one prefix pass however many passes the steps take
    views = feed.cache.views if feed.cache is not None else 1

    def batches():
        for epoch in itertools.count(step=views):
            feed.prepare(epoch)
            for i, (x, y) in enumerate(feed.train_batches(epoch, 0)):
                mx.random.seed(step_seed(t.seed, epoch, i))
                yield x, y, (i + 1) % t.accumulate == 0 or i + 1 == n_batches

    data = batches()

    def step(lr: float) -> float:
        trainer.set_learning_rate(lr)
        total, images = 0.0, 0
        while True:
            x, y, update = next(data)
            total += stepper.step(x, y, update=update)
            images += stepper.images
            if update:
                return total / images

    try:
        found = sweep(step, steps, start, end)
        found.feed = feed.summary()
    finally:
        feed.close()
    found.seconds = time.perf_counter() - began
    found.plot = plot(found, out / "lr_find.png", f"{recipe.name}: lr-find")
    found.record = write_text(RunFolder(out).lr_find_path, json.dumps(found.to_json(), indent=1), TrainError)
    return found
