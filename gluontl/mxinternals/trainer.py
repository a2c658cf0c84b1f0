"""The Gluon Trainer's and Optimizer's private state (MXNet 1.9.1, pinned), through named functions.

A Trainer sets up its kvstore and copies the weights to it lazily, at the first ``step``; a
checkpoint (its optimizer state) and a distributed run's first broadcast need that done before.
"""
from __future__ import annotations

from typing import Any

import mxnet as mx
from mxnet.gluon import Parameter, Trainer


def trainer_params(trainer: Trainer) -> list[Parameter]:
    """The parameters the trainer updates, in its index order (the optimizer state's keys)."""
    return list(trainer._params)


def init_trainer(trainer: Trainer) -> list[Parameter]:
    """Set up the kvstore and the parameters on it, as ``step`` would lazily; the parameters still
    waiting for a shape (deferred initialization) come back."""
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    return list(trainer._params_to_init)


def trainer_updaters(trainer: Trainer) -> list:
    """The ``Updater`` objects holding the optimizer state: one per context, or the local
    kvstore's when it updates (several contexts), set up as ``Trainer.save_states`` sets it up."""
    init_trainer(trainer)
    return [trainer._kvstore._updater] if trainer._update_on_kvstore else trainer._updaters


def trainer_optimizer(trainer: Trainer) -> mx.optimizer.Optimizer:
    return trainer._optimizer


def update_counts(opt: mx.optimizer.Optimizer) -> dict[int, dict[int, int]]:
    """Per device, per parameter index: how many updates the optimizer made (Adam's bias correction reads it)."""
    return opt._all_index_update_counts


def set_update_counts(opt: mx.optimizer.Optimizer, devices: dict[int, dict[Any, int]]) -> None:
    """Put back ``update_counts``; device 0's table is the one the next update counts on."""
    opt._all_index_update_counts = devices
    opt._index_update_count = devices.setdefault(0, {})


def count_update(opt: mx.optimizer.Optimizer, index: int) -> tuple[float, float, int]:
    """Count one update of parameter ``index`` as MXNet's own optimizers do at the start of ``update``;
    its ``(learning rate, weight decay)`` with the parameter's multipliers, and its update count so far."""
    opt._update_count(index)
    return opt._get_lr(index), opt._get_wd(index), opt._index_update_count[index]
