"""Segmentation loss: values against a float64 numpy log-softmax, GluonCV's
MixSoftmaxCrossEntropyLoss (its value averages over all pixels, ours over labelled ones), the
gradient against the closed form (softmax - one-hot) / labelled, and no NaN when every pixel of
an image is ignored."""
from __future__ import annotations

import mxnet as mx
import numpy as np
import pytest
from gluoncv.loss import MixSoftmaxCrossEntropyLoss
from tests.helpers import assert_f32_close

from gluontl.segment.loss import SegmentationLoss, median_frequency_weights


def _batch(seed, n=3, c=5, h=6, w=7, ignored=0.25):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=2, size=(n, c, h, w)).astype(np.float32)
    label = rng.integers(0, c, (n, h, w)).astype(np.float32)
    label[rng.random((n, h, w)) < ignored] = 255
    return logits, label


def _np_logp(logits):
    """float64 log-softmax over the class axis."""
    x = logits.astype(np.float64)
    logp = x - x.max(1, keepdims=True)
    return logp - np.log(np.exp(logp).sum(1, keepdims=True))


def _np_loss(logits, label):
    """Per image: mean over labelled pixels of -log softmax at the label (float64)."""
    logp, out = _np_logp(logits), []
    for i in range(len(logits)):
        ys, xs = np.nonzero(label[i] != 255)
        nll = -logp[i, label[i, ys, xs].astype(int), ys, xs]
        out.append(nll.mean() if len(nll) else 0.0)
    return np.array(out)


@pytest.mark.parametrize("hybridize", [False, True])
def test_value_against_numpy(hybridize):
    logits, label = _batch(0)
    loss = SegmentationLoss()
    if hybridize:
        loss.hybridize()
    got = loss(mx.nd.array(logits), mx.nd.array(label)).asnumpy()
    assert got.shape == (3,)
    assert_f32_close(got, _np_loss(logits, label), scale=np.abs(logits).max() * 2, terms=5)


def test_aux_head_adds_its_weighted_loss():
    logits, label = _batch(1)
    aux, _ = _batch(2)
    got = SegmentationLoss(aux_weight=0.4)(mx.nd.array(logits), mx.nd.array(aux), mx.nd.array(label)).asnumpy()
    want = _np_loss(logits, label) + 0.4 * _np_loss(aux, label)
    assert_f32_close(got, want, scale=np.abs(np.r_[logits, aux]).max() * 3, terms=5)


@pytest.mark.parametrize("ignored", [0.0, 0.3])
def test_matches_gluoncv_up_to_its_all_pixel_average(ignored):
    logits, label = _batch(3, ignored=ignored)
    aux, _ = _batch(4)
    theirs = MixSoftmaxCrossEntropyLoss(aux=True, aux_weight=0.2, ignore_label=255)
    want = theirs(mx.nd.array(logits), mx.nd.array(aux), mx.nd.array(label)).asnumpy()
    got = SegmentationLoss(aux_weight=0.2)(mx.nd.array(logits), mx.nd.array(aux), mx.nd.array(label)).asnumpy()
    share = (label != 255).mean(axis=(1, 2))  # labelled pixels / H*W, per image
    assert_f32_close(got * share, want, scale=np.abs(np.r_[logits, aux]).max() * 3, terms=5 * 42)
    if not ignored:
        assert_f32_close(got, want, scale=np.abs(np.r_[logits, aux]).max() * 3, terms=5 * 42)


def test_gradient_is_softmax_minus_one_hot_over_labelled_pixels_as_gluoncv():
    logits, label = _batch(5, n=1)
    ours, theirs = mx.nd.array(logits), mx.nd.array(logits)
    for x, fn in ((ours, SegmentationLoss()), (theirs, MixSoftmaxCrossEntropyLoss(aux=False, ignore_label=255))):
        x.attach_grad()
        with mx.autograd.record():
            out = fn(x, mx.nd.array(label))
        out.backward()
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    valid = label != 255
    onehot = np.eye(5)[np.where(valid, label, 0).astype(int)].transpose(0, 3, 1, 2)
    want = (p - onehot) * valid[:, None] / valid.sum()
    assert_f32_close(ours.grad.asnumpy(), want, scale=1 / valid.sum(), terms=5)
    # GluonCV's SoftmaxOutput(normalization='valid') gradient, for one image
    assert_f32_close(ours.grad.asnumpy(), theirs.grad.asnumpy(), scale=1 / valid.sum(), terms=5)


@pytest.mark.parametrize("hybridize", [False, True])
def test_an_image_whose_pixels_are_all_ignored_gives_zero_not_nan(hybridize):
    logits, label = _batch(6, n=2)
    label[0] = 255
    loss = SegmentationLoss(aux_weight=0.2)
    if hybridize:
        loss.hybridize()
    x = mx.nd.array(logits)
    x.attach_grad()
    with mx.autograd.record():
        out = loss(x, x * 0.5, mx.nd.array(label))
    out.backward()
    out, grad = out.asnumpy(), x.grad.asnumpy()
    assert np.isfinite(out).all() and np.isfinite(grad).all()
    assert out[0] == 0 and not grad[0].any()
    assert out[1] > 0 and grad[1].any()


def _np_weighted_loss(logits, label, weights):
    """Per image: sum(w[y] * nll) / sum(w[y]) over labelled pixels (float64), 0 without labelled weight."""
    logp, out = _np_logp(logits), []
    for i in range(len(logits)):
        ys, xs = np.nonzero(label[i] != 255)
        y = label[i, ys, xs].astype(int)
        w = np.asarray(weights, np.float64)[y]
        out.append((w * -logp[i, y, ys, xs]).sum() / w.sum() if w.sum() else 0.0)
    return np.array(out)


@pytest.mark.parametrize("hybridize", [False, True])
def test_class_weights_weigh_each_labelled_pixel_by_its_class_and_ignore_stays_ignored(hybridize):
    logits, label = _batch(6, ignored=0.3)
    label[2] = np.where(label[2] == 255, 255, 1)  # image 2: only class 1, whose weight is 0
    weights = [0.1, 0.0, 2.0, 1.0, 3.5]
    loss = SegmentationLoss(class_weights=weights)
    if hybridize:
        loss.hybridize()
    got = loss(mx.nd.array(logits), mx.nd.array(label)).asnumpy()
    want = _np_weighted_loss(logits, label, weights)
    assert want[2] == 0 and not np.allclose(want[:2], _np_loss(logits, label)[:2], rtol=1e-2)
    assert_f32_close(got, want, scale=np.abs(logits).max() * 2 * 3.5, terms=5 * 42)


def test_unit_class_weights_are_the_unweighted_loss():
    logits, label = _batch(7)
    got = SegmentationLoss(class_weights=[1.0] * 5)(mx.nd.array(logits), mx.nd.array(label)).asnumpy()
    assert_f32_close(got, _np_loss(logits, label), scale=np.abs(logits).max() * 2, terms=5 * 42)


def test_median_frequency_weights_by_hand():
    pixels = np.array([[90, 10, 0, 0], [80, 0, 20, 0], [100, 0, 0, 0]])
    # f = 270/300, 10/100, 20/100 (pixels over the labelled pixels of the images holding the class);
    # median 0.2; class 3 is in no mask: weight 0, and out of the median
    np.testing.assert_allclose(median_frequency_weights(pixels), [0.2 / 0.9, 2.0, 1.0, 0.0], rtol=1e-12)
