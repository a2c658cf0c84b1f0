"""Small shared helpers for tests: real models, real steps, no mocks."""
from __future__ import annotations

import mxnet as mx
import numpy as np

from gluontl.rules import trainable_params
from gluontl.sources.restore import snapshot  # noqa: F401  (re-exported for tests)


def sgd_step(net, x, y, lr=0.1, momentum=0.0, wd=0.0, steps=1):
    """``steps`` plain SGD steps with softmax CE, the Trainer given only trainable params."""
    params = trainable_params(net)
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": lr, "momentum": momentum, "wd": wd})
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(steps):
        with mx.autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
    return trainer


def batch(n=4, c=3, hw=32, classes=5, seed=0):
    rs = np.random.RandomState(seed)
    return mx.nd.array(rs.randn(n, c, hw, hw)), mx.nd.array(rs.randint(0, classes, n))
