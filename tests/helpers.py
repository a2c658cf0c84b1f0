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


DIGITS_5_9 = {"source": "demo:digits", "classes": ["5", "6", "7", "8", "9"], "batch_size": 16,
              "train_transform": {"resize": 16}, "val_transform": {"resize": 16}}


def tiny_symbol(folder, deep=True) -> str:
    """A small BN-free conv net for 16×16 digits, exported as an MXNet symbol checkpoint."""
    mx.random.seed(1)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 3, padding=1, activation="relu"))
    if deep:
        net.add(mx.gluon.nn.MaxPool2D(2), mx.gluon.nn.Conv2D(16, 3, padding=1, activation="relu"))
    net.add(mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(5))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, 3, 16, 16)))
    net.export(str(folder / "tiny"))
    return str(folder / "tiny")
