"""Turn a Gluon HybridBlock into one MXNet symbol plus its parameter values.

Both exporters share this trace so the symbol files and the ONNX file describe the same
graph: inputs carry the caller's names (not Gluon's ``data``/``data0``), and every output
gets an explicit ``identity`` named after the requested output name, which pins the order
and names of outputs regardless of how ``mx.onnx`` sorts them.
"""
from __future__ import annotations

from dataclasses import dataclass

import mxnet as mx
import numpy as np

from gluontl.errors import ExportError, short_reason
from gluontl.mxinternals import nodes_of


@dataclass(frozen=True)
class TracedBlock:
    """A block's inference graph, in a form both symbol and ONNX writers consume."""

    symbol: mx.sym.Symbol
    arg_params: dict[str, mx.nd.NDArray]
    aux_params: dict[str, mx.nd.NDArray]
    input_shapes: dict[str, tuple[int, ...]]
    output_names: list[str]

    def batched_output_shapes(self, batch: int) -> list[tuple[int, ...]]:
        """Output shapes when every input has ``batch`` rows (MXNet's own shape inference)."""
        shapes = {k: (batch, *s[1:]) for k, s in self.input_shapes.items()}
        params = {**self.arg_params, **self.aux_params}
        known = {k: v.shape for k, v in params.items()}
        _, out_shapes, _ = self.symbol.infer_shape(**shapes, **known)
        return [tuple(s) for s in out_shapes]


def _flatten_outputs(out: object) -> list[mx.sym.Symbol]:
    if isinstance(out, (list, tuple)):
        return [s for item in out for s in _flatten_outputs(item)]
    if isinstance(out, mx.sym.Symbol):
        return list(out) if len(out.list_outputs()) > 1 else [out]
    raise ExportError(
        f"The block returned a {type(out).__name__} when traced with symbolic inputs, so it "
        "cannot be exported; make sure its forward only returns MXNet arrays (or lists of them)."
    )


def _flatten_arrays(out: object) -> list[mx.nd.NDArray]:
    if isinstance(out, (list, tuple)):
        return [a for item in out for a in _flatten_arrays(item)]
    return [out]


def dummy_inputs(input_shapes: dict[str, tuple[int, ...]], batch: int, seed: int,
                 dtypes: dict[str, np.dtype] | None = None) -> dict[str, np.ndarray]:
    """Deterministic inputs of the given batch size: standard normal floats; integers and bools
    0 or 1 (valid as token ids, indices and masks of any model)."""
    rng = np.random.RandomState(seed)
    out = {}
    for k, s in input_shapes.items():
        dtype = np.dtype((dtypes or {}).get(k, np.float32))
        shape = (batch, *s[1:])
        out[k] = (rng.standard_normal(shape) if dtype.kind == "f" else rng.randint(0, 2, shape)).astype(dtype)
    return out


def sample_batches(sample: np.ndarray | None, shape: tuple[int, ...]) -> list[tuple[str, np.ndarray]]:
    """What an export of a one-input image model is verified on, with labels for messages: a batch
    of 1 and batches of up to 8 covering ``sample`` (preprocessed images of the batch-1 ``shape``),
    or two random batches (1 and 2) without one."""
    if sample is None:
        return [(f"random batch of {b}", dummy_inputs({"x": shape}, b, seed=b)["x"]) for b in (1, 2)]
    sample = np.asarray(sample, np.float32)
    if sample.ndim != 4 or sample.shape[1:] != shape[1:] or not len(sample):
        raise ExportError(f"sample has shape {sample.shape}; pass preprocessed images shaped (N, "
                          f"{', '.join(map(str, shape[1:]))}) with N >= 1.")
    return [("sample image 0", sample[:1])] + [(f"sample images {i}-{min(i + 8, len(sample)) - 1}", sample[i:i + 8])
                                               for i in range(0, len(sample), 8)]


def predict(block: mx.gluon.HybridBlock, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run the block in inference mode; ``inputs`` order is the block's positional order.

    Inputs go to the context of the block's first parameter: a block trained on several
    contexts (or only on cpu(1)) cannot be called with arrays on the default context.
    """
    params = list(block.collect_params().values())
    ctx = params[0].list_ctx()[0] if params else mx.cpu()
    args = [mx.nd.array(v, dtype=np.float32 if v.dtype == np.bool_ else v.dtype, ctx=ctx)  # MXNet has no bool
            for v in inputs.values()]
    with mx.autograd.predict_mode():
        out = block(*args)
    return [a.asnumpy() for a in _flatten_arrays(out)]


def _check_input_shapes(input_shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    if not input_shapes:
        raise ExportError("input_shapes is empty: pass one batch-1 shape per block input, e.g. {'data': (1, 3, 224, 224)}.")
    fixed = {}
    for name, shape in input_shapes.items():
        shape = tuple(int(d) for d in shape)
        if not shape or shape[0] != 1 or any(d <= 0 for d in shape):
            raise ExportError(
                f"input_shapes[{name!r}] is {shape}; give a batch-1 shape with positive sizes such as "
                "(1, 3, 224, 224). The exported file keeps the batch dimension free."
            )
        fixed[str(name)] = shape
    return fixed


def _fixed_gamma_names(sym: mx.sym.Symbol) -> set[str]:
    """Gamma variables of BatchNorm nodes with ``fix_gamma``: MXNet treats them as 1.

    ``mx.onnx`` ignores ``fix_gamma`` and would export whatever value the stored gamma
    holds, so the trace hands it ones instead.
    """
    nodes = nodes_of(sym)
    names = set()
    for node in nodes:
        attrs = node.get("attrs", {})
        if node["op"] == "BatchNorm" and attrs.get("fix_gamma", "True") in ("True", "true", "1"):
            names.add(nodes[node["inputs"][1][0]]["name"])
    return names


def _default_output_names(count: int, taken: set[str]) -> list[str]:
    """``output`` (or ``output0``, ``output1``...), ``_``-prefixed until no model name clashes:
    ONNX-imported graphs often already have a node called ``output``."""
    stem = "output"
    while True:
        names = [stem] if count == 1 else [f"{stem}{i}" for i in range(count)]
        if not taken & set(names):
            return names
        stem = "_" + stem


def trace_block(
    block: mx.gluon.HybridBlock,
    input_shapes: dict[str, tuple[int, ...]],
    output_names: list[str] | None = None,
) -> TracedBlock:
    """Trace ``block`` symbolically; ``input_shapes`` order is the block's argument order."""
    if not isinstance(block, mx.gluon.HybridBlock):
        raise ExportError(
            f"Only Gluon HybridBlocks can be exported, got {type(block).__name__}; convert the model "
            "to HybridBlocks (or load it as a SymbolBlock) first."
        )
    input_shapes = _check_input_shapes(input_shapes)
    # A real forward pass finishes deferred parameter initialisation and proves the shapes fit.
    try:
        predict(block, dummy_inputs(input_shapes, 1, seed=0))
    except (mx.base.MXNetError, ValueError) as err:
        raise ExportError(
            f"The block failed on inputs of shape {input_shapes}: {short_reason(err)}. "
            "Check input_shapes (names in the block's argument order, batch-1 shapes) and that all "
            "parameters are initialised."
        ) from err
    try:
        outputs = _flatten_outputs(block(*[mx.sym.var(name) for name in input_shapes]))
    except (mx.base.MXNetError, AttributeError, TypeError, AssertionError) as err:
        raise ExportError(
            f"{type(block).__name__} could not be traced symbolically ({type(err).__name__}: {err}); "
            "its forward must only use F.* operators (no NumPy, .shape or .asnumpy()) to be exportable."
        ) from err

    taken = {n.rsplit("_output", 1)[0] for n in mx.sym.Group(outputs).get_internals().list_outputs()}
    taken |= set(input_shapes)
    if output_names is None:
        output_names = _default_output_names(len(outputs), taken)
    output_names = [str(n) for n in output_names]
    if len(output_names) != len(outputs) or len(set(output_names)) != len(output_names):
        raise ExportError(
            f"output_names {output_names} must be {len(outputs)} distinct names, one per block output."
        )
    clashes = sorted(set(output_names) & taken)
    if clashes:
        raise ExportError(
            f"output_names {clashes} already name an input, layer or parameter of the model; "
            "pass different output_names."
        )
    sym = mx.sym.Group([mx.sym.identity(o, name=n) for o, n in zip(outputs, output_names)])

    params = {p.name: p for p in block.collect_params().values()}
    fixed_gamma = _fixed_gamma_names(sym)
    missing = [n for n in sym.list_arguments() if n not in input_shapes and n not in params]
    if missing:
        raise ExportError(
            f"The traced graph needs inputs {missing} that are neither in input_shapes {list(input_shapes)} "
            "nor parameters of the block; list every block input in input_shapes, in argument order."
        )

    def value(name: str) -> mx.nd.NDArray:
        data = params[name].data(params[name].list_ctx()[0]).copyto(mx.cpu())
        return mx.nd.ones_like(data) if name in fixed_gamma else data

    arg_params = {n: value(n) for n in sym.list_arguments() if n not in input_shapes}
    aux_params = {n: value(n) for n in sym.list_auxiliary_states()}
    return TracedBlock(sym, arg_params, aux_params, input_shapes, output_names)
