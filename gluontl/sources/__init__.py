"""Model sources: ``zoo:NAME``, ``symbol:PREFIX`` and ``onnx:PATH`` behind one function."""
from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import mxnet as mx
from mxnet.gluon import HybridBlock

from ..errors import ModelSourceError
from ..naming import named_params
from ..recipe import ModelSpec
from .restore import RestoreReport, restore

__all__ = ["load_model", "build_model", "zoo_names", "RestoreReport", "restore"]


def zoo_names() -> list[str]:
    """Every zoo model name.

    GluonCV's ``get_model`` also builds every ``mxnet.gluon.model_zoo.vision`` name
    (same architectures and parameter names; a test keeps that true), so one zoo serves both.
    """
    from gluoncv.model_zoo import get_model_list

    return sorted({n.lower() for n in get_model_list()})


def _zoo(name: str, classes: int | None, kwargs: dict[str, Any], pretrained: bool, ctx) -> HybridBlock:
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
    try:
        from gluoncv.model_zoo import get_model

        net = get_model(key, pretrained=pretrained, ctx=ctx, **args)
    except (OSError, ConnectionError) as e:
        raise ModelSourceError(
            f"Downloading pretrained weights for '{name}' failed ({type(e).__name__}: {str(e)[:160]}). Without "
            f"network access, put the zoo's .params file in the zoo cache (~/.mxnet/models) or set "
            f"model.weights to a local file instead of pretrained: true.") from None
    except TypeError as e:
        raise ModelSourceError(f"zoo model '{name}' does not accept these arguments: {e}. "
                               f"Check model.kwargs in the recipe.") from None
    if not isinstance(net, HybridBlock):
        raise ModelSourceError(f"zoo model '{name}' is not a HybridBlock and cannot be hybridized.")
    return net


_EPOCH = re.compile(r"-(\d{4})\.params$")


def _symbol(prefix: str, input_names: list[str], epoch: int | None, ctx) -> HybridBlock:
    sym_file = Path(f"{prefix}-symbol.json")
    if not sym_file.is_file():
        raise ModelSourceError(f"Symbol file '{sym_file}' does not exist; symbol:PREFIX expects "
                               f"PREFIX-symbol.json and PREFIX-NNNN.params (as HybridBlock.export writes).")
    if epoch is None:
        found = sorted(sym_file.parent.glob(f"{Path(prefix).name}-[0-9][0-9][0-9][0-9].params"))
        if not found:
            raise ModelSourceError(f"No '{prefix}-NNNN.params' next to '{sym_file}'. Export the "
                                   f"parameters too, or set model.weights to a .params file.")
        params = found[-1]
    else:
        params = Path(f"{prefix}-{epoch:04d}.params")
        if not params.is_file():
            raise ModelSourceError(f"Parameters file '{params}' does not exist (model.epoch: {epoch}).")
    try:
        sym = mx.sym.load(str(sym_file))
    except Exception as e:
        raise ModelSourceError(f"Symbol file '{sym_file}' is not a valid MXNet symbol JSON "
                               f"({str(e).splitlines()[0][:200]}).") from None
    args = set(sym.list_arguments())
    missing = [n for n in input_names if n not in args]
    if missing:
        raise ModelSourceError(f"Symbol '{sym_file}' has no input named {missing}; its variables include "
                               f"{', '.join(sorted(a for a in args if not a.endswith(('_weight', '_bias')))[:8])}. "
                               f"Set model.input_name.")
    try:
        return mx.gluon.SymbolBlock.imports(str(sym_file), input_names, str(params), ctx=ctx)
    except Exception as e:
        raise ModelSourceError(f"Loading '{params}' into '{sym_file}' failed: "
                               f"{str(e).splitlines()[0][:300]}.") from None


def load_model(spec: str | ModelSpec, *, classes: int | None = None, ctx=None,
               input_shapes: dict[str, tuple] | None = None) -> HybridBlock:
    """A model from ``zoo:NAME``, ``symbol:PREFIX`` or ``onnx:PATH``, parameters initialized.

    ``classes`` rebuilds a zoo model's classifier for N classes (its own head layer,
    GluonCV ``reset_class`` style). Weights of zoo models come from ``pretrained`` (the
    zoo's download cache) — other weights are restored by ``build_model``.
    """
    if isinstance(spec, str):
        spec = ModelSpec(source=spec)
    ctx = ctx or mx.cpu()
    scheme, _, rest = spec.source.partition(":")
    if scheme == "zoo":
        net = _zoo(rest, classes, spec.kwargs, spec.pretrained, ctx)
        if not spec.pretrained:
            net.initialize(mx.init.Xavier(), ctx=ctx)
        return net
    if classes is not None:
        raise ModelSourceError(f"A new classifier for {spec.source} needs surgery (cut_at / drop_last + head); "
                               f"only zoo: models can rebuild their own head from a class count.")
    if scheme == "symbol":
        return _symbol(rest, [spec.input_name], spec.epoch, ctx)
    from ..onnx import import_model

    return import_model(rest, input_shapes=input_shapes, ctx=ctx)


def build_model(spec: ModelSpec, *, classes: int | None = None, head_init: str = "xavier",
                ctx=None) -> tuple[HybridBlock, RestoreReport | None]:
    """``load_model`` + shapes made concrete + ``weights`` restored and checked against expectations.

    Parameters that are not restored keep a fresh ``head_init`` initialization, so a new
    head is initialized the way the recipe says.
    """
    ctx = ctx or mx.cpu()
    net = load_model(spec, classes=classes, ctx=ctx,
                     input_shapes={spec.input_name: (1, *spec.input_shape)})
    materialize(net, spec.input_shape, ctx)
    if not spec.weights:
        return net, None
    report = restore(net, spec.weights, prefix_map=spec.restore.prefix_map, only=spec.restore.only)
    report.check(spec.restore.expect_missing, spec.restore.expect_unexpected, spec.restore.expect_mismatch)
    init = _INITS[head_init]()
    entries = named_params(net)
    for name in report.not_restored():
        p = entries[name].param
        p.set_data(_init_array(init, p))
    return net, report


_INITS = {"xavier": mx.init.Xavier, "normal": lambda: mx.init.Normal(0.01), "uniform": mx.init.Uniform,
          "zeros": mx.init.Zero, "msra": mx.init.MSRAPrelu}


def _init_array(init: mx.init.Initializer, p) -> mx.nd.NDArray:
    arr = mx.nd.zeros(p.shape, dtype=p.dtype)
    init(mx.init.InitDesc(p.name), arr)
    return arr


def materialize(net: HybridBlock, input_shape: tuple[int, ...], ctx) -> None:
    """Resolve deferred shapes with one batch-1 forward so plans can show every shape."""
    with mx.autograd.predict_mode():
        net(mx.nd.zeros((1, *input_shape), ctx=ctx))
