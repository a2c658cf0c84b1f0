"""Segmentation networks: GluonCV's FCN, PSPNet and DeepLabV3, or an FCN / LR-ASPP head on the
feature taps of any gluontl model source, restored the way detectors are.

Every network is a :class:`Segmenter` with structural parameter names ``backbone.*``,
``head.*`` and ``aux.*`` (rules, globs, the plan and restore all see those). In predict mode it
returns logits (N, K, H, W) at the *input's* size whatever that size is: every resize reads its
target size from a tensor (``BilinearResize2D`` mode ``like``), never from a size fixed at
construction. GluonCV's own forwards resize to ``crop_size`` and pool PSP/ASPP branches to
``crop_size // 8``, so a crop that is not a multiple of the output stride breaks them (gluon-cv
#1173); its heads and backbone are reused here under a forward that does not. In training mode,
with ``aux``, it returns ``(logits, aux_logits)`` (GluonCV's deep supervision on the layer before
the last, both at the input's size) — the two-output graph is traced separately from the
one-output one, so hybridized nets switch cleanly between train and predict.

``restore.type``: ``classification`` restores the backbone only, from a classifier's file (the
source's own names, ``backbone.`` stripped; what the classifier has past the taps, and a
gluontl ``head.*``, are left out by design); ``segmentation`` restores everything, and a layer
whose output channels are the classes (``class_layers``) is rebuilt when the class count
changed (gluon-cv #969) with each new class's rows copied from the old class ``restore.reuse``
names (or the same name/index), the others left at their initialization.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import fnmatch
import io
import re
import warnings
from typing import Sequence

import mxnet as mx
import numpy as np
from mxnet.gluon import HybridBlock, nn

from ..errors import ModelSourceError, RestoreError
from ..mxinternals import children, clear_cached_op
from ..naming import named_params, shape_of
from ..recipe import HEAD, STEM, ModelSpec
from ..sources import build_model, declared_shape, materialize, weight_names
from ..sources.restore import RestoreReport, file_key, old_classes, read_params_file, reuse_map
from ..stages import register_stage_mapper, stage_map
from ..surgery import feature_shapes, list_nodes, tap

ARCHS = ("fcn", "psp", "deeplab", "lraspp")
# What error messages call the recipe section that holds a SegmenterSpec.
SECTION = "segmentation"
# GluonCV segmentation zoo names (fcn_resnet50_voc, psp_resnet101_ade, ...): arch and backbone.
_ZOO_SEG = re.compile(r"^(fcn|psp|deeplab)_(resnet(?:50|101|152))_[a-z]+$")
# Zoo classifiers that are GluonCV's segmentation backbones (same layers, so a classifier file
# restores into the dilated backbone); their heads need 2048 channels, so ResNet-50 and deeper.
GLUONCV_BACKBONES = {"resnet50_v1s": "resnet50", "resnet101_v1s": "resnet101", "resnet152_v1s": "resnet152"}


@dataclasses.dataclass(frozen=True)
class SegmenterSpec:
    """``arch``: fcn | psp | deeplab (GluonCV's) | lraspp. ``taps``: backbone node names, shallow
    to deep (``gluontl inspect --nodes``): fcn reads the deepest, lraspp the first (high
    resolution) and the last, the aux head the first; empty: the last node at each of the
    strides these want. ``head_channels``: width of the FCN / LR-ASPP heads on any source
    (GluonCV's heads keep their own widths)."""

    arch: str = "fcn"
    taps: tuple[str, ...] = ()
    aux: bool = False
    head_channels: int = 128

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ModelSourceError(f"{SECTION}.arch is '{self.arch}'; choose one of {', '.join(ARCHS)}.")
        if int(self.head_channels) < 1:
            raise ModelSourceError(f"{SECTION}.head_channels is {self.head_channels}; give a positive width.")
        object.__setattr__(self, "taps", tuple(self.taps))


# True while the training graph is traced (Segmenter.forward): resizes then take the matrix form.
_TRAINING_GRAPH: contextvars.ContextVar[bool] = contextvars.ContextVar("segmenter_training_graph", default=False)


def _up(F, x, like):
    """``x`` resized (bilinear, half-pixel) to the height and width of ``like``.

    Predict graphs (validation, exports) use ``BilinearResize2D``. Training graphs compute the
    same resize as two matrix products (:func:`bilinear_matmul`): MXNet 1.9.1's CPU backward of
    ``BilinearResize2D`` took 47 % of a training step of the demo on 2 threads (855 of 1811 ms,
    profiled; it gets slower with more threads), the products' backward is two GEMMs."""
    if _TRAINING_GRAPH.get():
        return bilinear_matmul(F, x, like)
    return F.contrib.BilinearResize2D(x, like, mode="like", align_corners=False)


def _axis_weights(F, x, like, axis: int):
    """(n_in, n_out) bilinear weights along ``axis``: column o holds output o's two taps, at
    source position (o + 0.5) * n_in / n_out - 0.5 clamped to [0, n_in - 1], the half-pixel rule
    of ``BilinearResize2D`` (and PyTorch's ``align_corners=False``), built from the shapes so one
    graph serves any input size."""
    sizes = F.cast(F.shape_array(x), "float32"), F.cast(F.shape_array(like), "float32")
    n_in, n_out = (F.slice_axis(s, axis=0, begin=axis, end=axis + 1) for s in sizes)
    src = F.relu(F.broadcast_mul(F.contrib.arange_like(like, axis=axis) + 0.5, n_in / n_out) - 0.5)
    low = F.floor(src)
    frac = src - low
    high = F.broadcast_minimum(low + 1, n_in - 1)
    low = F.broadcast_minimum(low, n_in - 1)
    rows = F.reshape(F.contrib.arange_like(x, axis=axis), (-1, 1))
    weights = (F.broadcast_mul(F.broadcast_equal(rows, F.reshape(low, (1, -1))), F.reshape(1 - frac, (1, -1)))
               + F.broadcast_mul(F.broadcast_equal(rows, F.reshape(high, (1, -1))), F.reshape(frac, (1, -1))))
    return F.BlockGrad(weights)


def bilinear_matmul(F, x, like):
    """``BilinearResize2D(x, like, mode="like", align_corners=False)`` as . W_h along the height,
    then . W_w along the width; equal to it within float32 rounding, gradient included. (Axes are
    swapped on the small tensors only: the output comes out of the last product in place.)"""
    y = F.dot(F.swapaxes(x, 2, 3), _axis_weights(F, x, like, 2))  # N, C, w, H
    return F.dot(F.swapaxes(y, 2, 3), _axis_weights(F, x, like, 3))  # N, C, H, W


def fcn_block(in_channels: int, channels: int, classes: int, dropout: float = 0.1) -> nn.HybridSequential:
    """GluonCV's ``_FCNHead`` layers (3x3 conv-BN-ReLU, dropout, 1x1 to classes) for any input width."""
    block = nn.HybridSequential()
    with block.name_scope():
        block.add(nn.Conv2D(channels, 3, padding=1, use_bias=False, in_channels=in_channels),
                  nn.BatchNorm(in_channels=channels), nn.Activation("relu"), nn.Dropout(dropout),
                  nn.Conv2D(classes, 1, in_channels=channels))
    return block


class FCNHead(HybridBlock):
    """``block`` on one feature map; ``block.4`` is the class layer (GluonCV's names)."""

    def __init__(self, block: nn.HybridSequential) -> None:
        super().__init__()
        self.block = block

    def hybrid_forward(self, F, x):
        return self.block(x)


class PyramidHead(HybridBlock):
    """PSPNet's head (GluonCV's ``_PyramidPooling`` and classifier): bins 1, 2, 3 and 6 of the
    feature map, each through its 1x1 conv, resized back to the map's own size."""

    def __init__(self, psp: HybridBlock, block: nn.HybridSequential) -> None:
        super().__init__()
        self.psp, self.block = psp, block

    def hybrid_forward(self, F, x):
        convs = (self.psp.conv1, self.psp.conv2, self.psp.conv3, self.psp.conv4)
        pooled = [_up(F, conv(F.contrib.AdaptiveAvgPooling2D(x, output_size=bins)), x)
                  for conv, bins in zip(convs, (1, 2, 3, 6))]
        return self.block(F.concat(x, *pooled, dim=1))


class ASPPHead(HybridBlock):
    """DeepLabV3's head (GluonCV's ``_ASPP`` and classifier): four atrous branches and the
    image-pooling branch, whose 1x1 map is spread over the feature map's own size."""

    def __init__(self, aspp: HybridBlock, block: nn.HybridSequential) -> None:
        super().__init__()
        self.aspp, self.block = aspp, block

    def hybrid_forward(self, F, x):
        *atrous, pooling = children(self.aspp.concurent).values()
        branches = [b(x) for b in atrous] + [_up(F, pooling.gap(x), x)]
        return self.block(self.aspp.project(F.concat(*branches, dim=1)))


class LRASPPHead(HybridBlock):
    """Lite R-ASPP (Howard et al., *Searching for MobileNetV3*, 2019): the deep features through
    a 1x1 conv-BN-ReLU gated by a sigmoid of their global average, resized to the shallow
    features' size and classified, plus a 1x1 classification of the shallow features."""

    def __init__(self, low_channels: int, high_channels: int, channels: int, classes: int) -> None:
        super().__init__()
        with self.name_scope():
            self.cbr = nn.HybridSequential()
            self.cbr.add(nn.Conv2D(channels, 1, use_bias=False, in_channels=high_channels),
                         nn.BatchNorm(in_channels=channels), nn.Activation("relu"))
            self.scale = nn.HybridSequential()
            self.scale.add(nn.GlobalAvgPool2D(), nn.Conv2D(channels, 1, use_bias=False, in_channels=high_channels),
                           nn.Activation("sigmoid"))
            self.low_classifier = nn.Conv2D(classes, 1, in_channels=low_channels)
            self.high_classifier = nn.Conv2D(classes, 1, in_channels=channels)

    def hybrid_forward(self, F, low, high):
        x = _up(F, F.broadcast_mul(self.cbr(high), self.scale(high)), low)
        return self.low_classifier(low) + self.high_classifier(x)


class DilatedResNet(HybridBlock):
    """GluonCV's dilated ResNet as its segmentation models run it (``SegBaseModel.base_forward``):
    the outputs of ``layer3`` (stride 8, the aux head's) and ``layer4`` (stride 8, dilated)."""

    LAYERS = ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4")

    def __init__(self, base: HybridBlock) -> None:
        super().__init__()
        for k in self.LAYERS:
            setattr(self, k, getattr(base, k))

    def hybrid_forward(self, F, x):
        x = self.layer2(self.layer1(self.maxpool(self.relu(self.bn1(self.conv1(x))))))
        c3 = self.layer3(x)
        return [c3, self.layer4(c3)]


class Segmenter(HybridBlock):
    """``backbone`` (its taps, shallow to deep) -> ``head`` -> logits at the input's size; with
    ``aux``, in training mode, also the aux head's logits on the first tap."""

    def __init__(self, backbone: HybridBlock, head: HybridBlock, aux: HybridBlock | None, arch: str) -> None:
        super().__init__(prefix="")
        self.backbone, self.head, self.arch = backbone, head, arch
        if aux is not None:
            self.aux = aux
        self.has_aux = aux is not None
        self._aux_on = self._training_graph = False

    @property
    def class_layers(self) -> list[str]:
        """Structural names of the layers whose output channels are the classes."""
        heads = ["head.low_classifier", "head.high_classifier"] if self.arch == "lraspp" else ["head.block.4"]
        return heads + (["aux.block.4"] if self.has_aux else [])

    def forward(self, x, *args):
        training = mx.autograd.is_training()
        aux = self.has_aux and training
        if (aux, training) != (self._aux_on, self._training_graph):  # a graph of its own
            self._aux_on, self._training_graph = aux, training
            clear_cached_op(self)
        token = _TRAINING_GRAPH.set(training)
        try:
            return self._forward(x, *args)
        finally:
            _TRAINING_GRAPH.reset(token)

    def _forward(self, x, *args):
        if self.has_aux and not self._aux_on:  # the aux head is idle in predict mode, as it should be
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Parameter .* is not used by any computation", UserWarning)
                return super().forward(x, *args)
        return super().forward(x, *args)

    def hybrid_forward(self, F, x):
        feats = self.backbone(x)
        feats = list(feats) if isinstance(feats, (list, tuple)) else [feats]
        logits = self.head(feats[0], feats[-1]) if self.arch == "lraspp" else self.head(feats[-1])
        out = _up(F, logits, x)
        if self._aux_on:
            return out, _up(F, self.aux(feats[0]), x)
        return out


def build_segmenter(model_spec: ModelSpec, seg_spec: SegmenterSpec, num_classes: int, ctx: mx.Context | None = None,
                    *, class_names: Sequence[str] | None = None) -> tuple[Segmenter, RestoreReport | None]:
    """The segmenter ``seg_spec`` describes on ``model_spec``'s source for ``num_classes`` classes,
    initialized, then restored per ``model_spec.restore`` (``class_names``, in label order, let
    ``restore.reuse`` name new classes)."""
    ctx = ctx or mx.cpu()
    spec = model_spec
    kind = _restore_kind(spec)
    names = list(class_names) if class_names is not None else [str(i) for i in range(num_classes)]
    if len(names) != num_classes:
        raise ModelSourceError(f"class_names lists {len(names)} names for {num_classes} classes.")
    with mx.name.NameManager():  # parameter names do not depend on how many nets this process built
        gcv = _gluoncv_backbone(spec, seg_spec)
        if gcv is not None:
            net, source_keys = _gluoncv(spec, seg_spec, gcv, num_classes, ctx)
        else:
            net, source_keys = _on_source(spec, seg_spec, num_classes, ctx)
    with warnings.catch_warnings():  # Gluon warns for each parameter the source did initialize
        warnings.simplefilter("ignore")
        net.initialize(mx.init.Xavier(), ctx=ctx)
    for p in net.collect_params().values():
        p.lr_mult = 1.0  # GluonCV sets 10 on its heads; learning rates are the recipe's rules
    materialize(net, {spec.input_name: (1, *spec.input_shape)}, ctx, spec.source)
    if kind == "none":
        return net, None
    old = old_classes(spec.weights)
    return net, restore_segmenter(net, spec, kind, names, old, source_keys)


def _restore_kind(spec: ModelSpec) -> str:
    kind = spec.restore.type or ("segmentation" if spec.weights else "none")
    if kind not in ("segmentation", "classification", "none"):
        raise RestoreError(f"model.restore.type is {kind}; a segmentation model restores segmentation (everything, "
                           f"class rows per reuse), classification (the backbone, from a classifier's file) or none.")
    if spec.restore.reuse and kind != "segmentation":
        raise RestoreError(f"model.restore.reuse copies class rows of a segmentation file, which only restore.type: "
                           f"segmentation reads (this recipe restores {kind}"
                           f"{'' if spec.weights else ', no model.weights'}); remove reuse or use type: segmentation.")
    if kind == "none" and spec.weights:
        raise RestoreError(f"model.restore.type is none but model.weights is {spec.weights}; remove one.")
    if kind != "none" and not spec.weights:
        raise RestoreError(f"model.restore.type: {kind} needs model.weights (a .params file or a run folder).")
    return kind


def _gluoncv_backbone(spec: ModelSpec, seg: SegmenterSpec) -> str | None:
    """GluonCV's backbone name when the network is GluonCV's FCN/PSPNet/DeepLabV3, else None."""
    scheme, _, name = spec.source.partition(":")
    found = _ZOO_SEG.match(name) if scheme == "zoo" else None
    if found:
        if found.group(1) != seg.arch:
            raise ModelSourceError(f"model.source {spec.source} is GluonCV's {found.group(1)}, but {SECTION}.arch is "
                                   f"{seg.arch}; make them agree (or name a backbone: zoo:resnet50_v1s).")
        if spec.pretrained:
            raise ModelSourceError(f"pretrained: true would download {spec.source}'s weights for its dataset's "
                                   f"classes; give the file as model.weights (restore.type: segmentation), or "
                                   f"use zoo:resnet50_v1s with pretrained: true for an "
                                   f"ImageNet backbone.")
        backbone = found.group(2)
    elif seg.arch in ("psp", "deeplab"):
        if scheme != "zoo" or name not in GLUONCV_BACKBONES:
            raise ModelSourceError(f"{SECTION}.arch {seg.arch} is GluonCV's head on its dilated ResNets: model.source "
                                   f"zoo:{' | zoo:'.join(GLUONCV_BACKBONES)} (or zoo:{seg.arch}_resnet101_voc-style "
                                   f"names); on {spec.source} use arch fcn or lraspp.")
        backbone = GLUONCV_BACKBONES[name]
    else:
        return None
    if seg.taps:
        raise ModelSourceError(f"{SECTION}.taps names nodes of a source backbone, but GluonCV's {seg.arch} taps its "
                               f"own (layer3, layer4); remove taps.")
    return backbone


def _gluoncv(spec: ModelSpec, seg: SegmenterSpec, backbone: str, classes: int, ctx) -> tuple[Segmenter, set[str]]:
    from gluoncv.model_zoo import FCN, DeepLabV3, PSPNet
    from gluoncv.model_zoo.segbase import get_backbone

    cls = {"fcn": FCN, "psp": PSPNet, "deeplab": DeepLabV3}[seg.arch]
    with contextlib.redirect_stdout(io.StringIO()):  # PSPNet prints its crop size
        try:
            gcv = cls(classes, backbone=backbone, aux=seg.aux, ctx=ctx, pretrained_base=spec.pretrained,
                      crop_size=spec.input_shape[-1], **spec.kwargs)
        except (OSError, ConnectionError) as e:
            raise ModelSourceError(f"Downloading the ImageNet {backbone} for {spec.source} failed "
                                   f"({type(e).__name__}); without network access set pretrained: false and restore "
                                   f"a local classifier file (model.weights, restore.type: classification).") from None
        except TypeError as e:
            raise ModelSourceError(f"GluonCV's {seg.arch} does not accept model.kwargs {spec.kwargs}: {e}.") from None
    head = {"fcn": lambda h: FCNHead(h.block), "psp": lambda h: PyramidHead(h.psp, h.block),
            "deeplab": lambda h: ASPPHead(h.aspp, h.block)}[seg.arch](gcv.head)
    net = Segmenter(DilatedResNet(gcv), head, FCNHead(gcv.auxlayer.block) if seg.aux else None, seg.arch)
    classifier = get_backbone(backbone, pretrained=False, dilated=True)  # its names: what a classifier file holds
    return net, set(named_params(classifier))


def _on_source(spec: ModelSpec, seg: SegmenterSpec, classes: int, ctx) -> tuple[Segmenter, set[str]]:
    if seg.arch not in ("fcn", "lraspp"):
        raise ModelSourceError(f"{SECTION}.arch {seg.arch} needs a GluonCV backbone; on {spec.source} use fcn or lraspp.")
    weightless, full = spec.model_copy(update={"weights": None}), None
    taps = list(seg.taps)
    if not taps:  # the same nodes at any size the graph runs at: found at the size it declares
        shape = declared_shape(spec)
        probe, _ = build_model(weightless.model_copy(update={"input_shape": shape}), ctx=ctx)
        taps = default_taps(probe, seg.arch, seg.aux, shape)
        full = probe if shape == tuple(spec.input_shape) else None
    if full is None:  # an ONNX file asked for another size than it declares: bound there up to the taps
        full, _ = build_model(weightless, ctx=ctx, ends=taps)
    shapes = _check_taps(full, taps, spec.input_shape, seg, spec.source)
    backbone = tap(full, taps, input_shape=spec.input_shape)
    width = int(seg.head_channels)
    if seg.arch == "lraspp":
        head = LRASPPHead(shapes[0][1], shapes[-1][1], width, classes)
    else:
        head = FCNHead(fcn_block(shapes[-1][1], width, classes))
    aux = FCNHead(fcn_block(shapes[0][1], width, classes)) if seg.aux else None
    keys = set(named_params(full))
    if declared_shape(spec) != tuple(spec.input_shape):  # cut at the taps: the file's own names past them
        keys |= weight_names(spec.source)
    return Segmenter(backbone, head, aux, seg.arch), keys


def _feature_maps(block: HybridBlock, input_shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """(node, batch-2 shape) of every node whose output is a feature map of each sample, global
    pools (1x1 maps) left out."""
    return [(n.name, n.shape) for n in list_nodes(block, input_shape, batch=2)
            if n.shape is not None and len(n.shape) == 4 and n.shape[0] == 2 and n.shape[2] * n.shape[3] > 1]


def default_taps(block: HybridBlock, arch: str, aux: bool, input_shape: tuple[int, ...]) -> list[str]:
    """The last node at each output stride the head wants: the deepest map (fcn), after the one
    nearest stride 8 (lraspp) or the last at the next-to-deepest stride (the aux head's)."""
    maps = _feature_maps(block, input_shape)
    if not maps:
        raise ModelSourceError(f"this model has no feature-map node to put a segmentation head on; name the taps "
                               f"({SECTION}.taps).")
    last_at: dict[int, str] = {}
    for name, shape in maps:
        last_at[shape[2]] = name
    deepest = maps[-1][0]
    heights = sorted(last_at, reverse=True)  # shallow (large) to deep
    if arch == "lraspp":
        low = min(heights[:-1], key=lambda h: abs(np.log2(input_shape[1] / h) - 3), default=None)
        if low is None:
            raise ModelSourceError(f"lraspp needs two feature resolutions; this model has one. Name the taps "
                                   f"({SECTION}.taps) or use arch fcn.")
        return [last_at[low], deepest]
    if aux:
        if len(heights) < 2:
            raise ModelSourceError(f"the aux head reads a shallower map, but this model has one resolution; name "
                                   f"the taps ({SECTION}.taps) or set aux: false.")
        return [last_at[heights[-2]], deepest]
    return [deepest]


def _check_taps(block: HybridBlock, taps: list[str], input_shape: tuple[int, ...], seg: SegmenterSpec,
                source: str) -> list[tuple[int, ...]]:
    want = 2 if seg.arch == "lraspp" or seg.aux else 1
    if len(taps) != want:
        role = ("lraspp reads a shallow and a deep map" if seg.arch == "lraspp" else
                "fcn with aux reads the aux head's map and the head's" if seg.aux else "fcn reads one map")
        raise ModelSourceError(f"{SECTION}.taps names {len(taps)} node(s) but {role}: give {want}, shallow to deep "
                               f"(or none for the defaults).")
    return feature_shapes(block, taps, input_shape, f"{SECTION}.taps", source)


# ----------------------------------------------------------------------------- restore

def restore_segmenter(net: Segmenter, spec: ModelSpec, kind: str, classes: list[str], old_names: list[str] | None,
                      source_keys: set[str] = frozenset()) -> RestoreReport:
    """Restore ``spec.weights`` into ``net`` per ``kind`` (module docstring); ``source_keys`` are
    the source classifier's own parameter names, which a classification file may hold past the taps."""
    weights, rs = spec.weights, spec.restore
    arrays = read_params_file(weights)
    report = RestoreReport(file=str(weights))
    rows = {f"{layer}.{w}" for layer in net.class_layers for w in ("weight", "bias")}
    used: set[str] = set()
    for name, e in named_params(net).items():
        if kind == "classification" and not name.startswith("backbone."):
            continue
        if rs.only and not any(fnmatch.fnmatchcase(name, g) for g in rs.only):
            continue
        key = next((k for k in _keys(name, rs.prefix_map, e.param.name) if k in arrays), None)
        if key is None:
            report.missing.append(name)
            continue
        used.add(key)
        src, want = arrays[key], shape_of(e.param)
        if name in rows and kind == "segmentation" and src.shape[1:] == want[1:]:
            mapping = reuse_map(rs.reuse, classes, old_names, src.shape[0])
            new = e.param.data().asnumpy()
            for i, j in mapping.items():
                new[i] = src[j].asnumpy()
            e.param.set_data(mx.nd.array(new, dtype=e.param.dtype))
            if len(mapping) == len(classes) == src.shape[0] and all(i == j for i, j in mapping.items()):
                report.restored.append(name)
            else:
                reused = ", ".join(f"{classes[i]}<-{old_names[j] if old_names else j}" for i, j in mapping.items())
                report.rebuilt.append((name, f"class rows {reused or 'all fresh'}"))
        elif want == tuple(src.shape):
            e.param.set_data(src)
            report.restored.append(name)
        else:
            report.mismatched.append((name, want, tuple(src.shape)))
    left = set(arrays) - used
    if kind == "classification":  # the classifier past the taps, and a gluontl classifier's new head
        left = {k for k in left if k not in source_keys and not k.startswith("head.")}
    report.unexpected = sorted(left)
    try:
        report.check(rs.expect_missing, rs.expect_unexpected, rs.expect_mismatch)
    except RestoreError as e:
        if kind == "segmentation" and report.missing and not any(n.startswith("backbone.") for n in report.missing):
            raise RestoreError(f"{e} The file has the backbone but no head: if it is a classifier's, set "
                               f"model.restore.type: classification.") from None
        raise
    if not report.restored and not report.rebuilt:
        raise RestoreError(f"Restoring '{weights}' (restore.type: {kind}) matched no parameter names; is it a file "
                           f"of this {'backbone' if kind == 'classification' else 'segmentation model'}? Map names "
                           f"with restore.prefix_map.")
    return report


def _keys(name: str, prefix_map: dict[str, str], global_name: str) -> list[str]:
    """Where a file may hold parameter ``name``: the recipe's prefix map, then the source's own
    name (a classifier file: ``backbone.`` stripped), GluonCV's segmentation names (``auxlayer.``)
    and Gluon's global name (``export()`` files)."""
    keys = [file_key(name, prefix_map)]
    if name.startswith("backbone."):
        keys.append(name[len("backbone."):])
    if name.startswith("aux."):
        keys.append("auxlayer." + name[len("aux."):])
    return keys + [global_name]


# ----------------------------------------------------------------------------- stages

def segmenter_stage_map(net: Segmenter, input_shape: tuple[int, ...]) -> dict:
    """The backbone by stride as its source's own map (GluonCV's dilated ResNet: stem, then
    layer1..4 as stages 1..4, since dilation keeps layer3 and layer4 at stride 8); heads: head."""
    names = named_params(net)
    if isinstance(net.backbone, DilatedResNet):
        inner = {}
        for n in named_params(net.backbone):
            top = n.split(".", 1)[0]
            inner[n] = int(top[-1]) if top.startswith("layer") else STEM
    else:
        inner = stage_map(net.backbone, input_shape)
    out = {f"backbone.{k}": v for k, v in inner.items()}
    return {n: out.get(n, HEAD) for n in names}


register_stage_mapper(lambda net: isinstance(net, Segmenter), segmenter_stage_map)
