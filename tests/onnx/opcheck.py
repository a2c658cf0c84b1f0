"""Check one converter against onnxruntime on a single-node model.

Independent of the graph importer: inputs named in ``consts`` become initializers in
the ONNX model and ``Tensor``s with a known value (and a variable symbol, as weights
are) on the MXNet side; the others are graph inputs.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np
import onnx
from tests.helpers import assert_f32_close, ort_run
from onnx import helper, numpy_helper

from gluontl.onnx import registry
from gluontl.onnx.registry import Tensor

NP2ONNX = {np.dtype(k): v for k, v in {
    "float32": onnx.TensorProto.FLOAT, "float64": onnx.TensorProto.DOUBLE,
    "int64": onnx.TensorProto.INT64, "int32": onnx.TensorProto.INT32,
    "bool": onnx.TensorProto.BOOL, "uint8": onnx.TensorProto.UINT8,
    "int8": onnx.TensorProto.INT8, "float16": onnx.TensorProto.FLOAT16}.items()}


def i64(*v):
    """An int64 vector: shapes, axes, starts and indices as ONNX takes them."""
    return np.array(v, np.int64)


def make_model(op_type, inputs, attrs, consts=(), opset=17, n_outputs=1, domain=""):
    """The single-node ONNX model that ``run_ort`` runs (for other oracles, e.g. onnx.reference)."""
    names = list(inputs)
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, [n if inputs[n] is not None else "" for n in names], outs,
                            name=f"{op_type.lower()}_node", domain=domain, **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, NP2ONNX[a.dtype], a.shape)
                    for n, a in inputs.items() if a is not None and n not in consts]
    inits = [numpy_helper.from_array(a, n) for n, a in inputs.items() if a is not None and n in consts]
    graph = helper.make_graph([node], "g", graph_inputs,
                              [onnx.ValueInfoProto(name=o) for o in outs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)])
    model.ir_version = min(model.ir_version, 9)
    return model


def run_ort(op_type, inputs, attrs, consts=(), opset=17, n_outputs=1, domain="", reference=False):
    """With ``reference`` the ONNX reference implementation is the oracle (cases onnxruntime lacks)."""
    model = make_model(op_type, inputs, attrs, consts, opset, n_outputs, domain)
    feed = {n: a for n, a in inputs.items() if a is not None and n not in consts}
    if reference:
        from onnx.reference import ReferenceEvaluator
        return model, ReferenceEvaluator(model).run(None, feed)
    return model, ort_run(model, feed)


def build_mx(model, inputs, consts=(), opset=17):
    """The converted symbol group, its argument arrays and aux states."""
    proto = model.graph.node[0]
    node = registry.node_from_proto(proto, opset)
    fn = registry.get(node.op_type, opset, node.domain)
    assert fn is not None, f"no converter for {node.op_type} at opset {opset}"
    # ONNX bools are carried as float32 0/1 on the MXNet side (see ops/elementwise.py).
    # numpy aliases (longlong, intc) reach converters as given; MXNet gets the carrier array
    mx_in = {n: (a.astype(registry.carrier_dtype(a.dtype)) if a is not None else a)
             for n, a in inputs.items()}
    tensors = []
    for n, a in inputs.items():
        if a is None:
            tensors.append(None)
            continue
        tensors.append(Tensor(n, mx.sym.var(n, shape=a.shape, dtype=mx_in[n].dtype),
                              const=a if n in consts else None, shape=a.shape, dtype=a.dtype))
    out = fn(node, tensors)
    outs = out if isinstance(out, (list, tuple)) else [out]
    group = mx.sym.Group([o for o in outs if o is not None])
    args = {n: mx.nd.array(a, dtype=a.dtype) for n, a in mx_in.items() if a is not None}
    aux = {k: args[k] for k in group.list_auxiliary_states()}  # e.g. BatchNorm running stats
    used = set(group.list_arguments())
    return group, {k: v for k, v in args.items() if k in used}, aux


def run_mx(model, inputs, consts=(), opset=17, grad=False):
    group, args, aux = build_mx(model, inputs, consts, opset)
    req = {k: ("write" if grad and v.dtype == np.float32 else "null") for k, v in args.items()}
    grads = {k: mx.nd.zeros_like(v) for k, v in args.items() if req[k] == "write"}
    exe = group.bind(mx.cpu(), args=args, args_grad=grads, grad_req=req, aux_states=aux)
    results = [o.asnumpy() for o in exe.forward(is_train=grad)]
    if grad:
        exe.backward([mx.nd.ones_like(o) for o in exe.outputs])
        return results, {k: g.asnumpy() for k, g in grads.items() if req[k] == "write"}
    return results, {}


def check(op_type, inputs, attrs=None, consts=(), opset=17, n_outputs=1, terms=1, depth=1, cond=1.0,
          grad=False, domain="", reference=False):
    """Assert the converter matches onnxruntime; with ``grad`` also that gradients flow.

    Each output must agree within the float32 bound of helpers.f32_tol at the output's
    scale: ``terms`` is the most values one output sums (a conv's C·kh·kw, a reduction's
    length; 1 for elementwise ops), ``depth`` how many such sums are chained (RNN steps),
    ``cond`` how much cancellation amplifies rounding (a variance as E[x²] - E[x]²: E[x²]/Var)."""
    attrs = attrs or {}
    model, ref = run_ort(op_type, inputs, attrs, consts, opset, n_outputs, domain, reference)
    got, grads = run_mx(model, inputs, consts, opset, grad)
    assert len(got) == len([r for r in ref]), (len(got), len(ref))
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.shape == r.shape, (g.shape, r.shape)
        scale = cond * np.abs(r[np.isfinite(r)].astype(np.float64)).max(initial=0.0)
        assert_f32_close(g, r, scale, terms, depth, err_msg=f"{op_type} output {i}:")
    if grad:
        assert grads, "no float input received a gradient"
        for k, g in grads.items():
            assert np.isfinite(g).all(), k
        assert any(np.abs(g).sum() > 0 for g in grads.values()), "all gradients are zero"
    return got


def check_grad(op_type, inputs, attrs=None, consts=(), opset=17, eps=1e-2, rtol=2e-2, atol=2e-3,
               seed=0):
    """Assert the converter's gradient equals central differences of its own forward, for
    every float32 graph input, on a random projection of the first output (keep inputs
    small: one forward per element)."""
    group, args, aux = build_mx(make_model(op_type, inputs, attrs or {}, consts, opset), inputs,
                                consts, opset)
    wrt = [k for k in args if inputs[k].dtype == np.float32 and k not in consts]
    grads = {k: mx.nd.zeros_like(args[k]) for k in wrt}
    exe = group[0].bind(mx.cpu(), args=args, args_grad=grads,
                        grad_req={k: "write" if k in grads else "null" for k in args},
                        aux_states=aux)
    head = np.random.RandomState(seed).randn(*exe.forward()[0].shape)

    def loss():
        return float((exe.forward()[0].asnumpy().astype(np.float64) * head).sum())

    exe.forward(is_train=True)
    exe.backward([mx.nd.array(head, dtype=exe.outputs[0].dtype)])
    for k in wrt:
        x = args[k].asnumpy()
        numeric = np.zeros(x.size)
        for i in range(x.size):
            for sign in (1, -1):
                shifted = x.copy().reshape(-1)
                shifted[i] += sign * eps
                args[k][:] = shifted.reshape(x.shape)
                numeric[i] += sign * loss() / (2 * eps)
        args[k][:] = x
        np.testing.assert_allclose(grads[k].asnumpy().reshape(-1), numeric, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of {op_type} w.r.t. '{k}'")
