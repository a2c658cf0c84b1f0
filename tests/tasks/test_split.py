"""Batches split over several contexts, including the last batch of an epoch when it is
smaller than the context list (split_and_load alone fails there)."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon

from gluontl.tasks import split
from gluontl.tasks.classification import classify
from gluontl.train.loop import Stepper

CTXS = [mx.cpu(1), mx.cpu(2), mx.cpu(3)]


@pytest.mark.parametrize("n, parts", [(1, 1), (2, 2), (3, 3), (7, 3)])
def test_split_uses_at_most_one_context_per_image(n, parts):
    x = mx.nd.array(np.arange(n * 2, dtype=np.float32).reshape(n, 2))
    got = split(x, CTXS)
    assert len(got) == parts and [g.context for g in got] == CTXS[:parts]
    np.testing.assert_array_equal(np.concatenate([g.asnumpy() for g in got]), x.asnumpy())
    with pytest.raises(mx.base.MXNetError):
        if n < len(CTXS):
            gluon.utils.split_and_load(x, CTXS, even_split=False)  # what split avoids
        else:
            raise mx.base.MXNetError("only short batches fail")


def test_a_one_image_step_on_three_contexts_equals_the_same_step_on_one():
    def trained(ctxs):
        mx.random.seed(0)
        net = gluon.nn.Dense(3, in_units=4)
        net.initialize(mx.init.Xavier(), ctx=ctxs)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
        step = Stepper(net, trainer, lambda n, xs, ys: classify(n, xs, ys, gluon.loss.SoftmaxCrossEntropyLoss()), ctxs)
        loss = step.step(mx.nd.array([[1.0, -2.0, 0.5, 3.0]]), mx.nd.array([2]))
        copies = [w.asnumpy() for w in net.weight.list_data()]
        for c in copies[1:]:  # every context's copy took the same update
            np.testing.assert_array_equal(c, copies[0])
        return loss, copies[0]

    (l1, w1), (l3, w3) = trained([mx.cpu(1)]), trained(CTXS)
    assert l1 == pytest.approx(l3, rel=1e-6)
    np.testing.assert_allclose(w1, w3, rtol=1e-6, atol=1e-7)
