"""Model sources: ``zoo:NAME``, ``symbol:PREFIX`` and ``onnx:PATH`` behind one function.

Bare paths and names become these forms in one place, ``recipe.resolve_source``.
"""
from __future__ import annotations

import contextlib
import difflib
import io
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import mxnet as mx
from mxnet.gluon import HybridBlock

from ..errors import ModelSourceError, hwc_hint, short_reason
from ..mxinternals.graphblock import GraphBlock
from ..naming import graph_nodes, named_params, shape_of
from ..recipe import ModelSpec, as_spec, resolve_source
from ..zoo import DEFAULT_SHAPE, zoo_input_shape, zoo_names
from .restore import RestoreReport, restore

__all__ = ["load_model", "build_model", "check_input_shape", "input_shapes", "make_model_file", "model_inputs",
           "resolve_source", "zoo_input_shape", "zoo_names", "RestoreReport", "restore"]


def zoo_block(name: str, classes: int | None, kwargs: dict[str, Any], pretrained: bool, ctx) -> HybridBlock:
    names = zoo_names()
    key = name.lower()
    if key not in names:
        close = difflib.get_close_matches(key, names, n=5)
        raise ModelSourceError(
            f"'{name}' is not a Gluon or GluonCV model-zoo name. Close matches: {', '.join(close) or 'none'}. "
            f"`gluontl zoo` lists all {len(names)} names.")
    args = dict(kwargs)
    if classes is not None:
        args["classes"] = classes
    cache = Path(os.environ.get("MXNET_HOME") or "~/.mxnet").expanduser() / "models"
    before = set(os.listdir(cache)) if cache.is_dir() else None
    made = [d for d in (cache, cache.parent) if not d.exists()]  # folders the download may create
    try:
        from gluoncv.model_zoo import get_model

        if pretrained or "pretrained_base" in args:
            net = get_model(key, pretrained=pretrained, ctx=ctx, **args)
        else:  # GluonCV detection/segmentation models fetch ImageNet backbones unless told not to
            try:
                net = get_model(key, pretrained=False, ctx=ctx, pretrained_base=False, **args)
            except TypeError as e:
                if "pretrained_base" not in str(e):
                    raise
                net = get_model(key, pretrained=False, ctx=ctx, **args)
    except (OSError, ConnectionError) as e:
        _tidy_zoo_cache(cache, before, made)
        raise ModelSourceError(
            f"Downloading pretrained weights for '{name}' failed ({type(e).__name__}: {str(e)[:160]}). Without "
            f"network access, put the zoo's .params file in the zoo cache (~/.mxnet/models), set "
            f"model.weights to a local file instead of pretrained: true, or start from the ImageNet "
            f"EfficientNet-Lite0 gluontl makes offline (the README's offline recipe: source "
            f"\"${{GLUONTL_HOME}}/models/efficientnet_lite0_imagenet.onnx\", surgery cut_at: flatten).") from None
    except TypeError as e:
        raise ModelSourceError(f"zoo model '{name}' does not accept these arguments: {e}. "
                               f"Check model.kwargs in the recipe.") from None
    if not isinstance(net, HybridBlock):
        raise ModelSourceError(f"zoo model '{name}' is not a HybridBlock and cannot be hybridized.")
    return net


class ZooInit(mx.init.Xavier):
    """Xavier for weights; vectors that GluonCV's symbol parts (SSD feature expanders) leave
    without an initializer get ones (gamma, variance) or zeros, as Xavier cannot fill them."""

    def _init_weight(self, name, arr):
        if len(arr.shape) >= 2:
            super()._init_weight(name, arr)
        else:
            arr[:] = 1.0 if str(name).endswith(("gamma", "_var")) else 0.0


_EPOCH = re.compile(r"-(\d{4})\.params$")


def _symbol_files(prefix: str, epoch: int | None) -> tuple[Path, Path]:
    sym_file = Path(f"{prefix}-symbol.json")
    if not sym_file.is_file():
        raise ModelSourceError(f"Symbol file '{sym_file}' does not exist; symbol:PREFIX expects "
                               f"PREFIX-symbol.json and PREFIX-NNNN.params (as HybridBlock.export writes).")
    if epoch is None:
        found = sorted(sym_file.parent.glob(f"{Path(prefix).name}-[0-9][0-9][0-9][0-9].params"))
        if not found:
            raise ModelSourceError(f"No '{prefix}-NNNN.params' next to '{sym_file}'. Export the "
                                   f"parameters too, or set model.weights to a .params file.")
        return sym_file, found[-1]
    params = Path(f"{prefix}-{epoch:04d}.params")
    if not params.is_file():
        raise ModelSourceError(f"Parameters file '{params}' does not exist (model.epoch: {epoch}).")
    return sym_file, params


def _load_symbol(sym_file: Path) -> mx.sym.Symbol:
    try:
        return mx.sym.load(str(sym_file))
    except Exception as e:  # MXNetError for bad JSON, UnicodeDecodeError for binary files
        raise ModelSourceError(f"Symbol file '{sym_file}' is not a valid MXNet symbol JSON "
                               f"({short_reason(e)}).") from None


def _tidy_zoo_cache(cache: Path, before: set[str] | None, made: list[Path]) -> None:
    """Remove what a failed zoo download left in the model cache: the download's ``.lock`` file
    (GluonCV's ``portalocker`` leaves it), a partial ``.zip`` and its temporary folders, and the
    folders the download made. Entries that were there before stay."""
    if not cache.is_dir():
        return
    for name in set(os.listdir(cache)) - (before or set()):
        path = cache / name
        if not (name.endswith((".lock", ".zip")) or ".zip" in name or path.is_dir()):
            continue  # a finished .params file of another process: keep it
        with contextlib.suppress(OSError):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for folder in made:
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty


def _symbol(prefix: str, input_names: list[str], epoch: int | None, ctx) -> HybridBlock:
    sym_file, params = _symbol_files(prefix, epoch)
    args = set(_load_symbol(sym_file).list_arguments())
    missing = [n for n in input_names if n not in args]
    if missing:
        raise ModelSourceError(f"Symbol '{sym_file}' has no input named {missing}; its variables include "
                               f"{', '.join(sorted(a for a in args if not a.endswith(('_weight', '_bias')))[:8])}. "
                               f"Set model.input_name (on the command line: --input-shape NAME=1,C,H,W).")
    try:
        with warnings.catch_warnings():  # input dtypes are known at the first call; the warning is noise
            warnings.filterwarnings("ignore", "Cannot decide type", UserWarning)
            return GraphBlock.from_files(str(sym_file), input_names, str(params), ctx=ctx)
    except Exception as e:
        raise ModelSourceError(f"Loading '{params}' into '{sym_file}' failed: {short_reason(e, 300)}.") from None


def _symbol_inputs(prefix: str, epoch: int | None) -> list[str]:
    """``data`` when the graph has it, else the variables the parameters file does not fill."""
    sym_file, params = _symbol_files(prefix, epoch)
    args = _load_symbol(sym_file).list_arguments()
    if "data" in args:
        return ["data"]
    try:
        stored = mx.nd.load(str(params))
    except Exception as e:
        raise ModelSourceError(f"Parameters file '{params}' is not a readable MXNet .params file "
                               f"({short_reason(e)}).") from None
    names = {k.partition(":")[2] or k for k in stored} if isinstance(stored, dict) else set()
    return [a for a in args if a not in names]


Shape = tuple[int | str | None, ...] | None
def model_inputs(source: str, *, epoch: int | None = None) -> list[tuple[str, Shape]]:
    """The model's own inputs with the batch-first shape it declares (None: it declares none).

    ONNX files declare shapes (strings for symbolic dims); zoo models read ``data`` and
    symbol checkpoints name their inputs but carry no shapes.
    """
    scheme, _, rest = resolve_source(source).partition(":")
    if scheme == "zoo":
        return [("data", None)]
    if scheme == "symbol":
        return [(n, None) for n in _symbol_inputs(rest, epoch)]
    from ..convert.efficientnet_lite import ensure_onnx_file
    from ..onnx import inspect_onnx

    return [(name, shape) for name, shape, _ in inspect_onnx(ensure_onnx_file(rest), check=False).inputs]


def make_model_file(source: str) -> None:
    """Make the file a model source names when gluontl makes it on first use (the ImageNet
    EfficientNet-Lite0 ONNX): ``gluontl launch`` calls this once before its workers start, which
    would otherwise all convert it at the same time."""
    scheme, _, rest = resolve_source(source).partition(":")
    if scheme == "onnx":
        from ..convert.efficientnet_lite import ensure_onnx_file

        ensure_onnx_file(rest)


def input_shapes(source: str, given: Mapping[str | None, tuple[int, ...]] | None = None, *,
                 epoch: int | None = None) -> dict[str, tuple[int, ...]]:
    """Batch-first shape of every model input, in the model's order: ``given`` (the
    ``--input-shape`` values; key None is the first input) over what the model declares.

    Checked before anything runs, so a wrong rank or a symbolic dimension without a value
    is a message naming the input, not an MXNet error. An input without a declared shape
    defaults, when it is the model's only input, to the zoo model's own size
    (``zoo_input_shape``) or 1,3,224,224 (symbol).
    """
    spec = resolve_source(source)
    declared = model_inputs(spec, epoch=epoch)
    names = [n for n, _ in declared]
    given = dict(given or {})
    if None in given:
        if names[0] in given:
            raise ModelSourceError(f"--input-shape gives the first input '{names[0]}' of {spec} twice "
                                   f"(as C,H,W and as {names[0]}=...); keep one.")
        given[names[0]] = given.pop(None)
    unknown = sorted(str(n) for n in given if n not in names)
    if unknown:
        raise ModelSourceError(f"--input-shape names input(s) {', '.join(unknown)}, but {spec} has input(s) "
                               f"{', '.join(names)}. Use NAME=1,C,H,W with those names.")
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in declared:
        if name in given:
            if shape is not None and len(given[name]) != len(shape):
                raise ModelSourceError(
                    f"--input-shape for input '{name}' of {spec} has {len(given[name]) - 1} dims after the batch "
                    f"{given[name][1:]}, but the model declares {len(shape) - 1}: {_dims(shape)}. Pass "
                    f"--input-shape {name}={_dims(shape, 1)} (or C,H,W style for the first input).")
            _check_shape(spec, name, given[name], shape, "--input-shape")
            shapes[name] = given[name]
        elif shape is None:
            if len(declared) > 1:
                raise ModelSourceError(f"Input '{name}' of {spec} has no declared shape; give each input's shape "
                                       f"with --input-shape {name}=1,C,H,W (repeatable).")
            shapes[name] = (1, *(zoo_input_shape(spec) if spec.startswith("zoo:") else DEFAULT_SHAPE))
        else:
            free = [f"{d or '?'} (dim {i})" for i, d in enumerate(shape) if i and not isinstance(d, int)]
            if free:
                raise ModelSourceError(
                    f"Input '{name}' of {spec} has symbolic dimension(s) {', '.join(free)} in its shape "
                    f"{_dims(shape)}; give values with --input-shape {name}={_dims(shape, 1)}.")
            shapes[name] = (1, *shape[1:])
    return shapes


def _check_shape(source: str, name: str, given: tuple[int, ...], declared: Shape, option: str) -> None:
    """``given`` (batch first) against the sizes the model declares after the batch, naming ``option``;
    without a declared shape, one that looks channels-last is refused (gluontl feeds C,H,W images)."""
    hint = hwc_hint(given[1:])
    text = f"{option} {','.join(map(str, given[1:]))} for input '{name}' of {source}"
    if declared is None:
        if hint:
            raise ModelSourceError(f"{text}:{hint} Give {option} as C,H,W.")
        return
    clash = [k for k, (g, d) in enumerate(zip(given, declared)) if k and isinstance(d, int) and g != d]
    if clash:
        raise ModelSourceError(
            f"{text} conflicts with the shape the model declares, {_dims(declared)} (batch first), at dimension "
            f"{clash[0]}.{hint} Give {option} in the model's order (after the batch): {_dims(declared[1:])}.")


def check_input_shape(spec: ModelSpec, name: str, ends: Sequence[str] = ()) -> None:
    """A recipe's ``model.input_shape`` against the shape an ONNX source declares for input ``name``
    (other sources declare none), before the model is built: the error names the recipe key.
    With ``ends`` (the nodes a dense head reads) H and W are free: ``load_model`` binds the graph
    up to them at another size where it is fully convolutional, and says why where it is not."""
    shape = (1, *spec.input_shape)
    declared = dict(model_inputs(spec.source)).get(name) if spec.source.startswith("onnx:") else None
    if ends and declared is not None and len(declared) == 4:
        declared = (*declared[:2], None, None)
    if declared is None or len(declared) == len(shape):  # a rank mismatch: import's own message
        _check_shape(spec.source, name, shape, declared, "model.input_shape")


def declared_shape(spec: ModelSpec) -> tuple[int, ...]:
    """The C, H, W an ONNX source declares for the recipe's input when it declares every one of
    them, else ``model.input_shape``."""
    if spec.source.startswith("onnx:"):
        declared = dict(model_inputs(spec.source)).get(model_input_name(spec))
        if declared is not None and len(declared) == 1 + len(spec.input_shape) and \
                all(isinstance(d, int) for d in declared[1:]):
            return tuple(declared[1:])
    return tuple(spec.input_shape)


def weight_names(source: str) -> set[str]:
    """The names of an ONNX source's initializers (its parameters keep them), empty for other
    sources: what a classifier file of the source may hold past a cut."""
    scheme, _, rest = resolve_source(source).partition(":")
    if scheme != "onnx":
        return set()
    from ..convert.efficientnet_lite import ensure_onnx_file
    from ..onnx.importer import read_proto

    return {t.name for t in read_proto(ensure_onnx_file(rest)).graph.initializer}


def _dims(shape: tuple, batch: int | None = None) -> str:
    """``batch,3,H,W`` for messages; ``batch`` replaces dim 0, symbolic dims print upper-case."""
    dims = [batch if i == 0 and batch is not None else d for i, d in enumerate(shape)]
    return ",".join(str(d).upper() if isinstance(d, str) else str(d if d is not None else "?") for d in dims)


def load_model(spec: str | ModelSpec | Mapping[str, Any], *, classes: int | None = None, ctx=None,
               input_shapes: Mapping[str, tuple] | None = None, ends: Sequence[str] = ()) -> HybridBlock:
    """A model from ``zoo:NAME``, ``symbol:PREFIX`` or ``onnx:PATH`` (or a bare name or path),
    parameters initialized; ``input_shapes`` names a symbol's or ONNX file's inputs, batch
    first (N,C,H,W) as ``export_onnx`` takes them (ONNX files, whose rank is declared, also take
    C,H,W). Zoo models default to ``zoo_input_shape``; a zoo model's C,H,W given here is refused,
    as (1,H,W) from a shape missing its channels would read the same.

    ``classes`` rebuilds a zoo model's classifier for N classes (its own head layer,
    GluonCV ``reset_class`` style). Weights of zoo models come from ``pretrained`` (the
    zoo's download cache) — other weights are restored by ``build_model``.

    ``ends``: the nodes a dense head will read. An ONNX file asked for another H, W than it
    declares is then cut after them and bound at that size, where the graph up to them is
    fully convolutional (``gluontl.onnx.spatial``); a classifier's Flatten -> Gemm past them
    no longer holds it to its training size.
    """
    if isinstance(spec, str):
        spec = ModelSpec(source=resolve_source(spec))  # a bad spec: ModelSourceError, not pydantic's
    spec = as_spec(spec, ModelSpec, "model", ModelSourceError, "{'source': 'zoo:resnet18_v1'}",
                   "A model takes the keys of a recipe's model section (see docs/recipes.md).")
    ctx = ctx or mx.cpu()
    scheme, _, rest = spec.source.partition(":")
    if scheme == "zoo":
        net = zoo_block(rest, classes, spec.kwargs, spec.pretrained, ctx)
        if not spec.pretrained:
            net.initialize(ZooInit(), ctx=ctx)
        shape = spec.input_shape if "input_shape" in spec.model_fields_set else zoo_input_shape(rest)
        # Gluon defers shapes to the first forward; callers get parameters they can read.
        materialize(net, dict(input_shapes or {"data": (1, *shape)}), ctx, spec.source)
        return net
    if classes is not None:
        raise ModelSourceError(f"A new classifier for {spec.source} needs surgery (cut_at / drop_last + head); "
                               f"only zoo: models can rebuild their own head from a class count.")
    if scheme == "symbol":
        return _symbol(rest, list(input_shapes or [spec.input_name]), spec.epoch, ctx)
    from ..convert.efficientnet_lite import ensure_onnx_file
    from ..onnx import import_model

    path = ensure_onnx_file(rest)
    if ends and input_shapes:
        return _bound(path, ends, input_shapes, ctx)
    return import_model(path, input_shapes=input_shapes, ctx=ctx)


def _bound(path: str, ends: Sequence[str], input_shapes: Mapping[str, tuple], ctx) -> HybridBlock:
    """The ONNX file imported up to ``ends`` at the H, W its first input is given, when that
    differs from the size the file declares (else imported whole, as it is)."""
    from ..onnx import import_model, rebind_spatial
    from ..onnx.importer import load

    proto, _ = load(path)
    name, shape = next(iter(input_shapes.items()))
    declared = next(([d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
                     for i in proto.graph.input if i.name == name), None)
    hw = tuple(int(d) for d in shape[-2:])
    if declared is None or len(declared) != 4 or len(shape) != 4 or tuple(declared[2:]) == hw:
        return import_model(proto, input_shapes=input_shapes, ctx=ctx, source=path)
    return import_model(rebind_spatial(proto, ends, name, hw, path), input_shapes=input_shapes, ctx=ctx,
                        source=path)


def build_model(spec: ModelSpec, *, classes: int | None = None, head_init: str = "xavier", ctx=None,
                input_shapes: Mapping[str, tuple[int, ...]] | None = None, ends: Sequence[str] = ()
                ) -> tuple[HybridBlock, RestoreReport | None]:
    """``load_model`` + shapes made concrete + ``weights`` restored and checked against expectations.

    ``input_shapes`` (batch-first, every input in call order) defaults to the spec's one
    input, named by ``model.input_name`` or else by the model itself. Parameters that are
    not restored keep a fresh ``head_init`` initialization, so a new head is initialized
    the way the recipe says. ``ends``: as ``load_model``'s.
    """
    ctx = ctx or mx.cpu()
    shapes = dict(input_shapes or {model_input_name(spec): (1, *spec.input_shape)})
    if input_shapes is None:
        check_input_shape(spec, next(iter(shapes)), ends)
    net = load_model(spec, classes=classes, ctx=ctx, input_shapes=shapes, ends=ends)
    if not spec.source.startswith("zoo:"):  # load_model ran zoo models at these shapes already
        materialize(net, shapes, ctx, spec.source)
    if spec.random_init:
        reinitialize(net)
    if not spec.weights:
        return net, None
    report = restore(net, spec.weights, prefix_map=spec.restore.prefix_map, only=spec.restore.only)
    report.check(spec.restore.expect_missing, spec.restore.expect_unexpected, spec.restore.expect_mismatch)
    init = INITS[head_init]()
    entries = named_params(net)
    for name in report.not_restored():
        p = entries[name].param
        p.set_data(_init_array(init, p))
    return net, report


# Per layer type, the initializer of each parameter input after the data, in input order.
_ROLE_INIT = {"BatchNorm": (mx.init.One, mx.init.Zero, mx.init.Zero, mx.init.One),  # scale, shift, mean, var
              **dict.fromkeys(("LayerNorm", "GroupNorm", "InstanceNorm"), (mx.init.One, mx.init.Zero)),
              "PReLU": (lambda: mx.init.Constant(0.25),)}  # Gluon's PReLU default slope
_GLUON_ROLE = {"gamma": 0, "beta": 1, "running_mean": 2, "running_var": 3, "alpha": 0}


def reinitialize(net: HybridBlock) -> None:
    """Every parameter afresh, as Gluon initializes a new layer: Xavier for weights, zero biases,
    normalization at identity, PReLU slope 0.25. Imported graphs name tensors freely
    (``bn0.weight`` is a BN scale), so such a parameter's role comes from its input position on
    the node, not from its name."""
    for e in named_params(net).values():
        p, layer = e.param, e.layer
        if isinstance(p, mx.gluon.Constant):  # buffers (a detector's anchors), not weights
            continue
        arr = mx.nd.zeros(shape_of(p), dtype=p.dtype)
        if layer is not None and layer.type in _ROLE_INIT:
            if layer.node is None:  # a Gluon block: its attribute names say the role
                role = _GLUON_ROLE[e.name.rsplit(".", 1)[-1]]
            else:
                nodes = graph_nodes(layer.owner)
                node = next(n for n in nodes if n["name"] == layer.node)
                role = [nodes[i[0]]["name"] for i in node["inputs"]].index(p.name) - 1
            init = _ROLE_INIT[layer.type][role]()
        else:
            init = mx.init.Xavier() if arr.ndim >= 2 else mx.init.Zero()
        init._init_weight(p.name, arr)
        p.set_data(arr)


def model_input_name(spec: ModelSpec) -> str:
    """``model.input_name``, or the model's own first input when the recipe leaves it out."""
    if "input_name" in spec.model_fields_set or spec.source.startswith("zoo:"):
        return spec.input_name
    names = [n for n, _ in model_inputs(spec.source, epoch=spec.epoch)]
    return names[0] if names else spec.input_name


INITS = {"xavier": mx.init.Xavier, "normal": lambda: mx.init.Normal(0.01), "uniform": mx.init.Uniform,
          "zeros": mx.init.Zero, "msra": mx.init.MSRAPrelu}


def _init_array(init: mx.init.Initializer, p) -> mx.nd.NDArray:
    arr = mx.nd.zeros(p.shape, dtype=p.dtype)
    init(mx.init.InitDesc(p.name), arr)
    return arr


def materialize(net: HybridBlock, shapes: Mapping[str, tuple[int, ...]], ctx, source: str = "the model") -> None:
    """Resolve deferred shapes with one forward at ``shapes`` so plans can show every shape.

    Input shapes come from the user, so a model that rejects them is a user error.
    """
    try:
        # MXNet prints its shape-inference arguments on failure; the message below says it better.
        with mx.autograd.predict_mode(), contextlib.redirect_stdout(io.StringIO()):
            net(*(mx.nd.zeros(s, ctx=ctx) for s in shapes.values()))
            mx.nd.waitall()
    except (mx.base.MXNetError, ValueError) as e:
        given = ", ".join(f"{n} {tuple(s)}" for n, s in shapes.items())
        raise ModelSourceError(
            f"{source} does not accept inputs of shape {given} (batch first): {short_reason(e)}. Set model.input_shape "
            f"in the recipe, or --input-shape on the command line (C,H,W without the batch, or NAME=1,C,H,W), to "
            f"what the model expects.") from None
