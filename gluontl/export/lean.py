"""Rewrite an ``mx.onnx`` ModelProto into the lean form onnxruntime can optimise.

``mx.onnx`` lists every weight as a graph input as well as an initializer, which tells
onnxruntime the weights may be overridden at run time, so it cannot constant-fold them.
These passes make weights initializer-only, fold inference-mode BatchNormalization into
the Conv/Gemm that feeds it (exact math in float64), and drop nodes that compute nothing.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from gluontl.onnx.control import outer_refs


def weights_to_initializers(graph: onnx.GraphProto) -> None:
    """Remove initializers from ``graph.input`` so they are constants, not overridable inputs."""
    init_names = {t.name for t in graph.initializer}
    keep = [v for v in graph.input if v.name not in init_names]
    del graph.input[:]
    graph.input.extend(keep)


def _rename_tensor(graph: onnx.GraphProto, old: str, new: str) -> None:
    for node in graph.node:
        node.input[:] = [new if n == old else n for n in node.input]
        node.output[:] = [new if n == old else n for n in node.output]


Dim = int | str | None


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[Dim, ...]]:
    """Tensor shapes from ONNX shape inference with data propagation (so Reshape targets
    computed from Shape ops resolve); a symbolic dim is its name, an unknown one None."""
    inferred = shape_inference.infer_shapes(model, data_prop=True).graph
    return {v.name: tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                          for d in v.type.tensor_type.shape.dim)
            for v in (*inferred.input, *inferred.value_info, *inferred.output)
            if v.type.tensor_type.HasField("shape")}


def _is_noop(node: onnx.NodeProto, shapes: dict[str, tuple[Dim, ...]]) -> bool:
    if node.op_type == "Identity":
        return True
    if node.op_type == "Dropout":  # inference mode, unless the mask or training_mode is wired
        return len(node.input) <= 2 and (len(node.output) < 2 or not node.output[1])
    if node.op_type not in ("Flatten", "Reshape"):
        return False
    before, after = shapes.get(node.input[0]), shapes.get(node.output[0])
    if node.op_type == "Flatten" and before is not None and len(before) == 2:
        return True  # (N, C) -> (N, C) for any axis; mx.onnx puts one before every Gemm
    # Equal inferred shapes (a shared symbolic dim is the same value) make it a copy.
    return before is not None and None not in before and before == after


def drop_noop_nodes(model: onnx.ModelProto) -> int:
    """Remove Identity, inference-mode Dropout and shape-preserving Flatten/Reshape; returns
    how many.

    A no-op whose output is a graph output survives only when its input is itself an
    input, initializer or another output (the name cannot then be moved upstream).
    """
    shapes = _shapes(model)
    graph = model.graph
    outputs = {o.name for o in graph.output}
    fixed = outputs | {i.name for i in graph.input} | {t.name for t in graph.initializer}
    removed = 0
    for node in list(graph.node):
        if not _is_noop(node, shapes):
            continue
        src, dst = node.input[0], node.output[0]
        if dst in outputs:
            if src in fixed:
                continue
            graph.node.remove(node)
            _rename_tensor(graph, src, dst)
        else:
            graph.node.remove(node)
            _rename_tensor(graph, dst, src)
        removed += 1
    return removed


def _fold_target(bn: onnx.NodeProto, producers: dict[str, onnx.NodeProto], consumers: Counter,
                 inits: dict[str, onnx.TensorProto], outputs: set[str]) -> onnx.NodeProto | None:
    """The Conv/Gemm whose only consumer is ``bn`` and whose weights are constants, if any."""
    if len(bn.output) != 1 or any(a.name == "training_mode" and a.i for a in bn.attribute):
        return None
    if not all(name in inits for name in bn.input[1:5]):
        return None
    prev = producers.get(bn.input[0])
    if prev is None or prev.op_type not in ("Conv", "Gemm") or consumers[bn.input[0]] != 1:
        return None
    if bn.input[0] in outputs or not all(name in inits for name in prev.input[1:]):
        return None
    if prev.op_type == "Gemm":
        attrs = {a.name: a for a in prev.attribute}
        if "transA" in attrs and attrs["transA"].i:
            return None
        if len(prev.input) > 2 and numpy_helper.to_array(inits[prev.input[2]]).size not in (1, _gemm_width(prev, inits)):
            return None
    return prev


def _gemm_width(gemm: onnx.NodeProto, inits: dict[str, onnx.TensorProto]) -> int:
    trans_b = any(a.name == "transB" and a.i for a in gemm.attribute)
    shape = inits[gemm.input[1]].dims
    return shape[0] if trans_b else shape[1]


def _unique_name(base: str, taken: set[str]) -> str:
    name, i = base, 0
    while name in taken:
        i += 1
        name = f"{base}_{i}"
    taken.add(name)
    return name


def fold_batchnorm(graph: onnx.GraphProto) -> int:
    """Fold BatchNormalization into a preceding Conv/Gemm; returns how many were folded.

    y = gamma * (W x + b - mean) / sqrt(var + eps) + beta, so with s = gamma / sqrt(var + eps)
    the weight's output-channel rows scale by s and the bias becomes (b - mean) * s + beta.
    New weight tensors get fresh names, so weights shared with other nodes stay intact.
    """
    inits = {t.name: t for t in graph.initializer}
    taken = set(inits) | {n for node in graph.node for n in (*node.input, *node.output)}
    outputs = {o.name for o in graph.output}
    folded = 0
    for bn in [n for n in graph.node if n.op_type == "BatchNormalization"]:
        producers = {o: n for n in graph.node for o in n.output}
        consumers = Counter(i for n in graph.node for i in n.input) + Counter(outputs)
        prev = _fold_target(bn, producers, consumers, inits, outputs)
        if prev is None:
            continue
        eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
        gamma, beta, mean, var = (numpy_helper.to_array(inits[n]).astype(np.float64) for n in bn.input[1:5])
        scale = gamma / np.sqrt(var + eps)
        w_init = inits[prev.input[1]]
        w = numpy_helper.to_array(w_init).astype(np.float64)
        if prev.op_type == "Conv":
            w = w * scale.reshape(-1, *([1] * (w.ndim - 1)))
            bias = numpy_helper.to_array(inits[prev.input[2]]).astype(np.float64) if len(prev.input) > 2 else 0.0
        else:
            attrs = {a.name: a for a in prev.attribute}
            alpha = attrs["alpha"].f if "alpha" in attrs else 1.0
            beta_c = attrs["beta"].f if "beta" in attrs else 1.0
            trans_b = "transB" in attrs and attrs["transB"].i
            w = alpha * (w * scale[:, None] if trans_b else w * scale[None, :])
            bias = beta_c * numpy_helper.to_array(inits[prev.input[2]]).astype(np.float64) if len(prev.input) > 2 else 0.0
            for key in ("alpha", "beta"):
                if key in attrs:
                    prev.attribute.remove(attrs[key])
        bias = (np.broadcast_to(bias, scale.shape) - mean) * scale + beta
        dtype = helper.tensor_dtype_to_np_dtype(w_init.data_type)
        w_name = _unique_name(prev.input[1] + "_bnfold", taken)
        b_name = _unique_name((prev.name or prev.output[0]) + "_bias_bnfold", taken)
        graph.initializer.extend([numpy_helper.from_array(w.astype(dtype), w_name),
                                  numpy_helper.from_array(bias.astype(dtype), b_name)])
        inits[w_name], inits[b_name] = graph.initializer[-2], graph.initializer[-1]
        prev.input[:] = [prev.input[0], w_name, b_name]
        prev.output[0] = bn.output[0]
        graph.node.remove(bn)
        folded += 1
    return folded


def _read(graph: onnx.GraphProto) -> set[str]:
    """Tensors the graph's nodes or outputs read, including what a Loop/If/Scan body reads
    from this graph by name (tf2onnx's Keras SimpleRNN body Gathers the outer sequence)."""
    used = {i for node in graph.node for i in node.input} | {o.name for o in graph.output}
    for node in graph.node:
        used |= outer_refs(node)
    return used


def drop_dead_nodes(graph: onnx.GraphProto) -> int:
    """Remove nodes none of whose outputs is read (e.g. the Shape arithmetic that fed a
    Reshape found to be a no-op); returns how many."""
    removed = 0
    while True:
        used = _read(graph)
        dead = [node for node in graph.node if not any(o in used for o in node.output)]
        if not dead:
            return removed
        for node in dead:
            graph.node.remove(node)
        removed += len(dead)


def prune_initializers(graph: onnx.GraphProto) -> None:
    """Drop initializers no node reads (BN statistics and pre-fold weights)."""
    used = _read(graph)
    keep = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)


def make_lean(model: onnx.ModelProto) -> dict[str, int]:
    """Apply all passes in place; returns counts for logging."""
    graph = model.graph
    weights_to_initializers(graph)
    noops = drop_noop_nodes(model)
    folded = fold_batchnorm(graph)
    noops += drop_dead_nodes(graph)
    prune_initializers(graph)
    return {"folded_batchnorm": folded, "dropped_noops": noops}
