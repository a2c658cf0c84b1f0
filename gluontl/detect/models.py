"""Detectors from the GluonCV zoo with new classes, restored the TF Object Detection API way.

``restore.type`` follows ``fine_tune_checkpoint_type``: ``classification`` takes the backbone
only (every parameter outside the class/box heads), ``detection`` takes everything the file
has, ``none`` nothing. A head whose width depends on the class count is rebuilt for the new
classes; under ``detection`` its class-independent rows (SSD's background row, YOLOv3's box
and objectness rows) always come from the file and a new class's rows come from the old class
that ``restore.reuse`` names, while unlisted classes start fresh. GluonCV's own
``reset_class`` would re-initialize YOLOv3's box and objectness rows unless a reuse map is
given, so the rows are copied here, by layout, for both families.

Pitfalls handled here, each pinned by a test: ``reset_class`` before ``initialize()`` raises
(we build with the classes instead); SSD's extra layers get GluonCV's Uniform init on their
BatchNorm, negative variances included (ONNX Runtime then computes NaN), so every BatchNorm
starts at identity; ``YOLOV3.num_class`` raises, so the class count comes from ``classes``;
GluonCV names SymbolBlock parameters after a per-process counter (``ssd0_``, ``ssd1_``),
so detectors are built in a fresh name scope and a file saved by one process loads in another.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import warnings
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.gluon import HybridBlock

from ..errors import ModelSourceError, RestoreError
from ..mxinternals import clear_cached_op, collect_params_by_path, set_loaded_names, ssd_anchor_geometry, ssd_anchors
from ..naming import named_params, shape_of
from ..recipe import Recipe
from ..sources import ZooInit, zoo_block, materialize
from ..sources.restore import RestoreReport, file_key, old_classes, read_params_file, reuse_map
from ..stages import detector_family

@dataclasses.dataclass(frozen=True)
class HeadLayout:
    """Rows of a class-dependent prediction layer: per anchor a block of ``kept + classes`` rows,
    the first ``kept`` independent of the classes (SSD: background; YOLOv3: box + objectness)."""

    glob: str  # structural names of the layer's weight and bias
    kept: int

    def block(self, classes: int) -> int:
        return self.kept + classes


# GluonCV's SSD features are a SymbolBlock whose input MXNet cannot type before the first call;
# its warning says nothing a user can act on, at every hybridized trace.
warnings.filterwarnings("ignore", message="Cannot decide type for the following arguments", category=UserWarning)

LAYOUTS = {"ssd": HeadLayout("class_predictors.*.predictor.*", 1),
           "yolo3": HeadLayout("yolo_outputs.*.prediction.*", 5)}
# What `restore.type: classification` leaves out: every head (class-dependent or not).
HEADS = {"ssd": ("class_predictors.*", "box_predictors.*"), "yolo3": ("yolo_outputs.*.prediction.*",)}
# Constant buffers GluonCV keeps as parameters; they follow the input size, never a file.
BUFFERS = {"ssd": ("anchor_generators.*",), "yolo3": ("yolo_outputs.*.anchors", "yolo_outputs.*.offsets")}


def build_detector(recipe: Recipe, classes: list[str], ctx: mx.Context | None = None
                   ) -> tuple[HybridBlock, RestoreReport | None]:
    """The recipe's zoo detector for ``classes``, initialized, then restored per ``model.restore``."""
    spec = recipe.model
    ctx = ctx or mx.cpu()
    scheme, _, name = spec.source.partition(":")
    if scheme != "zoo" and spec.detector is None:
        raise ModelSourceError(f"task: detection needs a GluonCV zoo detector as model.source (e.g. "
                               f"zoo:ssd_300_mobilenet0.25_custom or zoo:yolo3_mobilenet0.25_custom), or "
                               f"model.detector: {{features: [NODE, ...]}} to build an SSD on {spec.source} as "
                               f"backbone (`gluontl inspect` lists its nodes).")
    if spec.pretrained:
        raise ModelSourceError("task: detection: pretrained: true would download COCO/VOC weights for the "
                               "zoo's own classes; give the detector file as model.weights instead (and "
                               "model.restore.type: detection|classification).")
    loaded: set[str] = set()
    with mx.name.NameManager():  # parameter names do not depend on how many nets this process built
        if spec.detector is not None:
            net, loaded = _ssd_on(spec, classes, ctx)
        else:
            net = zoo_block(name, None, _with_classes(name, spec.kwargs, classes), False, ctx)
    fam = detector_family(net)
    with warnings.catch_warnings():  # Gluon warns for each parameter the backbone source did initialize
        warnings.simplefilter("ignore")
        net.initialize(ZooInit(), ctx=ctx)  # what the backbone source did not load
    materialize(net, {"data": (1, *spec.input_shape)}, ctx, spec.source)
    if list(net.classes) != list(classes):  # a _voc/_coco name: its own classes, now replaced
        net.reset_class(classes)
        materialize(net, {"data": (1, *spec.input_shape)}, ctx, spec.source)
    if spec.random_init:  # the from-scratch baseline: the backbone source's weights too
        from ..sources import reinitialize

        reinitialize(net)
        loaded = set()
    identity_batchnorm(net, keep=loaded)
    if fam == "ssd":
        small_heads(net)
    if fam == "ssd" and spec.anchors == "fit":
        fit_ssd_anchors(net, spec.input_shape)
    set_loaded_names(net, loaded)  # what came with the backbone source, for the guards (tasks.detection)
    kind = spec.restore.type or ("detection" if spec.weights else "none")
    if spec.restore.reuse and kind != "detection":
        raise RestoreError(f"model.restore.reuse copies class rows of a detector file, which only "
                           f"restore.type: detection reads (this recipe restores {kind}"
                           f"{'' if spec.weights else ', no model.weights'}); remove reuse or use type: detection.")
    if kind == "none" or not spec.weights:
        if spec.weights:
            raise RestoreError(f"model.restore.type is none but model.weights is {spec.weights}; remove one.")
        if kind != "none":
            raise RestoreError(f"model.restore.type: {kind} needs model.weights (a .params file or a run "
                               f"folder to restore from).")
        return net, None
    return net, restore_detector(net, fam, spec.weights, kind, classes, spec.restore, old_classes(spec.weights))


def fit_ssd_anchors(net: HybridBlock, input_shape: tuple[int, ...]) -> None:
    """SSD anchors placed on the feature maps the network really makes at ``input_shape``.

    GluonCV's SSDs keep anchor centres at ``(i + 0.5) * step`` with steps (and sizes) in pixels
    of their base size; ``ssd_300_mobilenet*`` reuse VGG-SSD's steps although MobileNet's maps
    are twice as coarse, so its small anchors cover only the top-left quarter of the image, and
    any other input size moves every anchor. Here each map's step is the input height over the
    map height and sizes scale with the input (anchors stay (cx, cy, w, h) in input pixels)."""
    height = input_shape[-2]
    ctx = next(iter(net.collect_params().values())).list_ctx()[0]
    with mx.autograd.train_mode():
        maps = [f.shape[2] for f in net.features(mx.nd.zeros((1, *input_shape), ctx=ctx))]
    for gen, rows in zip(net.anchor_generators, maps):
        im_size, base_sizes, ratios = ssd_anchor_geometry(gen)
        scale = height / im_size[0]
        alloc = gen.anchors.shape[2:4]
        sizes = tuple(s * scale for s in base_sizes)
        anchors = ssd_anchors(gen, sizes, ratios, height / rows, alloc, (0.5, 0.5))
        gen.anchors.set_data(mx.nd.array(anchors, ctx=ctx, dtype=gen.anchors.dtype))
    clear_cached_op(net)


def _ssd_on(spec, classes: list[str], ctx: mx.Context) -> tuple[HybridBlock, set[str]]:
    """GluonCV's SSD on a gluontl model source; the backbone keeps the weights it was loaded with."""
    from gluoncv.model_zoo.ssd.ssd import SSD

    from ..sources import check_input_shape, load_model

    d = spec.detector
    shape = (1, *spec.input_shape)
    name = _backbone_input(spec)
    check_input_shape(spec, name)
    backbone = load_model(spec.model_copy(update={"detector": None, "weights": None}), ctx=ctx,
                          input_shapes={name: shape})
    nodes = _feature_shapes(backbone, d.features, shape, spec.source)
    height = spec.input_shape[-2]
    strides = [height / h for h in nodes] + [height / max(1, -(-nodes[-1] // 2 ** (i + 1)))
                                             for i in range(len(d.filters))]
    layers = len(strides)
    sizes = [round(height * (d.min_size + (d.max_size - d.min_size) * k / layers), 2) for k in range(layers + 1)]
    net = SSD(backbone, height, d.features, d.filters, sizes, [list(d.ratios)] * layers, strides, classes,
              pretrained=False, ctx=ctx)
    owned = {id(p) for p in backbone.collect_params().values()}
    return net, {n for n, e in named_params(net).items() if id(e.param) in owned}


def _backbone_input(spec) -> str:
    from ..sources import model_input_name

    return model_input_name(spec.model_copy(update={"detector": None}))


def _feature_shapes(backbone: HybridBlock, features: list[str], shape: tuple[int, ...], source: str) -> list[int]:
    """Each feature node's output height at ``shape`` (checked: named nodes, shallow to deep)."""
    from ..surgery import feature_shapes

    return [int(s[2]) for s in feature_shapes(backbone, features, shape[1:], "model.detector.features", source)]


def _with_classes(name: str, kwargs: dict[str, Any], classes: list[str]) -> dict[str, Any]:
    return {**kwargs, "classes": classes} if name.endswith("_custom") else dict(kwargs)


def identity_batchnorm(net: HybridBlock, keep: set[str] = frozenset()) -> None:
    """Every BatchNorm but a loaded backbone's (``keep``) at identity (scale 1, shift 0, mean 0,
    var 1); GluonCV's SSD expanders otherwise start with Uniform(-0.07, 0.07) variances."""
    for n, e in named_params(net).items():
        if n in keep:
            continue
        if e.layer is not None and e.layer.type == "BatchNorm" or n.rsplit("_", 1)[-1] in ("var", "mean"):
            last = n.rsplit("_", 1)[-1].rsplit(".", 1)[-1]
            value = 1.0 if last in ("gamma", "var") else 0.0
            e.param.set_data(mx.nd.full(shape_of(e.param), value, dtype=e.param.dtype))


def small_heads(net: HybridBlock) -> None:
    """SSD's class and box predictors start at N(0, 0.01) weights and zero bias (Detectron's and
    RetinaNet's head init): Xavier on a deep, unnormalized backbone map (1280 ReLU6 channels x 3x3)
    starts with logits in the tens, a loss that spikes and a run that learns nothing for epochs."""
    for n, e in named_params(net).items():
        if fnmatch.fnmatchcase(n, "*_predictors.*.predictor.*"):
            init = mx.init.Normal(0.01) if n.endswith("weight") else mx.init.Zero()
            arr = mx.nd.zeros(shape_of(e.param), dtype=e.param.dtype)
            init._init_weight(n, arr)
            e.param.set_data(arr)


def num_classes(net: HybridBlock) -> int:
    """The detector's class count (``YOLOV3.num_class`` raises AttributeError)."""
    return len(net.classes)


def restore_detector(net: HybridBlock, fam: str, weights: str, kind: str, classes: list[str], spec,
                     old_names: list[str] | None) -> RestoreReport:
    """Restore ``weights`` into ``net`` per ``kind``; the report lists the class-dependent heads as
    layers it rebuilt for the new classes (rows copied per layout) under ``rebuilt``."""
    arrays = read_params_file(weights)
    entries = named_params(net)
    report = RestoreReport(file=str(weights))
    layout = LAYOUTS[fam]
    skip = BUFFERS[fam] + (HEADS[fam] if kind == "classification" else ())
    # Gluon's save_parameters (GluonCV's scripts and zoo files) names SSD's feature SymbolBlock
    # parameters without its prefix ("features.expand_bn0_beta", not "features.ssd0_expand_bn0_beta").
    saved = {id(p): k for k, p in collect_params_by_path(net).items()}
    used = set()
    for name, e in entries.items():
        if any(fnmatch.fnmatchcase(name, g) for g in skip):
            continue
        key = file_key(name, spec.prefix_map)
        if key not in arrays and saved.get(id(e.param)) in arrays:
            key = saved[id(e.param)]
        if key not in arrays:
            report.missing.append(name)
            continue
        used.add(key)
        src = arrays[key]
        if fnmatch.fnmatchcase(name, layout.glob) and kind == "detection":
            anchors = shape_of(e.param)[0] // layout.block(len(classes))
            old_count = src.shape[0] // anchors - layout.kept
            if src.shape[0] % anchors or old_count < 1 or src.shape[1:] != shape_of(e.param)[1:]:
                raise RestoreError(f"'{weights}': {name} has shape {tuple(src.shape)}, which is not {anchors} "
                                   f"anchors x ({layout.kept} + classes) rows over {shape_of(e.param)[1:]}; "
                                   f"the file is of another detector (family, backbone or anchors).")
            mapping = reuse_map(spec.reuse, classes, old_names, old_count)
            _copy_rows(e.param, src.asnumpy(), layout, len(classes), mapping)
            if len(mapping) == len(classes) == old_count and all(i == j for i, j in mapping.items()):
                report.restored.append(name)  # the same classes: the whole layer
            else:
                reused = ", ".join(f"{classes[i]}<-{old_names[j] if old_names else j}" for i, j in mapping.items())
                report.rebuilt.append((name, f"{layout.kept} class-independent row(s) per anchor from the file; "
                                             f"class rows {reused or 'all fresh'}"))
        elif shape_of(e.param) == tuple(src.shape):
            e.param.set_data(src)
            report.restored.append(name)
        else:
            report.mismatched.append((name, shape_of(e.param), tuple(src.shape)))
    ignored = set(BUFFERS[fam]) | (set(HEADS[fam]) if kind == "classification" else set())
    report.unexpected = sorted(k for k in set(arrays) - used if not any(fnmatch.fnmatchcase(k, g) for g in ignored))
    report.check(spec.expect_missing, spec.expect_unexpected, spec.expect_mismatch)
    if kind == "detection" and not report.restored:
        raise RestoreError(f"Restoring detector '{weights}' (restore.type: detection) matched no parameter "
                           f"names; is it a file of this detector family? Use restore.prefix_map to map names, "
                           f"or restore.type: classification for a backbone file.")
    return report


def _copy_rows(param, old: np.ndarray, layout: HeadLayout, classes: int, reuse: dict[int, int]) -> None:
    new = param.data().asnumpy()
    anchors = new.shape[0] // layout.block(classes)
    old_block = old.shape[0] // anchors
    for a in range(anchors):
        o, n = a * old_block, a * layout.block(classes)
        new[n:n + layout.kept] = old[o:o + layout.kept]
        for i, j in reuse.items():
            new[n + layout.kept + i] = old[o + layout.kept + j]
    param.set_data(mx.nd.array(new, dtype=param.dtype))
