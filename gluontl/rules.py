"""Rule engine: ordered rules → a Plan (one row per parameter) → applied to a block.

Precedence (documented, mmengine-style): rules are read top to bottom; each rule sets only
the fields it names, for every parameter its selector matches; a later rule overrides an
earlier one field by field. Defaults before any rule: ``grad_req=write``, ``lr_mult=1``,
``wd_mult=1``, ``bn=train``. A BatchNorm layer has one mode: the last rule that set ``bn``
on any of its parameters decides it. The Plan records, per field, which rule decided.

Selectors combine with AND: ``match`` (globs on structural names; a list is OR),
``type`` (layer type), ``stage`` (from the stage map), ``kind`` (bias, norm, depthwise, 1d:
see ``param_kinds``). Running mean/var are auxiliary states: they take no grad_req/lr/wd;
whether they move is the layer's ``bn`` mode.

A rule's ``adapter`` puts LoRA factors on the Conv/Dense layers it selects (added to the model by
``attach_adapters`` before planning, see gluontl/adapters.py): they train, at that rule's ``lr_mult``
and ``wd_mult`` if it sets them (later rules change them as they change any parameter), and the
adapted layers' own parameters are frozen whatever other rules say.
"""
from __future__ import annotations

import dataclasses
import fnmatch
from typing import Any, Iterable, Mapping

import numpy as np
from mxnet.gluon import Constant, HybridBlock, Parameter, SymbolBlock

from .adapters import LORA_TYPE, Adapted, adapter_params, adapters_of, add_lora, target
from .errors import AdapterError, RuleError
from .mxinternals import (cached_symbol, clear_cached_ops, is_differentiable, op_kwargs, param_table, set_graph_bn_modes,
                          set_op_kwarg)
from .naming import Layer, ParamEntry, graph_nodes, named_params, shape_of
from .recipe import Preset, Rule, as_rules  # each preset's keys and expansion: gluontl/recipe/presets.py
from .stages import Stage, ordered, stage_map

FIELDS = ("grad_req", "lr_mult", "wd_mult", "bn")
DEFAULTS: dict[str, Any] = {"grad_req": "write", "lr_mult": 1.0, "wd_mult": 1.0, "bn": "train"}
NORM_TYPES = ("BatchNorm", "LayerNorm", "GroupNorm", "InstanceNorm")
_BIASED_OPS = ("Convolution", "Deconvolution", "FullyConnected")  # graph ops whose 3rd input is a bias


@dataclasses.dataclass
class PlannedRule:
    """A rule as the plan numbers it: recipe index (1-based) plus sub-index for presets."""

    label: str
    rule: Rule
    preset: str | None = None  # the preset this rule stands for a part of: a model may lack its layer types


RuleLike = Rule | Preset | Mapping[str, Any]


def expand(rules: Iterable[RuleLike], order: list[Stage] | None = None) -> list[PlannedRule]:
    """Presets as the ordinary rules they stand for; ``order`` (the model's stages, stem to head)
    is what ``layer_decay`` and ``fine_tune`` spread over. A preset's ``from_epoch`` delays each
    of its rules (``fine_tune``'s unfreezing comes that much later too)."""
    out = []
    for i, r in enumerate(as_rules(rules), 1):
        if isinstance(r, Preset):
            for j, sub in enumerate(r.expand(order), 1):
                sub = sub.model_copy(update={"from_epoch": r.from_epoch + sub.from_epoch,
                                             "optional": r.optional or sub.optional})
                out.append(PlannedRule(f"{i}.{j}", sub, r.preset))
        else:
            out.append(PlannedRule(str(i), r))
    return out


@dataclasses.dataclass
class Row:
    name: str
    global_name: str
    shape: tuple[int, ...]
    size: int
    layer: str | None
    layer_type: str | None
    stage: Stage | None
    aux: bool
    grad_req: str
    lr_mult: float
    wd_mult: float
    bn: str | None  # None for parameters of non-BatchNorm layers
    decided_by: dict[str, str]  # field → rule label, "default" when no rule set it
    adapter: str | None = None  # a LoRA factor, or a base parameter an adapter froze

    @property
    def trainable(self) -> bool:
        return not self.aux and self.grad_req != "null"


@dataclasses.dataclass
class Plan:
    rows: list[Row]
    rules: list[PlannedRule]
    epoch: int
    notes: list[str]
    stages_from: str = ""  # how the stage column was found ("output stride, 4 stages", …)

    def by_name(self) -> dict[str, Row]:
        return {r.name: r for r in self.rows}

    def totals(self) -> dict[str, int]:
        t = sum(r.size for r in self.rows if r.trainable)
        f = sum(r.size for r in self.rows) - t
        return {"params": len(self.rows), "trainable": t, "frozen": f, "trainable_bytes": 4 * t,
                "frozen_bytes": 4 * f}

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "totals": self.totals(), "notes": self.notes, "stages_from": self.stages_from,
                "rules": [{"label": r.label, **r.rule.model_dump(exclude_defaults=True),
                           **({"adapter": r.rule.adapter.model_dump()} if r.rule.adapter else {})} for r in self.rules],
                "params": [_row_json(r) for r in self.rows]}

    def settings(self) -> dict[str, tuple]:
        """What apply() would set — for comparing plans across epochs."""
        return {r.name: (r.grad_req, r.lr_mult, r.wd_mult, r.bn) for r in self.rows}


def _row_json(row: Row) -> dict[str, Any]:
    """A row as plan.json holds it; ``adapter`` only on rows an adapter concerns."""
    return {k: v for k, v in dataclasses.asdict(row).items() if k != "adapter" or v is not None}


def _selects(rule: Rule, e: ParamEntry, stage: Stage | None, kinds: frozenset[str]) -> bool:
    if rule.match is not None and not any(fnmatch.fnmatchcase(n, g) for g in rule.match
                                          for n in (e.name, *e.aliases)):  # an imported graph's own name too
        return False
    if rule.type is not None and (e.layer is None or e.layer.type not in rule.type):
        return False
    if rule.stage is not None and stage not in rule.stage:
        return False
    if rule.kind is not None and not kinds.intersection(rule.kind):
        return False
    return True


def param_kinds(entries: Mapping[str, ParamEntry]) -> dict[str, frozenset[str]]:
    """Each parameter's kinds, as mmengine's ``paramwise_cfg`` and timm sort them for weight decay.

    ``bias``: the bias of a Conv/Deconv/Dense (a Gluon block's ``bias`` / ``*_bias``; in a graph,
    the third input of Convolution, Deconvolution, FullyConnected). ``norm``: every array of a
    BatchNorm/LayerNorm/GroupNorm/InstanceNorm layer (running statistics are aux states: only
    ``bn`` applies to them). ``depthwise``: the weight of a convolution with groups = input
    channels > 1 (a 1-channel input's plain conv is not one). ``1d``: ndim <= 1. Graph layers are
    read from the op and its attributes, as ``type`` is.
    """
    graph_roles: dict[int, dict[str, set[str]]] = {}
    out = {}
    for name, e in entries.items():
        shape, layer = shape_of(e.param), e.layer
        kinds = {"1d"} if len(shape) <= 1 else set()
        if layer is not None and layer.type in NORM_TYPES:
            kinds.add("norm")
        if layer is not None and layer.block is not None:
            key = name[len(layer.name) + 1:] if layer.name else name
            if key == "bias" or key.endswith("_bias"):
                kinds.add("bias")
            if key == "weight" and layer.type == "Conv" and _depthwise(op_kwargs(layer.block)["num_group"], shape):
                kinds.add("depthwise")
        elif layer is not None and layer.owner is not None:
            if id(layer.owner) not in graph_roles:
                graph_roles[id(layer.owner)] = _graph_roles(layer.owner)
            kinds |= graph_roles[id(layer.owner)].get(e.param.name, set())
        out[name] = frozenset(kinds)
    return out


def _depthwise(groups: Any, weight_shape: tuple[int, ...]) -> bool:
    """groups = in_channels > 1, i.e. one input channel per group (weight: out, in/groups, k...)."""
    return int(groups) > 1 and weight_shape[1:2] == (1,)


def _graph_roles(owner: SymbolBlock) -> dict[str, set[str]]:
    nodes = graph_nodes(owner)
    roles: dict[str, set[str]] = {}
    for node in nodes:
        if node["op"] not in _BIASED_OPS:
            continue
        ins = [nodes[i[0]] for i in node["inputs"]]
        if len(ins) > 2 and ins[2]["op"] == "null":
            roles.setdefault(ins[2]["name"], set()).add("bias")
        weight = ins[1]  # data, weight[, bias]: a variable, or computed (a transposed Gemm weight)
        if node["op"] == "Convolution" and weight["op"] == "null" and weight["name"] in param_table(owner.params) and \
                _depthwise(node["attrs"].get("num_group", 1), shape_of(param_table(owner.params)[weight["name"]])):
            roles.setdefault(weight["name"], set()).add("depthwise")
    return roles


def _is_aux(e: ParamEntry) -> bool:
    """Auxiliary states (BN running mean/var) are updated by the op, never by the optimizer;
    nor are Gluon Constants (GluonCV's anchors), which refuse a grad_req with a warning."""
    owner = e.layer.owner if e.layer is not None else None
    if owner is not None:
        return e.param.name in cached_symbol(owner).list_auxiliary_states()
    return not is_differentiable(e.param) or isinstance(e.param, Constant)


def make_plan(block: HybridBlock, rules: Iterable[RuleLike], *, epoch: int | None = None,
              input_shape: tuple[int, ...] | Mapping[str, tuple[int, ...]] | None = None) -> Plan:
    """Decide every parameter's settings; ``epoch`` keeps only rules active by then.

    Rules are ``Rule`` objects or dicts with the recipe's keys. ``input_shape`` (C,H,W, or
    N,C,H,W as ``load_model``/``export_onnx`` take it) gives the stage column; a model whose
    stages cannot be mapped says so in the plan's notes rather than leaving it blank unexplained.
    ``epoch=None`` checks all rules (gradual-unfreezing rules included) for matches but
    plans epoch 0.
    """
    given = as_rules(rules)
    entries = _entries(block)
    needs_stages = any(r.needs_stages if isinstance(r, Preset) else r.stage is not None for r in given)
    stages: dict[str, Stage] = {}
    no_stages = None
    if needs_stages and input_shape is None:
        raise RuleError("stage selectors need the model's input shape (model.input_shape).")
    if input_shape is not None:
        try:
            stages = stage_map(block, image_shape(input_shape))
        except RuleError as e:
            if needs_stages:
                raise
            no_stages = f"no stage column: {e}"
    planned = expand(given, ordered(stages.values()) if stages else None)
    kind_of = param_kinds(entries) if any(p.rule.kind is not None for p in planned) else {}
    values = {n: dict(DEFAULTS) for n in entries}
    decided = {n: {f: "default" for f in FIELDS} for n in entries}
    bn_rank: dict[int, tuple[str, str]] = {}  # id(layer) → (value, label) of the last rule setting bn
    targets, errors, adapter_notes = _adapter_targets(block, planned, entries, stages, kind_of)
    preset_notes: list[str] = []
    missing = _adapters_missing(block, targets)
    if missing:
        raise RuleError("The rules do not fit this model: " + "; ".join(missing) + ".")
    for pr in planned:
        hits = [e for e in entries.values()
                if _selects(pr.rule, e, stages.get(e.name), kind_of.get(e.name, frozenset()))]
        missing_type = pr.preset is not None and pr.rule.type is not None and \
            not any(e.layer and e.layer.type in pr.rule.type for e in entries.values())
        if not hits:
            if missing_type:  # a preset's rule for a layer type the model lacks: nothing to apply, nothing wrong
                preset_notes.append(_nothing_to_do(pr, "/".join(pr.rule.type), "in this model"))
            elif not pr.rule.optional:
                errors.append(_no_match(pr, entries, stages, kind_of))
            continue
        if pr.rule.bn is not None and not any(e.layer and e.layer.type == "BatchNorm" for e in hits):
            if pr.preset is None:
                kinds = sorted({(e.layer.type or "other") if e.layer else "other" for e in hits})
                errors.append(f"rule {pr.label} sets bn: {pr.rule.bn} but matches no BatchNorm layer "
                              f"(it matches {len(hits)} parameters of {', '.join(kinds)} layers); bn applies "
                              f"only to BatchNorm — add type: BatchNorm or fix match")
                continue
            has_bn = any(e.layer and e.layer.type == "BatchNorm" for e in entries.values())
            preset_notes.append(_nothing_to_do(pr, "BatchNorm", "among the parameters it selects" if has_bn
                                               else "in this model"))  # its other settings still apply
        if epoch is not None and pr.rule.from_epoch > epoch:
            continue
        for e in hits:
            for f in ("grad_req", "lr_mult", "wd_mult"):
                v = getattr(pr.rule, f)
                if v is not None:
                    values[e.name][f] = v
                    decided[e.name][f] = pr.label
            if pr.rule.bn is not None and e.layer is not None and e.layer.type == "BatchNorm":
                bn_rank[id(e.layer)] = (pr.rule.bn, pr.label)
        for t, n in ((t, entries[n].name) for label, t in targets.values() if label == pr.label for n in (t.a, t.b)):
            values[n]["grad_req"], decided[n]["grad_req"] = "write", pr.label
            for f in ("lr_mult", "wd_mult"):  # the rule's base weights are frozen: its multipliers mean the factors
                if getattr(pr.rule, f) is not None:
                    values[n][f], decided[n][f] = getattr(pr.rule, f), pr.label
            if pr.rule.lr_mult is None:  # the factors' own default rate (Adapted.default_lr_mult)
                values[n]["lr_mult"], decided[n]["lr_mult"] = t.default_lr_mult, pr.label
    adapter_text = {}
    for label, t in targets.values():  # an adapted layer's own parameters are frozen whatever other rules say
        for n in (entries[n].name for n in t.frozen):  # the graph's names: an imported model's alias
            values[n]["grad_req"], decided[n]["grad_req"] = "null", label
            adapter_text[n] = f"base of lora on {t.layer}"
        for n, f in ((entries[t.a].name, "lora_a"), (entries[t.b].name, "lora_b")):
            adapter_text[n] = f"{f} rank {t.spec.rank} alpha {t.spec.alpha:g}" + \
                (f" dropout {t.spec.dropout:g}" if t.spec.dropout else "")
    if errors:
        raise RuleError("The rules do not fit this model: " + "; ".join(errors) +
                        ". Mark a rule optional: true if matching nothing is intended; "
                        "`gluontl inspect` lists every parameter name.")
    rows = []
    for n, e in entries.items():
        aux = _is_aux(e)
        v, d = values[n], decided[n]
        bn = None
        if e.layer is not None and e.layer.type == "BatchNorm":
            bn, label = bn_rank.get(id(e.layer), (DEFAULTS["bn"], "default"))
            d["bn"] = label
        else:
            d["bn"] = "-"
        if aux:
            d.update(grad_req="aux", lr_mult="aux", wd_mult="aux")
        shape = shape_of(e.param)
        rows.append(Row(name=n, global_name=e.param.name, shape=shape, size=int(np.prod(shape)),
                        layer=e.layer.name if e.layer else None, layer_type=e.layer.type if e.layer else None,
                        stage=stages.get(n), aux=aux,
                        grad_req="null" if aux else v["grad_req"], lr_mult=v["lr_mult"], wd_mult=v["wd_mult"],
                        bn=bn, decided_by=d, adapter=adapter_text.get(n)))
    notes = preset_notes + _notes(rows) + adapter_notes + _factor_lr_notes(planned, targets) + ([no_stages] if no_stages else [])
    return Plan(rows=rows, rules=planned, epoch=epoch or 0, notes=notes, stages_from=getattr(stages, "how", ""))


def _entries(block: HybridBlock) -> dict[str, ParamEntry]:
    """Every parameter; adapter factors as layers of type LoRA, which no ``type`` selector names."""
    entries = named_params(block)
    for n in adapter_params(block):
        entries[n] = dataclasses.replace(entries[n], layer=Layer(n.removesuffix(".weight"), LORA_TYPE, [n]))
    return entries


def _factor_lr_notes(planned: list[PlannedRule], targets: dict[str, tuple[str, Adapted]]) -> list[str]:
    """Where adapter factors train at the adapter default lr_mult rather than one a rule gave."""
    notes = []
    for pr in planned:
        mults = sorted({t.default_lr_mult for label, t in targets.values() if label == pr.label})
        if pr.rule.adapter is not None and pr.rule.lr_mult is None and mults:
            notes.append(f"rule {pr.label}'s LoRA factors train at lr_mult {'/'.join(f'{m:g}' for m in mults)}, "
                         f"the adapter default 0.4 / (alpha/rank)^2 (small factors run away at a full "
                         f"fine-tune's rate); set lr_mult in the rule to choose another")
    return notes


def _adapter_targets(block: HybridBlock, planned: list[PlannedRule], entries: dict[str, ParamEntry],
                     stages: dict[str, Stage], kind_of: dict[str, frozenset[str]]
                     ) -> tuple[dict[str, tuple[str, Adapted]], list[str], list[str]]:
    """The layers the rules put adapters on (layer → rule label, adapter; a later rule wins); the
    rules with an adapter on no Conv or Dense layer (errors); and, as plan notes, the selected layers
    LoRA cannot adapt (grouped and depthwise convolutions, ...), which a rule's adapter leaves out."""
    out: dict[str, tuple[str, Adapted]] = {}
    errors, notes = [], []
    for pr in planned:
        if pr.rule.adapter is None:
            continue
        layers = {e.layer.name: e.layer for e in entries.values()
                  if e.layer is not None and e.layer.type != LORA_TYPE
                  and _selects(pr.rule, e, stages.get(e.name), kind_of.get(e.name, frozenset()))}
        found, refused = [], {}
        for layer in layers.values():
            try:
                t = target(block, layer, pr.rule.adapter)
            except AdapterError as e:
                refused[layer.name] = str(e)
                continue
            if t is not None:
                found.append(t)
        if refused and not found:
            errors.append(f"rule {pr.label} (adapter): {next(iter(refused.values()))}")
        elif refused:
            names = list(refused)
            notes.append(f"rule {pr.label}'s adapter leaves out {len(names)} selected layer(s) LoRA cannot adapt: "
                         f"{', '.join(names[:5])}{', …' if len(names) > 5 else ''} (e.g. {refused[names[0]]})")
        elif layers and not found:
            kinds = sorted({layer.type or "other" for layer in layers.values()})
            errors.append(f"rule {pr.label} sets adapter but matches no Conv or Dense layer (it matches "
                          f"{', '.join(kinds)} layers); add type: [Conv, Dense] or fix match")
        out.update((t.layer, (pr.label, t)) for t in found)
    return out, errors, notes


def _adapters_missing(block: HybridBlock, targets: dict[str, tuple[str, Adapted]]) -> list[str]:
    """Where the block's adapters are not the ones the rules ask for (a plan would not describe it)."""
    have = adapters_of(block)
    wrong = [f"rule {label} puts a LoRA adapter (rank {t.spec.rank}) on layer {name}, which has "
             f"{'none' if name not in have else f'one of rank {have[name].spec.rank}'}"
             for name, (label, t) in targets.items() if name not in have or have[name].spec != t.spec]
    wrong += [f"layer {name} has an adapter no rule asks for" for name in have if name not in targets]
    if wrong:
        wrong[-1] += (" (adapters are added when the model is built: gluontl.prepare, or "
                      "gluontl.rules.attach_adapters before make_plan)")
    return wrong


def attach_adapters(block: HybridBlock, rules: Iterable[RuleLike], *,
                    input_shape: tuple[int, ...] | Mapping[str, tuple[int, ...]] | None = None) -> HybridBlock:
    """``block`` with the adapters its rules' ``adapter`` settings ask for, before planning (the plan
    lists their parameters); for graphs a new block, Gluon blocks change in place."""
    # adapter rules are never presets: no stage order is needed to expand them
    planned = [PlannedRule(str(i), r) for i, r in enumerate(as_rules(rules), 1)
               if isinstance(r, Rule) and r.adapter is not None]
    if not planned:
        return block
    entries = _entries(block)
    stages = stage_map(block, image_shape(input_shape)) if any(p.rule.stage is not None for p in planned) \
        and input_shape is not None else {}
    kind_of = param_kinds(entries) if any(p.rule.kind is not None for p in planned) else {}
    targets = _adapter_targets(block, planned, entries, stages, kind_of)[0]
    have = adapters_of(block)
    return add_lora(block, {t.source: t.spec for _, t in targets.values() if t.layer not in have})


def image_shape(shape: Iterable[int] | Mapping[str, Iterable[int]]) -> tuple[int, ...]:
    """C,H,W from C,H,W or N,C,H,W (or a one-input ``{name: N,C,H,W}`` as ``load_model`` takes).

    Both conventions are in use (recipes write C,H,W; graph APIs take batch-first shapes),
    so either works; any other rank is refused rather than mapped to a blank stage column.
    """
    if isinstance(shape, Mapping):
        if len(shape) != 1:
            raise RuleError(f"input_shape {dict(shape)} names {len(shape)} inputs; stages are mapped for a "
                            f"model with one image input: pass its C,H,W or N,C,H,W.")
        shape = next(iter(shape.values()))
    dims = tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d > 0 for d in dims) \
            or len(dims) not in (3, 4):
        raise RuleError(f"input_shape {dims} is neither C,H,W nor N,C,H,W (positive integers, e.g. 3,224,224 "
                        f"or 1,3,224,224); stages are mapped for image models. Select by match: or type: "
                        f"for other models.")
    return tuple(int(d) for d in dims[-3:])


def _no_match(pr: PlannedRule, entries: dict[str, ParamEntry], stages: dict[str, Stage],
              kinds: dict[str, frozenset[str]]) -> str:
    r = pr.rule
    parts = []
    if r.match is not None:
        parts.append(f"match {r.match}")
    if r.type is not None:
        present = sorted({e.layer.type for e in entries.values() if e.layer and e.layer.type})
        parts.append(f"type {r.type} (this model has {', '.join(present) or 'no typed layers'})")
    if r.stage is not None:
        parts.append(f"stage {r.stage} (this model has {', '.join(map(str, dict.fromkeys(stages.values())))})")
    if r.kind is not None:
        present = sorted(set().union(*kinds.values()))
        parts.append(f"kind {r.kind} (this model has {', '.join(present) or 'none of them'})")
    example = ", ".join(list(entries)[:3])
    return f"rule {pr.label} ({' and '.join(parts)}) matches no parameter (names look like: {example})"


def _nothing_to_do(pr: PlannedRule, layer_type: str, where: str) -> str:
    """The plan's word on a preset's rule for a layer type the model lacks (a BN-less ViT, BN folded
    into convolutions): the user cannot edit a preset's rules, so this is no error."""
    what = "bn: " + pr.rule.bn if pr.rule.bn is not None and layer_type == "BatchNorm" else (pr.rule.note or "")
    return f"rule {pr.label} ({pr.preset}{': ' + what if what else ''}): no {layer_type} layer {where}, nothing to do"


def _notes(rows: list[Row]) -> list[str]:
    """Warn where MXNet will not do what the plan seems to say."""
    notes = []
    any_trainable_before = False
    warned = set()
    for row in rows:
        if row.bn == "train" and row.layer not in warned and row.layer_type == "BatchNorm":
            layer_rows = [r for r in rows if r.layer == row.layer]
            if not any_trainable_before and not any(r.trainable for r in layer_rows):
                warned.add(row.layer)
        any_trainable_before |= row.trainable
    if warned:
        notes.append(f"{len(warned)} BatchNorm layer(s) are in bn: train but neither they nor anything "
                     f"before them trains (e.g. {sorted(warned)[0]}): MXNet updates running statistics "
                     f"during backward on CPU, so their statistics will not move. Use bn: frozen to say "
                     f"so, or let the layer's gamma/beta train.")
    return notes


def freeze_bn_stats(plan: Plan, decided_by: str) -> Plan:
    """The plan with every ``bn: train`` layer frozen, ``decided_by`` recorded for it: what a
    setting outside the rules (train.distributed.batch_norm) decides, shown in the plan."""
    rows = [dataclasses.replace(r, bn="frozen", decided_by={**r.decided_by, "bn": decided_by})
            if r.bn == "train" else r for r in plan.rows]
    return dataclasses.replace(plan, rows=rows)


def apply_plan(block: HybridBlock, plan: Plan) -> None:
    """Set grad_req/lr_mult/wd_mult on each Parameter and BN modes on layers.

    Drops cached graphs so the next forward is traced again: a hybridized block keeps the
    grad_req and use_global_stats it was traced with otherwise.
    """
    entries = named_params(block)
    bn_layers: dict[int, tuple[Layer, bool]] = {}
    for row in plan.rows:
        e = entries[row.name]
        if not row.aux:
            e.param.grad_req = row.grad_req
            e.param.lr_mult = row.lr_mult
            e.param.wd_mult = row.wd_mult
        if row.bn is not None and e.layer is not None:
            bn_layers[id(e.layer)] = (e.layer, row.bn == "frozen")
    graph_frozen: dict[int, tuple[SymbolBlock, dict[str, bool]]] = {}
    for layer, frozen in bn_layers.values():
        if layer.block is not None:
            set_op_kwarg(layer.block, "use_global_stats", frozen)
        elif layer.owner is not None:
            graph_frozen.setdefault(id(layer.owner), (layer.owner, {}))[1][layer.node] = frozen
    for owner, modes in graph_frozen.values():
        set_graph_bn_modes(owner, modes)
    clear_cached_ops(block)


def trainable_params(block: HybridBlock) -> dict[str, Parameter]:
    """Parameters the Trainer should own: only those that receive gradients."""
    return {n: e.param for n, e in named_params(block).items() if e.param.grad_req != "null"}


def format_plan(plan: Plan) -> str:
    """Human-readable table: every parameter, its settings and the rule that decided each."""
    head = ("name", "mxnet name", "shape", "count", "stage", "grad_req", "lr", "wd", "bn", "rules g/lr/wd/bn")
    adapters = any(r.adapter for r in plan.rows)
    head += ("adapter",) * adapters
    lines = []
    for r in plan.rows:
        d = r.decided_by
        lines.append((r.name, r.global_name, "x".join(map(str, r.shape)), f"{r.size:,}",
                      "" if r.stage is None else str(r.stage), "aux" if r.aux else r.grad_req,
                      "" if r.aux else f"{r.lr_mult:g}", "" if r.aux else f"{r.wd_mult:g}", r.bn or "",
                      f"{d['grad_req']}/{d['lr_mult']}/{d['wd_mult']}/{d['bn']}", *(r.adapter or "",) * adapters))
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [f"rules (epoch {plan.epoch}):"]
    out += [f"  {p.label}: {_rule_text(p.rule)}" for p in plan.rules]
    out += [f"stages: {plan.stages_from}"] if plan.stages_from else []
    out += ["", fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*l) for l in lines]
    t = plan.totals()
    out.append("")
    out.append(f"{t['params']} parameters: trainable {t['trainable']:,} ({t['trainable_bytes'] / 2**20:.1f} MiB), "
               f"frozen {t['frozen']:,} ({t['frozen_bytes'] / 2**20:.1f} MiB)")
    out += [f"note: {n}" for n in plan.notes]
    return "\n".join(out)


def format_params(plan: Plan) -> str:
    """What ``gluontl inspect`` lists: every parameter with the names rules match it by (an imported
    graph's own tensor name beside the module path it takes), shape, layer type and stage."""
    head = ("name", "mxnet name", "shape", "count", "type", "stage")
    lines = [(r.name, r.global_name, "x".join(map(str, r.shape)), f"{r.size:,}",
              ("aux " if r.aux else "") + (r.layer_type or "-"), "" if r.stage is None else str(r.stage))
             for r in plan.rows]
    widths = [max(len(h), *(len(l[i]) for l in lines)) if lines else len(h) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    t = plan.totals()
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths)),
                      *(fmt.format(*l).rstrip() for l in lines),
                      f"{t['params']} parameters, {t['trainable'] + t['frozen']:,} values",
                      *(f"note: {n}" for n in plan.notes)]).rstrip()


def _rule_text(r: Rule) -> str:
    d = r.model_dump(exclude_defaults=True, exclude={"note"})
    if r.adapter is not None:  # its settings in full: the defaults are the adapter the rule makes
        d["adapter"] = r.adapter.model_dump()
    text = ", ".join(f"{k}={v}" for k, v in d.items())
    return text + (f"  # {r.note}" if r.note else "")
