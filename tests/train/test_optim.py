"""The adamw optimizer matches PyTorch's AdamW update rule, computed by hand."""
import mxnet as mx
import numpy as np
from tests.helpers import assert_f32_close

import gluontl.train  # noqa: F401  (registers adamw)


def reference(w, grads, lr, wd, b1=0.9, b2=0.999, eps=1e-8):
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        w = w - lr * wd * w
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w = w - lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    return w


def test_adamw_matches_decoupled_weight_decay_rule():
    rs = np.random.RandomState(0)
    w0 = rs.randn(4, 3).astype(np.float64)
    grads = [rs.randn(4, 3) for _ in range(5)]
    p = mx.gluon.Parameter("w", shape=(4, 3))
    p.initialize(mx.init.Constant(0))
    p.set_data(mx.nd.array(w0))
    trainer = mx.gluon.Trainer([p], "adamw", {"learning_rate": 0.01, "wd": 0.1})
    for g in grads:
        with mx.autograd.record():
            loss = (p.data() * mx.nd.array(g)).sum()  # d loss / d w = g
        loss.backward()
        trainer.step(1)
    # float32 against float64: each of the 5 steps rounds w at its size; a wrong rule is off by ~lr
    assert_f32_close(p.data().asnumpy(), reference(w0, grads, 0.01, 0.1), scale=np.abs(w0).max(), terms=5)
    # and it is not plain Adam with L2: with wd the result differs from wd=0 by the decay only
    assert not np.allclose(reference(w0, grads, 0.01, 0.1), reference(w0, grads, 0.01, 0.0))
