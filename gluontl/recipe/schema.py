"""The recipe as a whole: its sections, its version, the checks across them (policy.py) and what a
run records of it (as written, its digest).

``load_recipe`` (load.py) turns every validation problem into one ``RecipeError`` paragraph naming
the file, each bad key path and the allowed values.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, Mapping

from pydantic import Field, model_validator

from . import compat, policy
from .common import Strict
from .presets import RuleItem
from .sections import (TASK_SCHEMAS, DataSpec, ExportSpec, ModelSpec, MultiLabelSpec, SegmentationSpec, SurgerySpec, TrainSpec,
                       TransformSpec)


class Recipe(Strict):
    schema_version: int = Field(default=compat.SCHEMA_VERSION, description="the recipe schema's version "
                                "(gluontl/recipe/compat.py): left out, 1; read as the current one")
    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")  # a run folder name: no "..", no "/"
    task: Literal[tuple(TASK_SCHEMAS)] = "classification"  # type: ignore[valid-type]
    model: ModelSpec
    surgery: SurgerySpec = SurgerySpec()
    rules: list[RuleItem] = Field(default_factory=list)  # type: ignore[valid-type]
    data: DataSpec | None = None
    train: TrainSpec = TrainSpec()
    export: ExportSpec = ExportSpec()
    multilabel: MultiLabelSpec | None = Field(default=None, description="task: multilabel: its loss (defaults "
                                              "when left out)")
    segmentation: SegmentationSpec | None = Field(default=None, description="task: segmentation: the "
                                                  "segmenter and its augmentation (defaults when left out)")

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data: Any) -> Any:
        """A recipe of an older schema version as the current one reads it (compat.upgrade)."""
        return compat.upgrade(data) if isinstance(data, Mapping) else data

    @model_validator(mode="before")
    @classmethod
    def _task_select(cls, data: Any) -> Any:
        """A recipe that does not choose picks its best checkpoint by its task's first metric
        (detection: mAP@0.5, segmentation: mIoU)."""
        if isinstance(data, Mapping) and data.get("task") in TASK_SCHEMAS:
            train = data.get("train") if isinstance(data.get("train"), Mapping) else {}
            if "select" not in train:
                data = {**data, "train": {**train, "select": TASK_SCHEMAS[data["task"]].metrics[0]}}
        return data

    @model_validator(mode="after")
    def _fits(self) -> "Recipe":
        policy.check_task(self)
        data = policy.fitted_data(self)
        if data is not None:
            object.__setattr__(self, "data", data)  # frozen: this validator completes construction
        return self

    def differences(self, other: "Recipe", *sections: str) -> list[str]:
        """``key.path: old -> new`` for every leaf that differs (what a refused resume reports)."""
        def leaves(d: Any, path: str = "") -> dict[str, Any]:
            if isinstance(d, dict):
                return {k: v for key, val in d.items() for k, v in leaves(val, f"{path}.{key}" if path else key).items()}
            return {path: d}

        mine = leaves(self.model_dump(mode="json", include=set(sections) or None))
        theirs = leaves(other.model_dump(mode="json", include=set(sections) or None))
        return [f"{k}: {mine.get(k)!r} -> {theirs.get(k)!r}" for k in sorted(set(mine) | set(theirs))
                if mine.get(k) != theirs.get(k)]

    def as_written(self) -> dict[str, Any]:
        """The recipe as YAML data that loads back to it (a run folder's recipe.yaml): transforms
        derived from the model's input size are left out, to be derived again (and shown as
        defaults) when it is loaded."""
        out = self.model_dump(mode="json", exclude_none=True)
        for key, spec in (self.data._given if self.data is not None else {}).items():
            if spec is None:
                del out["data"][key]
            else:  # as given: a normalize left out is derived again (from the model file, say)
                out["data"][key] = spec.model_dump(mode="json", exclude_none=True, exclude_unset=True)
        return out

    def digest(self, *sections: str) -> str:
        """Hash of the sections that decide what a run computes (for resume checks); guards
        only watch a run and validation (``val_every``) only reads it, so a resume may change
        them. Transforms count as the recipe wrote them (what is derived from them is a function
        of the rest), so digests are those of before defaults existed; a distributed run's
        step_timeout is a watch too."""
        data = self.model_dump(mode="json", include=set(sections) or None, exclude={"train": {
            "guards": True, "val_every": True, "callbacks": True, "distributed": {"step_timeout": True}}})
        for key, spec in (self.data._given if self.data is not None and "data" in data else {}).items():
            data["data"][key] = (spec or TransformSpec()).model_dump(mode="json")
        if data.get("multilabel", 0) is None:  # added in version 6 without a migration: hashed only when set
            del data["multilabel"]
        if data.get("export", {}).get("tta") == "none":
            del data["export"]["tta"]
        compat.digest_form(data)  # keys added since version 1 count when set: runs from before them agree
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


