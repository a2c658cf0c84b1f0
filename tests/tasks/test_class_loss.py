"""train.loss: focal loss and class-weighted cross-entropy against a numpy hand computation (float64),
values and gradients; the default loss path stays Gluon's own."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

from gluontl.data.balance import loss_class_weights
from gluontl.errors import DataError
from gluontl.recipe import parse_recipe
from gluontl.tasks.class_loss import ClassLoss, imbalance_loss
from gluontl.tasks.classification import loss_fn
from tests import helpers

K = 4


def _softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def reference(z, y, gamma, w, eps):
    """Per-image loss and d(sum loss)/dz by hand: L = w_y sum_k t_k (1 - p_k)^g (-log p_k);
    dL/dp_k = w_y t_k (-g (1 - p_k)^(g-1) (-log p_k) - (1 - p_k)^g / p_k); dp_k/dz_j = p_k (d_kj - p_j)."""
    z = np.asarray(z, np.float64)
    p = _softmax(z)
    t = np.eye(K)[y] * (1 - eps) + eps / K
    wy = np.ones(len(y)) if w is None else np.asarray(w, np.float64)[y]
    loss = wy * (t * (1 - p) ** gamma * -np.log(p)).sum(axis=1)
    dp = wy[:, None] * t * (-gamma * (1 - p) ** (gamma - 1) * -np.log(p) - (1 - p) ** gamma / p) if gamma else \
        wy[:, None] * t * (-1 / p)
    dz = (dp * p).sum(axis=1, keepdims=True) * -p + dp * p  # sum_k dp_k p_k (d_kj - p_j)
    return loss, dz


def run(loss, z, y):
    x = mx.nd.array(z)
    x.attach_grad()
    with autograd.record():
        out = loss(x, mx.nd.array(y, dtype=np.float32))
    out.backward()
    return out.asnumpy(), x.grad.asnumpy()


@pytest.fixture
def batch():
    rng = np.random.default_rng(3)
    z = rng.normal(0, 2.0, (6, K)).astype(np.float32)
    z[0, 2] = 9.0  # one confident right answer: focal loss scales it down most
    y = np.array([2, 0, 1, 3, 3, 1])
    return z, y


@pytest.mark.parametrize("gamma, w, eps", [
    (0.0, [0.5, 2.0, 1.0, 4.0], 0.0),  # weighted cross-entropy
    (2.0, None, 0.0),  # focal
    (2.0, [0.5, 2.0, 1.0, 4.0], 0.0),  # focal with alpha_t
    (0.5, None, 0.0),  # gamma below 1 (clipped 1 - p only at 1e-12; not reached here)
    (1.5, [0.5, 2.0, 1.0, 4.0], 0.1),  # with label smoothing
])
def test_loss_and_gradient_match_the_hand_computation(batch, gamma, w, eps):
    z, y = batch
    got, grad = run(ClassLoss(K, gamma=gamma, weights=w, label_smoothing=eps), z, y)
    want, want_grad = reference(z, y, gamma, w, eps)
    # a log-softmax, a power and a sum of K terms per image, each of size ~ max |loss| / |gradient|
    helpers.assert_f32_close(got, want, terms=K, depth=4)
    helpers.assert_f32_close(grad, want_grad, terms=K, depth=4)
    assert not np.allclose(grad, reference(z, y, 0.0, None, 0.0)[1], atol=1e-3)  # not plain CE's gradient


def test_focal_scales_down_the_easy_image(batch):
    z, y = batch
    ce, _ = run(ClassLoss(K), z, y)
    focal, _ = run(ClassLoss(K, gamma=2.0), z, y)
    p = _softmax(z.astype(np.float64))[np.arange(len(y)), y]
    # per image, the factor (1 - p_t)^gamma; float32's 1 - p near p = 1 is exact to ~eps32 only in absolute terms
    np.testing.assert_allclose(focal / ce, (1 - p) ** 2, rtol=1e-5, atol=helpers.f32_tol(1.0, K))
    assert (focal / ce)[0] < 1e-4  # the confident right answer counts ~20,000 times less


def test_no_loss_key_is_gluons_softmax_cross_entropy(batch):
    """Recipes without train.loss (or with plain unweighted cross_entropy) keep Gluon's loss: the same
    object type, so their numbers are bit for bit those of before."""
    z, y = batch
    base = helpers.tiny_recipe("p", epochs=1)
    for train in ({}, {"loss": {"kind": "cross_entropy"}}, {"loss": {"kind": "cross_entropy", "gamma": 3}}):
        recipe = parse_recipe({**base, "train": {**base["train"], **train}})
        fn = loss_fn(recipe, K)
        assert isinstance(fn, gluon.loss.SoftmaxCrossEntropyLoss)
    ce = run(ClassLoss(K), z, y)
    gl = run(gluon.loss.SoftmaxCrossEntropyLoss(), z, y)
    helpers.assert_f32_close(ce[0], gl[0], terms=K, depth=2)
    helpers.assert_f32_close(ce[1], gl[1], terms=K, depth=2)


def test_balanced_weights_are_sklearns_and_average_one():
    counts = np.array([6, 3, 1, 10])
    w = loss_class_weights("balanced", counts, list("abcd"), "x")
    np.testing.assert_allclose(w, [20 / 24, 20 / 12, 20 / 4, 20 / 40])  # N / (K n_c) by hand
    assert np.isclose((w * counts).sum() / counts.sum(), 1.0)
    assert loss_class_weights("none", counts, list("abcd"), "x") is None
    np.testing.assert_array_equal(loss_class_weights([1, 2, 3, 4], counts, list("abcd"), "x"), [1, 2, 3, 4])


def test_bad_class_weights_name_the_key():
    with pytest.raises(DataError, match=r"train\.loss\.class_weights lists 3 weights but the data has 4 classes"):
        loss_class_weights([1.0, 2.0, 3.0], np.array([1, 1, 1, 1]), list("abcd"), "x")
    with pytest.raises(DataError, match=r"train\.loss\.class_weights: balanced .* 'c' have no image in x"):
        loss_class_weights("balanced", np.array([1, 1, 0, 1]), list("abcd"), "x")


def test_imbalance_loss_counts_the_train_split():
    recipe = parse_recipe({**helpers.tiny_recipe("p"), "train": {"loss": {"kind": "focal", "gamma": 1.0,
                                                                          "class_weights": [1, 2, 3, 4, 5]}}})
    fn = imbalance_loss(recipe, 5)
    assert isinstance(fn, ClassLoss) and fn.gamma == 1.0
    np.testing.assert_array_equal(fn.weights, [1, 2, 3, 4, 5])
