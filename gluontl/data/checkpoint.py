"""Checkpoints that survive kill -9: params, optimizer state and counters, written atomically.

A checkpoint is ``TAG.json`` naming and hashing (SHA-256) its ``TAG.<generation>.params``
and ``.states`` files. Each save writes a new generation and then the JSON, atomically: a
kill -9 at any moment leaves the JSON naming complete files, the old generation's or the new
one's (rewriting TAG.params in place left the old JSON over new params when killed between
the two). ``TAG.params``/``TAG.states`` are hard links to the committed generation for
readers of the run folder.

Nothing in a checkpoint is code. The optimizer state is an NDArray file (``mx.nd.save``: named
arrays, which ``mx.nd.load`` only parses) plus a JSON record in ``TAG.json`` of what MXNet's
``Updater`` holds beyond the arrays: the optimizer's name, ``num_update`` and the per-index update
counts (the hyper-parameters come from the recipe, which a resume checks). MXNet's own
``Trainer.save_states`` pickles, and unpickling a file runs whatever code its author put in it; a
hash proves only that a folder agrees with itself, not who wrote it. Checkpoints pickled by older
gluontl are refused, never unpickled (their weights still load: ``--init-from``).
"""
from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError
from mxnet.gluon import HybridBlock

from ..atomic import atomic_write, link_or_copy, write_text
from ..errors import TrainError, short_reason
from ..mxinternals import set_update_counts, trainer_optimizer, trainer_params, trainer_updaters, update_counts
from ..naming import named_params
from ..readers import read_json
from ..runfolder import RunFolder, checkpoint_files, file_sha256, read_checkpoint as load  # load: the resume's read


def save_params(block: HybridBlock, path: Path) -> Path:
    """Parameters under their structural names (what ``weights:`` and restore read).

    oneDNN's BatchNorm updates the running statistics in its backward, which the engine sees
    as a read of them: a copy right after a step would not wait for it and save the statistics
    one step behind (a resume then differs from an uninterrupted run), hence the waitall."""
    mx.nd.waitall()
    arrays = {n: e.param.list_data()[0].copyto(mx.cpu()) for n, e in named_params(block).items()}
    return atomic_write(path, lambda tmp: mx.nd.save(str(tmp), arrays), TrainError)


def save(folder: Path, tag: str, block: HybridBlock, trainer: mx.gluon.Trainer, state: dict[str, Any],
         ema: tuple[dict[str, mx.nd.NDArray], dict[str, Any]] | None = None) -> None:
    """``ema``: train.ema's average (named arrays, record), a third file of the generation."""
    for stale in folder.glob(".*.tmp"):  # left by a kill -9 in the middle of a write
        stale.unlink(missing_ok=True)
    arrays, record = optimizer_state(trainer)  # before any write: a state it cannot keep leaves no file behind
    gen = secrets.token_hex(4)
    params = save_params(block, RunFolder.checkpoint_file(folder, tag, "params", gen))
    states = atomic_write(RunFolder.checkpoint_file(folder, tag, "states", gen),
                          lambda tmp: mx.nd.save(str(tmp), arrays), TrainError)
    files = {"params": params, "states": states}
    meta = dict(state, params_file=params.name, states_file=states.name,
                params_sha256=file_sha256(params), states_sha256=file_sha256(states), optimizer=record)
    if ema is not None:
        files["ema"] = atomic_write(RunFolder.checkpoint_file(folder, tag, "ema", gen),
                                    lambda tmp: mx.nd.save(str(tmp), ema[0]), TrainError)
        meta.update(ema_file=files["ema"].name, ema_sha256=file_sha256(files["ema"]), ema=ema[1])
    write_text(RunFolder.checkpoint_record(folder, tag), json.dumps(meta, indent=1), TrainError)  # the commit
    for kind, path in files.items():
        atomic_write(RunFolder.checkpoint_file(folder, tag, kind), lambda tmp, src=path: _link(src, tmp), TrainError)
        for old in RunFolder.generations(folder, tag, kind):
            if old != path:
                old.unlink(missing_ok=True)


def _link(src: Path, dst: Path) -> None:
    dst.unlink()
    link_or_copy(src, dst)


def restore_into(folder: Path, tag: str, block: HybridBlock, trainer: mx.gluon.Trainer | None, ctx) -> None:
    meta = read_json(RunFolder.checkpoint_record(folder, tag), TrainError, "the checkpoint record")
    files = checkpoint_files(folder, tag, meta)
    if trainer is not None and not isinstance(meta.get("optimizer"), dict):
        run = RunFolder(folder.parent)
        raise TrainError(f"Cannot resume {run}: its checkpoint keeps the optimizer state in '{files['states']}' as a "
                         f"Python pickle (gluontl's format before it stopped unpickling), and unpickling a file runs "
                         f"whatever code its author put in it; the hash recorded beside it only shows the folder "
                         f"agrees with itself, not who wrote it, so gluontl does not load it. Start a new run from "
                         f"this run's weights instead (the optimizer's momentum and the schedule start afresh): "
                         f"`gluontl finetune --recipe {run.recipe_path} --init-from {run.path / tag}`.")
    arrays = _load_arrays(files["params"])
    entries = named_params(block)
    missing = sorted(set(entries) - set(arrays))
    if missing:
        raise TrainError(f"Checkpoint '{RunFolder.checkpoint_file(folder, tag, 'params')}' lacks {missing[:3]}: "
                         f"it belongs to another model.")
    if trainer is not None:  # checked in full before anything is set
        optimizer = _checked_optimizer(trainer, meta["optimizer"], _load_arrays(files["states"]),
                                       f"'{RunFolder.checkpoint_record(folder, tag)}'")
    for n, e in entries.items():
        e.param.set_data(arrays[n])
    if trainer is not None:  # after set_data, which resets a kvstore that updates (and its state)
        _put_optimizer(trainer, *optimizer)


def load_ema(folder: Path, tag: str) -> tuple[Any, dict[str, mx.nd.NDArray]] | None:
    """The checkpoint's ema record and arrays (hash-checked), or None when it has none."""
    meta = load(folder, tag)
    if "ema_file" not in meta:
        return None
    return meta.get("ema"), _load_arrays(checkpoint_files(folder, tag, meta)["ema"])


def _load_arrays(path: Path) -> dict[str, mx.nd.NDArray]:
    try:
        arrays = mx.nd.load(str(path))
    except MXNetError as e:
        raise TrainError(f"Checkpoint file '{path}' is not an MXNet array file ({short_reason(e)}); it was "
                         f"written by something other than gluontl. Refusing it.") from None
    if arrays == []:  # what mx.nd.save writes for no arrays (e.g. SGD without momentum has no state)
        return {}
    if not isinstance(arrays, dict):
        raise TrainError(f"Checkpoint file '{path}' holds unnamed arrays; gluontl writes named ones. Refusing it.")
    return arrays


def _optimizer_name(trainer: mx.gluon.Trainer) -> str:
    return type(trainer_optimizer(trainer)).__name__.lower()


def optimizer_state(trainer: mx.gluon.Trainer) -> tuple[dict[str, mx.nd.NDArray], dict[str, Any]]:
    """The first updater's state (``Trainer.save_states`` saves that one too) as named CPU arrays,
    and the JSON record that puts them back: per parameter index, an array's name, None (no
    state, e.g. SGD without momentum) or a list of those (Adam's mean and variance)."""
    updater = trainer_updaters(trainer)[0]
    opt = trainer_optimizer(trainer)
    arrays: dict[str, mx.nd.NDArray] = {}

    def flat(state: Any, key: str) -> Any:
        if state is None:
            return None
        if isinstance(state, mx.nd.NDArray):
            arrays[key] = state.copyto(mx.cpu())
            return key
        if isinstance(state, (tuple, list)):
            return [flat(s, f"{key}.{j}") for j, s in enumerate(state)]
        raise TrainError(f"The {_optimizer_name(trainer)} optimizer keeps a {type(state).__name__} as its state, "
                         f"which gluontl cannot checkpoint; use train.optimizer sgd, nag, adam or adamw.")

    states = {str(i): flat(s, str(i)) for i, s in sorted(updater.states.items())}
    counts = {str(dev): {str(i): n for i, n in sorted(c.items())} for dev, c in update_counts(opt).items()}
    return arrays, {"format": 1, "optimizer": _optimizer_name(trainer), "num_update": opt.num_update,
                    "update_counts": counts, "states": states}


def _checked_optimizer(trainer: mx.gluon.Trainer, record: dict[str, Any], arrays: dict[str, mx.nd.NDArray],
                       where: str) -> tuple[dict[int, Any], dict[int, dict[int, int]], int]:
    """:func:`optimizer_state`'s record and arrays, checked against ``trainer`` (built afresh
    from the same recipe), as (states by index, update counts by device, num_update). Every
    value is checked: the files may come from anyone."""
    def bad(what: str) -> TrainError:
        return TrainError(f"Checkpoint {where} has an optimizer record that {what}; it was edited by hand or "
                          f"written by something other than gluontl. Refusing it; start a new run from its "
                          f"weights with --init-from.")

    def count(v: Any) -> int:
        if type(v) is not int or v < 0:
            raise bad(f"holds {v!r:.40} where an update count belongs")
        return v

    def index(k: str) -> int:
        if not (k.isascii() and k.isdigit()) or len(k) > 9 or int(k) >= len(params):
            raise bad(f"names parameter index {k!r:.40}, but the trainer has {len(params)} parameters")
        return int(k)

    params = trainer_params(trainer)
    name = _optimizer_name(trainer)
    if record.get("format") != 1 or record.get("optimizer") != name:
        raise bad(f"is for optimizer {record.get('optimizer')!r:.40} (format {record.get('format')!r:.20}) where "
                  f"this run uses {name!r} (format 1)")
    counts, states = record.get("update_counts"), record.get("states")
    if not isinstance(counts, dict) or not isinstance(states, dict) \
            or not all(isinstance(c, dict) for c in counts.values()):
        raise bad("lacks its update_counts or states tables")
    devices = {}
    for dev, table in counts.items():
        if not (dev.isascii() and dev.isdigit()):
            raise bad(f"names device {dev!r:.40}")
        devices[int(dev)] = {index(k): count(v) for k, v in table.items()}
    num_update = count(record.get("num_update"))

    def unflat(item: Any, i: int) -> Any:
        if item is None:
            return None
        if isinstance(item, list):
            return tuple(unflat(s, i) for s in item)
        a = arrays.get(item) if isinstance(item, str) else None
        want = np.dtype(params[i].dtype), tuple(params[i].shape)
        if a is None or (np.dtype(a.dtype), a.shape) != want:
            got = "nothing" if a is None else f"{np.dtype(a.dtype).name}{list(a.shape)}"
            raise bad(f"gives parameter {params[i].name} ({want[0].name}{list(want[1])}) the state array "
                      f"{item!r:.40}: {got}")
        return a

    return {index(k): unflat(v, index(k)) for k, v in states.items()}, devices, num_update


def _put_optimizer(trainer: mx.gluon.Trainer, loaded: dict[int, Any], devices: dict[int, dict[int, int]],
                   num_update: int) -> None:
    """The checked state into ``trainer``, so its next step is the one the saved trainer would take."""
    for updater in trainer_updaters(trainer):  # each context's updater its own copies, as load_states
        updater.states = {i: _copy(s) for i, s in loaded.items()}
        updater.states_synced = dict.fromkeys(loaded, False)  # moved to each weight's context on first use
    opt = trainer_optimizer(trainer)
    opt.num_update = num_update
    set_update_counts(opt, devices)


def _copy(state: Any) -> Any:
    if isinstance(state, tuple):
        return tuple(_copy(s) for s in state)
    return None if state is None else state.copy()
