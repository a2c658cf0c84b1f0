"""The fine-tuning loop: hybridized block, Trainer over trainable parameters only.

Determinism is designed in, not hoped for: data order and augmentation come from
(seed, epoch, index), the lr from the global step, and MXNet's RNG is reseeded every
step, so a resumed run continues exactly where an uninterrupted one would be.

When the rules leave a frozen prefix, the loop trains only the suffix after it, from
cached prefix features or from a faster prefix engine (``data/cache.py``, ``data/prefix.py``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import mxnet as mx
import numpy as np
import yaml
from mxnet import autograd, gluon

from ..atomic import write_text
from ..console import WorkerLog, alert, bars_on, say, show
from ..runfolder import RunFolder, discard_unstarted
from ..dist.backend import Backend, connect
from ..errors import Interrupted, TrainError, resume_command
from ..pipeline import with_input_name
from ..recipe import Recipe, ScheduleSpec, load_recipe, resolve_backend
from ..naming import named_params
from ..adapters import adapters_of, save_adapters
from ..rules import Plan, apply_plan, format_plan, freeze_bn_stats, make_plan, trainable_params
from ..tasks import get_task, split, transform_lines
from ..data import checkpoint
from ..data.cache import Feed
from ..metrics import computed_metrics, find_metric
from ..readers import read_json
from .callbacks import Callback, Callbacks, RunInfo, Step, build as build_callbacks
from .elastic import global_batch, rebatch
from .engine import Average, Batch, Console, Guards, KeepBest, Record
from .gpu import check_gpus
from ..data.guards import GuardLog
from .schedule import lr_at
from .weights import ensure_weights


def parse_ctx(spec: str) -> list[mx.Context]:
    kind, _, ids = spec.partition(":")
    make = mx.gpu if kind == "gpu" else mx.cpu
    ctxs = [make(int(i)) for i in ids.split(",")] if ids else [make(0)]
    if kind == "gpu":
        check_gpus(spec, [c.device_id for c in ctxs])
    return ctxs


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    mx.random.seed(seed % 2**31)


@dataclasses.dataclass
class RunResult:
    run_dir: Path
    metrics: list[dict[str, Any]]
    best: dict[str, Any] | None
    stopped_early: bool = False
    rank: int = 0  # a distributed worker's rank; only rank 0 writes the run folder
    workers: int = 1
    exported: list[Path] = dataclasses.field(default_factory=list)  # what the recipe's export: section wrote
    finished_before: bool = False  # a resume of a run that had already finished: nothing was done
    stop_reason: str | None = None  # a callback (early stopping) ended the run before train.epochs: why
    callbacks: Any = dataclasses.field(default=None, repr=False)  # the run's Callbacks (on_exported)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def last_epoch(self) -> dict[str, Any] | None:
        epochs = [m for m in self.metrics if "epoch" in m]
        return epochs[-1] if epochs else None


class _Stop:
    """SIGINT/SIGTERM set a flag; the loop checkpoints at the next step boundary and exits."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> "_Stop":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread
                pass
        return self

    def _handle(self, signum, frame) -> None:
        self.signum = self.signum or signum

    def __exit__(self, *exc) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


_RESUME_SECTIONS = ("model", "surgery", "rules", "data", "train")
_EXTENDABLE = ("train.epochs", "train.schedule.")  # what a resume may change: the schedule's length and shape


def _resume_digest(recipe: Recipe) -> str:
    """What a checkpoint records of its recipe: all that decides the computation but the
    schedule, which a resume may lengthen or reshape to extend the run."""
    fixed = recipe.train.model_copy(update={"epochs": 1, "schedule": ScheduleSpec()})
    return recipe.model_copy(update={"train": fixed}).digest(*_RESUME_SECTIONS)


def _check_resume(run_dir: Path, recipe: Recipe, meta: dict[str, Any]) -> list[str]:
    """Refuse a resume that would compute something else; accept a longer or different
    schedule, returning what differs (for the run's recipe.yaml)."""
    old = load_recipe(RunFolder(run_dir).recipe_path)
    diff = old.differences(recipe, *_RESUME_SECTIONS)
    if meta.get("recipe_digest") not in (_resume_digest(recipe), recipe.digest(*_RESUME_SECTIONS)):
        fixed = [d for d in diff if not d.startswith(_EXTENDABLE)]
        if not fixed:  # same settings, other digest: fields added since, or recipe.yaml edited by hand
            raise TrainError(f"Cannot resume {run_dir}: its checkpoint records a recipe digest that this "
                             f"gluontl does not compute from {RunFolder(run_dir).recipe_path}, although the "
                             f"settings agree: the run was written by an older gluontl (recipes have gained fields "
                             f"since) or {RunFolder.RECIPE} was edited by hand. Start a new run from this one's "
                             f"weights with `gluontl finetune --recipe {RunFolder(run_dir).recipe_path} --init-from "
                             f"{run_dir}`.")
        raise TrainError(f"Cannot resume {run_dir}: the recipe differs from the one the run started with "
                         f"({'; '.join(fixed[:8])}). A resume may change only "
                         f"train.epochs and train.schedule (to extend the run); resume with "
                         f"`gluontl finetune --resume {run_dir}` (it uses {RunFolder(run_dir).recipe_path}), or "
                         f"start a new run from this one's weights with `--init-from {run_dir}`.")
    done = meta["epoch"] + (1 if meta["batch_in_epoch"] else 0)
    if recipe.train.epochs < done:
        raise TrainError(f"Cannot resume {run_dir} with train.epochs={recipe.train.epochs}: it has already "
                         f"trained {meta['epoch']} epochs{' and part of the next' if meta['batch_in_epoch'] else ''}. "
                         f"Set train.epochs to {done} or more to continue it (e.g. --set "
                         f"train.epochs={done + 5}).")
    return diff


def _finished(run_dir: Path, recipe: Recipe, meta: dict[str, Any]) -> bool:
    """Whether the checkpoint is the end of all ``train.epochs`` and the run wrote its summary
    after it (a run killed between its last checkpoint and its summary still has to finish)."""
    if meta["batch_in_epoch"] or meta["epoch"] != recipe.train.epochs:
        return False
    try:
        last = read_json(RunFolder(run_dir).summary_path, TrainError, "the run summary")["last"]
        return (last["step"], last["epoch"]) == (meta["global_step"], meta["epoch"])
    except (TrainError, TypeError, KeyError):
        return False


def _best_text(best: dict[str, Any] | None, select: str) -> str:
    metric = find_metric(select)
    label = metric.label if metric else select  # the epoch lines' name
    return f"best {label} {best[select]:.4f} at epoch {best['epoch']}" if best and select in best else "no best yet"


def _nothing_to_do(run_dir: Path, recipe: Recipe, meta: dict[str, Any], dist: Backend, quiet: bool) -> RunResult:
    """A resume of a finished run: say so, and touch nothing (no export either)."""
    from .logs import read_metrics

    if dist.is_root and meta.get("early_stopped"):
        stopped = meta["early_stopped"]
        show(f"{run_dir} was stopped by {stopped['reason']} after epoch {stopped['epoch']} (step {stopped['step']}; "
             f"{_best_text(meta.get('best'), recipe.train.select)}); nothing to do, nothing rewritten. To train on "
             f"from its weights, start a new run: `gluontl finetune --recipe {RunFolder(run_dir).recipe_path} "
             f"--init-from {run_dir}`.", quiet)
    elif dist.is_root:
        epochs = meta["epoch"]
        best = _best_text(meta.get("best"), recipe.train.select)
        show(f"{run_dir} already finished its {epochs} epoch{'s' * (epochs != 1)} ({best}); "
             f"nothing to do, nothing rewritten. To train it longer: "
             f"`{resume_command(run_dir, dist.size)} --set train.epochs={epochs + 5}`.", quiet)
    return RunResult(run_dir, read_metrics(RunFolder(run_dir).metrics_path), meta.get("best"), rank=dist.rank,
                     workers=dist.size, finished_before=True,
                     stop_reason=(meta.get("early_stopped") or {}).get("reason"))


def _write_recipe(run_dir: Path, recipe: Recipe) -> None:
    write_text(RunFolder(run_dir).recipe_path, yaml.safe_dump(recipe.as_written(), sort_keys=False))


def step_seed(seed: int, epoch: int, index: int) -> int:
    """MXNet's seed before batch ``index`` of ``epoch`` (dropout, ...): a function of the position
    alone, so a resumed run draws what the uninterrupted one did. The one home of the formula."""
    return (seed * 1_000_003 + epoch * 10_007 + index) % 2**31


def make_trainer(net, recipe: Recipe, dist: Backend) -> gluon.Trainer:
    """The set-up the loop and lr-find share: the parameters' accumulation mode (train.accumulate)
    and a Trainer over the parameters that train."""
    _set_accumulation(net, recipe.train.accumulate)
    t = recipe.train
    params = trainable_params(net)
    if not params:
        raise TrainError("No parameter trains under these rules: every grad_req is null. "
                         "Add a rule with grad_req: write (e.g. stage: head).")
    opt: dict[str, Any] = {"learning_rate": t.lr, "wd": t.wd}
    if t.optimizer in ("sgd", "nag"):
        opt["momentum"] = t.momentum
    if t.clip_gradient:
        opt["clip_gradient"] = t.clip_gradient
    return dist.trainer(list(params.values()), t.optimizer, opt)


def _set_accumulation(net, k: int) -> None:
    """With k > 1 every trainable parameter accumulates (grad_req add) and is zeroed after each update."""
    if k > 1:
        for p in trainable_params(net).values():
            p.grad_req = "add"


class Stepper:
    """One training step over a batch split across contexts: the task's forward + loss,
    backward and, when ``update`` says so, the optimizer update.

    The loop, the feature-cache path (``net`` is then the trainable suffix) and
    ``scripts/bench_finetune.py`` share it, so the benchmark times the step that trains.
    For gradient accumulation the caller puts the parameters in ``grad_req: add``
    (``_set_accumulation``) and passes ``update=False`` until the k-th batch; ``pending``
    counts the images the piled-up gradients cover. A non-finite loss discards them and
    updates nothing. ``correct`` is the batch's hits in training mode (classification: top-1;
    None where the task has no such count), so train accuracy comes on the fly, without a
    second pass over the training set.

    ``forward(net, xs, ys) -> (losses, hits)`` is the task's (``gluontl.tasks``).

    Distributed (``dist``), the loss, image and hit counts and the stop flag of a batch are
    summed over the workers in one message before anything is decided: every worker skips a
    non-finite step, or stops, at the same step (a worker skipping alone would hang the
    others), and ``images``/``correct``/the returned loss are global.
    """

    def __init__(self, net, trainer: gluon.Trainer, forward: Callable, ctxs: list[mx.Context],
                 dist: Backend | None = None) -> None:
        self.net, self.trainer, self.forward, self.ctxs = net, trainer, forward, ctxs
        self.dist = dist or Backend()
        self.params = list(trainable_params(net).values())
        self.pending = 0
        self.updated = False
        self.correct: int | None = 0
        self.images = 0
        self.stop = False

    def step(self, x: mx.nd.NDArray, y: mx.nd.NDArray, update: bool = True, stop: bool = False) -> float:
        """Summed loss of the batch (synchronizes, like any loss read)."""
        xs = split(x, self.ctxs)
        ys = split(y, self.ctxs)
        with autograd.record():
            losses, hits = self.forward(self.net, xs, ys)
        autograd.backward(losses)
        if len(xs) < len(self.ctxs):
            self._idle_contexts(len(xs))
        batch_loss = sum(float(l.sum().asscalar()) for l in losses)
        self.correct = None if hits is None else sum(int(h.asscalar()) for h in hits)
        self.images, self.stop = x.shape[0], stop
        if self.dist.size > 1:
            total = self.dist.sum(np.array([batch_loss, self.images, self.correct or 0, stop], np.float64))
            batch_loss, self.images, self.stop = float(total[0]), int(total[1]), bool(total[3])
            self.correct = None if hits is None else int(total[2])
        self.updated = False
        if not np.isfinite(batch_loss):
            self._zero_grads()
            self.pending = 0
            return batch_loss
        self.pending += self.images
        if update:
            self.trainer.step(self.dist.step_batch(self.pending))
            self._zero_grads(only_add=True)
            self.pending = 0
            self.updated = True
        return batch_loss

    def _idle_contexts(self, used: int) -> None:
        """A batch smaller than the context list left the last contexts without a backward:
        they add nothing (their write-gradients are zeroed) and count as fresh, so the Trainer's
        sum over contexts is the batch's gradient and every copy of a weight gets the same update."""
        for p in self.params:
            for data, grad in zip(p.list_data()[used:], p.list_grad()[used:]):
                if p.grad_req == "write":
                    grad[:] = 0
                data._fresh_grad = True

    def _zero_grads(self, only_add: bool = False) -> None:
        for p in self.params:
            if not only_add or p.grad_req == "add":
                p.zero_grad()


def lower_lr_hint(plan) -> str:
    """What to lower when training diverged: with LoRA factors in the plan, their lr_mult first
    (small tensors at a full fine-tune's rate are what runs away; docs/recipes.md 'Adapters')."""
    factors = _factors(plan)
    if not factors:
        return "Lower train.lr or set train.clip_gradient."
    rules = sorted({r.decided_by["lr_mult"] for r in factors})
    mults = sorted({r.lr_mult for r in factors})
    return (f"The plan trains {len(factors)} LoRA factors at lr_mult {'/'.join(f'{m:g}' for m in mults)} (decided "
            f"by rule {', '.join(rules)}): lower the adapter's lr_mult in that rule (e.g. lr_mult: "
            f"{min(mults) / 10:g}), or train.lr, or set train.clip_gradient.")


def _factors(plan) -> list:
    return [r for r in plan.rows if r.adapter and r.adapter.startswith("lora_") and r.grad_req != "null"]


def _check_finite(net, step: int, run_dir: Path, plan=None) -> None:
    """A trained weight gone NaN/Inf stops the run even when the loss stays finite: MXNet's relu and
    max pooling turn NaN into numbers, so a diverged layer before one (a LoRA factor, say) hides
    from the loss check and the run would finish, and export, a broken model."""
    for name, p in trainable_params(net).items():
        if not all(np.isfinite(copy.asnumpy()).all() for copy in p.list_data()):  # every context's copy
            raise TrainError(f"Parameter '{name}' holds NaN/Inf after step {step}, though the loss may not show it "
                             f"(relu and max pooling turn NaN into 0); nothing was checkpointed, the last good "
                             f"checkpoint is in {RunFolder(run_dir).checkpoints_dir}. " + (
                                 lower_lr_hint(plan) if plan is not None and _factors(plan) else
                                 f"Lower train.lr (or the lr_mult of the rule that trains '{name}') or set "
                                 f"train.clip_gradient."))


def finetune(recipe: Recipe, *, runs_root: str | Path = "runs", resume: str | Path | None = None,
             quiet: bool = False, stop_after_steps: int | None = None,
             callbacks: list[Callback] | tuple[Callback, ...] = ()) -> RunResult:
    """Fine-tune per the recipe into a run folder; ``resume`` continues a run folder.

    SIGINT/SIGTERM checkpoint at the next step boundary and raise ``Interrupted``;
    ``stop_after_steps`` stops the same way after that many optimizer steps in this call
    but returns (``stopped_early``): a time-boxed slot (``--stop-after-steps``), and a stop
    that tests can place exactly. ``callbacks`` run after the recipe's ``train.callbacks``.
    """
    if recipe.data is None:
        raise TrainError("The recipe has no data: section; finetune needs training data "
                         "(e.g. data: {source: demo:digits}).")
    if recipe.train.lr == "auto":
        raise TrainError("train.lr: auto is resolved by gluontl finetune and gluontl.finetune (which run the range "
                         "test first); the loop itself needs a number: run `gluontl lr-find` and set train.lr.")
    ctxs = parse_ctx(recipe.train.ctx)  # a card MXNet cannot use is refused before any pretrain or connect
    recipe = resolve_backend(recipe)
    t = recipe.train
    if t.distributed.backend != "none":
        _weights_made_before(recipe)
    else:
        _alone(recipe)
    ensure_weights(recipe, finetune, quiet=quiet)
    recipe = with_input_name(recipe)
    dist = connect(t.distributed, alert)
    if dist.size > 1:  # what `gluontl launch` reads to name a failing worker by rank
        print(f"gluontl worker: rank {dist.rank} of {dist.size}", file=sys.stderr, flush=True)
    with contextlib.ExitStack() as logs:
        # a worker's lines go to RUN/logs/worker-RANK.log once the run folder is known; rank 0's also to the console
        worker_log = logs.enter_context(WorkerLog(echo=dist.is_root)) if dist.size > 1 else None

        made: list[Path] = []

        def logged(run_dir: Path) -> None:
            made.append(run_dir)
            if dist.size > 1:  # what `gluontl launch --max-restarts` resumes
                print(f"gluontl worker: run folder {Path(run_dir).resolve()}", file=sys.stderr, flush=True)
            if worker_log is not None:
                worker_log.open(RunFolder(run_dir).worker_log(dist.rank))

        try:
            return _finetune(recipe, dist, ctxs, runs_root, resume, quiet, stop_after_steps, logged, list(callbacks))
        except BaseException as e:  # a new run that ends before its first checkpoint leaves no folder
            if made and resume is None and dist.size == 1 and not isinstance(e, Interrupted):
                discard_unstarted(made[0])
            raise


def _alone(recipe: Recipe) -> None:
    """A job's worker whose recipe does not say how to share the work would train on its own and
    race the others for the run folder."""
    if os.environ.get("DMLC_ROLE") == "worker" or "HOROVOD_RANK" in os.environ:
        engine = "kvstore" if os.environ.get("DMLC_ROLE") == "worker" else "horovod"
        raise TrainError(f"This process is a worker of a distributed job (started by "
                         f"{'gluontl launch' if engine == 'kvstore' else 'horovodrun'}) but recipe '{recipe.name}' "
                         f"has train.distributed.backend: none, so every worker would train alone. Set "
                         f"train.distributed.backend: {engine} in the recipe (or --set "
                         f"train.distributed.backend={engine}){' or leave it unset' if engine == 'kvstore' else ''}"
                         f", or run finetune without the launcher.")


def _weights_made_before(recipe: Recipe) -> None:
    """Every worker would pretrain at once and race to write the file: `gluontl launch` makes it
    before it starts them; a worker that still finds it missing was started otherwise (a cluster's
    launcher) or on a host that does not see the launcher's file."""
    spec = recipe.model
    if spec.weights and spec.weights_from and not Path(spec.weights).is_file():
        raise TrainError(f"model.weights '{spec.weights}' does not exist yet on this worker's machine; a worker "
                         f"does not make it (every worker would train {spec.weights_from} at once). `gluontl "
                         f"launch` makes it before it starts the workers, in its working folder: on several "
                         f"machines that folder must be on a shared file system. Otherwise make it first in one "
                         f"process (`gluontl finetune --recipe {spec.weights_from}` and copy its "
                         f"{RunFolder('runs/NAME').checkpoint_params('best')} to '{spec.weights}'), or run "
                         f"this recipe once without "
                         f"train.distributed.")


def _finetune(recipe: Recipe, dist: Backend, ctxs: list[mx.Context], runs_root: str | Path,
              resume: str | Path | None, quiet: bool, stop_after_steps: int | None,
              logged: Callable[[Path], None], callbacks: list[Callback]) -> RunResult:
    """The run's life as its steps: open the run, then per epoch train and validate + checkpoint,
    then the summary."""
    meta, extending = None, []
    if resume is not None:  # checked before any work: a finished run or a refused resume answers at once
        run_dir = Path(resume)
        meta = checkpoint.load(RunFolder(run_dir).checkpoints_dir, "last")
        extending = _check_resume(run_dir, recipe, meta)
        if _finished(run_dir, recipe, meta) or meta.get("early_stopped"):
            return _nothing_to_do(run_dir, recipe, meta, dist, quiet)
        written, total = recipe, global_batch(recipe, meta)
        if total != dist.size * recipe.data.batch_size:  # another worker count: the global batch and order stay
            recipe = rebatch(run_dir, recipe, meta, dist.size)
            show(f"resuming on {dist.size} worker(s) a run trained on {meta.get('workers', 1)}: data.batch_size "
                 f"{recipe.data.batch_size} per worker, {total} images a step as before", quiet)
    run = _Run(recipe, dist, ctxs, quiet, stop_after_steps)
    if meta is not None and recipe is not written:  # its digest stays the run's recipe's
        run.digest_of, run.global_batch = written, total
    run.open(runs_root, resume, meta, extending, logged, callbacks)
    completed = False  # every epoch trained: the feature cache goes; otherwise it stays for the resume
    with _Stop() as stop:
        try:
            run.callbacks.call("on_run_start")
            for epoch in range(run.start_epoch, recipe.train.epochs):
                sums = run.train_epoch(epoch, stop)
                if run.stopped or run.validate(epoch, sums, stop) or run.stop_reason:
                    break
            completed = not run.stopped
        except BaseException as e:
            run.callbacks.call("on_exception", e)
            raise
        finally:
            run.close(completed)
    return run.summary(stop)


class _Run:
    """One call of ``finetune``: what its steps share (model, feed, trainer, counters)."""

    def __init__(self, recipe: Recipe, dist: Backend, ctxs: list[mx.Context], quiet: bool,
                 stop_after_steps: int | None) -> None:
        self.recipe, self.t, self.dist, self.ctxs = recipe, recipe.train, dist, ctxs
        self.quiet, self.stop_after_steps = quiet, stop_after_steps
        self.root = dist.is_root  # only rank 0 writes the run folder; every worker writes its own log
        self.stopped = False  # ended before its last epoch by a signal or stop_after_steps (a resume continues it)
        self.stop_reason: str | None = None  # ended by a callback's request (a complete run)
        self.steps_this_call = 0
        self.bad_steps = 0
        self.feed: Feed | None = None
        self.digest_of: Recipe | None = None  # a resume on another worker count: the recipe before rebatch
        self.global_batch = 0  # recorded once a run resumed: what a resume on other workers keeps

    # ------------------------------------------------------------------ open the run

    def open(self, runs_root: str | Path, resume: str | Path | None, meta: dict[str, Any] | None,
             extending: list[str], logged: Callable[[Path], None], callbacks: list[Callback]) -> None:
        """Model, data, run folder, plan and trainer; a resume's checkpoint loaded into them."""
        recipe, t, dist, quiet, root = self.recipe, self.t, self.dist, self.quiet, self.root
        ctxs = self.ctxs
        say(quiet, f"threads: OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset (mxnet default)')}; "
                    f"hybridize static_alloc/static_shape: {t.hybridize}")
        seed_all(t.seed)
        self.task = task = get_task(recipe)
        self.prep, self.loaders = prep, loaders = task.setup(recipe, ctxs[0], seed=t.seed)
        self.net = net = prep.block
        guards = Guards(GuardLog(t.guards), task, loaders, resumed=resume is not None)
        if resume is None:  # a resumed run was checked when it started
            task.check(recipe, prep, loaders, ctxs[0], guards.log)
        if len(ctxs) > 1:
            net.collect_params().reset_ctx(ctxs)
        if resume is not None:
            run_dir = Path(resume)
        if extending:
            say(quiet, f"extending {run_dir}: {'; '.join(extending)}")
            if root:
                _write_recipe(run_dir, self.digest_of or recipe)
        if resume is None:
            with dist.guard("sharing the run folder's name"):
                run_dir = Path(dist.broadcast_text(str(RunFolder.create(Path(runs_root), recipe.name)) if root else ""))
            if root:
                _write_recipe(run_dir, recipe)
                if loaders.split is not None:  # an automatic hold-out: which files it held out, for audits
                    write_text(RunFolder(run_dir).split_path, json.dumps(loaders.split.to_json(), indent=1), TrainError)
                    say(quiet, loaders.split.summary(loaders.train_size, loaders.val_size))
        self.run_dir = run_dir
        logged(run_dir)
        if root:
            guards.log.attach(run_dir)
            # preprocessing + class names: what predict and exports read
            write_text(RunFolder(run_dir).card_path, json.dumps(task.card(recipe, loaders), indent=1), TrainError)
        if dist.size > 1:
            loaders.train_sampler.shard(dist.rank, dist.size)
            if loaders.train_sampler.batches_per_epoch() == 0:
                raise TrainError(f"The training split has {loaders.train_size} images, fewer than {dist.size} "
                                 f"workers × data.batch_size {recipe.data.batch_size}, so a distributed epoch would "
                                 f"have no step. Lower data.batch_size (it is per worker) or use fewer workers.")
            say(quiet, f"distributed ({dist.name}): rank {dist.rank} of {dist.size}; a step covers {dist.size} × "
                       f"{recipe.data.batch_size} images; BatchNorm statistics: {t.distributed.batch_norm}")
        self.n_batches = loaders.train_sampler.batches_per_epoch()
        self.epoch_data = _epoch_data(loaders.train_sampler)
        say(quiet, self.epoch_data["note"])
        self.steps_per_epoch = max(1, self.n_batches // t.accumulate)
        was = meta or {}  # a distributed run resumed on one worker keeps what it trained with
        self.frozen_bn = (dist.size > 1 or was.get("workers", 1) > 1 or bool(was.get("global_batch"))) and \
            t.distributed.batch_norm == "frozen"

        plan = prep.plan
        self.start_epoch, self.skip, self.global_step = 0, 0, 0
        self.partial = (0.0, 0, 0)
        if meta is not None:
            self.start_epoch, self.skip, self.global_step = meta["epoch"], meta["batch_in_epoch"], meta["global_step"]
            self.partial = (*meta.get("epoch_loss", (0.0, 0)), meta.get("epoch_correct", 0))
            plan = self.plan_for(self.start_epoch)
            apply_plan(net, plan)
        elif self.frozen_bn:
            plan = freeze_bn_stats(plan, "train.distributed.batch_norm")
            apply_plan(net, plan)
        self.plan = plan
        self.trainer = make_trainer(net, recipe, dist)
        dist.prepare(self.trainer)  # before restore_into: loading trainer states would do it lazily, racing
        if meta is not None:
            # at an epoch whose rules differ from the epoch before, the uninterrupted run builds a new
            # trainer (fresh optimizer state, see train_epoch): so does the resume
            fresh = not self.skip and self.start_epoch > 0 and \
                plan.settings() != self.plan_for(self.start_epoch - 1).settings()
            checkpoint.restore_into(RunFolder(run_dir).checkpoints_dir, "last", net,
                                    None if fresh else self.trainer, ctxs[0])
        if t.hybridize:
            net.hybridize(static_alloc=True, static_shape=True)
        self.state = {"recipe_digest": _resume_digest(self.digest_of or recipe),
                      **({"workers": dist.size} if dist.size > 1 else {}),
                      **({"global_batch": self.global_batch} if self.global_batch else {})}
        self.info = info = RunInfo(recipe, run_dir, dist.rank, dist.size)
        info.epoch, info.global_step = self.start_epoch, self.global_step
        info.batches_per_epoch = self.n_batches
        average = None if t.ema is None else Average.open(info, net, meta is not None, self._bn_names,
                                                           self._recompute_args)
        engine = [Record(run_dir, None if meta is None else self.global_step, root, t.log_every), Console(quiet),
                  *([average] if average else []),
                  KeepBest(info, None if meta is None else meta.get("best"), average is not None, self._save_best),
                  guards]
        self.callbacks = Callbacks(build_callbacks(recipe, callbacks), info, engine)
        self.callbacks.load(None if meta is None else meta.get("callbacks"))

    def _bn_names(self) -> list[str]:
        """The BatchNorm statistics the plan has (what an average's recompute moves)."""
        return [r.name for r in self.plan.rows if r.aux]

    def _recompute_args(self, epoch: int) -> tuple:
        """``Ema.recompute_bn``'s arguments for ``epoch``: the run's feed, forward and contexts."""
        return (self.feed.net, trainable_params(self.net).values(), self.task.forward,
                self.feed.train_batches(epoch, 0), self.ctxs, split, step_seed(self.t.seed, epoch, 7_919_000))

    def _save_best(self, epoch: int) -> None:
        self.save("best", epoch=epoch, batch_in_epoch=0)

    def plan_for(self, epoch: int) -> Plan:
        p = make_plan(self.net, self.recipe.rules, epoch=epoch, input_shape=self.recipe.model.input_shape)
        return freeze_bn_stats(p, "train.distributed.batch_norm") if self.frozen_bn else p

    def save(self, tag: str, epoch: int, batch_in_epoch: int, **counters: Any) -> None:
        _check_finite(self.net, self.global_step, self.run_dir, self.plan)  # before writing: the last good checkpoint stays
        if self.root:  # a distributed run's BatchNorm statistics were made rank 0's everywhere before
            extra = {"callbacks": self.callbacks.state()} if self.callbacks.list else {}
            record = dict(self.state, epoch=epoch, batch_in_epoch=batch_in_epoch, global_step=self.global_step,
                          **self.callbacks.engine_state("checkpoint_record"), **counters, **extra)
            checkpoint.save(RunFolder(self.run_dir).checkpoints_dir, tag, self.net, self.trainer, record,
                            self.callbacks.checkpoint_arrays())
            if tag == "best" and adapters_of(self.net):  # the adapters alone, for load_adapters onto the base
                save_adapters(self.net, RunFolder(self.run_dir).adapters_path)

    # ------------------------------------------------------------------ one epoch

    def _replan(self, epoch: int) -> None:
        """The epoch's rules: a changed plan rebuilds the trainer, and the feed follows the plan."""
        quiet = self.quiet
        new_plan = self.plan_for(epoch)
        replan = new_plan.settings() != self.plan.settings()
        if replan:
            changed = [n for n, s in new_plan.settings().items() if self.plan.settings()[n] != s]
            say(quiet, f"epoch {epoch}: rules changed {len(changed)} parameters (e.g. {changed[0]}); "
                        f"rebuilding the trainer and the cached graph")
            self.plan = new_plan
            apply_plan(self.net, self.plan)
            self.trainer = make_trainer(self.net, self.recipe, self.dist)
            self.callbacks.call_engine("on_replan", self.net)
        if replan or self.feed is None:
            dist = self.dist
            cache_dir = RunFolder(self.run_dir).feature_cache_dir(dist.rank, dist.size)
            new_feed = self.task.feed(self.net, self.plan, self.recipe, self.loaders, self.ctxs[0], cache_dir,
                                      not bars_on(quiet), self.feed)
            if new_feed is not self.feed:
                say(quiet, new_feed.log)
                if self.feed is not None:
                    self.feed.close()
            self.feed = new_feed
            if self.root:
                _write_plan(self.run_dir, self.plan, self.feed, self.task.transforms(self.recipe), self.epoch_data,
                            self.callbacks.engine_state("plan_notes"))

    def train_epoch(self, epoch: int, stop: _Stop) -> tuple[float, int, int | None, float]:
        """Train ``epoch`` from batch ``self.skip``: (summed loss, images, hits or None, start time).
        A stop request or ``stop_after_steps`` checkpoints at a step boundary and sets ``stopped``."""
        t, dist = self.t, self.dist
        t0 = time.perf_counter()
        self._replan(epoch)
        feed, trainer, n_batches, skip = self.feed, self.trainer, self.n_batches, self.skip
        stepper = Stepper(feed.net, trainer, self.task.forward, self.ctxs, dist)
        feed.prepare(epoch)
        self.info.epoch = epoch
        if not skip:  # a resume inside an epoch: the uninterrupted run started this epoch before the checkpoint
            self.callbacks.call("on_epoch_start", epoch)
        batches = self.callbacks.batches(feed.train_batches(epoch, skip), epoch, skip, n_batches)
        (run_loss, run_n, run_correct), self.partial = self.partial, (0.0, 0, 0)
        tick = time.perf_counter()  # img_per_s: since the last step, so data and prefix count too
        for i, (x, y) in enumerate(batches, start=skip):
            mx.random.seed(step_seed(t.seed, epoch, i))
            lr = lr_at(t.schedule, t.lr, self.global_step, self.steps_per_epoch, t.epochs)
            trainer.set_learning_rate(lr)
            with dist.guard("a training step"):
                batch_loss = stepper.step(x, y, update=(i + 1) % t.accumulate == 0 or i + 1 == n_batches,
                                          stop=stop.requested)
            if not np.isfinite(batch_loss):
                self.bad_steps += 1
                if self.bad_steps > t.max_bad_steps:
                    saved = RunFolder(self.run_dir).has_checkpoint("last")  # else the folder goes
                    raise TrainError(f"Loss was NaN/Inf in {self.bad_steps} steps (epoch {epoch}); " + (
                                     f"the last good checkpoint is in {RunFolder(self.run_dir).checkpoints_dir}"
                                     if saved else
                                     "no checkpoint was written yet") + f". {lower_lr_hint(self.plan)}")
                continue
            run_loss += batch_loss
            run_n += stepper.images
            run_correct = None if stepper.correct is None else run_correct + stepper.correct
            ips, tick = stepper.images / max(time.perf_counter() - tick, 1e-9), time.perf_counter()
            self.callbacks.call_engine("on_batch", Batch(epoch, i, batch_loss / stepper.images, stepper.images,
                                                         run_loss / run_n, lr, ips))
            if stepper.updated:
                self.global_step += 1
                self.steps_this_call += 1
                self.info.global_step = self.global_step
                self.callbacks.call("on_step", Step(self.global_step, epoch, i, batch_loss / stepper.images,
                                                    stepper.images, lr, ips))
            halt = stepper.stop if dist.size > 1 else stop.requested
            if halt or (self.stop_after_steps is not None and self.steps_this_call >= self.stop_after_steps):
                if stepper.pending == 0:
                    _share_bn_stats(self.net, self.plan, dist, t.distributed.batch_norm)
                    self.save("last", epoch=epoch, batch_in_epoch=i + 1, epoch_loss=(run_loss, run_n),
                              epoch_correct=run_correct)
                    self.stopped = True
                    break
        self.skip = 0
        return run_loss, run_n, run_correct, t0

    # ------------------------------------------------------------------ validate + checkpoint

    def validate(self, epoch: int, sums: tuple[float, int, int | None, float], stop: _Stop) -> bool:
        """Validate the epoch (every ``train.val_every``-th and the last), log it, checkpoint best
        and last; whether a stop request ends the run here."""
        t, dist = self.t, self.dist
        run_loss, run_n, run_correct, t0 = sums
        with dist.guard("the last step of the epoch"):  # a dead peer shows here, not in validation
            mx.nd.waitall()
        _share_bn_stats(self.net, self.plan, dist, t.distributed.batch_norm)  # validation sees rank 0's
        gs = self.global_step
        validating = (epoch + 1) % t.val_every == 0 or epoch + 1 == t.epochs
        val = self._evaluate() if validating else {}
        # other weights (the average) validated too: their metrics and, when selected, their best checkpoint
        with self.callbacks.evaluating(epoch, val, self._evaluate) if validating else \
                contextlib.nullcontext(False) as averaged:
            row = {"step": gs, "epoch": epoch + 1, "train_loss": run_loss / max(run_n, 1),
                   **({} if run_correct is None else {"train_acc": run_correct / max(run_n, 1)}), **val,
                   "lr": lr_at(t.schedule, t.lr, max(gs - 1, 0), self.steps_per_epoch, t.epochs),
                   "seconds": time.perf_counter() - t0}
            if averaged:
                self.callbacks.call_engine("on_measured", row, True)
        self.callbacks.call_engine("on_row", row)
        if validating:
            self.callbacks.call("on_validation", row)
            self.callbacks.call_engine("on_measured", row, False)
        self.callbacks.call("on_epoch_end", row)
        asked = self.info.stop_reason
        with dist.guard("agreeing to stop"):  # a signal or a callback's request; every worker must agree
            halt, stop_asked = dist.sum(np.array([stop.requested, asked is not None]))[:2]
        last = {}
        if stop_asked and epoch + 1 < t.epochs:  # a callback ends the run here: a complete run
            self.stop_reason = asked or "a callback on another worker"
            last = {"early_stopped": {"epoch": epoch + 1, "step": gs, "reason": self.stop_reason}}
        self.save("last", epoch=epoch + 1, batch_in_epoch=0, **last)
        self.callbacks.call_engine("on_saved", row)
        if halt and epoch + 1 < t.epochs and not self.stop_reason:
            self.stopped = True
        return self.stopped

    def _evaluate(self) -> dict[str, int | float]:
        """The task's validation numbers for the weights in the model now."""
        with autograd.predict_mode():
            val = self.task.evaluate(self.feed.net, self.feed.val_batches(), self.ctxs)
            custom = computed_metrics(self.recipe.task)
            if custom:
                outputs, labels = _val_outputs(self.feed.net, self.feed.val_batches(), self.ctxs)
                val.update({m.key: float(m.fn(outputs, labels)) for m in custom})
        return {k: v for k, v in val.items() if isinstance(v, (int, float))}

    # ------------------------------------------------------------------ the summary

    def close(self, completed: bool) -> None:
        for cb in self.callbacks.engine:
            cb.close(completed)
        if self.feed is not None:
            # a finished run keeps its val features for evaluate (one folder: a single worker's)
            self.feed.close(keep=not completed, keep_val=completed and self.dist.size == 1)

    def summary(self, stop: _Stop) -> RunResult:
        """The result, and (a run that trained to its end) summary.json."""
        t, dist, run_dir, quiet = self.t, self.dist, self.run_dir, self.quiet
        best = self.callbacks.engine_of(KeepBest).best
        result = RunResult(run_dir, self.callbacks.engine_of(Record).log.rows, best, stopped_early=self.stopped,
                           rank=dist.rank,
                           workers=dist.size, stop_reason=self.stop_reason, callbacks=self.callbacks)
        if dist.size > 1:
            _write_checksum(run_dir, self.net, dist.rank)
        if not self.stopped and self.root:
            feed, loaders = self.feed, self.loaders
            summary = {"run_dir": str(run_dir), "best": best, "last": result.last_epoch,
                       "restore": self.prep.restore.summary() if self.prep.restore else None,
                       "bad_images": loaders.bad.summary(), "bad_steps": self.bad_steps,
                       "trainable": self.plan.totals()["trainable"],
                       "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "mxnet default"),
                       "hybridized": t.hybridize, "feature_cache": feed.summary() if feed else None,
                       **self.callbacks.engine_state("summary")}
            if self.stop_reason:
                last = result.last_epoch or {}
                summary["stopped"] = {"epoch": last.get("epoch"), "step": last.get("step"), "reason": self.stop_reason}
                _card_says_stopped(run_dir, summary["stopped"])
                show(f"stopped after epoch {last.get('epoch')} of {t.epochs} (step {last.get('step')}): "
                     f"{self.stop_reason}", quiet)
            write_text(RunFolder(run_dir).summary_path, json.dumps(summary, indent=1), TrainError)
            show(f"done: {_best_text(best, t.select)}; run folder {run_dir}", quiet)
            if len(loaders.bad):
                say(quiet, loaders.bad.summary())
        elif not self.stopped:
            show(f"done (rank {dist.rank}); rank 0 wrote the run folder {run_dir}", quiet)
        if stop.signum is not None:
            error = Interrupted(run_dir, stop.signum, dist.size, RunFolder(run_dir).checkpoints_dir)
            self.callbacks.call("on_exception", error)
            raise error
        self.callbacks.call("on_run_end")
        return result


def _val_outputs(net, batches, ctxs: list[mx.Context]) -> tuple[np.ndarray, np.ndarray]:
    """The network's outputs and the labels over the validation batches, for computed metrics."""
    outs, labels = [], []
    for x, y in batches:
        for xi, yi in zip(split(x, ctxs), split(y, ctxs)):
            outs.append(net(xi).asnumpy())
            labels.append(yi.asnumpy())
    return np.concatenate(outs), np.concatenate(labels)


def _card_says_stopped(run_dir: Path, stopped: dict[str, Any]) -> None:
    """The run card (preprocess.json) records why and when a callback ended the run."""
    path = RunFolder(run_dir).card_path
    card = read_json(path, TrainError, "the run card")
    write_text(path, json.dumps({**card, "stopped": stopped}, indent=1), TrainError)


def _share_bn_stats(net, plan: Plan, dist: Backend, mode: str) -> None:
    """Under ``batch_norm: rank0`` every worker's moving BatchNorm statistics become rank 0's."""
    if dist.size > 1 and mode == "rank0":
        entries = named_params(net)
        moving = [a for r in plan.rows if r.aux and r.bn == "train" for a in entries[r.name].param.list_data()]
        with dist.guard("sharing rank 0's BatchNorm statistics"):
            mx.nd.waitall()
            dist.broadcast_arrays(moving)


def _write_checksum(run_dir: Path, net, rank: int) -> None:
    """SHA-256 over every parameter's name and bytes: equal files mean bit-identical workers."""
    mx.nd.waitall()
    h = hashlib.sha256()
    for name, e in sorted(named_params(net).items()):
        h.update(name.encode())
        for copy in e.param.list_data():  # every context's: copies that drift apart are a bug too
            h.update(copy.asnumpy().tobytes())
    write_text(RunFolder(run_dir).worker_digest(rank), h.hexdigest() + "\n", TrainError)


def _write_plan(run_dir: Path, plan: Plan, feed: Feed, transforms: dict[str, Any], epoch_data: dict[str, Any],
                notes: dict[str, str]) -> None:
    """``notes``: what the engine's callbacks add (``ema``: the average's line)."""
    lines = "\n".join([*transform_lines(transforms), epoch_data["note"], feed.log, *notes.values()])
    write_text(RunFolder(run_dir).plan_text_path, format_plan(plan) + f"\n{lines}\n", TrainError)
    write_text(RunFolder(run_dir).plan_json_path, json.dumps({**plan.to_json(), "feature_cache": feed.summary(),
                                                               "transforms": transforms, "epoch_data": epoch_data,
                                                               **notes}, indent=1),
               TrainError)


def _epoch_data(sampler) -> dict[str, Any]:
    """How an epoch covers the training set, with a sentence for the console and plan.txt: a run
    that leaves images out says how many, and why."""
    left, workers = sampler.left_out(), sampler.workers
    step = f"{workers} workers × {sampler.batch_size}" if workers > 1 else f"{sampler.batch_size}"
    smaller = " (the last one smaller)" if sampler.n % (sampler.batch_size * workers) and not left else ""
    note = f"data: {sampler.n} training images, {sampler.batches_per_epoch()} batches of {step}{smaller} per epoch; "
    if not left:
        note += "every image is trained each epoch"
    elif sampler.last_batch == "discard":
        note += (f"{left} left out each epoch (the tail of that epoch's shuffled order, another {left} every "
                 f"epoch): data.last_batch: discard trains whole batches only; data.last_batch: keep trains "
                 f"them in a smaller last batch")
    else:
        note += (f"{left} left out each epoch (the tail of that epoch's shuffled order): fewer than the "
                 f"{workers} workers, and a last step needs an image on every worker")
    return {"train_images": sampler.n, "batches": sampler.batches_per_epoch(), "batch_size": sampler.batch_size,
            "workers": workers, "last_batch": sampler.last_batch, "left_out": left, "note": note}


__all__ = ["finetune", "RunResult", "Stepper", "parse_ctx", "make_trainer", "step_seed"]
