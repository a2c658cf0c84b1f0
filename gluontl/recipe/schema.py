"""Recipe schema: the one place a YAML recipe becomes typed, validated objects.

Every section is a pydantic model with ``extra="forbid"`` so a misspelt key is an error,
not a silently ignored setting. ``load_recipe`` turns every validation problem into one
``RecipeError`` paragraph naming the file, each bad key path and the allowed values.
"""
from __future__ import annotations

import difflib
import functools
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Annotated, Any, Iterable, Literal, Mapping, TypeVar, get_args

import yaml
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

from ..errors import GluontlError, ModelSourceError, RecipeError, RuleError, hwc_hint
from ..home import gluontl_home
from ..metrics import EMA, find_metric, task_metrics
from ..zoo import zoo_input_shape, zoo_names
from ..task_registry import TASKS, source_tasks
from ..readers import SafeYamlLoader, parse_yaml

SpecT = TypeVar("SpecT", bound=BaseModel)

GradReq = Literal["write", "null", "add"]
BNMode = Literal["train", "frozen"]
StageName = Literal["stem", "neck", "head"]  # neck: a detector's layers between backbone and heads
STEM, NECK, HEAD = get_args(StageName)
# each expanded by rules.PRESETS; the keys each takes besides preset/optional/from_epoch/note
PRESET_KEYS: dict[str, tuple[str, ...]] = {
    "freeze_all_but_head": (), "freeze_until_stage": ("until_stage",), "freeze_bn": (),
    "no_weight_decay_1d": (), "layer_decay": ("rate", "min_scale", "stage", "last"),
    "fine_tune": ("freeze_epochs", "base_lr_div", "train_bn")}
PRESET_NAMES = tuple(PRESET_KEYS)
ParamKind = Literal["bias", "norm", "depthwise", "1d"]  # what rules.param_kinds finds in a layer
KEYS_SINCE_20 = (("segmentation",), ("train", "ema"), ("export", "quantize"))
RULE_KEYS_SINCE_21 = ("kind", "rate", "min_scale", "last", "freeze_epochs", "base_lr_div", "train_bn", "adapter")
LAYER_TYPES = ("Conv", "Dense", "BatchNorm", "LayerNorm", "InstanceNorm", "GroupNorm", "Embedding",
               "PReLU", "RNN", "Deconv")


def suggest(word: Any, valid: Iterable[str]) -> str:
    """`` (did you mean 'x'? valid: a, b, c)`` for a misspelt name, GluonCV-style."""
    valid = list(valid)
    close = difflib.get_close_matches(word, valid, n=1, cutoff=0.6) if isinstance(word, str) else []
    return f" ({f'did you mean {close[0]!r}? ' if close else ''}valid: {', '.join(valid)})"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RestoreSpec(Strict):
    """How ``weights`` (or the pretrained file) is restored: what to take, what may not fit.

    Anything missing, unexpected or shape-mismatched that no ``expect_*`` glob covers is
    an error, so a typo in a prefix map cannot silently leave a backbone random.
    """

    prefix_map: dict[str, str] = Field(default_factory=dict,
                                       description="model-name prefix -> file-name prefix")
    only: list[str] = Field(default_factory=list, description="globs of model names to restore")
    expect_missing: list[str] = Field(default_factory=list)
    expect_unexpected: list[str] = Field(default_factory=list)
    expect_mismatch: list[str] = Field(default_factory=list)
    type: Literal["detection", "segmentation", "classification", "none"] | None = Field(
        default=None, description="task: detection / segmentation only (TF Object Detection API's "
        "fine_tune_checkpoint_type): detection or segmentation (the task's default) restores everything the "
        "file has, class rows per `reuse`; classification the "
        "backbone only; none nothing")
    reuse: dict[str, str] = Field(default_factory=dict, description="task: detection / segmentation, restore.type "
                                  "detection / segmentation: "
                                  "new class -> old class (names or indices) whose prediction rows it starts from")

    @field_validator("reuse", mode="before")
    @classmethod
    def _reuse_names(cls, v: Any) -> Any:
        return {str(k): str(x) for k, x in v.items()} if isinstance(v, Mapping) else v


SOURCE_FORMS = ("PATH.onnx or onnx:PATH (an ONNX file); PREFIX, PREFIX-symbol.json or symbol:PREFIX (an MXNet "
                "checkpoint PREFIX-symbol.json + PREFIX-NNNN.params); NAME or zoo:NAME (a Gluon/GluonCV model-zoo "
                "name, `gluontl zoo` lists them)")


def resolve_source(text: str) -> str:
    """The prefixed form (``zoo:``, ``symbol:``, ``onnx:``) of a model spec as people type it.

    Bare paths and names are what users try first; resolving them where ``ModelSpec``
    validates ``source`` makes CLI arguments, recipes and the API agree. The model zoo
    (a slow gluoncv import) is consulted only when nothing on disk matches. Paths expand
    ``~`` and ``$VAR``/``${VAR}`` as a shell would, so a recipe can name a file under
    ``$GLUONTL_HOME`` (which means its default when unset, as everywhere in gluontl).
    """
    scheme, _, rest = text.partition(":")
    if scheme in ("zoo", "symbol", "onnx"):
        if not rest.strip():
            raise ModelSourceError(f"Model spec '{text}' names no model after '{scheme}:'. "
                                   f"Accepted forms: {SOURCE_FORMS}.")
        return text if scheme == "zoo" else f"{scheme}:{_expand(rest)}"
    if not text.strip():
        raise ModelSourceError(f"The model spec is empty. Accepted forms: {SOURCE_FORMS}.")
    text = _expand(text)
    if text.lower().endswith(".onnx"):
        return f"onnx:{text}"
    if text.endswith("-symbol.json"):
        return f"symbol:{text.removesuffix('-symbol.json')}"
    if _exists(Path(f"{text}-symbol.json"), "is_file"):
        return f"symbol:{text}"
    if _exists(Path(text), "is_dir"):
        raise ModelSourceError(f"'{text}' is a directory, not a model. Pass a model file or name; accepted "
                               f"forms: {SOURCE_FORMS}.")
    if _exists(Path(text), "is_file"):
        if _parses_as_onnx(text):
            return f"onnx:{text}"
        hint = (" A .params file holds weights only: pass its symbol PREFIX as the model (and the file as "
                "model.weights)." if text.endswith(".params") else "")
        raise ModelSourceError(f"'{text}' is a file but neither an ONNX model nor an MXNet symbol checkpoint."
                               f"{hint} Accepted forms: {SOURCE_FORMS}.")
    if "/" in text or "\\" in text:
        raise ModelSourceError(f"Model file '{text}' does not exist (nor does '{text}-symbol.json'). Check the "
                               f"path; accepted forms: {SOURCE_FORMS}.")
    names = zoo_names()
    if text.lower() in names:
        return f"zoo:{text}"
    close = difflib.get_close_matches(text.lower(), names, n=5)
    raise ModelSourceError(f"'{text}' is not a file, a symbol prefix or a model-zoo name (close zoo names: "
                           f"{', '.join(close) or 'none'}). Accepted forms: {SOURCE_FORMS}.")


def _expand(path: str) -> str:
    path = os.path.expanduser(path)
    if not os.environ.get("GLUONTL_HOME"):
        path = re.sub(r"\$(GLUONTL_HOME\b|\{GLUONTL_HOME\})", lambda _: str(gluontl_home()), path)
    return os.path.expandvars(path)


def _exists(path: Path, test: str) -> bool:
    try:
        return getattr(path, test)()
    except (OSError, ValueError):  # a name too long or with a NUL byte exists nowhere
        return False


def _parses_as_onnx(path: str) -> bool:
    import onnx

    try:
        graph = onnx.load(path, load_external_data=False).graph
    except Exception:  # protobuf has no single parse-error type; any failure means "not ONNX"
        return False
    return bool(graph.node or graph.output)


class DetectorSpec(Strict):
    """An SSD built on the model source as backbone (task: detection with an onnx:/symbol: source):
    GluonCV's SSD head on the named internal feature maps, extended by ``filters`` extra stride-2
    layers (the neck). Anchor sizes default to fractions of the input height spaced evenly from
    ``min_size`` to ``max_size`` (the SSD paper's rule), steps to each map's real stride."""

    family: Literal["ssd"] = "ssd"
    features: list[str] = Field(min_length=1, max_length=8, description="backbone nodes whose outputs feed "
                                "the heads, shallow to deep (`gluontl inspect MODEL` lists them)")
    filters: list[Annotated[int, Field(gt=0, le=4096)]] = Field(default_factory=lambda: [256, 256, 128, 128],
                                                                max_length=8)
    min_size: float = Field(default=0.1, gt=0.0, le=1.0)
    max_size: float = Field(default=1.05, gt=0.0, le=2.0)
    ratios: list[Annotated[float, Field(gt=0.0)]] = Field(default_factory=lambda: [1.0, 2.0, 0.5], min_length=1)


class ModelSpec(Strict):
    source: str = Field(description="zoo:NAME | symbol:PREFIX | onnx:PATH, or bare: NAME, PREFIX, PATH.onnx")
    pretrained: bool = False
    weights: str | None = None
    weights_from: str | None = Field(default=None, description="recipe whose best params become `weights` "
                                     "when that file does not exist yet (a local pretraining step)")
    restore: RestoreSpec = RestoreSpec()
    kwargs: dict[str, Any] = Field(default_factory=dict, description="extra zoo constructor args")
    epoch: int | None = Field(default=None, ge=0, description="symbol: checkpoint epoch")
    input_shape: tuple[Annotated[int, Field(gt=0, le=1 << 16)], ...] = Field(default=(3, 224, 224), min_length=1, max_length=5)
    input_name: str = "data"
    detector: DetectorSpec | None = Field(default=None, description="task: detection: build an SSD on this "
                                          "source as backbone (zoo detectors need none)")
    anchors: Literal["fit", "zoo"] = Field(default="fit", description="task: detection, SSD: fit = anchor steps "
                                           "from the real feature-map strides at input_shape, sizes scaled to "
                                           "it; zoo = GluonCV's own (ssd_300_mobilenet*: small anchors cover "
                                           "only the top-left quarter of the image)")
    random_init: bool = Field(default=False, description="discard the source's weights: every parameter "
                              "initialized afresh (Xavier; BatchNorm scale 1, shift 0, statistics 0/1) — the "
                              "from-scratch baseline of a transfer-learning recipe")

    @field_validator("source")
    @classmethod
    def _resolve(cls, v: str) -> str:
        try:
            return resolve_source(v)
        except ModelSourceError as e:
            raise ValueError(str(e).rstrip(".")) from None

    @model_validator(mode="after")
    def _weights_once(self) -> "ModelSpec":
        if self.pretrained and self.weights:
            raise ValueError("choose one of pretrained: true (zoo download) or weights: FILE")
        if self.random_init and (self.pretrained or self.weights):
            raise ValueError("random_init: true discards weights; remove pretrained / weights, or random_init")
        if self.pretrained and not self.source.startswith("zoo:"):
            raise ValueError("pretrained: true is for zoo: sources; use weights: FILE for others")
        return self

    @model_validator(mode="before")
    @classmethod
    def _declared_size(cls, data: Any) -> Any:
        """Without ``input_shape`` a zoo model gets the size its family is made for (InceptionV3: 299),
        an ONNX file the C, H, W its first input declares (when all three are numbers)."""
        if isinstance(data, Mapping) and "input_shape" not in data and isinstance(data.get("source"), str):
            try:
                source = resolve_source(data["source"])
                if source.startswith("zoo:"):
                    return {**data, "input_shape": zoo_input_shape(source)}
                if source.startswith("onnx:"):
                    from ..convert.efficientnet_lite import ensure_onnx_file
                    from ..onnx import inspect_onnx

                    # resolved again, as sources.model_inputs resolves what it is given
                    inputs = inspect_onnx(ensure_onnx_file(resolve_source(source)[5:]), check=False).inputs
                    declared = inputs[0][1] if inputs else None
                    if declared and len(declared) == 4 and all(isinstance(d, int) and d > 0 for d in declared[1:]):
                        return {**data, "input_shape": tuple(declared[1:])}
            except GluontlError:  # the source's own validation, or its loader, says what is wrong
                return data
        return data


class HeadSpec(Strict):
    classes: int = Field(gt=0, le=1 << 20)
    init: Literal["xavier", "normal", "uniform", "zeros", "msra"] = "xavier"
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    hidden: list[Annotated[int, Field(gt=0, le=1 << 16)]] = Field(default_factory=list, max_length=8)
    activation: Literal["relu", "gelu", "tanh", "sigmoid"] = "relu"
    inputs: list[str] = Field(default_factory=list, description="feature taps: nodes/units whose "
                              "outputs are pooled and concatenated (default: the model's output)")
    pool: Literal["auto", "avg", "max", "none"] = Field(
        default="auto", description="global pooling of feature maps (rank >= 3); auto = avg; "
        "none flattens them, tying the head to one input size")

    @field_validator("inputs")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"head inputs must be distinct, got {v}")
        return v


class SurgerySpec(Strict):
    """Applied in the order ignore → cut_at / drop_last → head (see gluontl/surgery.py)."""

    head: HeadSpec | None = None
    cut_at: str | None = None
    drop_last: int | None = Field(default=None, gt=0, le=10_000)
    ignore: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_cut(self) -> "SurgerySpec":
        if self.cut_at and self.drop_last:
            raise ValueError("cut_at and drop_last both say where the model ends; use one of them")
        if self.head is not None and self.head.inputs and (self.cut_at or self.drop_last):
            raise ValueError("head.inputs already says which features the head reads (nodes after the "
                             "last one are dropped); remove cut_at / drop_last")
        return self


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


class Rule(Strict):
    """One rule: a selector (match/type/stage/kind) and the settings it sets.

    Settings left out keep what earlier rules decided; later rules win field by field.
    """

    match: list[str] | None = None
    type: list[str] | None = None
    stage: list[int | StageName] | None = None
    kind: list[ParamKind] | None = None
    grad_req: GradReq | None = None
    lr_mult: float | None = Field(default=None, ge=0.0)
    wd_mult: float | None = Field(default=None, ge=0.0)
    bn: BNMode | None = None
    adapter: AdapterSpec | None = None
    optional: bool = False
    from_epoch: int = Field(default=0, ge=0, le=100_000)
    preset: str | None = None
    until_stage: int | StageName | None = None
    rate: float | None = Field(default=None, gt=0.0, le=1.0, description="layer_decay: lr_mult = rate^depth "
                               "below the head")
    min_scale: float | None = Field(default=None, ge=0.0, le=1.0, description="layer_decay: lr_mult floor")
    last: int | None = Field(default=None, ge=1, le=10_000, description="layer_decay: only the head and the "
                             "last N stages before it")
    freeze_epochs: int | None = Field(default=None, ge=1, le=100_000, description="fine_tune: epochs the body "
                                      "stays frozen (default 1)")
    base_lr_div: float | None = Field(default=None, ge=1.0, description="fine_tune: the stem's lr divisor after "
                                      "unfreezing (default 100)")
    train_bn: bool | None = Field(default=None, description="fine_tune: BatchNorm trains while the body is "
                                  "frozen (default true, as fastai)")
    note: str | None = None

    @field_validator("match", "type", "kind", mode="before")
    @classmethod
    def _listify(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("stage", mode="before")
    @classmethod
    def _stages(cls, v: Any) -> Any:
        if isinstance(v, (int, str)) and not isinstance(v, bool):
            v = [v]
        if isinstance(v, dict):  # {start: 1, end: 3}
            r = StageRange(**v)
            order = _stage_order(r.start), _stage_order(r.end)
            return [_stage_name(i) for i in range(order[0], order[1] + 1)]
        return v

    @field_validator("type")
    @classmethod
    def _types(cls, v: list[str] | None) -> list[str] | None:
        for t in v or []:
            if t not in LAYER_TYPES:
                raise ValueError(f"unknown layer type '{t}'{suggest(t, LAYER_TYPES)}")
        return v

    @model_validator(mode="after")
    def _shape(self) -> "Rule":
        preset_keys = {k for keys in PRESET_KEYS.values() for k in keys} - {"stage"}
        given = {k for k in self.model_fields_set if getattr(self, k) is not None}  # None: not set (model_dump)
        if self.preset is not None:
            if self.preset not in PRESET_NAMES:
                raise ValueError(f"unknown preset '{self.preset}'{suggest(self.preset, PRESET_NAMES)}")
            takes = PRESET_KEYS[self.preset]
            extra = sorted(given - {"preset", "optional", "from_epoch", "note", *takes})
            if self.adapter is not None:
                raise ValueError("a preset takes no adapter; give the adapter its own rule with match/type/stage")
            if extra:
                raise ValueError(f"preset {self.preset} takes no key {', '.join(extra)} (it takes "
                                 f"{', '.join(takes) or 'none'} besides optional, from_epoch and note); a later "
                                 f"rule of its own can refine what it sets")
            if self.preset == "layer_decay" and self.rate is None:
                raise ValueError("preset layer_decay needs rate: R (0 < R <= 1; 0.75 is timm's usual value)")
            if self.stage is not None and self.last is not None:
                raise ValueError("layer_decay takes stage: [...] or last: N, not both")
            return self
        misplaced = sorted(given & preset_keys)
        if misplaced:
            owners = sorted({p for p, keys in PRESET_KEYS.items() if set(misplaced) & set(keys)})
            raise ValueError(f"{', '.join(misplaced)} belongs to preset {' / '.join(owners)}; add preset: "
                             f"{owners[0]} or remove {misplaced[0]}")
        if self.match is None and self.type is None and self.stage is None and self.kind is None:
            raise ValueError("a rule needs a selector: match, type, stage or kind (or a preset)")
        if all(getattr(self, k) is None for k in ("grad_req", "lr_mult", "wd_mult", "bn", "adapter")):
            raise ValueError("a rule needs at least one setting: grad_req, lr_mult, wd_mult, bn or adapter")
        if self.adapter is not None and self.from_epoch:
            raise ValueError("an adapter is part of the model from the start; remove from_epoch from the rule "
                             "with adapter (a later rule can change the adapter's lr_mult by match)")
        return self


def _stage_order(s: int | str) -> int:
    return {STEM: 0, NECK: 10**5, HEAD: 10**6}.get(s, s) if isinstance(s, str) else int(s)


def _stage_name(i: int) -> int | str:
    return {0: STEM, 10**5: NECK, 10**6: HEAD}.get(i, i)


Side = Annotated[int, Field(gt=0, le=1 << 16)]
Size = Side | tuple[Side, Side]  # S (an S x S image) or [H, W]


def size_hw(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """(H, W) of a transform size: S is S x S."""
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


class TransformSpec(Strict):
    resize: Size | None = None
    random_resized_crop: Size | None = None
    center_crop: Size | None = None
    flip: bool = False
    color_jitter: float = Field(default=0.0, ge=0.0, le=1.0)
    normalize: Literal["imagenet", "none"] | tuple[tuple[float, float, float], tuple[float, float, float]] = "imagenet"

    @field_validator("resize", "random_resized_crop", "center_crop", mode="after")
    @classmethod
    def _square_as_one(cls, v: Any) -> Any:
        """[S, S] is S, so square recipes read (and hash) as they always did."""
        return v[0] if isinstance(v, tuple) and v[0] == v[1] else v

    def out_size(self) -> tuple[int, int] | None:
        """(H, W) of the image this transform makes (train and evaluation alike: the last crop,
        else the resize), or None when it keeps each image's own size."""
        size = self.center_crop or self.random_resized_crop or self.resize
        return None if size is None else size_hw(size)

    def sizes(self) -> str:
        """The size keys as a recipe writes them, e.g. ``resize: 256, center_crop: 224``."""
        return ", ".join(f"{k}: {list(v) if isinstance(v, tuple) else v}"
                         for k in ("resize", "random_resized_crop", "center_crop") if (v := getattr(self, k)))


def _file_normalize(source: str) -> tuple[Any, str] | Literal[False] | None:
    """The normalization an ONNX model file declares for its input, and where it says so: gluontl's
    own ``gluontl.preprocess`` metadata (its exports, its converted EfficientNet-Lite0). False: an
    ONNX file that declares none; None: not an ONNX file (or one that cannot be read here: the
    model source reports that)."""
    try:
        source = resolve_source(source)
        if not source.startswith("onnx:"):
            return None
        from ..convert.efficientnet_lite import ensure_onnx_file

        path = Path(ensure_onnx_file(source[5:]))
        stat = path.stat()
    except (GluontlError, OSError):
        return None
    return _declared_normalize(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _declared_normalize(path: str, mtime: int, size: int) -> tuple[Any, str] | Literal[False] | None:
    import onnx

    try:
        props = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
    except Exception:  # protobuf has no single parse-error type; the model source reports it
        return None
    try:
        record = json.loads(props["gluontl.preprocess"])
        mean, std = (tuple(float(v) for v in record[k]) for k in ("mean", "std"))
    except (KeyError, TypeError, ValueError):
        return False
    if record.get("scale") != 255.0 or len(mean) != 3 or len(std) != 3 or min(std) <= 0:
        return False
    return (mean, std), "model file metadata gluontl.preprocess"


TASK_SCHEMAS = TASKS  # the tasks as the schema reads them: gluontl.task_registry
TASK_METRICS = {name: t.metrics for name, t in TASK_SCHEMAS.items()}  # the built-in ones; best records these


def selectable(task: str) -> tuple[str, ...]:
    """What train.select may pick for ``task``: its built-in metrics (the default first), then any
    registered since (``gluontl.register_metric``)."""
    return tuple(dict.fromkeys([*TASK_METRICS[task], *(m.key for m in task_metrics(task, selectable=True))]))


class DataSpec(Strict):
    source: str = Field(description="; ".join(f"{name}: {t.source_help}" for name, t in TASK_SCHEMAS.items()))
    train: str = "train"
    val: str = "val"
    batch_size: int = Field(default=32, gt=0, le=1 << 16)
    workers: int = Field(default=0, ge=0, le=64)
    on_bad_image: Literal["error", "skip"] = "error"
    train_transform: TransformSpec = TransformSpec()
    val_transform: TransformSpec = TransformSpec()
    classes: list[str] | None = Field(default=None, description="class folders/labels to use, in label order")
    val_fraction: float = Field(default=0.2, gt=0.0, lt=1.0, description="share held out for val (fixed "
                                "seed) where the source has no val split: demo:, plain class folders, one "
                                "list/rec file")
    last_batch: Literal["discard", "keep"] = Field(
        default="discard", description="discard: an epoch trains whole batches (workers × batch_size when "
        "distributed) and leaves out the rest of its shuffled order, another set each epoch (the run's plan says "
        "how many); keep: trains them as a smaller last batch (distributed: split over the workers, unless fewer "
        "than the workers are left)")
    # transform key -> why it is (partly) a default rather than the recipe's own, and the transform as the
    # recipe gave it (None: not at all); see Recipe._transforms_fit
    _defaults: dict[str, str] = PrivateAttr(default_factory=dict)
    _given: dict[str, TransformSpec | None] = PrivateAttr(default_factory=dict)

    def transform_default(self, key: str) -> str | None:
        """Why ``key`` (train_transform / val_transform) is gluontl's default, None when the recipe gave it."""
        return self._defaults.get(key)

    @field_validator("classes", mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        if isinstance(v, list):
            v = [str(c) for c in v]
            twice = sorted({c for c in v if v.count(c) > 1})
            if twice:
                raise ValueError(f"lists {', '.join(repr(c) for c in twice)} more than once; name each class once")
        return v

    @field_validator("source")
    @classmethod
    def _scheme(cls, v: str) -> str:
        scheme, _, rest = v.partition(":")
        schemes = {f.partition(":")[0] for t in TASK_SCHEMAS.values() for f in t.sources}
        if scheme not in schemes or not rest:
            raise ValueError(f"'{v}' is not a data source; use " + "; ".join(
                f"for {name} {t.source_help}" for name, t in TASK_SCHEMAS.items()))
        return v


class ScheduleSpec(Strict):
    kind: Literal["constant", "step", "multistep", "cosine", "poly"] = "constant"
    step: int | None = Field(default=None, gt=0)
    milestones: list[int] = Field(default_factory=list)
    factor: float = Field(default=0.1, gt=0.0)
    power: float = Field(default=2.0, gt=0.0)
    warmup_epochs: float = Field(default=0.0, ge=0.0)
    final_lr: float = Field(default=0.0, ge=0.0)


GuardLevel = Literal["error", "warn", "off"]


class GuardsSpec(Strict):
    """What each guard against a run that cannot learn does (gluontl/data/guards.py);
    ``train.guards: warn`` (one level) sets all four."""

    random_backbone: GuardLevel = "error"
    unloaded_bn_stats: GuardLevel = "error"
    collapsed_features: GuardLevel = "error"
    stuck_loss: GuardLevel = "warn"


class DistributedSpec(Strict):
    """Data-parallel training on N workers (``gluontl launch``). ``data.batch_size`` is the
    per-worker batch: a step covers workers × batch_size images, sharded so every worker takes
    the same number of steps (uneven shards hang a synchronous job)."""

    backend: Literal["none", "kvstore", "horovod"] | None = Field(
        default=None, description="unset: kvstore in a worker of a parameter-server job (gluontl launch), none "
        "elsewhere (resolve_backend); none refuses to run under a launcher")
    kvstore: Literal["dist_sync", "dist_sync_device"] = Field(
        default="dist_sync", description="dist_sync_device sums on the GPU (multi-GPU workers)")
    batch_norm: Literal["frozen", "rank0"] = Field(
        default="frozen", description="MXNet never synchronizes BatchNorm statistics across workers: frozen "
        "keeps them fixed (bn: train layers use their running statistics); rank0 lets each worker update its "
        "own and copies rank 0's to all at every checkpoint and before validation")
    step_timeout: float = Field(default=300.0, gt=0.0, description="seconds a step (or a collective) may take "
                                "before the worker exits: a dead peer must not hang the job forever")

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            kv = data.get("kvstore")
            if isinstance(kv, str) and "async" in kv:
                raise ValueError(f"kvstore {kv} is refused: asynchronous training makes MXNet update on the "
                                 f"servers (update_on_kvstore), which drops per-parameter lr_mult/wd_mult, "
                                 f"ignores the lr schedule and cannot save trainer states; use dist_sync")
            if "compression" in data or "gradient_compression" in data:
                raise ValueError("gradient compression is refused: MXNet 1.9.1's Trainer fails with it "
                                 "('Compression not supported with PushPull'); remove the key")
        return data


class EmaSpec(Strict):
    """An exponential moving average of the trained weights, validated beside them each epoch
    (``ema_*`` metrics). After optimizer step t (t = 0 for the first) every trained parameter's
    average moves as ``avg += (1 - d_t) * (w - avg)`` with ``d_t = decay``, or with ``warmup``
    ``d_t = min(decay, (1 + t) / (10 + t))`` (0.1 at the first step: early averages forget the
    initial weights fast)."""

    decay: float = Field(default=0.9998, gt=0.0, lt=1.0)
    warmup: bool = True
    batch_norm: Literal["copy", "recompute"] = Field(
        default="copy", description="the averaged model's BatchNorm statistics: copy the model's, or recompute "
        "them with the averaged weights on the first recompute_batches training batches of the epoch")
    recompute_batches: int = Field(default=20, gt=0, le=100_000)


class EarlyStoppingSpec(Strict):
    """Lightning's ``EarlyStopping``, counted in validations (so ``val_every`` applies)."""

    monitor: str | None = Field(default=None, description="the metric watched; default: train.select")
    mode: Literal["max", "min"] | None = Field(default=None, description="default: the metric's registered "
                                               "direction")
    patience: int = Field(default=3, ge=0, le=100_000, description="validations without an improvement of more "
                          "than min_delta before the run stops")
    min_delta: float = Field(default=0.0, ge=0.0)
    stopping_threshold: float | None = Field(default=None, description="stop as soon as the metric reaches it")
    divergence_threshold: float | None = Field(default=None, description="stop as soon as the metric is worse "
                                               "than it")
    check_finite: bool = Field(default=True, description="stop when the metric is NaN or infinite")


class CsvSpec(Strict):
    """Every epoch row of metrics.jsonl, also as RUN/metrics.csv (a column per key)."""

    file: str = Field(default="metrics.csv", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}\.csv$")


class MlflowSpec(Strict):
    """The run in an MLflow tracking store (``pip install gluontl[mlflow]``; docs/callbacks.md)."""

    tracking_uri: str | None = Field(default=None, description="default: MLFLOW_TRACKING_URI, else a local "
                                     "SQLite store mlflow.db (artifacts in mlartifacts/) beside the run folders")
    experiment: str = Field(default="gluontl", min_length=1, max_length=500)
    run_name: str | None = Field(default=None, description="default: the run folder's name")
    log_steps: bool = Field(default=True, description="each optimizer step's loss and lr too, not only epochs")


# train.callbacks: the built-in callbacks' settings by name; gluontl.register_callback adds names
CALLBACK_SPECS: dict[str, type[BaseModel] | None] = {"early_stopping": EarlyStoppingSpec, "csv": CsvSpec,
                                                     "mlflow": MlflowSpec}


def _callback_item(item: Any) -> Any:
    """One ``{name: {settings}}`` entry of train.callbacks, its settings validated by the name's spec."""
    if isinstance(item, str):
        item = {item: {}}
    if not isinstance(item, Mapping) or len(item) != 1:
        raise ValueError(f"each train.callbacks entry is one name with its settings, e.g. {{early_stopping: "
                         f"{{patience: 3}}}}; got {item!r}")
    (name, settings), = item.items()
    if name not in CALLBACK_SPECS:
        raise ValueError(f"'{name}' is not a callback; use one of {', '.join(CALLBACK_SPECS)} (or register yours "
                         f"with gluontl.register_callback before the recipe is loaded)")
    spec = CALLBACK_SPECS[name]
    settings = {} if settings is None else settings
    if spec is None:
        if not isinstance(settings, Mapping):
            raise ValueError(f"train.callbacks {name}: settings are a mapping, got {settings!r}")
        return {name: dict(settings)}
    return {name: spec.model_validate(settings)}


class TrainSpec(Strict):
    epochs: int = Field(default=5, gt=0, le=100_000)
    optimizer: Literal["sgd", "nag", "adam", "adamw"] = "sgd"
    lr: Annotated[float, Field(gt=0.0)] | Literal["auto"] = Field(
        default=0.01, description="auto: run `gluontl lr-find` first and train with its suggestion")
    momentum: float = Field(default=0.9, ge=0.0, lt=1.0)
    wd: float = Field(default=1e-4, ge=0.0)
    schedule: ScheduleSpec = ScheduleSpec()
    clip_gradient: float | None = Field(default=None, gt=0.0)
    accumulate: int = Field(default=1, gt=0, le=4096)
    label_smoothing: float = Field(default=0.0, ge=0.0, lt=1.0)
    ctx: str = "cpu"
    seed: int = Field(default=0, ge=0, lt=1 << 63)
    hybridize: bool = True
    cache_features: Literal["auto", "on", "off"] = "auto"
    cache_views: int = Field(default=0, ge=0, description="with random augmentation: cache this many "
                             "augmented views per image (epoch e uses view e % K); 0 = no cache")
    cache_dtype: Literal["float32", "float16"] = "float32"
    cache_max_bytes: int = Field(default=2 * 2**30, gt=0, description="beyond this, cached features "
                                 "go to a memory-mapped file in the run folder")
    prefix_engine: Literal["auto", "mxnet", "onnxruntime", "onnxruntime-int8"] = "auto"
    log_every: int = Field(default=10, gt=0, le=1 << 30)
    val_every: int = Field(default=1, gt=0, le=100_000, description="validate after every N-th epoch and after "
                           "the last (Lightning's check_val_every_n_epoch); the best checkpoint is chosen among "
                           "those; every epoch still logs its training numbers and checkpoints as last")
    max_bad_steps: int = Field(default=10, ge=0, le=1 << 30)
    guards: GuardsSpec = GuardsSpec()
    distributed: DistributedSpec = DistributedSpec()
    ema: EmaSpec | None = None
    callbacks: list[dict[str, Any]] = Field(default_factory=list, description="callbacks by name with their "
                                            "settings, e.g. [{early_stopping: {patience: 3}}, {csv: {}}]")
    select: str = Field(
        default="val_top1", description="the validation metric that picks the best checkpoint (what export, "
        "evaluate and predict use); val_balanced_acc suits imbalanced classes; detection: val_map50 (VOC "
        "mAP@0.5, its default) or val_map (COCO mAP@[.5:.95]); segmentation: val_miou (its default), "
        "val_pixel_acc or val_loss; ema_*: the same of the averaged weights (train.ema), which the best "
        "checkpoint then holds")

    @field_validator("callbacks", mode="before")
    @classmethod
    def _callbacks(cls, v: Any) -> Any:
        return [_callback_item(item) for item in v] if isinstance(v, list) else v

    @field_validator("guards", mode="before")
    @classmethod
    def _one_level(cls, v: Any) -> Any:
        if isinstance(v, str):
            if v not in get_args(GuardLevel):
                raise ValueError(f"'{v}' is not a guard level; use error, warn or off, or one per guard: "
                                 f"{', '.join(GuardsSpec.model_fields)}")
            return dict.fromkeys(GuardsSpec.model_fields, v)
        return v

    @field_validator("lr", mode="before")
    @classmethod
    def _lr(cls, v: Any) -> Any:
        """One message for a bad lr, not one per member of the union (number or auto)."""
        if v == "auto":
            return v
        try:
            x = None if isinstance(v, bool) else float(v)
        except (TypeError, ValueError):
            x = None
        if x is None:
            raise PydanticCustomError("lr", "Input should be a number greater than 0, or auto")
        if not math.isfinite(x):
            raise PydanticCustomError("finite_number", "Input should be a finite number")
        if not x > 0:
            raise PydanticCustomError("greater_than", "Input should be greater than 0")
        return v

    @field_validator("ctx")
    @classmethod
    def _ctx(cls, v: str) -> str:
        if not re.fullmatch(r"cpu(:\d{1,3}(,\d{1,3})*)?|gpu:\d{1,3}(,\d{1,3})*", v):
            raise ValueError(f"'{v}' is not a context; use cpu, cpu:0,1, gpu:0 or gpu:0,1")
        ids = [int(i) for i in v.partition(":")[2].split(",") if i]
        if len(set(ids)) != len(ids):
            raise ValueError(f"'{v}' lists a device twice; list each device once, e.g. cpu:0,1")
        return v


class QuantizeSpec(Strict):
    """Post-training int8 of the ONNX export (onnxruntime) and of the symbol export (MXNet oneDNN)
    (docs/export.md, "int8"): calibrated on the run's own images through the recorded
    preprocessing, refused when accuracy drops by more than ``max_drop`` points on the validation
    split."""

    calibration: Literal["train", "val"] | Annotated[int, Field(gt=0, le=100_000)] = Field(
        default=256, description="train | val (the whole split) | N (that many training images, a fixed draw)")
    method: Literal["minmax", "entropy", "percentile"] = "minmax"
    per_channel: Literal["auto", True, False] = Field(default="auto", description="auto: per-tensor for "
                                                "depthwise-heavy models (onnxruntime #11415), else per-channel")
    exclude: list[str] = Field(default_factory=list, description="globs of ONNX node (or MXNet layer) names kept float")
    max_drop: float = Field(default=1.0, ge=0.0, le=100.0, description="allowed top-1 (or mAP) drop, in points")
class SegmentationSpec(Strict):
    """The segmenter (task: segmentation) and its joint image + mask augmentation. ``arch`` fcn,
    psp and deeplab on a GluonCV ResNet zoo source are GluonCV's own networks; on any other source
    (ONNX, symbol, zoo classifier) an FCN head (fcn) or LR-ASPP head (lraspp) sits on the backbone
    nodes ``taps`` names, shallow to deep (`gluontl inspect MODEL` lists them)."""

    arch: Literal["fcn", "psp", "deeplab", "lraspp"] = "fcn"
    taps: list[str] = Field(default_factory=list, max_length=2, description="backbone nodes the heads read, "
                            "shallow to deep: fcn one, fcn with aux [aux map, head map], lraspp [low-level, "
                            "high-level]; none: the last node at each stride they want")
    aux: bool = Field(default=False, description="an auxiliary FCN head on a shallower map (GluonCV's deep "
                      "supervision), trained only")
    aux_weight: float = Field(default=0.4, gt=0.0, le=10.0, description="weight of the auxiliary loss "
                              "(GluonCV's default 0.4)")
    ignore_label: int = Field(default=255, ge=0, le=255, description="mask value that counts in neither loss "
                              "nor metric (VOC draws object borders with 255)")
    head_channels: int = Field(default=128, gt=0, le=4096)
    class_weights: Literal["none", "balanced"] | list[Annotated[float, Field(ge=0.0, le=1e6)]] = Field(
        default="none", description="per-class weights of the pixel loss: none (GluonCV's loss), balanced "
        "(median-frequency balancing over the training masks, as in SegNet) or one weight per class in "
        "class order; each image's loss is then sum(w * nll) / sum(w) over its labelled pixels")
    crop: tuple[Annotated[int, Field(gt=0, le=1 << 16)], Annotated[int, Field(gt=0, le=1 << 16)]] | None = Field(
        default=None, description="training crop H, W after the random scale (default: model.input_shape's "
        "H, W); images and masks smaller than it are padded (masks with ignore_label)")
    scale: tuple[Annotated[float, Field(gt=0.0, le=16.0)], Annotated[float, Field(gt=0.0, le=16.0)]] = Field(
        default=(0.5, 2.0), description="random scale range of training images (GluonCV: 0.5 to 2.0)")
    flip: bool = True
    stride: int = Field(default=8, gt=0, le=256, description="images and masks are padded at the bottom and "
                        "right to a multiple of it, so feature maps line up with the label (gluon-cv #1173)")

    @field_validator("crop", mode="before")
    @classmethod
    def _square(cls, v: Any) -> Any:
        return (v, v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("taps")
    @classmethod
    def _taps(cls, v: list[str]) -> list[str]:
        if any(not t.strip() for t in v) or len(set(v)) != len(v):
            raise ValueError(f"taps {v} must name distinct backbone nodes, shallow to deep")
        return v

    @model_validator(mode="after")
    def _fits(self) -> "SegmentationSpec":
        if self.scale[0] > self.scale[1]:
            raise ValueError(f"scale {list(self.scale)} is [low, high]; give the smaller factor first")
        if isinstance(self.class_weights, list) and not any(self.class_weights):
            raise ValueError("class_weights are all 0: no pixel would count in the loss; give each class a weight "
                             "> 0 that should be learned (or balanced / none)")
        want = 2 if self.arch == "lraspp" or self.aux else 1
        if self.taps and len(self.taps) != want:
            role = ("arch lraspp reads a shallow and a deep map" if self.arch == "lraspp" else
                    "aux: true reads the auxiliary head's shallower map and the head's" if self.aux else
                    f"arch {self.arch} reads one map")
            raise ValueError(f"taps lists {len(self.taps)} node(s) but {role}: give {want}, shallow to deep, or "
                             f"none for the defaults")
        return self


class ExportSpec(Strict):
    """Unset names and opset follow the model: an imported ONNX graph keeps its own (it is
    exported as that graph, patched); zoo and symbol models get ``data``, ``output``, opset 13.
    ``quantize`` set: the export also writes ``NAME.int8.onnx`` (see QuantizeSpec)."""

    formats: list[Literal["symbol", "onnx"]] = Field(default_factory=lambda: ["onnx"])
    opset: int | None = Field(default=None, ge=7, le=21)
    input_names: list[str] | None = Field(default=None, min_length=1)
    output_names: list[str] | None = Field(default=None, min_length=1)
    rtol: float = Field(default=1e-4, gt=0.0)
    lean: bool = True
    quantize: QuantizeSpec | None = None


_TRANSFORMS = ("train_transform", "val_transform")


class Recipe(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")  # a run folder name: no "..", no "/"
    task: Literal[tuple(TASK_SCHEMAS)] = "classification"  # type: ignore[valid-type]
    model: ModelSpec
    surgery: SurgerySpec = SurgerySpec()
    rules: list[Rule] = Field(default_factory=list)
    data: DataSpec | None = None
    train: TrainSpec = TrainSpec()
    export: ExportSpec = ExportSpec()
    segmentation: SegmentationSpec | None = Field(default=None, description="task: segmentation: the "
                                                  "segmenter and its augmentation (defaults when left out)")

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
    def _task_fits(self) -> "Recipe":
        valid = selectable(self.task)
        if self.train.select.removeprefix(EMA) not in valid:
            known = find_metric(self.train.select)
            what = (f"it is a {'/'.join(known.task)} metric" if known and known.task and self.task not in known.task
                    else "it cannot pick a checkpoint" if known else "no metric of that name is registered")
            raise ValueError(f"train.select {self.train.select} is not a {self.task} metric ({what}); use one of "
                             f"{', '.join(valid)} (or ema_ and one of them, with train.ema); a metric of your "
                             f"own is registered with gluontl.register_metric before the recipe is loaded")
        for item in self.train.callbacks:
            spec = item.get("early_stopping")
            monitor = spec and spec.monitor
            if monitor and (monitor.removeprefix(EMA) not in valid or (monitor.startswith(EMA) and
                                                                       self.train.ema is None)):
                raise ValueError(f"train.callbacks early_stopping monitor {monitor} is not a metric of this "
                                 f"{self.task} run; monitor one of {', '.join(valid)}"
                                 f"{' (or ema_ and one of them)' if self.train.ema else ''}")
        if self.train.select.startswith("ema_") and self.train.ema is None:
            raise ValueError(f"train.select {self.train.select} picks the best checkpoint by the averaged "
                             f"weights, but the recipe averages none; add train.ema (e.g. train.ema: "
                             f"{{decay: 0.9998}}) or select {self.train.select.removeprefix('ema_')}")
        if self.task == "classification" and (self.model.restore.type or self.model.restore.reuse):
            raise ValueError("model.restore.type / reuse are for task: detection (which rows of a detector's "
                             "heads to restore); classification restores by name (only, prefix_map, expect_*)")
        if self.model.detector is not None and (self.task != "detection" or self.model.source.startswith("zoo:")):
            raise ValueError("model.detector builds an SSD on an onnx:/symbol: backbone for task: detection; zoo "
                             "detectors (zoo:ssd_*, zoo:yolo3_*) come whole — remove model.detector")
        for owner in TASK_SCHEMAS.values():
            if owner.section and getattr(self, owner.section) is not None and self.task != owner.name:
                raise ValueError(f"the {owner.section}: section is for task: {owner.name}; the recipe's task is "
                                 f"{self.task} (set task: {owner.name}, or remove the section)")
        owners = source_tasks(self.data.source) if self.data is not None else [self.task]
        if owners and self.task not in owners:  # a source of no task (demo:NAME) is the loader's to explain
            raise ValueError(f"data.source {self.data.source} is {' or '.join(owners)} data, not {self.task} data "
                             f"(the recipe's task); set task: {owners[0]} or use a {self.task} source "
                             f"({TASK_SCHEMAS[self.task].source_help})")
        if self.task == "segmentation":
            self._segmentation_fits()
        if self.train.distributed.backend == "horovod" and "," in self.train.ctx:
            raise ValueError(f"train.ctx {self.train.ctx} lists several devices, but Horovod 0.28's MXNet Trainer "
                             f"reduces only the first context's gradients (the other copies would drift apart); "
                             f"run one Horovod process per device (horovodrun -np <devices>) with one ctx each")
        if self.train.lr == "auto" and self.train.distributed.backend not in (None, "none"):
            raise ValueError("train.lr: auto would run the range test in every worker; run `gluontl lr-find` once "
                             "and set train.lr to its suggestion")
        staged = [i + 1 for i, r in enumerate(self.rules) if r.from_epoch or r.preset == "fine_tune"]
        if self.train.distributed.backend not in (None, "none") and staged:  # unset: checked once resolved
            raise ValueError(f"rules {', '.join(map(str, staged))} start at a later epoch (from_epoch, or preset "
                             f"fine_tune's unfreezing), which "
                             f"rebuilds the Trainer mid-run; a distributed Trainer's parameter-server keys cannot "
                             f"be rebuilt, so gradual unfreezing needs one run per stage with train.distributed "
                             f"(--init-from the previous run) or backend: none")
        if self.task == "detection" and (self.train.label_smoothing or self.train.cache_features == "on"):
            raise ValueError("train.label_smoothing and train.cache_features: on are for classification; a "
                             "detector uses its family's loss and trains on augmented images end to end")
        if self.task == "detection" and self.surgery != SurgerySpec():
            raise ValueError("surgery (cut_at, drop_last, ignore, head) is for classifiers; a detector gets its "
                             "new classes from data.classes and keeps its own heads (model.restore.reuse "
                             "chooses which class rows start from old ones)")
        return self

    def _segmentation_fits(self) -> None:
        if self.train.label_smoothing or self.train.cache_features == "on" or self.surgery != SurgerySpec():
            raise ValueError("train.label_smoothing, train.cache_features: on and surgery are for classification; "
                             "a segmenter trains its own head (segmentation:) on augmented images end to end")
        if self.model.restore.type == "detection" or self.model.detector is not None:
            raise ValueError("model.restore.type: detection and model.detector are for task: detection; a "
                             "segmenter restores with restore.type segmentation or classification")
        if len(self.model.input_shape) != 3:
            raise ValueError(f"model.input_shape {list(self.model.input_shape)} is not C, H, W; a segmenter takes "
                             f"images, e.g. [3, 128, 128]")
        stride = (self.segmentation or SegmentationSpec()).stride
        if any(d % stride for d in self.model.input_shape[1:]):
            raise ValueError(f"model.input_shape {list(self.model.input_shape)}: H and W must be multiples of "
                             f"segmentation.stride {stride}, the size validation, predict and exports feed (training "
                             f"crops of any size are padded to it; gluon-cv #1173)")
        if self.data is not None:
            plain = TransformSpec()
            changed = {k: [f for f in TransformSpec.model_fields if f != "normalize"
                           and getattr(getattr(self.data, k), f) != getattr(plain, f)] for k in _TRANSFORMS}
            wrong = [f"data.{k} ({', '.join(fields)})" for k, fields in changed.items() if fields]
            if wrong:
                raise ValueError(f"{' and '.join(wrong)} set more than normalize; a segmenter's image and mask move "
                                 f"together, so sizes, crops and flips are segmentation.crop, .scale and .flip "
                                 f"(validation resizes to model.input_shape's H x W)")

    @model_validator(mode="after")
    def _transforms_fit(self) -> "Recipe":
        """Transforms a recipe leaves out, or gives without a size, come from ``model.input_shape``
        (timm's ``resolve_data_config``): evaluation scales the shorter side to H and takes the
        centre H x W; training adds a horizontal flip. A size that differs from the input size is
        refused here, before any work: hybridized blocks (static shapes), the onnxruntime prefix and
        exports are built for that one size."""
        if self.data is None:
            return self
        given = self.data.model_fields_set
        if self.task == "segmentation":  # checked by _segmentation_fits: segmentation: holds the geometry
            self.data._defaults = {k: "default: segmentation's own rule" for k in _TRANSFORMS if k not in given}
            return self
        if self.task == "detection":  # a detector resizes every image to input_shape's H, W itself
            sized = [f"data.{k} ({getattr(self.data, k).sizes()})" for k in _TRANSFORMS
                     if getattr(self.data, k).out_size() is not None]
            if sized:
                raise ValueError(f"{' and '.join(sized)} sets a size, which detection does not use: every image is "
                                 f"resized whole to model.input_shape's H x W {tuple(self.model.input_shape[-2:])} "
                                 f"and crops are the IoU-constrained SSD crops; remove resize / center_crop / "
                                 f"random_resized_crop")
            self.data._defaults = {k: "default: the detector's own rule" for k in _TRANSFORMS if k not in given}
            return self
        if len(self.model.input_shape) != 3:
            return self
        shape, (_, h, w) = list(self.model.input_shape), self.model.input_shape
        filled, defaults, wrong = {}, {}, []
        for key in _TRANSFORMS:
            spec = getattr(self.data, key)
            size = spec.out_size()
            if size is not None and size != (h, w):
                wrong.append((key, f"data.{key} makes {size[0]}x{size[1]} images ({spec.sizes()})"))
            elif size is None:
                whole = key not in given  # else a transform without a size: it gets the size only
                flip = whole and key == "train_transform"
                one_view = flip and self.train.cache_features == "on" and self.train.cache_views == 0
                filled[key] = spec.model_copy(update={"resize": h if h == w else (h, w),
                                                      "flip": spec.flip or (flip and not one_view)})
                defaults[key] = (f"{'default' if whole else 'size'} from model.input_shape {shape}"
                                 + (", no flip: train.cache_features: on caches one view" if one_view else ""))
        declared = _file_normalize(self.model.source) if not wrong else None
        for key in _TRANSFORMS:  # normalization the model file declares, where the recipe gives none
            spec = filled.get(key, getattr(self.data, key))
            if declared and (key not in given or "normalize" not in getattr(self.data, key).model_fields_set):
                filled[key] = spec.model_copy(update={"normalize": declared[0]})
                defaults[key] = ", ".join(filter(None, [defaults.get(key), f"normalize from {declared[1]}"]))
            elif declared is False and key in defaults and spec.normalize == "imagenet":
                defaults[key] += ", normalize ImageNet default (the model file declares none)"
        hint = hwc_hint(tuple(shape))
        if wrong and hint:  # the transforms do not fit because the channels came last
            raise PydanticCustomError("input_shape_hwc", f"model.input_shape {','.join(map(str, shape))}:{hint} Give "
                                      f"model.input_shape as C,H,W", {"keys": [("model", "input_shape")]})
        if wrong:
            size = h if h == w else f"[{h}, {w}]"
            fix = (f"Give {' and '.join(f'data.{k}' for k, _ in wrong)} the size {size} (resize: {size}; or "
                   f"resize: N >= {min(h, w)} with center_crop: {size}), "
                   f"or leave the sizes out to get the default ("
                   + (f"shorter side to {h}" if h == w else f"scaled to cover {h}x{w}") +
                   f", centre crop {h}x{w}), or change model.input_shape to the size the transform makes")
            raise PydanticCustomError(
                "transform_size", f"{'; '.join(text for _, text in wrong)}, but model.input_shape {shape} takes "
                f"{h}x{w} images "
                f"(H x W), the one size the model is built for (hybridized with static shapes, a frozen prefix "
                f"run by onnxruntime, the exported ONNX). {fix}",
                {"keys": [("model", "input_shape"), *(("data", k) for k, _ in wrong)]})
        if filled:
            data = self.data.model_copy(update=filled)
            data._defaults = defaults
            data._given = {k: getattr(self.data, k) if k in given else None for k in filled}
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
        of the rest), so digests are those of before defaults existed."""
        data = self.model_dump(mode="json", include=set(sections) or None,
                               exclude={"train": {"guards", "val_every", "callbacks"}})
        for key, spec in (self.data._given if self.data is not None and "data" in data else {}).items():
            data["data"][key] = (spec or TransformSpec()).model_dump(mode="json")
        for path in KEYS_SINCE_20:  # sections and keys added later count when set: runs from before them agree
            *outer, key = path
            section = data
            for name in outer:
                section = section.get(name) or {}
            if key in section and section[key] is None:
                del section[key]
        dist = data.get("train", {}).pop("distributed", None)
        if dist and dist["backend"] not in (None, "none"):  # absent when not distributed: runs from before it agree
            data["train"]["distributed"] = {k: v for k, v in dist.items() if k != "step_timeout"}
        if (data.get("data") or {}).get("last_batch") == "discard":  # the default: runs from before the key agree
            del data["data"]["last_batch"]
        for rule in data.get("rules") or []:  # rule keys added later count when set: runs from before them agree
            for key in RULE_KEYS_SINCE_21:
                if rule.get(key) is None:
                    rule.pop(key, None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


MAX_RECIPE_BYTES = 1 << 20


def _key_path(loc: tuple) -> str:
    """A key path as users write it: list items numbered from 1, as the plan numbers rules."""
    return ".".join(str(p + 1) if isinstance(p, int) else str(p) for p in loc) or "(top level)"


def _section(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The section model a key path leads to, for listing its valid keys."""
    cls: type[BaseModel] | None = root
    for p in loc:
        if isinstance(p, str) and cls is not None:
            field = cls.model_fields.get(p)
            cls = _model_in(field.annotation) if field is not None else None
    return cls


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in get_args(annotation) if (m := _model_in(a)) is not None), None)


def _describe(err: Mapping[str, Any], root: type[BaseModel] = Recipe) -> str:
    loc = _key_path(err["loc"])
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        section = _section(root, err["loc"][:-1])
        return f"unknown key '{loc}'" + (suggest(err["loc"][-1], section.model_fields) if section else "")
    if kind == "missing":
        return f"missing required key '{loc}'"
    if kind in ("transform_size", "input_shape_hwc"):  # names its keys itself
        return msg
    msg = msg.removeprefix("Value error, ")
    if kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
        close = difflib.get_close_matches(str(err.get("input")), expected, n=1, cutoff=0.6)
        msg += f" (did you mean {close[0]!r}?)" if close else ""
    whole = not err["loc"] or isinstance(err.get("input"), Mapping)  # a section's own rule: the section is no help
    return f"'{loc}': {msg}" if whole or "input" not in err or kind == "model_type" else \
        f"'{loc}': {msg} (got {err.get('input')!r})"


def as_spec(value: Any, cls: type[SpecT], what: str, error: type[GluontlError], example: str,
            hint: str = "") -> SpecT:
    """``value`` as the spec ``cls`` where the API takes one: the object itself, or a dict with
    the recipe section's keys, validated like a recipe (a wrong key is named, never an
    AttributeError deep inside)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise error(f"{what} is a {type(value).__name__}; give it as a dict with the recipe's keys (e.g. "
                    f"{example}) or as a gluontl.recipe.{cls.__name__}.")
    try:
        return cls.model_validate(dict(value))
    except ValidationError as e:
        problems = "; ".join(_describe(err, cls) for err in e.errors())
        raise error(f"{what} is invalid: {problems}. {hint or f'It takes the keys of {cls.__name__} (see docs/recipes.md).'}"
                    ) from None


def as_rules(rules: Iterable[Rule | Mapping[str, Any]]) -> list[Rule]:
    """Rules as the API takes them: ``Rule`` objects or dicts with a recipe rule's keys."""
    return [as_spec(r, Rule, f"rule {i}", RuleError, "{'match': 'features.*', 'grad_req': 'null'}",
                    "Rules take the keys of a recipe's rules (see docs/recipes.md, Rules and their precedence).")
            for i, r in enumerate(rules, 1)]


def as_recipe(recipe: Any) -> "Recipe":
    """A recipe as the API takes it: a ``Recipe``, a dict with a recipe file's keys, or a YAML path."""
    if isinstance(recipe, Recipe):
        return recipe
    if isinstance(recipe, Mapping):
        return parse_recipe(dict(recipe), origin="the recipe dict")
    if isinstance(recipe, (str, os.PathLike)):
        return load_recipe(recipe)
    raise RecipeError(f"recipe is a {type(recipe).__name__}; pass a gluontl.recipe.Recipe, a dict with a recipe "
                      f"file's keys (name, model, data, ...) or the path of a recipe YAML file.")


def parse_recipe(data: Any, origin: str = "<recipe>",
                 overrides: list[str] | None = None) -> Recipe:
    """A validated Recipe from YAML data and ``--set`` overrides.

    A problem under a key that a ``--set`` wrote is blamed on that ``--set``, so users do not
    search the recipe file for a value it does not contain.
    """
    if not isinstance(data, dict):
        raise RecipeError(f"{origin}: a recipe must be a YAML mapping with keys name, model, "
                          f"surgery, rules, data, train, export; got {type(data).__name__}.")
    data = dict(data)
    written = [(_apply_override(data, ov), ov) for ov in overrides or []]
    try:
        return Recipe(**data)
    except ValidationError as e:
        found = [(_describe(err), _culprit(written, err)) for err in e.errors()]
        if all(ov for _, ov in found):
            problems = "; ".join(f"--set {ov!r}: {d}" for d, ov in found)
            raise RecipeError(f"Invalid --set value: {problems}. Fix the value given with --set (list items, "
                              f"rules included, are numbered from 1 as in `gluontl plan`).") from None
        problems = "; ".join(d + (f" (from --set {ov!r})" if ov else "") for d, ov in found)
        raise RecipeError(f"{origin}: invalid recipe: {problems}. Fix these keys (see recipes/ for "
                          f"working examples and docs/recipes.md).") from None
    except TypeError as e:  # non-string keys at the top level
        raise RecipeError(f"{origin}: invalid recipe: {e}.") from None


def resolve_backend(recipe: Recipe) -> Recipe:
    """``recipe`` with ``train.distributed.backend`` decided where it was left unset: kvstore in a
    parameter-server job's worker (``DMLC_ROLE=worker``: gluontl launch, or a cluster's own
    launcher), so the documented recipes run under ``gluontl launch`` as written; none elsewhere.
    A distributed recipe is checked again as a whole: it refuses some settings (``from_epoch``)."""
    spec = recipe.train.distributed
    if spec.backend is not None:
        return recipe
    if os.environ.get("DMLC_ROLE") != "worker":
        train = recipe.train.model_copy(update={"distributed": spec.model_copy(update={"backend": "none"})})
        return recipe.model_copy(update={"train": train})
    data = recipe.as_written()  # transforms as written: defaults are derived again, and marked so
    data["train"]["distributed"]["backend"] = "kvstore"
    return parse_recipe(data, origin=f"recipe '{recipe.name}' (train.distributed.backend unset: kvstore in a "
                                     f"launched worker)")


def _culprit(written: list[tuple[tuple, str]], err: Mapping[str, Any]) -> str | None:
    """The last ``--set`` that wrote at, above or below the key path of a problem (or of one of
    the ``keys`` a recipe-wide problem names)."""
    locs = err.get("ctx", {}).get("keys") or [err["loc"]]
    return next((ov for path, ov in reversed(written) for loc in locs
                 if loc[:len(path)] == path or path[:len(loc)] == loc), None)


def _apply_override(data: dict[str, Any], spec: str) -> tuple[str | int, ...]:
    """``train.epochs=3`` or ``rules.2.lr_mult=0.1`` (list items from 1; one past the end
    appends) from the CLI; the value is parsed as YAML. Returns the key path it wrote."""
    key, eq, raw = spec.partition("=")
    parts = key.split(".")
    if not eq or not all(parts):
        raise RecipeError(f"--set '{spec}' must look like section.key=value, e.g. --set train.epochs=3 or "
                          f"--set rules.1.lr_mult=0.1.")
    try:
        value = parse_yaml(raw, _NoAliasLoader)
        if value is None and parts[-1] == "grad_req":  # YAML reads a bare null as "no value"
            value = "null"
    except yaml.YAMLError as e:
        raise RecipeError(f"--set '{spec}': the value is not valid YAML "
                          f"({' '.join(str(e).split())}); write it as YAML, e.g. --set train.lr=0.01 or "
                          f"--set 'train.schedule={{kind: cosine}}'.") from None
    node: Any = data
    path: list[str | int] = []
    for depth, p in enumerate(parts):
        where = ".".join(parts[:depth])
        if isinstance(node, list):
            if not (p.isdigit() and 1 <= int(p) <= len(node) + 1):
                items = f"{where}.1 to {where}.{len(node)}, or " if node else ""
                raise RecipeError(f"--set '{spec}': '{where}' is a list of {len(node)} item(s), numbered from 1 "
                                  f"as in `gluontl plan`; use {items}{where}.{len(node) + 1} to add one, or set "
                                  f"the whole list: --set '{where}=[...]'.")
            k: str | int = int(p) - 1
            if k == len(node):
                node.append({})
        else:
            k = p
        path.append(k)
        if depth == len(parts) - 1:
            node[k] = value
            break
        nxt = node[k] if isinstance(node, list) else node.get(k)
        if nxt is None:
            nxt = [] if parts[depth + 1].isdigit() else {}
        if not isinstance(nxt, (dict, list)):
            raise RecipeError(f"--set '{spec}': '{where + '.' if where else ''}{p}' holds {nxt!r}, not a section "
                              f"or a list.")
        node[k] = nxt = type(nxt)(nxt)  # copies: the caller's data stays as it was
        node = nxt
    return tuple(path)


class _NoAliasLoader(SafeYamlLoader):
    """The reading policy's YAML loader (no aliases, tags or deep nesting) with YAML 1.2 booleans."""


# YAML 1.2 booleans: only true/false. YAML 1.1 also reads on/off/yes/no as booleans, which turned
# `cache_features: off` and `guards: off` into False; pydantic still reads those words as booleans
# where a field is one (`flip: yes`).
_BOOL = "tag:yaml.org,2002:bool"
_NoAliasLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_NoAliasLoader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    p = Path(path)
    if p.is_dir():
        raise RecipeError(f"Recipe '{p}' is a directory; pass a YAML file, e.g. --recipe recipes/resnet18_freeze.yaml.")
    if not p.is_file():
        raise RecipeError(f"Recipe file '{p}' does not exist. Pass an existing YAML file, e.g. "
                          f"--recipe recipes/resnet18_freeze.yaml.")
    if p.stat().st_size > MAX_RECIPE_BYTES:
        raise RecipeError(f"Recipe file '{p}' is {p.stat().st_size} bytes; recipes are small YAML files (< 1 MiB).")
    try:
        data = parse_yaml(p.read_text(encoding="utf-8"), _NoAliasLoader)
    except UnicodeDecodeError:
        raise RecipeError(f"Recipe file '{p}' is not UTF-8 text; a recipe is a YAML text file "
                          f"(see recipes/).") from None
    except yaml.YAMLError as e:
        raise RecipeError(f"Recipe file '{p}' is not valid YAML: {' '.join(str(e).split())}.") from None
    rules = data.get("rules") if isinstance(data, dict) else None
    if isinstance(rules, list):
        if p.name == "recipe.yaml" and (p.parent / "checkpoints").is_dir():
            # Run folders written before runs dropped unset fields hold `grad_req: null` for "not set".
            data["rules"] = [{k: v for k, v in r.items() if v is not None} if isinstance(r, dict) else r
                             for r in rules]
        else:
            _refuse_bare_null(rules, p)
    return parse_recipe(data, origin=str(p), overrides=overrides)


def _refuse_bare_null(rules: list[Any], path: Path) -> None:
    """YAML reads ``grad_req: null`` as no value, which beside another setting would silently
    leave grad_req unset; in a recipe file it can only mean the mode ``"null"`` misspelt."""
    for i, r in enumerate(rules, 1):
        if isinstance(r, dict) and "grad_req" in r and r["grad_req"] is None:
            raise RecipeError(f"{path}: rules.{i}.grad_req is empty: YAML reads a bare null as no value, not as "
                              f"the mode 'null'. Write grad_req: \"null\" (quoted) to freeze, or leave "
                              f"grad_req out.")
