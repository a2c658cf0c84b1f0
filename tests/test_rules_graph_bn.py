"""BatchNorm mode on graph models (imported ONNX, MXNet symbol checkpoints).

Graph models hold BatchNorm as a node of a SymbolBlock's graph, so ``bn: train``/``frozen`` is
applied by rewriting that node. The running mean after one training step is checked against
the momentum update written out in numpy from the layer's real input, hybridized and not.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gluontl.onnx import import_model
from gluontl.recipe import Rule
from gluontl.rules import apply_plan, make_plan
from gluontl.sources import load_model
from tests.helpers import conv3x3_np

MOMENTUM = 0.9


def _onnx_model():
    rng = np.random.RandomState(5)
    w = (rng.randn(4, 3, 3, 3) * 0.5).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.ones(4, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(4, np.float32), "beta"),
             numpy_helper.from_array(np.full(4, 0.3, np.float32), "mean"),
             numpy_helper.from_array(np.ones(4, np.float32), "var")]
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["b"], name="bn",
                          momentum=MOMENTUM),
         helper.make_node("Relu", ["b"], ["y"], name="relu")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    block = import_model(model)
    params = block.collect_params()
    return block, w, params["mean"]


def _symbol_model(tmp_path):
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, padding=1, use_bias=False, in_channels=3),
            mx.gluon.nn.BatchNorm(momentum=MOMENTUM, in_channels=4), mx.gluon.nn.Activation("relu"))
    net.initialize(mx.init.Xavier(rnd_type="gaussian", magnitude=3))
    bn = net[1]
    bn.running_mean.set_data(mx.nd.full((4,), 0.3))
    net.hybridize()
    net(mx.nd.zeros((1, 3, 6, 6)))
    net.export(str(tmp_path / "bnnet"))
    block = load_model(f"symbol:{tmp_path / 'bnnet'}")
    params = block.collect_params()
    conv_w = next(p for n, p in params.items() if n.endswith("weight")).data().asnumpy()
    mean = next(p for n, p in params.items() if n.endswith("running_mean"))
    return block, conv_w, mean


@pytest.mark.parametrize("kind", ["onnx", "symbol"])
@pytest.mark.parametrize("mode", ["train", "frozen"])
@pytest.mark.parametrize("hybrid", [False, True])
def test_bn_mode_on_graph_models(kind, mode, hybrid, tmp_path):
    block, w, mean = _onnx_model() if kind == "onnx" else _symbol_model(tmp_path)
    apply_plan(block, make_plan(block, [Rule(type=["BatchNorm"], bn=mode)]))
    if hybrid:
        block.hybridize()
    x = np.random.RandomState(1).standard_normal((4, 3, 6, 6)).astype(np.float32)
    before = mean.data().asnumpy().copy()
    np.testing.assert_allclose(before, 0.3, rtol=0, atol=1e-7)
    with mx.autograd.record():
        loss = block(mx.nd.array(x)).sum()
    loss.backward()
    mx.nd.waitall()
    after = mean.data().asnumpy()
    if mode == "frozen":
        np.testing.assert_array_equal(after, before)
        return
    batch_mean = conv3x3_np(x, w).mean(axis=(0, 2, 3))
    want = MOMENTUM * before + (1 - MOMENTUM) * batch_mean
    assert np.abs(want - before).max() > 1e-2  # the update is large enough to tell apart
    np.testing.assert_allclose(after, want, rtol=0, atol=1e-5)


def _two_bn_model(tmp_path):
    """conv -> bn_a -> bn_b as a symbol checkpoint; both BatchNorm nodes with default attributes
    (their JSON nodes have no ``attrs`` at all)."""
    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), pad=(1, 1), no_bias=True, name="conv")
    out = mx.sym.BatchNorm(mx.sym.BatchNorm(conv, name="bn_a"), name="bn_b")
    rng = np.random.RandomState(7)
    w = (rng.randn(4, 3, 3, 3) * 0.5).astype(np.float32)
    arrays = {"arg:conv_weight": mx.nd.array(w)}
    for bn in ("bn_a", "bn_b"):
        arrays.update({f"arg:{bn}_gamma": mx.nd.ones(4), f"arg:{bn}_beta": mx.nd.zeros(4),
                       f"aux:{bn}_moving_mean": mx.nd.zeros(4), f"aux:{bn}_moving_var": mx.nd.ones(4)})
    out.save(str(tmp_path / "two-symbol.json"))
    mx.nd.save(str(tmp_path / "two-0000.params"), arrays)
    block = load_model(f"symbol:{tmp_path / 'two'}")
    params = block.collect_params()
    return block, w, params["bn_a_moving_mean"], params["bn_b_moving_mean"]


@pytest.mark.parametrize("frozen", ["bn_a", "bn_b"])
@pytest.mark.parametrize("hybrid", [False, True])
def test_graph_bn_modes_are_per_layer(frozen, hybrid, tmp_path):
    # one BatchNorm frozen, the other training: each keeps its own mode
    block, w, mean_a, mean_b = _two_bn_model(tmp_path)
    plan = make_plan(block, [Rule(type=["BatchNorm"], bn="train"), Rule(match=[f"{frozen}_*"], bn="frozen")])
    apply_plan(block, plan)
    if hybrid:
        block.hybridize()
    x = np.random.RandomState(2).standard_normal((4, 3, 6, 6)).astype(np.float32)
    with mx.autograd.record():
        loss = block(mx.nd.array(x)).sum()
    loss.backward()
    mx.nd.waitall()
    a, b = mean_a.data().asnumpy(), mean_b.data().asnumpy()
    conv_mean = conv3x3_np(x, w).mean(axis=(0, 2, 3))
    eps = 1e-3  # MXNet's BatchNorm default
    if frozen == "bn_a":
        # bn_a normalizes with its stored statistics (mean 0, var 1): bn_b sees conv / sqrt(1 + eps)
        np.testing.assert_array_equal(a, np.zeros(4))
        want = (1 - MOMENTUM) * conv_mean / np.sqrt(1 + eps)
        assert np.abs(want).max() > 1e-2
        np.testing.assert_allclose(b, want, rtol=0, atol=1e-5)
    else:
        np.testing.assert_allclose(a, (1 - MOMENTUM) * conv_mean, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(b, np.zeros(4))


def test_graph_running_statistics_are_auxiliary_states(tmp_path):
    # a graph model's moving mean/var are aux states of its graph (MXNet marks them
    # differentiable like weights): no grad_req, never given to the Trainer
    from gluontl.rules import trainable_params

    block, _, _, _ = _two_bn_model(tmp_path)
    plan = make_plan(block, [Rule(match=["*"], grad_req="write")])
    aux = {r.name for r in plan.rows if r.aux}
    assert aux == {f"{bn}_moving_{s}" for bn in ("bn_a", "bn_b") for s in ("mean", "var")}
    apply_plan(block, plan)
    params = block.collect_params()
    assert all(params[n].grad_req == "null" for n in aux)
    assert set(trainable_params(block)) == {"conv_weight", "bn_a_gamma", "bn_a_beta", "bn_b_gamma", "bn_b_beta"}


def _bn_only(tmp_path, name):
    data = mx.sym.var("data")
    mx.sym.BatchNorm(data, name=name).save(str(tmp_path / f"{name}-symbol.json"))
    mx.nd.save(str(tmp_path / f"{name}-0000.params"),
               {f"arg:{name}_gamma": mx.nd.ones(3), f"arg:{name}_beta": mx.nd.zeros(3),
                f"aux:{name}_moving_mean": mx.nd.zeros(3), f"aux:{name}_moving_var": mx.nd.ones(3)})
    return load_model(f"symbol:{tmp_path / name}")


@pytest.mark.parametrize("frozen", ["first", "second"])
def test_bn_modes_of_two_graph_blocks_in_one_model(frozen, tmp_path):
    net = mx.gluon.nn.HybridSequential()
    net.add(_bn_only(tmp_path, "p"), _bn_only(tmp_path, "q"))
    which = "0.*" if frozen == "first" else "1.*"
    apply_plan(net, make_plan(net, [Rule(type=["BatchNorm"], bn="train"), Rule(match=[which], bn="frozen")]))
    x = np.random.RandomState(3).standard_normal((4, 3, 5, 5)).astype(np.float32) + 0.5
    with mx.autograd.record():
        loss = net(mx.nd.array(x)).sum()
    loss.backward()
    mx.nd.waitall()
    p, q = (net[i].collect_params()[f"{k}_moving_mean"].data().asnumpy() for i, k in ((0, "p"), (1, "q")))
    batch_mean = x.astype(np.float64).mean(axis=(0, 2, 3))
    if frozen == "first":  # p passes x / sqrt(1 + eps) on; q averages that
        np.testing.assert_array_equal(p, np.zeros(3))
        np.testing.assert_allclose(q, (1 - MOMENTUM) * batch_mean / np.sqrt(1 + 1e-3), rtol=0, atol=1e-5)
    else:  # p normalizes the batch: q is frozen anyway
        np.testing.assert_allclose(p, (1 - MOMENTUM) * batch_mean, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(q, np.zeros(3))
