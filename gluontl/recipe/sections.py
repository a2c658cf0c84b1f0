"""The recipe's sections as pydantic models: model, surgery, data, train, export, segmentation.

Every section has ``extra="forbid"`` so a misspelt key is an error, not a silently ignored
setting. Checks across sections are policy.py's; what a source on disk declares, sources.py's.
"""
from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal, Mapping, get_args

from pydantic import BaseModel, Field, PrivateAttr, field_validator, model_validator
from pydantic_core import PydanticCustomError

from .. import export_formats
from ..errors import ModelSourceError
from ..metrics import task_metrics
from ..task_registry import TASKS
from .common import Strict
from .sources import declared_input_shape, resolve_source

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
        """Without ``input_shape``, the size the source is made for (sources.declared_input_shape)."""
        return declared_input_shape(data)


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


Side = Annotated[int, Field(gt=0, le=1 << 16)]
Size = Side | tuple[Side, Side]  # S (an S x S image) or [H, W]


def size_hw(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """(H, W) of a transform size: S is S x S."""
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


class RandAugmentSpec(Strict):
    """timm's RandAugment (``rand-m9-n2-mstd0.5``): ``n`` ops drawn with replacement from timm's 15, each
    applied with probability ``p`` at magnitude ``m`` (of 10), jittered by a normal of std ``mstd``
    (``mstd`` > 100: uniform in [0, m], as timm) and clipped to [0, 10] (docs/classification.md)."""

    n: int = Field(default=2, ge=1, le=15, description="ops per image (timm num_layers)")
    m: float = Field(default=9.0, ge=0.0, le=10.0, description="magnitude, 0..10 (timm's _LEVEL_DENOM scale)")
    mstd: float = Field(default=0.0, ge=0.0, description="std of the per-op magnitude noise; > 100: uniform")
    p: float = Field(default=0.5, ge=0.0, le=1.0, description="probability each drawn op is applied (timm p)")


class RandomErasingSpec(Strict):
    """timm's RandomErasing, on the normalised tensor: with probability ``prob``, ``count`` boxes of
    area ``min_area``..``max_area`` of the image (shared by the boxes), aspect ``min_aspect``..1/``min_aspect``
    (log-uniform), filled with 0 (const), a normal per channel (rand) or per pixel (pixel)."""

    prob: float = Field(default=0.25, ge=0.0, le=1.0)
    mode: Literal["const", "rand", "pixel"] = "pixel"
    count: int = Field(default=1, ge=1, le=16)
    min_area: float = Field(default=0.02, gt=0.0, lt=1.0)
    max_area: float = Field(default=1 / 3, gt=0.0, lt=1.0)
    min_aspect: float = Field(default=0.3, gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _areas(self) -> "RandomErasingSpec":
        if self.min_area > self.max_area:
            raise ValueError(f"random_erasing.min_area {self.min_area} is above max_area {self.max_area}")
        return self


class TransformSpec(Strict):
    resize: Size | None = None
    random_resized_crop: Size | None = None
    center_crop: Size | None = None
    flip: bool = False
    color_jitter: float = Field(default=0.0, ge=0.0, le=1.0)
    randaugment: RandAugmentSpec | None = None
    trivial_augment: bool = Field(default=False, description="torchvision's TrivialAugmentWide (one op, "
                                  "a uniform magnitude of 31 bins)")
    random_erasing: RandomErasingSpec | None = None
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
    sampler: Literal["uniform", "balanced", "sqrt"] = Field(
        default="uniform", description="classification: how an epoch draws its training images; balanced: each "
        "class equally often, sqrt: classes in proportion to the square root of their image counts (both draw "
        "as many images as the split has, deterministic per seed and epoch; gluontl/data/balance.py)")
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


class LossSpec(Strict):
    """Classification's loss: softmax cross-entropy or focal loss (Lin et al. 2017), each with optional
    per-class weights (the true class's weight scales an image's loss; gluontl/tasks/class_loss.py)."""

    kind: Literal["cross_entropy", "focal"] = "cross_entropy"
    gamma: float = Field(default=2.0, ge=0.0, le=10.0, description="focal: the (1 - p) exponent; 0 is "
                         "cross-entropy")
    class_weights: Literal["none", "balanced"] | list[Annotated[float, Field(gt=0.0)]] = Field(
        default="none", description="balanced: N / (classes × images of the class) over the train split "
        "(scikit-learn's; weights average 1 over its images); or one positive weight per class, in label order")


class MixupSpec(Strict):
    """timm's Mixup / CutMix on each training batch, targets soft (with train.label_smoothing as timm's
    ``label_smoothing``): with probability ``prob`` a batch (``mode: batch``), each pair i, N-1-i (``pair``)
    or each image (``elem``) is mixed with the batch reversed, by CutMix with probability ``switch_prob``
    when both alphas are > 0; lambda ~ Beta(alpha, alpha); CutMix's lambda is corrected to the box's
    area (``correct_lam``). With a frozen prefix the mixing is of its features (docs/classification.md)."""

    mixup_alpha: float = Field(default=0.8, ge=0.0, le=100.0)
    cutmix_alpha: float = Field(default=0.0, ge=0.0, le=100.0)
    prob: float = Field(default=1.0, ge=0.0, le=1.0)
    switch_prob: float = Field(default=0.5, ge=0.0, le=1.0)
    mode: Literal["batch", "pair", "elem"] = "batch"
    correct_lam: bool = True

    @model_validator(mode="after")
    def _some_alpha(self) -> "MixupSpec":
        if not (self.mixup_alpha > 0 or self.cutmix_alpha > 0):
            raise ValueError("train.mixup needs mixup_alpha > 0 or cutmix_alpha > 0 (both are 0: nothing mixes); "
                             "remove train.mixup to train without it")
        return self


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
    loss: LossSpec | None = Field(default=None, description="classification: unset is cross-entropy "
                                  "(train.label_smoothing applies to either kind)")
    mixup: MixupSpec | None = None
    ctx: str = "cpu"
    seed: int = Field(default=0, ge=0, lt=1 << 63)
    hybridize: bool = True
    cache_features: Literal["auto", "on", "off"] = "auto"
    cache_views: int = Field(default=0, ge=0, description="with random augmentation: cache this many "
                             "augmented views per image (epoch e uses view e % K); 0 = no cache")
    cache_dtype: Literal["float32", "float16"] = "float32"
    cache_max_bytes: int = Field(default=2 * 2**30, gt=0, description="beyond this, cached features "
                                 "go to a memory-mapped file in the run folder")
    prefix_engine: Literal["auto", "mxnet", "onnxruntime", "onnxruntime-int8", "openvino", "openvino-int8"] = "auto"
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


class MultiLabelSpec(Strict):
    """task: multilabel: one sigmoid per class, binary cross-entropy (gluontl/tasks/multilabel.py)."""

    pos_weight: Literal["none", "balanced"] | list[float] = Field(
        default="none", description="weight of each class's positive term in BCE: none (1), balanced "
        "(negatives/positives of the train split, per class) or one number per class")


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

    formats: list[str] = Field(default_factory=lambda: ["onnx"], description="registered export formats "
                               "(gluontl.export_formats: symbol, onnx, openvino and any registered since)")
    opset: int | None = Field(default=None, ge=7, le=21)
    input_names: list[str] | None = Field(default=None, min_length=1)
    output_names: list[str] | None = Field(default=None, min_length=1)
    rtol: float | None = Field(default=None, gt=0.0, description=(
        "ONNX verification's tolerance relative to each output's range; unset: the float32 bound of the "
        "exported graph (docs/onnx-import.md, 'How close is close enough')"))
    lean: bool = True
    quantize: QuantizeSpec | None = None
    tta: Literal["none", "flip"] = Field(default="none", description="flip: the ONNX graph averages the "
                                         "probabilities of the image and its mirror image (test-time augmentation)")

    @field_validator("formats")
    @classmethod
    def _registered(cls, v: list[str]) -> list[str]:
        return export_formats.check(v)


