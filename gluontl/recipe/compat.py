"""Recipes from older gluontl: the schema's version and one migration per change since version 1.

A run's checkpoints record a digest of its recipe (``Recipe.digest``), and a resume is refused
when the digest differs; so a change to the schema must not change the digest of a recipe that
does not use what the change added. Each change is a ``Change`` with its migration: from a
digest's data at its version to the data version - 1 hashed (what it added left out where it
holds the value recipes had before it). ``digest_form`` applies them newest first, so a recipe
hashes as version 1 did whatever version it was written at.

A recipe file states ``schema_version`` (runs write it); one without it is version 1. Every
change so far only added keys, and a key left out means what recipes before it did, so reading
an older recipe needs no rewrite of its data: ``upgrade`` checks the version and sets the current
one. A change that renames or reshapes a key adds its rewrite there, step by step.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

SCHEMA_VERSION = 9


@dataclasses.dataclass(frozen=True)
class Change:
    version: int  # the schema version this change made
    commit: str  # where it came in (git log)
    what: str
    migrate: Callable[[dict[str, Any]], None]  # a digest's data at `version` to version - 1's, in place


def _distributed(data: dict[str, Any]) -> None:
    train = data.get("train") or {}
    dist = train.get("distributed")
    if dist is not None and dist.get("backend") in (None, "none"):
        del train["distributed"]


def _last_batch(data: dict[str, Any]) -> None:
    if (data.get("data") or {}).get("last_batch") == "discard":
        del data["data"]["last_batch"]


RULE_KEYS_V4 = ("kind", "rate", "min_scale", "last", "freeze_epochs", "base_lr_div", "train_bn", "adapter")


def _rule_keys(data: dict[str, Any]) -> None:
    for rule in data.get("rules") or []:
        for key in RULE_KEYS_V4:
            if rule.get(key) is None:
                rule.pop(key, None)


SECTIONS_V5 = (("segmentation",), ("train", "ema"), ("export", "quantize"))


def _sections(data: dict[str, Any]) -> None:
    for *outer, key in SECTIONS_V5:
        section = data
        for name in outer:
            section = section.get(name) or {}
        if key in section and section[key] is None:
            del section[key]


# every key of version 5's one Rule model, presets' keys included (unset: null)
FLAT_RULE_KEYS = ("match", "type", "stage", "kind", "grad_req", "lr_mult", "wd_mult", "bn", "adapter", "optional",
                  "from_epoch", "preset", "until_stage", "rate", "min_scale", "last", "freeze_epochs",
                  "base_lr_div", "train_bn", "note")


def _presets(data: dict[str, Any]) -> None:
    data.pop("schema_version", None)
    if data.get("rules") is not None:
        data["rules"] = [{**dict.fromkeys(FLAT_RULE_KEYS), **rule} for rule in data["rules"]]


RTOL_V6 = 1e-4  # export.rtol's default before version 7


def _rtol(data: dict[str, Any]) -> None:
    export = data.get("export")
    if export is not None and export.get("rtol") is None:
        export["rtol"] = RTOL_V6


def _imbalance(data: dict[str, Any]) -> None:
    if (data.get("data") or {}).get("sampler") == "uniform":
        del data["data"]["sampler"]
    if "loss" in (data.get("train") or {}) and data["train"]["loss"] is None:
        del data["train"]["loss"]


STRONG_AUGMENTATION_V7 = (("randaugment", None), ("trivial_augment", False), ("random_erasing", None))


def _strong_augmentation(data: dict[str, Any]) -> None:
    section = data.get("data") or {}
    for key in ("train_transform", "val_transform"):
        spec = section.get(key) or {}
        for name, unset in STRONG_AUGMENTATION_V7:
            if name in spec and spec[name] == unset:
                del spec[name]
    train = data.get("train") or {}
    if "mixup" in train and train["mixup"] is None:
        del train["mixup"]


CHANGES = (
    Change(2, "c247d34", "train.distributed: hashed only when a backend other than none is set", _distributed),
    Change(3, "1a99bf7", "data.last_batch: hashed only when keep (discard is what epochs did before)", _last_batch),
    Change(4, "a80b625", "rule keys kind and adapter, layer_decay's and fine_tune's keys: hashed only when set",
           _rule_keys),
    Change(5, "d06fb41", "sections segmentation, train.ema and export.quantize: hashed only when set", _sections),
    Change(6, "recipe-pkg", "schema_version (never hashed); each preset a model of its own: a rule hashes "
           "with every key of the one Rule model before it, unset ones null", _presets),
    Change(7, "onnxtol", "export.rtol unset (null): ONNX verification by the graph's float32 bound; hashed as 1e-4, "
           "the default before", _rtol),
    Change(8, "imbalance", "data.sampler and train.loss: hashed only when set (uniform, unset: what runs did "
           "before)", _imbalance),
    Change(9, "augment", "transforms' randaugment, trivial_augment, random_erasing and train.mixup: hashed only "
           "when set", _strong_augmentation),
)
assert [c.version for c in CHANGES] == list(range(2, SCHEMA_VERSION + 1))


def digest_form(data: dict[str, Any], since: int = 1) -> dict[str, Any]:
    """``data`` (a recipe's JSON dump) as version ``since`` hashed it: each change's migration, newest first."""
    for change in reversed(CHANGES):
        if change.version > since:
            change.migrate(data)
    return data


def upgrade(data: dict[str, Any]) -> dict[str, Any]:
    """A recipe's data of any version as the current version reads it (see the module docstring).
    Raises ValueError for a version this gluontl does not know."""
    version = data.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION
        raise ValueError(f"schema_version {version!r} is " + (
            f"newer than this gluontl's ({SCHEMA_VERSION}): the recipe was written by a later gluontl; upgrade "
            f"gluontl, or remove keys it does not know and the schema_version" if newer else
            f"not a schema version; give a whole number from 1 to {SCHEMA_VERSION}, or leave it out (version 1)"))
    return {**data, "schema_version": SCHEMA_VERSION}
