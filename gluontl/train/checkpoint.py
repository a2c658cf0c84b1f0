"""Checkpoints that survive kill -9: params, optimizer state and counters, written atomically.

A checkpoint is three files (``TAG.params``, ``TAG.states``, ``TAG.json``); the JSON is
written last and records the SHA-256 of the other two, so a reader trusts a checkpoint
only when all three agree. Trainer states are pickled by MXNet; we load them only after
their hash matches the one our own run wrote.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import mxnet as mx
from mxnet.gluon import HybridBlock

from ..atomic import atomic_write, write_text
from ..errors import TrainError
from ..naming import named_params


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_params(block: HybridBlock, path: Path) -> Path:
    """Parameters under their structural names (what ``weights:`` and restore read)."""
    arrays = {n: e.param.data().copyto(mx.cpu()) for n, e in named_params(block).items()}
    return atomic_write(path, lambda tmp: mx.nd.save(str(tmp), arrays), TrainError)


def save(folder: Path, tag: str, block: HybridBlock, trainer: mx.gluon.Trainer, state: dict[str, Any]) -> None:
    for stale in folder.glob(".*.tmp"):  # left by a kill -9 in the middle of a write
        stale.unlink(missing_ok=True)
    params = save_params(block, folder / f"{tag}.params")
    states = atomic_write(folder / f"{tag}.states", lambda tmp: trainer.save_states(str(tmp)), TrainError)
    meta = dict(state, params_sha256=_sha(params), states_sha256=_sha(states))
    write_text(folder / f"{tag}.json", json.dumps(meta, indent=1), TrainError)


def load(folder: Path, tag: str) -> dict[str, Any]:
    """The checkpoint's counters, after checking its files are the ones it recorded."""
    meta_path = folder / f"{tag}.json"
    if not meta_path.is_file():
        raise TrainError(f"No checkpoint '{tag}' in {folder}: '{meta_path.name}' is missing. "
                         f"Resume needs a run folder written by gluontl finetune.")
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        raise TrainError(f"Checkpoint file '{meta_path}' is unreadable ({e}).") from None
    for kind in ("params", "states"):
        path = folder / f"{tag}.{kind}"
        if not path.is_file() or _sha(path) != meta.get(f"{kind}_sha256"):
            raise TrainError(f"Checkpoint '{path}' does not match the hash recorded in '{meta_path.name}' "
                             f"(missing, modified or from another run); refusing to load it.")
    return meta


def restore_into(folder: Path, tag: str, block: HybridBlock, trainer: mx.gluon.Trainer | None, ctx) -> None:
    arrays = mx.nd.load(str(folder / f"{tag}.params"))
    entries = named_params(block)
    missing = sorted(set(entries) - set(arrays))
    if missing:
        raise TrainError(f"Checkpoint '{folder / tag}.params' lacks {missing[:3]}: it belongs to another model.")
    for n, e in entries.items():
        e.param.set_data(arrays[n])
    if trainer is not None:
        trainer.load_states(str(folder / f"{tag}.states"))
