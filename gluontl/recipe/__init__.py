"""The recipe: a YAML file (or dict) as typed, validated objects, the one place a recipe key is defined.

- ``common``: the strict base model, stage names, the "did you mean" hint;
- ``sources``: what a recipe names on disk (model specs as people type them, an ONNX file's
  declared input size and normalization);
- ``presets``: a rule, and each preset as a model of its own with its keys and its expansion;
- ``sections``: model, surgery, data, train, export, segmentation;
- ``policy``: the checks across sections; ``schema``: the ``Recipe`` and its digest;
- ``compat``: the schema's version and one migration per change (old runs keep their digests);
- ``overrides``: ``--set key=value``; ``load``: reading, validating and saying what is wrong.
"""
from .common import (HEAD, LAYER_TYPES, NECK, STEM, BNMode, GradReq, ParamKind, StageName, Strict,
                     suggest)
from .compat import SCHEMA_VERSION
from .load import MAX_RECIPE_BYTES, SpecT, as_recipe, as_rules, as_spec, load_recipe, parse_recipe, resolve_backend
from .presets import (PRESET_KEYS, PRESET_NAMES, PRESETS, AdapterSpec, AnyRule, FineTune, FreezeAllButHead,
                      FreezeBn, FreezeUntilStage, LayerDecay, NoWeightDecay1d, Preset, Rule, RuleItem, StageRange)
from .schema import Recipe
from .sections import (CALLBACK_SPECS, TASK_METRICS, TASK_SCHEMAS, CsvSpec, DataSpec, DetectorSpec, DistributedSpec,
                       EarlyStoppingSpec, EmaSpec, ExportSpec, GuardLevel, GuardsSpec, HeadSpec, MlflowSpec,
                       MixupSpec, ModelSpec, MultiLabelSpec, QuantizeSpec, RandAugmentSpec, RandomErasingSpec,
                       RestoreSpec, ScheduleSpec, SegmentationSpec, Side, Size,
                       SurgerySpec, TrainSpec, TransformSpec, selectable, size_hw)
from .sources import SOURCE_FORMS, resolve_source

__all__ = [
    "HEAD", "LAYER_TYPES", "NECK", "STEM", "BNMode", "GradReq", "ParamKind", "StageName", "Strict", "suggest",
    "SCHEMA_VERSION", "MAX_RECIPE_BYTES", "SpecT", "as_recipe", "as_rules", "as_spec", "load_recipe",
    "parse_recipe", "resolve_backend", "PRESET_KEYS", "PRESET_NAMES", "PRESETS", "AdapterSpec", "AnyRule",
    "FineTune", "FreezeAllButHead", "FreezeBn", "FreezeUntilStage", "LayerDecay", "NoWeightDecay1d", "Preset",
    "Rule", "RuleItem", "StageRange", "Recipe", "CALLBACK_SPECS", "TASK_METRICS", "TASK_SCHEMAS", "CsvSpec",
    "DataSpec", "DetectorSpec", "DistributedSpec", "EarlyStoppingSpec", "EmaSpec", "ExportSpec", "GuardLevel",
    "GuardsSpec", "HeadSpec", "MixupSpec", "MlflowSpec", "ModelSpec", "MultiLabelSpec", "RandAugmentSpec",
    "RandomErasingSpec", "QuantizeSpec", "RestoreSpec", "ScheduleSpec", "SegmentationSpec", "Side", "Size",
    "SurgerySpec", "TrainSpec", "TransformSpec", "selectable", "size_hw",
    "SOURCE_FORMS", "resolve_source"]
