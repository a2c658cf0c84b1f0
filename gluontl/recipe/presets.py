"""A recipe's rules: the plain ``Rule`` (a selector and the settings it sets) and the presets, each
a model of its own with its own keys, their checks and its expansion into plain rules.

``RuleItem`` is their discriminated union: a rule with ``preset: NAME`` is that preset's model,
any other is a ``Rule``. gluontl/rules.py turns presets into rules with ``Preset.expand`` and plans
the rules; the schema here needs nothing from it.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Mapping, Union

from pydantic import BeforeValidator, Discriminator, Field, Tag, field_validator, model_validator

from ..errors import RuleError
from .common import HEAD, LAYER_TYPES, NECK, STEM, BNMode, GradReq, ParamKind, StageName, Strict, suggest

Stage = Union[int, str]  # gluontl.stages.Stage: a stage number, stem, neck or head


class StageRange(Strict):
    start: int | StageName
    end: int | StageName


class AdapterSpec(Strict):
    """A LoRA adapter on each matched Conv/Dense layer (gluontl/adapters.py): the layer's output
    gains ``alpha/rank · B(A(dropout(x)))``, B starting at zero; its own weights are frozen."""

    kind: Literal["lora"] = "lora"
    rank: int = Field(default=8, ge=1, le=1 << 16)
    alpha: float = Field(default=16.0, gt=0.0)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)


def _stage_order(s: int | str) -> int:
    return {STEM: 0, NECK: 10**5, HEAD: 10**6}.get(s, s) if isinstance(s, str) else int(s)


def _stage_name(i: int) -> int | str:
    return {0: STEM, 10**5: NECK, 10**6: HEAD}.get(i, i)


def _stages(v: Any) -> Any:
    """``stage: 2``, ``stage: [1, 2]`` or ``stage: {start: 1, end: 3}`` as a list of stages."""
    if isinstance(v, (int, str)) and not isinstance(v, bool):
        v = [v]
    if isinstance(v, dict):  # {start: 1, end: 3}
        r = StageRange(**v)
        order = _stage_order(r.start), _stage_order(r.end)
        return [_stage_name(i) for i in range(order[0], order[1] + 1)]
    return v


Stages = Annotated[list[int | StageName] | None, BeforeValidator(_stages)]


class Rule(Strict):
    """One rule: a selector (match/type/stage/kind) and the settings it sets.

    Settings left out keep what earlier rules decided; later rules win field by field.
    """

    preset: ClassVar[None] = None  # a plain rule stands for no preset (``Preset.preset`` names one)

    match: list[str] | None = None
    type: list[str] | None = None
    stage: Stages = None
    kind: list[ParamKind] | None = None
    grad_req: GradReq | None = None
    lr_mult: float | None = Field(default=None, ge=0.0)
    wd_mult: float | None = Field(default=None, ge=0.0)
    bn: BNMode | None = None
    adapter: AdapterSpec | None = None
    optional: bool = False
    from_epoch: int = Field(default=0, ge=0, le=100_000)
    note: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_a_preset(cls, data: Any) -> Any:
        """A preset's own key on a plain rule names its preset; null means "not set", as everywhere."""
        if not isinstance(data, Mapping):
            return data
        if data.get("preset") is not None:
            raise ValueError(f"preset {data['preset']!r} is a model of its own: give the rule as a dict with "
                             f"preset: NAME where rules are taken, or as gluontl.recipe."
                             f"{PRESETS[data['preset']].__name__ if data['preset'] in PRESETS else 'Preset'}(...)")
        misplaced = sorted(k for k in PRESET_ONLY_KEYS if data.get(k) is not None)
        if misplaced:
            owners = sorted({p for p, keys in PRESET_KEYS.items() if set(misplaced) & set(keys)})
            raise ValueError(f"{', '.join(misplaced)} belongs to preset {' / '.join(owners)}; add preset: "
                             f"{owners[0]} or remove {misplaced[0]}")
        return {k: v for k, v in data.items() if not (v is None and k in ("preset", *PRESET_ONLY_KEYS))}

    @field_validator("match", "type", "kind", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("type")
    @classmethod
    def _types(cls, v: list[str] | None) -> list[str] | None:
        for t in v or []:
            if t not in LAYER_TYPES:
                raise ValueError(f"unknown layer type '{t}'{suggest(t, LAYER_TYPES)}")
        return v

    @model_validator(mode="after")
    def _shape(self) -> "Rule":
        if self.match is None and self.type is None and self.stage is None and self.kind is None:
            raise ValueError("a rule needs a selector: match, type, stage or kind (or a preset)")
        if all(getattr(self, k) is None for k in ("grad_req", "lr_mult", "wd_mult", "bn", "adapter")):
            raise ValueError("a rule needs at least one setting: grad_req, lr_mult, wd_mult, bn or adapter")
        if self.adapter is not None and self.from_epoch:
            raise ValueError("an adapter is part of the model from the start; remove from_epoch from the rule "
                             "with adapter (a later rule can change the adapter's lr_mult by match)")
        return self


class Preset(Strict):
    """A named bundle of rules (``preset: NAME``): its keys besides these are its own fields, and
    ``expand`` gives the plain rules it stands for. A preset's ``from_epoch`` and ``optional`` are
    added to each of them by gluontl/rules.py."""

    needs_stages: ClassVar[bool] = True  # expanding needs the model's stage order

    optional: bool = False
    from_epoch: int = Field(default=0, ge=0, le=100_000)
    preset: str
    note: str | None = None

    @classmethod
    def takes(cls) -> tuple[str, ...]:
        """The keys this preset takes besides preset, optional, from_epoch and note."""
        return tuple(k for k in cls.model_fields if k not in Preset.model_fields)

    @model_validator(mode="before")
    @classmethod
    def _own_keys(cls, data: Any) -> Any:
        """Another rule key (a selector, a setting, another preset's) is refused by name; null means
        "not set", as everywhere."""
        if not isinstance(data, Mapping):
            return data
        name = cls.model_fields["preset"].default
        if data.get("adapter") is not None:
            raise ValueError("a preset takes no adapter; give the adapter its own rule with match/type/stage")
        extra = sorted(k for k, v in data.items() if v is not None and k in RULE_KEYS and k not in cls.model_fields)
        if extra:
            raise ValueError(f"preset {name} takes no key {', '.join(extra)} (it takes "
                             f"{', '.join(cls.takes()) or 'none'} besides optional, from_epoch and note); a later "
                             f"rule of its own can refine what it sets")
        return {k: v for k, v in data.items() if not (v is None and k in RULE_KEYS and k not in cls.model_fields)}

    def expand(self, order: list[Stage] | None) -> list[Rule]:
        """The plain rules this preset stands for on a model whose stages are ``order`` (stem to head)."""
        raise NotImplementedError


class FreezeAllButHead(Preset):
    """Everything frozen (BatchNorm statistics too) but the head."""

    preset: Literal["freeze_all_but_head"] = "freeze_all_but_head"

    def expand(self, order: list[Stage] | None) -> list[Rule]:
        return [Rule(match=["*"], grad_req="null", bn="frozen", note="freeze everything"),
                Rule(stage=[HEAD], grad_req="write", note="train the head")]


class FreezeUntilStage(Preset):
    """The stem and stages 1..until_stage frozen (BatchNorm statistics too)."""

    preset: Literal["freeze_until_stage"] = "freeze_until_stage"
    until_stage: int | StageName | None = None

    def expand(self, order: list[Stage] | None) -> list[Rule]:
        if self.until_stage is None:
            raise RuleError("preset freeze_until_stage needs until_stage: N (stem, 1, 2, …).")
        until = self.until_stage
        last = 0 if until == STEM else 99 if until in (NECK, HEAD) else int(until)
        stages: list[int | str] = [STEM] + list(range(1, last + 1)) + ([NECK] if until != STEM and
                                                                      not isinstance(until, int) else [])
        return [Rule(stage=stages, grad_req="null", bn="frozen", note=f"freeze stem..{until}")]


class FreezeBn(Preset):
    """Every BatchNorm frozen: no gradient, running statistics kept."""

    needs_stages: ClassVar[bool] = False
    preset: Literal["freeze_bn"] = "freeze_bn"

    def expand(self, order: list[Stage] | None) -> list[Rule]:
        return [Rule(type=["BatchNorm"], grad_req="null", bn="frozen", note="freeze every BatchNorm")]


class NoWeightDecay1d(Preset):
    """timm's default: no weight decay on 1-D parameters (biases, norm scales and shifts)."""

    needs_stages: ClassVar[bool] = False
    preset: Literal["no_weight_decay_1d"] = "no_weight_decay_1d"

    def expand(self, order: list[Stage] | None) -> list[Rule]:
        return [Rule(kind=["1d"], wd_mult=0.0, note="no weight decay on 1-D parameters (timm's default)")]


def _depths(order: list[Stage] | None, preset: str) -> list[tuple[Stage, int]]:
    """Each stage with its depth below the last one (the head: 0), timm's ``layer_max - layer_id``.

    Depth counts every stage of the model, frozen or not: freezing the stem does not make
    stage 1 shallower, and multipliers must not shift when a ``from_epoch`` rule unfreezes it.
    """
    if not order:
        raise RuleError(f"preset {preset} spreads over the model's stages: it needs the model's input shape "
                        f"(model.input_shape) and a model whose stages can be mapped (`gluontl inspect`).")
    return [(s, len(order) - 1 - i) for i, s in enumerate(order)]


class LayerDecay(Preset):
    """timm's layer-wise lr decay: ``lr_mult = rate^depth`` below the head, on every stage, the
    ``stage`` list, or the head and the ``last`` N stages before it."""

    preset: Literal["layer_decay"] = "layer_decay"
    rate: float | None = Field(default=None, gt=0.0, le=1.0, description="layer_decay: lr_mult = rate^depth "
                               "below the head")
    min_scale: float | None = Field(default=None, ge=0.0, le=1.0, description="layer_decay: lr_mult floor")
    stage: Stages = None
    last: int | None = Field(default=None, ge=1, le=10_000, description="layer_decay: only the head and the "
                             "last N stages before it")

    @model_validator(mode="after")
    def _settings(self) -> "LayerDecay":
        if self.rate is None:
            raise ValueError("preset layer_decay needs rate: R (0 < R <= 1; 0.75 is timm's usual value)")
        if self.stage is not None and self.last is not None:
            raise ValueError("layer_decay takes stage: [...] or last: N, not both")
        return self

    def expand(self, order: list[Stage] | None) -> list[Rule]:
        depths = _depths(order, "layer_decay")
        chosen = [s for s, _ in depths]
        if self.stage is not None:
            missing = [s for s in self.stage if s not in chosen]
            if missing:
                raise RuleError(f"preset layer_decay names stage {', '.join(map(str, missing))}, which this model "
                                f"does not have (it has {', '.join(map(str, chosen))}).")
            chosen = self.stage
        elif self.last is not None:
            chosen = chosen[-(self.last + 1):] if chosen[-1] == HEAD else chosen[-self.last:]
        floor = self.min_scale or 0.0
        return [Rule(stage=[s], lr_mult=max(floor, self.rate ** d),
                     note=f"layer decay {self.rate:g}^{d}" + (f", at least {floor:g}" if floor else ""))
                for s, d in depths if s in chosen]


class FineTune(Preset):
    """fastai's ``fine_tune``: the head alone for ``freeze_epochs``, then everything with lr
    multipliers spread geometrically from 1/base_lr_div (the stem) to 1 (the head), fastai's
    ``slice(base_lr/lr_mult, base_lr)``. BatchNorm trains in the frozen phase unless
    ``train_bn: false`` (fastai's ``train_bn``). Unset keys take their defaults when expanded,
    so a recipe's digest is that of before they existed."""

    preset: Literal["fine_tune"] = "fine_tune"
    freeze_epochs: int | None = Field(default=None, ge=1, le=100_000, description="fine_tune: epochs the body "
                                      "stays frozen (default 1)")
    base_lr_div: float | None = Field(default=None, ge=1.0, description="fine_tune: the stem's lr divisor after "
                                      "unfreezing (default 100)")
    train_bn: bool | None = Field(default=None, description="fine_tune: BatchNorm trains while the body is "
                                  "frozen (default true, as fastai)")

    def expand(self, order: list[Stage] | None) -> list[Rule]:
        depths = _depths(order, "fine_tune")
        then = self.freeze_epochs or 1
        div = 100.0 if self.base_lr_div is None else self.base_lr_div
        train_bn = self.train_bn is not False
        top = max(depths[0][1], 1)
        out = [Rule(match=["*"], grad_req="null", note=f"fine_tune: freeze the body for {then} epoch(s)"),
               Rule(type=["BatchNorm"], grad_req="write", bn="train", optional=True,
                    note="fine_tune: BatchNorm trains")
               if train_bn else Rule(type=["BatchNorm"], bn="frozen", optional=True, note="fine_tune: BatchNorm frozen"),
               Rule(stage=[HEAD], grad_req="write", note="fine_tune: train the head")]
        out.append(Rule(match=["*"], grad_req="write", from_epoch=then, note="fine_tune: unfreeze"))
        if not train_bn:
            out.append(Rule(type=["BatchNorm"], bn="train", optional=True, from_epoch=then,
                            note="fine_tune: BatchNorm trains"))
        out += [Rule(stage=[s], lr_mult=div ** (-d / top), from_epoch=then,
                     note=f"fine_tune: discriminative lr 1/{div:g}^({d}/{top})") for s, d in depths]
        return out


PRESETS: dict[str, type[Preset]] = {cls.model_fields["preset"].default: cls for cls in (
    FreezeAllButHead, FreezeUntilStage, FreezeBn, NoWeightDecay1d, LayerDecay, FineTune)}
PRESET_NAMES = tuple(PRESETS)
PRESET_KEYS: dict[str, tuple[str, ...]] = {name: cls.takes() for name, cls in PRESETS.items()}
PRESET_ONLY_KEYS = tuple(dict.fromkeys(k for keys in PRESET_KEYS.values() for k in keys if k not in Rule.model_fields))
RULE_KEYS = frozenset(Rule.model_fields) | set(PRESET_ONLY_KEYS)  # every key some rule takes
TAGS: dict[str, type[Strict]] = {"rule": Rule, **PRESETS}  # the union's members by tag (in error locations)


def plain_loc(loc: tuple) -> tuple:
    """An error's location as a recipe's keys: the union's tag after a rule's index left out."""
    return tuple(p for i, p in enumerate(loc)
                 if not (isinstance(p, str) and p in TAGS and (i == 0 or isinstance(loc[i - 1], int))))


def _tag(v: Any) -> str:
    """``preset: NAME`` picks that preset's model; anything else is a plain rule."""
    name = v.get("preset") if isinstance(v, Mapping) else getattr(v, "preset", None)
    return name if isinstance(name, str) and name in PRESETS else "rule"


def _known_preset(v: Any) -> Any:
    if isinstance(v, Mapping) and v.get("preset") is not None and v["preset"] not in PRESETS:
        raise ValueError(f"unknown preset '{v['preset']}'{suggest(v['preset'], PRESET_NAMES)}")
    return v


RuleItem = Annotated[Union[tuple(Annotated[cls, Tag(tag)] for tag, cls in TAGS.items())],  # type: ignore[misc]
                     Discriminator(_tag), BeforeValidator(_known_preset)]
AnyRule = Union[Rule, Preset]  # what a recipe's rules list holds
