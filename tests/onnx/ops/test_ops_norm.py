import mxnet as mx
import numpy as np
import pytest
from tests.helpers import assert_f32_close
from tests.onnx.opcheck import check, check_grad, make_model, run_mx, run_ort

from gluontl.errors import OnnxImportError
from gluontl.onnx import registry
from gluontl.onnx.registry import Tensor



def f(*shape):
    return np.random.randn(*shape).astype("f")


def var_cond(x, axes):
    """E[x²]/Var[x] over ``axes``, worst group: how much a variance computed as
    E[x²] - E[x]² (onnxruntime, and ONNX's function bodies) amplifies rounding."""
    return float(((x.astype(np.float64) ** 2).mean(axis=axes) / x.var(axis=axes, dtype=np.float64)).max())


def _bn_inputs(shape):
    c = shape[1]
    return {"x": f(*shape), "scale": f(c), "bias": f(c), "mean": f(c), "var": np.random.uniform(0.5, 2, c).astype("f")}


def _convert(op, inputs, attrs, opset, consts=(), n_outputs=1):
    model, ref = run_ort(op, inputs, attrs, consts, opset, n_outputs)
    node = registry.node_from_proto(model.graph.node[0], opset)
    tensors = [None if a is None else Tensor(n, mx.sym.var(n), const=a if n in consts else None, shape=a.shape)
               for n, a in inputs.items()]
    return registry.get(op, opset)(node, tensors), ref


@pytest.mark.parametrize("shape,attrs,opset", [
    ((2, 3, 5, 4), {}, 15), ((2, 3, 5, 4), {"epsilon": 1e-2, "momentum": 0.7}, 9),
    ((4, 3), {}, 14), ((2, 3, 7), {"epsilon": 1e-6}, 7), ((2, 3, 2, 3, 2), {}, 15),
])
def test_batch_norm_inference(shape, attrs, opset):
    check("BatchNormalization", _bn_inputs(shape), attrs, consts={"scale", "bias", "mean", "var"},
          opset=opset)


def test_batch_norm_running_stats_are_aux_states_with_onnx_momentum():
    inputs = _bn_inputs((4, 3, 5, 5))
    sym, _ = _convert("BatchNormalization", inputs, {"momentum": 0.8}, 15, consts={"scale", "bias", "mean", "var"})
    assert sym.list_auxiliary_states() == ["mean", "var"]
    assert sym.list_arguments() == ["x", "scale", "bias"]
    args = {k: mx.nd.array(inputs[k]) for k in sym.list_arguments()}
    grads = {k: mx.nd.zeros_like(v) for k, v in args.items()}
    aux = {k: mx.nd.array(inputs[k]) for k in ("mean", "var")}
    exe = sym.bind(mx.cpu(), args=args, args_grad=grads, aux_states=aux)
    y = exe.forward(is_train=True)[0].asnumpy()
    # oneDNN updates running stats in backward, asynchronously: reading them needs waitall.
    exe.backward([mx.nd.array(np.random.randn(*y.shape))])
    mx.nd.waitall()
    x = inputs["x"]
    bm, bv = x.mean(axis=(0, 2, 3)), x.var(axis=(0, 2, 3))
    expect = (x - bm[:, None, None]) / np.sqrt(bv[:, None, None] + 1e-5) * inputs["scale"][:, None, None] \
        + inputs["bias"][:, None, None]
    n = x.size // x.shape[1]  # values per channel in the batch statistics
    assert_f32_close(y, expect, terms=n)  # trains on batch statistics
    assert_f32_close(exe.aux_dict["mean"].asnumpy(), 0.8 * inputs["mean"] + 0.2 * bm, terms=n)
    for k, g in grads.items():
        g = g.asnumpy()
        assert np.isfinite(g).all() and np.abs(g).sum() > 0, k


def test_batch_norm_with_computed_statistics():
    inputs = _bn_inputs((2, 3, 4, 4))
    model, ref = run_ort("BatchNormalization", inputs, {}, (), 15)
    node = registry.node_from_proto(model.graph.node[0], 15)
    tensors = [Tensor(n, mx.sym.var(n) * 1.0 if n in ("mean", "var") else mx.sym.var(n), shape=a.shape)
               for n, a in inputs.items()]
    sym = registry.get("BatchNormalization", 15)(node, tensors)
    got = sym.eval(**{k: mx.nd.array(v) for k, v in inputs.items()})[0].asnumpy()
    assert_f32_close(got, ref[0])


def test_batch_norm_legacy_training_outputs_are_clear_error():
    with pytest.raises(OnnxImportError, match="batchnormalization_node.*inference mode"):
        run_mx(make_model("BatchNormalization", _bn_inputs((2, 3, 4)), {"is_test": 0}, opset=6, n_outputs=5),
               _bn_inputs((2, 3, 4)), opset=6)


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (2, 3, 7)])
def test_instance_norm(shape):
    x, spatial = f(*shape), tuple(range(2, len(shape)))
    check("InstanceNormalization", {"x": x, "s": f(3), "b": f(3)}, {"epsilon": 1e-3}, consts={"s", "b"},
          opset=6, grad=True, terms=int(np.prod(shape[2:])), cond=var_cond(x, spatial))


@pytest.mark.parametrize("shape,axis", [((2, 5, 6), -1), ((2, 5, 6), 1), ((2, 3, 4, 5), -2), ((4, 6), 0)])
def test_layer_norm(shape, axis):
    norm_shape, norm_axes = shape[axis:], tuple(range(axis % len(shape), len(shape)))
    inputs = {"x": f(*shape), "s": f(*norm_shape), "b": f(*norm_shape)}
    check("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, consts={"s", "b"}, opset=17,
          grad=True, terms=int(np.prod(norm_shape)), cond=var_cond(inputs["x"], norm_axes))


def test_layer_norm_without_bias():
    # onnxruntime 1.31 crashes on an omitted B; the ONNX reference implementation is the oracle.
    check("LayerNormalization", {"x": f(2, 3, 4), "s": f(3, 4), "b": None}, {"axis": 1}, consts={"s"}, opset=17,
          grad=True, terms=12, reference=True)


def test_layer_norm_mean_and_inv_std_outputs():
    inputs = {"x": f(2, 3, 4), "s": f(3, 4), "b": f(3, 4)}
    check("LayerNormalization", inputs, {"axis": 1}, consts={"s", "b"}, opset=17, n_outputs=3, grad=True,
          terms=12)


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("spatial", [(4, 3), (5,), (2, 3, 2)])
def test_group_norm(opset, spatial):
    groups, c = 2, 6
    n_params = groups if opset == 18 else c
    inputs = {"x": f(2, c, *spatial), "s": f(n_params), "b": f(n_params)}
    by_group = inputs["x"].reshape(2, groups, -1)
    check("GroupNormalization", inputs, {"num_groups": groups, "epsilon": 1e-3}, consts={"s", "b"}, opset=opset,
          grad=True, terms=by_group.shape[-1], cond=var_cond(by_group, (2,)))


@pytest.mark.parametrize("p,axis", [(2, -1), (1, 1), (2, 0)])
def test_lp_normalization(p, axis):
    check("LpNormalization", {"x": f(3, 4, 5)}, {"p": p, "axis": axis}, opset=1, grad=True, terms=5)


LRN_ATTRS = {"alpha": 1e-2, "beta": 0.6, "bias": 2.0}


def test_lrn():
    check("LRN", {"x": f(2, 7, 4, 3)}, dict(LRN_ATTRS, size=3), opset=13, grad=True, terms=3)


def _lrn_by_hand(x, size, alpha, beta, bias):
    sq = np.zeros_like(x)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), c + size // 2  # floor/ceil of (size - 1) / 2
        sq[:, c] = (x[:, lo:hi + 1] ** 2).sum(axis=1)
    return x / (bias + alpha / size * sq) ** beta


@pytest.mark.parametrize("shape,size", [((2, 7, 4, 3), 4), ((2, 7, 5), 5), ((1, 6, 2, 2, 3), 2)])
def test_lrn_even_window_and_other_ranks(shape, size):
    # onnxruntime and onnx.reference only run 4-D input (and differ on even windows): the spec by hand.
    x = f(*shape)
    got, grads = run_mx(make_model("LRN", {"x": x}, dict(LRN_ATTRS, size=size), (), 13), {"x": x}, (), 13, grad=True)
    assert_f32_close(got[0], _lrn_by_hand(x, size, **LRN_ATTRS), terms=size)
    assert np.isfinite(grads["x"]).all() and np.abs(grads["x"]).sum() > 0


def test_batch_norm_training_mode_uses_batch_statistics():
    inputs = _bn_inputs((2, 3, 4, 5))
    check("BatchNormalization", inputs, {"training_mode": 1, "momentum": 0.7}, consts={"scale", "bias"},
          opset=15, n_outputs=3, grad=True, terms=2 * 4 * 5, cond=var_cond(inputs["x"], (0, 2, 3)))


@pytest.mark.parametrize("axes", [None, [0, 2], [1]])
def test_mean_variance_normalization(axes):
    attrs = {} if axes is None else {"axes": axes}
    x, axes = f(2, 3, 4, 5), tuple(axes or [0, 2, 3])  # ONNX's default axes
    check("MeanVarianceNormalization", {"x": x}, attrs, opset=13, grad=True,
          terms=int(np.prod([x.shape[a] for a in axes])), cond=var_cond(x, axes))


@pytest.mark.parametrize("op,inputs,attrs,opset", [  # inputs drawn in the test, from its seeded RNG
    ("LayerNormalization", lambda: {"x": f(2, 3, 2), "s": f(3, 2), "b": f(3, 2)}, {"axis": 1}, 17),
    ("GroupNormalization", lambda: {"x": f(1, 4, 3), "s": f(4), "b": f(4)}, {"num_groups": 2}, 21),
    ("BatchNormalization", lambda: _bn_inputs((3, 2, 2)), {"training_mode": 1}, 15),
    ("LRN", lambda: {"x": f(1, 4, 2, 2)}, {"size": 2, "alpha": 0.5}, 13),
    ("MeanVarianceNormalization", lambda: {"x": f(2, 2, 2, 2)}, {}, 13),
    ("LpNormalization", lambda: {"x": f(3, 4)}, {"p": 2}, 1),
], ids=lambda v: v if isinstance(v, str) else "")
def test_composed_norm_gradients_match_central_differences(op, inputs, attrs, opset):
    check_grad(op, inputs(), attrs, opset=opset)
