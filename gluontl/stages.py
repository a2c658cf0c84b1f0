"""Stage maps: which stage (stem, 1..N, head) each parameter belongs to.

Like timm's ``group_matcher`` or detectron2's ``FREEZE_AT``, but derived from the network
itself instead of a hand-written table per family: a stage is a run of layers at the
same output stride. We run one forward pass, record each unit's output resolution, and
number strides 4, 8, 16, 32, … as stages 1, 2, 3, 4, …; units at stride ≤ 2 form the
stem, units whose output is no longer a feature map form the head. This works for every
zoo CNN (ResNet v1/v1b/v2, MobileNet v1/v2/v3, VGG, DenseNet, …). Imported graphs are mapped
from their data flow (``graph_stage_map``): squeeze-excitation pools stay inside their blocks,
and single-stride graphs (ViT) are staged by repeated residual block. Every map says ``how``
it was found, for the plan.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Iterable, Iterator

import mxnet as mx
from mxnet.gluon import HybridBlock, SymbolBlock, nn

from .errors import ModelSourceError, RuleError
from .mxinternals import cached_graph, children, is_hybridized
from .naming import graph_nodes, named_params
from .recipe import HEAD, NECK, STEM

_GLOBAL_POOLS = (nn.GlobalAvgPool2D, nn.GlobalMaxPool2D, nn.GlobalAvgPool1D, nn.GlobalMaxPool1D)
Stage = int | str
StageMapper = Callable[[HybridBlock, tuple[int, ...]], dict[str, Stage]]
_FAMILY_MAPPERS: list[tuple[Callable[[HybridBlock], bool], StageMapper]] = []


def trunk_units(net: HybridBlock) -> list[tuple[str, HybridBlock]]:
    """Top-level children, with plain Sequential containers opened one level."""
    out = []
    for name, child in children(net).items():
        if isinstance(child, (nn.HybridSequential, nn.Sequential)) and len(children(child)) > 1:
            out += [(f"{name}.{k}", c) for k, c in children(child).items()]
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


def stage_map(net: HybridBlock, input_shape: tuple[int, ...]) -> StageMap:
    """Structural parameter name → stage, from one batch-1 forward pass at ``input_shape``;
    ``.how`` says how the map was found."""
    if len(input_shape) != 3:
        raise RuleError(f"stage selectors need an image model (input C,H,W); this model's input shape "
                        f"is {input_shape}. Select by match: or type: instead.")
    for claims, mapper in _FAMILY_MAPPERS:
        if claims(net):
            found = mapper(net, input_shape)
            return found if isinstance(found, StageMap) else \
                StageMap(found, f"family mapper {getattr(mapper, '__name__', type(mapper).__name__)}")
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
    active = is_hybridized(net)
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
    numbered = {s for s in stages.values() if isinstance(s, int)}
    return StageMap(stages, f"output stride of the top-level blocks, {len(numbered)} stages")


class StageMap(dict):
    """Parameter name → stage, and ``how`` the map was found (the plan prints it)."""

    how: str = ""

    def __init__(self, stages: dict, how: str) -> None:
        super().__init__(stages)
        self.how = how


_REDUCE_OPS = frozenset({"mean", "sum", "max", "min", "norm", "_npi_mean", "_npi_sum", "_npi_max"})
_ADD_OPS = frozenset({"broadcast_add", "elemwise_add", "_Plus", "_plus", "add_n", "ElementWiseSum"})
_NCHW_OPS = frozenset({"Convolution", "Pooling", "BatchNorm", "InstanceNorm", "GroupNorm"})


def _extent(shape: tuple[int, ...]) -> int:
    """Positions a tensor still spans: H·W of a map, N of a token sequence, 1 once pooled."""
    if len(shape) <= 2:
        return 1
    return shape[1] if len(shape) == 3 else math.prod(shape[2:])


def _positions(node: dict, shape: tuple[int, ...]) -> int | None:
    """Spatial positions of an output whose layout the op fixes: N,C,H,W for convolutions, pools
    and channel norms; the feature axis last for dense layers and LayerNorm (tokens, NHWC).
    Other ops (reshapes, window partitions, attention products) say nothing about stride."""
    if not shape or shape[0] != 1 or any(d <= 0 for d in shape):
        return None
    op, attrs = node["op"], node.get("attrs", {})
    if op in _NCHW_OPS and len(shape) == 4:
        if op == "Pooling" and attrs.get("global_pool") == "True":
            return None
        return shape[2] * shape[3]
    if op == "FullyConnected" and attrs.get("flatten") == "False" and len(shape) >= 3:
        return math.prod(shape[1:-1])
    if op == "LayerNorm" and len(shape) >= 3 and int(attrs.get("axis", "-1")) in (-1, len(shape) - 1):
        return math.prod(shape[1:-1])
    return None


def _collapses(node: dict, shape: tuple[int, ...], in_shape: tuple[int, ...]) -> bool:
    """A global reduction: the output no longer spans positions its input spanned (a global
    pool, a mean over space or tokens, a class-token pick, a flatten to (1, K))."""
    if not shape or not in_shape:
        return False
    attrs = node.get("attrs", {})
    if node["op"] == "Pooling" and attrs.get("global_pool") == "True":
        return True
    if node["op"] in _REDUCE_OPS and len(in_shape) == 4 and "axis" in attrs:
        axes = {int(a) % 4 for a in re.findall(r"-?\d+", attrs["axis"])}
        if {2, 3} <= axes:
            return True
    if len(shape) == 2 and len(in_shape) >= 3 and shape[0] == 1:
        return True
    if node["op"] in ("Convolution", "Deconvolution", "Pooling"):  # a strided layer reaching 1×1 at a small input
        return False
    return _extent(in_shape) > 1 and _extent(shape) == 1


def graph_stage_map(net: SymbolBlock, input_shape: tuple[int, ...]) -> StageMap:
    """Stages of an imported graph, from its data flow (no layer names needed).

    ``head`` is what follows the last global reduction on the way to the output: a reduction
    whose result is combined again with a feature map (squeeze-excitation, attention pooling) is
    inside a block, not the end of the backbone. The rest is numbered by output stride as for
    zoo CNNs; a graph with one stride after its patch embedding (a ViT) is numbered by its
    repeated residual units instead, the layers before the first unit being the stem. Stages
    flow along data edges, not node order: a feature tap pooled for a new head must not turn
    the layers computed after it (in the file's order) into head layers."""
    inputs, sym = cached_graph(net)
    data_inputs = {s.name for s in inputs}
    internals = sym.get_internals()
    first = inputs[0].name
    _, out_shapes, _ = internals.infer_shape_partial(**{first: (1, *input_shape)})
    shape_by_name = dict(zip(internals.list_outputs(), out_shapes))
    nodes = graph_nodes(net)
    n = len(nodes)
    is_data = [False] * n
    shapes: list[tuple[int, ...]] = [()] * n
    data_in: list[list[int]] = [[] for _ in range(n)]
    params_of: list[list[str]] = [[] for _ in range(n)]
    consumers: list[list[int]] = [[] for _ in range(n)]
    for i, node in enumerate(nodes):
        if node["op"] == "null":
            is_data[i] = node["name"] in data_inputs
            shapes[i] = (1, *input_shape) if is_data[i] else ()
            continue
        refs = node["inputs"][-1:] if node["op"].endswith("_like") else []  # read for its shape only
        for j, *_ in node["inputs"]:
            if [j, *_] in refs:
                continue
            consumers[j].append(i)
            if is_data[j]:
                data_in[i].append(j)
            elif nodes[j]["op"] == "null":
                params_of[i].append(nodes[j]["name"])
        is_data[i] = bool(data_in[i])
        s = tuple(shape_by_name.get(f"{node['name']}_output") or ())
        shapes[i] = s if s and all(d > 0 for d in s) else ()
    desc = [0] * n  # bitsets: data nodes reachable from each node, itself included
    for i in reversed(range(n)):
        if is_data[i]:
            d = 1 << i
            for c in consumers[i]:
                d |= desc[c]
            desc[i] = d
    anc = [0] * n
    for i in range(n):
        if is_data[i]:
            a = 1 << i
            for j in data_in[i]:
                a |= anc[j]
            anc[i] = a

    # Global reductions; one whose result meets a feature map it does not derive from is in a block.
    head = pooled = 0
    for i in range(n):
        if not is_data[i] or nodes[i]["op"] == "null" or not data_in[i]:
            continue
        if not _collapses(nodes[i], shapes[i], shapes[data_in[i][0]]):
            continue
        merges = [k for k in _bits(desc[i] & ~(1 << i)) if any(
            not (desc[i] >> j) & 1 and _extent(shapes[j]) > 1 for j in data_in[k])]
        if not merges:
            head |= desc[i]
        else:
            after = 0
            for k in merges:
                after |= desc[k]
            pooled |= desc[i] & ~after

    if head and not any((head >> i) & 1 for i in range(n) if params_of[i]):
        head |= _classifier_conv(head, nodes, data_in, params_of)

    in_h, in_w = input_shape[1], input_shape[2]
    param_nodes = [i for i in range(n) if is_data[i] and params_of[i]]
    with_params = sum(1 << i for i in param_nodes)
    stem_chain = _stem_chain(nodes, is_data, data_in, consumers)
    stride_stage: dict[int, Stage] = {}
    for i in range(n):
        if not is_data[i] or nodes[i]["op"] == "null" or (head >> i) & 1:
            continue
        before = [stride_stage[j] for j in data_in[i] if j in stride_stage]
        st: Stage = max(before, key=_order) if before else STEM
        pos = None if (pooled >> i) & 1 else _positions(nodes[i], shapes[i])
        if pos is not None:
            stride = math.sqrt(in_h * in_w / pos)
            own: Stage = STEM if stride < 2 ** 1.5 else max(1, int(round(math.log2(stride))) - 1)
            if nodes[i]["op"] == "Convolution" and _order(own) > _order(st):
                for j in _block_lead(i, nodes, data_in, consumers, params_of, desc, anc, with_params):
                    if j not in stem_chain:
                        stride_stage[j] = own
            st = max(st, own, key=_order)
        stride_stage[i] = st
    numbered = {stride_stage[i] for i in param_nodes if i in stride_stage} - {STEM}
    node_stage: dict[int, Stage] = dict(stride_stage)
    how = f"output stride, {len(numbered)} stage{'s' * (len(numbered) != 1)}"
    units = _residual_units(nodes, is_data, data_in, desc, anc, param_nodes, head) if len(numbered) == 1 else None
    if units and units[1] > 1:  # one stride after the patch embedding: number the repeated units
        node_stage, count = units
        how = f"repeated residual blocks, {count}"
    else:
        lead = [i for i in stem_chain if nodes[i]["op"] == "Convolution" and node_stage.get(i) == 1]
        strided = [i for i in lead if max(map(int, re.findall(r"\d+", nodes[i].get("attrs", {}).get("stride", "1")))) > 1]
        if all(_order(node_stage.get(i, STEM)) <= 1 for i in stem_chain) and len(lead) <= 1 and lead == strided:
            node_stage.update({i: STEM for i in stem_chain if i in node_stage})
    for i in range(n):
        if (head >> i) & 1 and is_data[i]:
            node_stage[i] = HEAD
    for i in reversed(range(n)):  # weights computed from weights (a transposed MatMul weight): their user's
        if nodes[i]["op"] != "null" and not is_data[i]:
            users = [node_stage[c] for c in consumers[i] if c in node_stage]
            if users:
                node_stage[i] = users[0]
    by_node = {nodes[i]["name"]: st for i, st in node_stage.items()}
    by_param: dict[str, Stage] = {}
    for i in range(n):
        if i in node_stage:
            for p in params_of[i]:
                by_param.setdefault(p, node_stage[i])
    last = node_stage[max(node_stage)] if node_stage else STEM
    out = {}
    for name, e in named_params(net).items():
        if e.layer is not None and e.layer.node in by_node:
            out[name] = by_node[e.layer.node]
        else:
            out[name] = by_param.get(e.param.name, by_param.get(name, last))
    return StageMap(out, how + (", head after the last global pool" if head else ", no global pool (no head)"))


def _block_lead(i, nodes, data_in, consumers, params_of, desc, anc, with_params) -> list[int]:
    """The layers of a block that run before its strided convolution ``i`` (a bottleneck's or
    inverted residual's 1×1 expansion): back along the path to the block's input (a fork or a
    merge), through at most one convolution; a gate ``x·σ(x)`` (SiLU, hard-swish) is no fork.
    They belong to the stage the block opens."""
    def gate_input(j):  # the x of x·f(x) when f has no weights
        if len(data_in[j]) != 2:
            return None
        a, b = data_in[j]
        for x, y in ((a, b), (b, a)):
            if (anc[y] >> x) & 1 and not desc[x] & anc[y] & with_params & ~(1 << x):
                return x
        return None

    out: list[int] = []
    j = i
    while True:
        if len(data_in[j]) == 1:
            p = data_in[j][0]
        else:
            p = gate_input(j)
            if p is None:
                break
            out += [k for k in _bits(desc[p] & anc[j]) if k not in (p, j)]
        if nodes[p]["op"] == "null" or any(not (anc[i] >> c) & 1 for c in consumers[p]):
            break
        if len(data_in[p]) != 1 and gate_input(p) is None:
            break
        out.append(p)
        if nodes[p]["op"] in ("Convolution", "FullyConnected") and params_of[p]:
            break
        j = p
    return out


def _classifier_conv(head: int, nodes, data_in, params_of) -> int:
    """No weights after the last global pool (SqueezeNet: a 1×1 conv classifies every position,
    then the pool averages): the weighted layer right before the pool, and what lies between."""
    out = 0
    for i in _bits(head):
        if any((head >> j) & 1 for j in data_in[i]):
            continue  # not where the head starts
        j = i
        while len(data_in[j]) == 1:
            j = data_in[j][0]
            out |= 1 << j
            if params_of[j] or nodes[j]["op"] == "null":
                break
        if not params_of[j]:
            return 0
    return out


def _stem_chain(nodes, is_data, data_in, consumers) -> list[int]:
    """The single path from the input to the first fork: a patchify stem (a stride-4 convolution
    and its norm, as ConvNeXt and Swin have) is the stem although it runs at stage 1's stride."""
    start = next((i for i, nd in enumerate(nodes) if nd["op"] == "null" and is_data[i]), None)
    out: list[int] = []
    cur = start
    while cur is not None and len(consumers[cur]) == 1:
        nxt = consumers[cur][0]
        if len(data_in[nxt]) != 1:
            break
        out.append(nxt)
        cur = nxt
    return out


def _bits(x: int) -> Iterator[int]:
    while x:
        low = x & -x
        yield low.bit_length() - 1
        x ^= low


def _residual_units(nodes, is_data, data_in, desc, anc, param_nodes, head):
    """Stages by repeated unit: residual adds ``x + f(x)`` (f with weights) along the trunk,
    grouped by the period of their op pattern (a ViT block's attention and MLP adds are one
    unit). Layers before the first unit's input are the stem; after the last add, the last unit."""
    with_params = sum(1 << i for i in param_nodes)
    adds = []
    for i, node in enumerate(nodes):
        if node["op"] not in _ADD_OPS or len(data_in[i]) != 2 or (head >> i) & 1:
            continue
        a, b = data_in[i]
        for x, y in ((a, b), (b, a)):
            if (anc[y] >> x) & 1 and desc[x] & anc[y] & with_params & ~(1 << x):
                adds.append((i, x))
                break
    if len(adds) < 2:
        return None
    trunk = [adds[0]]
    for i, x in adds[1:]:  # the trunk: each add's skip comes from the previous trunk add
        if (anc[x] >> trunk[-1][0]) & 1:
            trunk.append((i, x))
    if len(trunk) < 2:
        return None
    stem_end = trunk[0][1]
    sigs, prev = [], stem_end
    for i, _ in trunk:
        seg = anc[i] & ~anc[prev]
        sigs.append(tuple(sorted(nodes[k]["op"] for k in _bits(seg))))
        prev = i
    m = len(sigs)
    period = next((p for p in range(1, m + 1) if m % p == 0 and all(sigs[k] == sigs[k + p] for k in range(m - p))), 1)
    stages: dict[int, Stage] = {}
    stem = anc[stem_end]
    bounds = [i for i, _ in trunk]
    unit = 0
    for i in range(len(nodes)):
        if not is_data[i] or nodes[i]["op"] == "null":
            continue
        if (stem >> i) & 1:
            stages[i] = STEM
            continue
        while unit < len(bounds) and i > bounds[unit]:
            unit += 1
        stages[i] = min(unit, len(bounds) - 1) // period + 1
    return stages, m // period


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
