"""model.random_init: the from-scratch baseline of a transfer-learning recipe, for every source kind."""
from __future__ import annotations

import math

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from gluontl.errors import RecipeError
from gluontl.naming import named_params
from gluontl.recipe import ModelSpec, parse_recipe
from gluontl.sources import build_model

FIXTURE = "tests/onnx/fixtures/resnet_legacy_op13_nofold.onnx"


def _xavier_bound(shape: tuple[int, ...]) -> float:
    receptive = math.prod(shape[2:])
    fan_in, fan_out = shape[1] * receptive, shape[0] * receptive
    return math.sqrt(3.0 / ((fan_in + fan_out) / 2.0))


def _check_weight(name: str, w: np.ndarray, original: np.ndarray | None) -> None:
    bound = _xavier_bound(w.shape)
    assert np.abs(w).max() <= bound * (1 + 1e-6), name
    if w.size >= 500:  # uniform(-b, b) has std b/sqrt(3); 500 draws put it within 10 %
        assert abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound / math.sqrt(3), name
    if original is not None:
        assert not np.allclose(w, original), name


def test_onnx_source_every_tensor_reinitialized_by_its_role_in_the_graph():
    mx.random.seed(0)
    model = onnx.load(FIXTURE)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    bn_role = {}
    for node in model.graph.node:
        if node.op_type == "BatchNormalization":
            for role, tensor in zip(("scale", "shift", "mean", "var"), node.input[1:5]):
                bn_role[tensor] = role
    net, _ = build_model(ModelSpec(source=f"onnx:{FIXTURE}", random_init=True, input_shape=(3, 32, 32)))
    params = named_params(net)
    seen_roles = set()
    for name, e in params.items():
        value = e.param.data().asnumpy()
        role = bn_role.get(name)
        if role is not None:
            seen_roles.add(role)
            want = 1.0 if role in ("scale", "var") else 0.0
            np.testing.assert_array_equal(value, np.full_like(value, want), err_msg=name)
        elif value.ndim >= 2:
            _check_weight(name, value, inits.get(name))
        else:
            np.testing.assert_array_equal(value, 0, err_msg=name)
    assert seen_roles == {"scale", "shift", "mean", "var"}
    assert set(bn_role) <= set(params)


def test_zoo_source_batchnorm_at_identity_and_weights_xavier():
    mx.random.seed(1)
    net, _ = build_model(ModelSpec(source="zoo:mobilenetv2_0.25", random_init=True, input_shape=(3, 32, 32)))
    kinds = set()
    for name, e in named_params(net).items():
        value = e.param.data().asnumpy()
        suffix = name.rsplit(".", 1)[-1]
        kinds.add(suffix)
        if suffix in ("gamma", "running_var"):
            np.testing.assert_array_equal(value, 1, err_msg=name)
        elif suffix in ("beta", "running_mean", "bias"):
            np.testing.assert_array_equal(value, 0, err_msg=name)
        else:
            _check_weight(name, value, None)
    assert {"gamma", "beta", "running_mean", "running_var", "weight"} <= kinds


def test_random_init_changes_the_onnx_model_output_and_is_seeded():
    x = mx.nd.array(np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32))
    outs = []
    for random_init, seed in ((False, 0), (True, 5), (True, 5), (True, 6)):
        mx.random.seed(seed)
        net, _ = build_model(ModelSpec(source=f"onnx:{FIXTURE}", random_init=random_init, input_shape=(3, 32, 32)))
        outs.append(net(x).asnumpy())
    assert not np.allclose(outs[0], outs[1])
    np.testing.assert_array_equal(outs[1], outs[2])
    assert not np.allclose(outs[1], outs[3])


@pytest.mark.parametrize("extra", [{"weights": "w.params"}, {"pretrained": True}])
def test_random_init_with_weights_refused(extra):
    data = {"model": {"source": "zoo:resnet18_v1", "random_init": True, **extra},
            "data": {"source": "demo:digits"}}
    with pytest.raises(RecipeError, match="random_init"):
        parse_recipe(data)


def test_gluon_norm_layers_at_identity_and_prelu_at_gluons_slope():
    mx.random.seed(2)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3), mx.gluon.nn.LayerNorm(axis=1), mx.gluon.nn.InstanceNorm(),
            mx.gluon.nn.GroupNorm(2), mx.gluon.nn.PReLU(), mx.gluon.nn.Dense(3))
    net.initialize(mx.init.Normal(5.0))
    net(mx.nd.ones((1, 3, 8, 8)))  # shapes
    from gluontl.sources import reinitialize
    reinitialize(net)
    got = {n: e.param.data().asnumpy() for n, e in named_params(net).items()}
    for i in (1, 2, 3):
        np.testing.assert_array_equal(got[f"{i}.gamma"], 1)
        np.testing.assert_array_equal(got[f"{i}.beta"], 0)
    np.testing.assert_array_equal(got["4.alpha"], 0.25)
    _check_weight("5.weight", got["5.weight"], None)
    np.testing.assert_array_equal(got["5.bias"], 0)
