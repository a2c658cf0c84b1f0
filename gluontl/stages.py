"""Stage maps: which stage (stem, 1..N, head) each parameter belongs to.

Like timm's ``group_matcher`` or detectron2's ``FREEZE_AT``, but derived from the network
itself instead of a hand-written table per family: a stage is a run of layers at the
same output stride. We run one forward pass, record each unit's output resolution, and
number strides 4, 8, 16, 32, … as stages 1, 2, 3, 4, …; units at stride ≤ 2 form the
stem, units whose output is no longer a feature map form the head. This works for every
zoo CNN (ResNet v1/v1b/v2, MobileNet v1/v2/v3, VGG, DenseNet, …) and for imported graphs.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Iterable

import mxnet as mx
from mxnet.gluon import HybridBlock, SymbolBlock, nn

from .errors import ModelSourceError, RuleError
from .naming import graph_nodes, named_params
from .recipe import HEAD, NECK, STEM

_GLOBAL_POOLS = (nn.GlobalAvgPool2D, nn.GlobalMaxPool2D, nn.GlobalAvgPool1D, nn.GlobalMaxPool1D)
Stage = int | str
StageMapper = Callable[[HybridBlock, tuple[int, ...]], dict[str, Stage]]
_FAMILY_MAPPERS: list[tuple[Callable[[HybridBlock], bool], StageMapper]] = []


def trunk_units(net: HybridBlock) -> list[tuple[str, HybridBlock]]:
    """Top-level children, with plain Sequential containers opened one level."""
    out = []
    for name, child in net._children.items():
        if isinstance(child, (nn.HybridSequential, nn.Sequential)) and len(child._children) > 1:
            out += [(f"{name}.{k}", c) for k, c in child._children.items()]
        else:
            out.append((name, child))
    return out


def stage_of(shape: tuple[int, ...], in_hw: int, global_pool: bool) -> Stage:
    """Head from global pooling on (or once the output is no feature map): a 1×1 map at a
    small input is still a stage — ResNet's stage 4 at 32² — not the head."""
    if len(shape) != 4 or global_pool:
        return HEAD
    stride = max(1, round(in_hw / max(shape[2], 1)))
    return STEM if stride <= 2 else int(round(math.log2(stride))) - 1


def register_stage_mapper(claims: Callable[[HybridBlock], bool], mapper: StageMapper) -> None:
    """A model family whose stages are not runs of one stride (a detector's neck and heads) maps its
    own: ``mapper`` serves every net ``claims`` (timm's ``group_matcher``). A family a task builds
    registers from its module at import; GluonCV's zoo detectors are registered below, as
    ``gluontl.load_model`` loads them without any task."""
    _FAMILY_MAPPERS.append((claims, mapper))


def stage_map(net: HybridBlock, input_shape: tuple[int, ...]) -> dict[str, Stage]:
    """Structural parameter name → stage, from one batch-1 forward pass at ``input_shape``."""
    if len(input_shape) != 3:
        raise RuleError(f"stage selectors need an image model (input C,H,W); this model's input shape "
                        f"is {input_shape}. Select by match: or type: instead.")
    for claims, mapper in _FAMILY_MAPPERS:
        if claims(net):
            return mapper(net, input_shape)
    if isinstance(net, SymbolBlock):
        return graph_stage_map(net, input_shape)
    # Probe at ≥ 224² so small training inputs (32² digits) do not shrink stage 4 to 1×1.
    input_shape = (input_shape[0], max(input_shape[1], 224), max(input_shape[2], 224))
    shapes: dict[str, tuple[int, ...]] = {}
    hooks = []
    for name, unit in trunk_units(net):
        def record(block, inputs, output, name=name):
            out = output[0] if isinstance(output, (list, tuple)) else output
            shapes[name] = tuple(out.shape)
        hooks.append(unit.register_forward_hook(record))
    active = net._active
    net.hybridize(False)
    try:
        with mx.autograd.predict_mode():
            net(mx.nd.zeros((1, *input_shape), ctx=next(iter(net.collect_params().values())).list_ctx()[0]))
    finally:
        for h in hooks:
            h.detach()
        if active:
            net.hybridize(True)
    stages: dict[str, Stage] = {}
    last: Stage = STEM
    for name, unit in trunk_units(net):
        shape = shapes.get(name)
        if shape is not None:
            st = stage_of(shape, input_shape[1], isinstance(unit, _GLOBAL_POOLS))
            last = HEAD if HEAD in (st, last) else max(st, last, key=_order)
        prefix = name + "."
        for pname in named_params(net):
            if pname.startswith(prefix):
                stages[pname] = last
    return stages


def graph_stage_map(net: SymbolBlock, input_shape: tuple[int, ...]) -> dict[str, Stage]:
    """Stages flow along data edges, not node order: a feature tap pooled for a new head
    must not turn the layers computed after it (in the file's order) into head layers."""
    sym = net._cached_graph[1]
    inputs = [s.name for s in net._cached_graph[0]]
    internals = sym.get_internals()
    _, out_shapes, _ = internals.infer_shape_partial(**{inputs[0]: (1, *input_shape)})
    shape_of = dict(zip(internals.list_outputs(), out_shapes))
    nodes = graph_nodes(net)
    node_stage: dict[int, Stage] = {}
    for idx, node in enumerate(nodes):
        if node["op"] == "null":
            continue
        before = [node_stage[i[0]] for i in node["inputs"] if i[0] in node_stage]
        shape = tuple(shape_of.get(f"{node['name']}_output") or ())
        if HEAD in before:
            st: Stage = HEAD
        elif shape and all(d > 0 for d in shape):
            global_pool = node["op"] == "Pooling" and node.get("attrs", {}).get("global_pool") == "True"
            st = stage_of(shape, input_shape[1], global_pool)
            st = st if st == HEAD else max([st, *before], key=_order)
        else:
            st = max(before, key=_order) if before else STEM
        node_stage[idx] = st
    by_node = {nodes[i]["name"]: st for i, st in node_stage.items()}
    last = node_stage[max(node_stage)] if node_stage else STEM
    return {name: by_node.get(e.layer.node, last) if e.layer is not None else last
            for name, e in named_params(net).items()}


def _order(s: Stage) -> int:
    return {STEM: 0, NECK: 10**5, HEAD: 10**6}[s] if isinstance(s, str) else int(s)


def ordered(stages: Iterable[Stage]) -> list[Stage]:
    """The distinct stages, stem to head: the layers layer-wise lr decay counts."""
    return sorted(set(stages), key=_order)


# ---------------------------------------------------------------- GluonCV zoo detectors

def detector_family(net: HybridBlock) -> str:
    from gluoncv.model_zoo.ssd.ssd import SSD
    from gluoncv.model_zoo.yolo.yolo3 import YOLOV3

    if isinstance(net, SSD):
        return "ssd"
    if isinstance(net, YOLOV3):
        return "yolo3"
    raise ModelSourceError(f"{type(net).__name__} is not a detector gluontl can fine-tune yet; supported "
                           f"families: SSD (ssd_*) and YOLOv3 (yolo3_*) from the GluonCV zoo "
                           f"(`gluontl zoo ssd`, `gluontl zoo yolo3`).")


_EXPANDER = re.compile(r"(^|_)expand_(trans_)?(conv|bn)\d")  # GluonCV FeatureExpander's layers


def detector_stage_map(net: HybridBlock, input_shape: tuple[int, ...]) -> dict[str, Stage]:
    """Detector stages: the backbone numbered by output stride as for classifiers (stem, 1, 2, …),
    then ``neck`` (SSD's extra feature layers; YOLOv3's transitions and detection blocks) and
    ``head`` (the class/box predictors), so "freeze the backbone" and "backbone + neck" are
    ``freeze_until_stage`` with a number or ``neck``."""
    fam = detector_family(net)
    names = named_params(net)
    if fam == "ssd":
        if not isinstance(net.features, mx.gluon.SymbolBlock):
            raise RuleError(f"stage selectors are mapped for SSDs whose features are a graph (MobileNet/ResNet "
                            f"zoo SSDs, model.detector); this one's are a {type(net.features).__name__}. Select "
                            f"by match: (e.g. 'features.*', 'class_predictors.*') or type: instead.")
        inner = graph_stage_map(net.features, input_shape)
        out = {f"features.{k}": (NECK if _EXPANDER.search(k) else v) for k, v in inner.items()}
    else:
        out = {}
        ctx = next(iter(net.collect_params().values())).list_ctx()[0]
        x = mx.nd.zeros((1, *input_shape), ctx=ctx)
        with mx.autograd.predict_mode():
            for i, stage in enumerate(net.stages):
                x = stage(x)
                st = stage_of(tuple(x.shape), input_shape[1], False)
                out.update({n: st for n in names if n.startswith(f"stages.{i}.")})
        out.update({n: NECK for n in names if n.startswith(("transitions.", "yolo_blocks."))})
    return {n: out.get(n, HEAD) for n in names}


def is_detector(net: HybridBlock) -> bool:
    return type(net).__module__.startswith(("gluoncv.model_zoo.ssd.", "gluoncv.model_zoo.yolo."))


register_stage_mapper(is_detector, detector_stage_map)
