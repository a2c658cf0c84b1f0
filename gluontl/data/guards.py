"""Guards against runs that train without error and learn nothing.

Four failures look like a normal run in every log line: frozen weights that were never
loaded (a random backbone), BatchNorm in ``bn: frozen`` with statistics that were never
loaded (mean 0 / variance 1 normalize nothing, so activations shrink or blow up layer by
layer), frozen features that are the same for every image, and a loss that sits at
ln(classes) — uniform guessing — for the whole first epoch. Each guard has a level in
``train.guards`` (error | warn | off). The first three are facts about the model and the
first batch and default to ``error``, checked before the run folder exists; the stuck loss
is a judgement about progress and defaults to ``warn`` after epoch 1.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Callable

import mxnet as mx
import numpy as np
from mxnet import autograd
from mxnet.gluon import HybridBlock

from ..atomic import write_text
from ..console import show
from ..errors import TrainError
from ..mxinternals import loader_dataset
from ..naming import named_params
from ..readers import read_json
from ..pipeline import Prepared
from ..recipe import GuardsSpec, Recipe
from ..runfolder import RunFolder
from ..rules import Plan, make_plan
from ..surgery import needs_surgery
from .datasets import Loaders
from .prefix import COLLAPSE_RTOL, collapsed, feature_spread, split_frozen_prefix

# Images of the first batch the features are compared on: 8 show whether features vary
# (a collapse makes all of them equal) at a quarter of a 32-image forward pass (~2 s for
# EfficientNet-Lite0 at 224 px on 2 cores) before training.
CHECK_IMAGES = 8
# Within 1 % of ln C: a balanced binary task at 55 % accuracy already sits 0.7 % below ln 2,
# so this flags only runs that learned (almost) nothing, not slow ones.
STUCK_RTOL = 0.01
# The first step's loss comes before any update; fewer steps than this prove nothing.
STUCK_MIN_STEPS = 10


@dataclasses.dataclass
class Finding:
    guard: str  # a field of GuardsSpec
    message: str
    level: str = "error"  # "warn": never more than a warning, whatever the guard's setting


def _advice(guard: str, level: str) -> str:
    """The recipe key that changes what this guard does, in the words of its current level."""
    if level == "error":
        return f"If this is intended, set train.guards.{guard}: warn (train anyway, with a warning) or off."
    return f"To silence this warning set train.guards.{guard}: off (error stops such runs)."


def _few(names: list[str], k: int = 4) -> str:
    return ", ".join(names[:k]) + (f" … ({len(names)} in all)" if len(names) > k else "")


@dataclasses.dataclass
class Weights:
    """Where a prepared model's parameter values came from."""

    text: str  # "weights: …", for plan output and messages
    loaded: set[str]  # structural names whose values came from a file or the zoo
    fresh: list[str]  # the others: initialized at random (or zeros/ones)


def weights_of(recipe: Recipe, prep: Prepared) -> Weights:
    """ONNX files and symbol checkpoints carry their weights, zoo models only with ``pretrained``;
    ``model.weights`` adds what it restored; a new ``head.*`` and ``random_init`` start fresh."""
    spec = recipe.model
    names = [n for n, e in named_params(prep.block).items() if not isinstance(e.param, mx.gluon.Constant)]
    scheme, _, rest = spec.source.partition(":")
    new_head = recipe.surgery.head is not None and needs_surgery(recipe.surgery, spec.source)
    carried = not spec.random_init and (scheme != "zoo" or spec.pretrained)
    if prep.loaded is not None:  # a detector: its backbone source's part only
        loaded = set(prep.loaded)
    else:
        loaded = {n for n in names if carried and not (new_head and n.startswith("head."))}
    if prep.restore is not None:
        loaded |= set(prep.restore.restored)
    fresh = [n for n in names if n not in loaded]
    if prep.restore is not None:
        text = f"weights: {prep.restore.file} (restored {len(prep.restore.restored)} of {len(names)} arrays)"
    elif spec.random_init:
        text = "weights: none — random init (model.random_init: true)"
    elif carried:
        text = (f"weights: {spec.source} pretrained (model zoo)" if scheme == "zoo" else
                f"weights: {rest} (from the {'ONNX file' if scheme == 'onnx' else 'symbol checkpoint'})")
    else:
        text = (f"weights: none — random init ({spec.source} without model.pretrained: true or "
                f"model.weights)")
    if fresh and loaded:
        text += f"; {len(fresh)} arrays start from a fresh init ({_few(fresh)})"
    return Weights(text, loaded, fresh)


def _frozen_throughout(net: HybridBlock, recipe: Recipe, plan: Plan) -> list[str]:
    """Parameters with grad_req null in the plan of every epoch a rule starts at: they never train."""
    starts = sorted({p.rule.from_epoch for p in plan.rules if 0 < p.rule.from_epoch < recipe.train.epochs})
    frozen = {r.name for r in plan.rows if not r.aux and r.grad_req == "null"}
    for e in starts:
        later = make_plan(net, recipe.rules, epoch=e, input_shape=recipe.model.input_shape)
        frozen &= {r.name for r in later.rows if not r.aux and r.grad_req == "null"}
    return [r.name for r in plan.rows if r.name in frozen]


def check_weights(recipe: Recipe, prep: Prepared, weights: Weights | None = None) -> list[Finding]:
    """Guards 1 and 2, from the plan and where the weights came from (no data needed)."""
    w = weights or weights_of(recipe, prep)
    found = []
    frozen = _frozen_throughout(prep.block, recipe, prep.plan)
    random_frozen = [n for n in frozen if n not in w.loaded]
    rows = prep.plan.by_name()
    if random_frozen:
        rules = sorted({rows[n].decided_by["grad_req"] for n in random_frozen})
        if len(random_frozen) == len(frozen):
            found.append(Finding("random_backbone", (
                f"The rules freeze {len(frozen)} parameter(s) (grad_req null, rule {', '.join(rules)}) for the whole "
                f"run, but none of them was loaded from anywhere — {w.text}. A frozen random backbone stays "
                f"random: the trainable part learns on noise features (e.g. {_few(random_frozen)}). Load "
                f"weights (model.pretrained: true for zoo models, model.weights: FILE, or an onnx:/symbol: "
                f"source), or drop the freezing rules to train from scratch.")))
        else:
            found.append(Finding("random_backbone", (
                f"{len(random_frozen)} of the {len(frozen)} frozen parameters were never loaded and stay at "
                f"their random init for the whole run: {_few(random_frozen)} (frozen by rule "
                f"{', '.join(rules)}; {w.text}). Check model.restore (only / prefix_map) or let them train."),
                level="warn"))
    layers: dict[str, list] = {}
    for r in prep.plan.rows:
        if r.bn == "frozen" and r.aux and r.layer is not None:
            layers.setdefault(r.layer, []).append(r)
    entries = named_params(prep.block)
    stale = []
    for layer, aux in layers.items():
        if any(r.name in w.loaded for r in aux):
            continue
        values = [entries[r.name].param.list_data()[0].asnumpy() for r in aux]
        if all(np.all(v == 0) or np.all(v == 1) for v in values):
            stale.append(layer)
    if stale:
        rules = sorted({r.decided_by["bn"] for layer in stale for r in layers[layer]})
        found.append(Finding("unloaded_bn_stats", (
            f"{len(stale)} BatchNorm layer(s) are in bn: frozen (rule {', '.join(rules)}) but their running "
            f"statistics were never loaded: {_few(stale)} still hold the initial mean 0 / variance 1 ({w.text}). "
            f"Frozen at those values they normalize nothing, activations shrink or grow layer by layer and "
            f"the head sees near-constant features (a MobileNetV2 trained so stayed at chance). Load "
            f"statistics with the weights (model.pretrained / model.weights including running_mean/var), or "
            f"put these layers in bn: train.")))
    return found


def _flat(out) -> np.ndarray:
    outs = out if isinstance(out, (list, tuple)) else [out]
    return np.concatenate([o.asnumpy().reshape(o.shape[0], -1) for o in outs], axis=1)


def check_features(recipe: Recipe, net: HybridBlock, plan: Plan, loaders: Loaders, ctx: mx.Context
                   ) -> list[Finding]:
    """Guard 3: what the model, and its frozen prefix, make of the first training batch."""
    if recipe.train.guards.collapsed_features == "off":  # spare the forward passes
        return []
    split = split_frozen_prefix(net, plan, recipe.model.input_shape, ctx)
    ds = loader_dataset(loaders.train)
    order = loaders.train_sampler.order(0)[:min(recipe.data.batch_size, CHECK_IMAGES)]
    x = np.stack([ds[(int(i), 0)][0] for i in order])
    with autograd.predict_mode():
        data = mx.nd.array(x, ctx=ctx)
        feats = split.prefix(data) if split.prefix is not None else None
        out = _flat(split.suffix(feats) if feats is not None else net(data))
    if not np.isfinite(out).all():
        bad = int((~np.isfinite(out)).any(axis=1).sum())
        return [Finding("collapsed_features", (
            f"On the first batch ({len(x)} images checked), before any training, the model's output is NaN/Inf for "
            f"{bad} image(s): nothing can train on that. Check the loaded weights (model.weights, the ONNX or "
            f"symbol file) for NaN/Inf and the input normalization (data.train_transform.normalize)."))]
    if feats is None or len(x) < 2 or collapsed(x):
        return []  # no frozen boundary, one image, or identical images: nothing to compare
    f = _flat(feats)
    if collapsed(f):
        spread, size = feature_spread(f)
        return [Finding("collapsed_features", (
            f"On the first batch ({len(x)} different images checked), the output of the frozen prefix ({split.reason}) "
            f"is the same for every image: its spread across the batch is {spread:.1e} at a size of "
            f"{size:.1e}, below {COLLAPSE_RTOL:g} x (1 + size). The trainable part from {split.boundary} cannot "
            f"tell the images apart, so training will stay at chance. Usual causes: BatchNorm in bn: frozen "
            f"with statistics never loaded, random or wrong frozen weights, an input normalization the model "
            f"was not trained with; `gluontl plan` shows the weights and rules."))]
    return []


def check_first_epoch(batch_losses: list[float], steps: int, num_classes: int) -> list[Finding]:
    """Guard 4: mean losses per image of epoch 1's batches, all of them and the last quarter,
    within STUCK_RTOL of ln C (what uniform predictions score, label smoothing or not)."""
    if num_classes < 2 or steps < STUCK_MIN_STEPS or not batch_losses:
        return []
    chance = math.log(num_classes)
    tail = batch_losses[-max(1, len(batch_losses) // 4):]
    mean, last = float(np.mean(batch_losses)), float(np.mean(tail))
    if abs(mean - chance) > STUCK_RTOL * chance or abs(last - chance) > STUCK_RTOL * chance:
        return []
    return [Finding("stuck_loss", (
        f"The train loss stayed at ln({num_classes}) = {chance:.4f} — uniform guessing — for the whole first "
        f"epoch ({steps} steps; mean {mean:.4f}, last quarter {last:.4f}): nothing is being learned. Usual "
        f"causes: a random frozen backbone, frozen BatchNorm without loaded statistics, a learning rate far "
        f"too small (train.lr), labels that do not match the images."))]


class GuardLog:
    """Applies ``train.guards`` to findings: errors raise, warnings are said and kept for the run folder."""

    def __init__(self, spec: GuardsSpec, say: Callable[[str], None] | None = None) -> None:
        self.spec, self.say = spec, say or show  # in the run's log, -q or not
        self.warnings: list[dict[str, str]] = []
        self.run_dir: Path | None = None

    def handle(self, findings: list[Finding]) -> None:
        for f in findings:
            level = getattr(self.spec, f.guard)
            if level == "off":
                continue
            if level == "error" and f.level == "error":
                raise TrainError(f"{f.message} {_advice(f.guard, 'error')}")
            message = f"{f.message} {_advice(f.guard, 'warn')}"
            self.say(f"warning: {message}")
            self.warnings.append({"guard": f.guard, "message": message})
        self.save()

    def attach(self, run_dir: Path) -> None:
        """Warnings found before the run folder existed go into it now; a resumed run keeps the
        warnings its start found (it is not checked again)."""
        self.run_dir = run_dir
        earlier = RunFolder(run_dir).warnings_path
        if not self.warnings and earlier.is_file():
            try:
                loaded = read_json(earlier, TrainError, "the warnings record")
            except TrainError:
                loaded = None  # a damaged file only loses the record of old warnings; training goes on
            self.warnings = loaded if isinstance(loaded, list) else []
        self.save()

    def save(self) -> None:
        if self.run_dir is not None and self.warnings:
            write_text(RunFolder(self.run_dir).warnings_path, json.dumps(self.warnings, indent=1), TrainError)


def plan_flags(recipe: Recipe, prep: Prepared) -> tuple[str, list[str]]:
    """The weights line and the guard findings ``gluontl plan`` shows (never raised there)."""
    w = weights_of(recipe, prep)
    lines = []
    for f in check_weights(recipe, prep, w):
        level = getattr(recipe.train.guards, f.guard)
        if level != "off":
            level = "warn" if f.level == "warn" else level
            label = "warning" if level == "warn" else "error at finetune"
            lines.append(f"{label}: {f.message} {_advice(f.guard, level)}")
    return w.text, lines


__all__ = ["Finding", "GuardLog", "Weights", "check_features", "check_first_epoch", "check_weights",
           "collapsed", "plan_flags", "weights_of"]
