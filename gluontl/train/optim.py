"""AdamW for MXNet 1.9.1, which ships the fused ``contrib.adamw_update`` kernel but registers
no optimizer for it (``Trainer(..., 'adamw')`` fails out of the box).

Semantics are PyTorch's ``torch.optim.AdamW``: bias-corrected Adam step plus decoupled
weight decay scaled by the learning rate, ``w -= lr * (m̂ / (√v̂ + ε) + wd * w)``.
"""
from __future__ import annotations

import math

import mxnet as mx

from ..mxinternals import count_update


@mx.optimizer.register
class AdamW(mx.optimizer.Optimizer):
    def __init__(self, learning_rate: float = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, **kwargs) -> None:
        super().__init__(learning_rate=learning_rate, **kwargs)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def create_state(self, index, weight):
        return (mx.nd.zeros(weight.shape, weight.context, dtype=weight.dtype),
                mx.nd.zeros(weight.shape, weight.context, dtype=weight.dtype))

    def update(self, index, weight, grad, state):
        lr, wd, t = count_update(self, index)
        # Bias correction folded into the kernel's alpha; eta (applied to both terms) is the lr.
        # ε is scaled so that ε is added to √v̂ (PyTorch) rather than to √v (the kernel).
        correction = math.sqrt(1 - self.beta2 ** t)
        alpha = correction / (1 - self.beta1 ** t)
        mean, var = state
        mx.nd.contrib.adamw_update(weight, grad, mean, var, rescale_grad=self.rescale_grad, lr=alpha,
                                   eta=lr, beta1=self.beta1, beta2=self.beta2,
                                   epsilon=self.epsilon * correction, wd=wd,
                                   clip_gradient=self.clip_gradient or -1, out=weight)
