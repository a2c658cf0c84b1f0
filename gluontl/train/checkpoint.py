"""Checkpoints that survive kill -9: params, optimizer state and counters, written atomically.

A checkpoint is ``TAG.json`` naming and hashing (SHA-256) its ``TAG.<generation>.params``
and ``.states`` files. Each save writes a new generation and then the JSON, atomically: a
kill -9 at any moment leaves the JSON naming complete files, the old generation's or the new
one's (rewriting TAG.params in place left the old JSON over new params when killed between
the two). ``TAG.params``/``TAG.states`` are hard links to the committed generation for
readers of the run folder. Trainer states are pickled by MXNet; we load them only after
their hash matches the one our own run wrote.
"""
from __future__ import annotations

import hashlib
import json
import secrets
from pathlib import Path
from typing import Any

import mxnet as mx
from mxnet.gluon import HybridBlock

from ..atomic import atomic_write, link_or_copy, write_text
from ..errors import TrainError
from ..naming import named_params


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_params(block: HybridBlock, path: Path) -> Path:
    """Parameters under their structural names (what ``weights:`` and restore read).

    oneDNN's BatchNorm updates the running statistics in its backward, which the engine sees
    as a read of them: a copy right after a step would not wait for it and save the statistics
    one step behind (a resume then differs from an uninterrupted run), hence the waitall."""
    mx.nd.waitall()
    arrays = {n: e.param.list_data()[0].copyto(mx.cpu()) for n, e in named_params(block).items()}
    return atomic_write(path, lambda tmp: mx.nd.save(str(tmp), arrays), TrainError)


def save(folder: Path, tag: str, block: HybridBlock, trainer: mx.gluon.Trainer, state: dict[str, Any]) -> None:
    for stale in folder.glob(".*.tmp"):  # left by a kill -9 in the middle of a write
        stale.unlink(missing_ok=True)
    gen = secrets.token_hex(4)
    params = save_params(block, folder / f"{tag}.{gen}.params")
    states = atomic_write(folder / f"{tag}.{gen}.states", lambda tmp: trainer.save_states(str(tmp)), TrainError)
    meta = dict(state, params_file=params.name, states_file=states.name,
                params_sha256=_sha(params), states_sha256=_sha(states))
    write_text(folder / f"{tag}.json", json.dumps(meta, indent=1), TrainError)  # the commit
    for kind, path in (("params", params), ("states", states)):
        atomic_write(folder / f"{tag}.{kind}", lambda tmp, src=path: _link(src, tmp), TrainError)
        for old in folder.glob(f"{tag}.*.{kind}"):
            if old != path:
                old.unlink(missing_ok=True)


def _link(src: Path, dst: Path) -> None:
    dst.unlink()
    link_or_copy(src, dst)


def _files(folder: Path, tag: str, meta: dict[str, Any]) -> dict[str, Path]:
    """The params/states files the checkpoint names (TAG.params/.states before generations);
    only plain names inside the checkpoint folder count."""
    out = {}
    for kind in ("params", "states"):
        name = str(meta.get(f"{kind}_file", f"{tag}.{kind}"))
        if Path(name).name != name or name in ("", ".."):  # "." has no name: caught by the first test
            raise TrainError(f"Checkpoint '{folder / tag}.json' names '{name}' as its {kind} file, which is not "
                             f"a file of {folder}; refusing to read it. The JSON was edited by hand or is damaged.")
        out[kind] = folder / name
    return out


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
    if not isinstance(meta, dict):
        raise TrainError(f"Checkpoint file '{meta_path}' is not a checkpoint record (a JSON object); refusing it.")
    for kind, path in _files(folder, tag, meta).items():
        if not path.is_file() or _sha(path) != meta.get(f"{kind}_sha256"):
            raise TrainError(f"Checkpoint '{path}' does not match the hash recorded in '{meta_path.name}' "
                             f"(missing, modified or from another run); refusing to load it.")
    return meta


def restore_into(folder: Path, tag: str, block: HybridBlock, trainer: mx.gluon.Trainer | None, ctx) -> None:
    files = _files(folder, tag, json.loads((folder / f"{tag}.json").read_text()))
    arrays = mx.nd.load(str(files["params"]))
    entries = named_params(block)
    missing = sorted(set(entries) - set(arrays))
    if missing:
        raise TrainError(f"Checkpoint '{folder / tag}.params' lacks {missing[:3]}: it belongs to another model.")
    for n, e in entries.items():
        e.param.set_data(arrays[n])
    if trainer is not None:
        trainer.load_states(str(files["states"]))
