"""A run folder's checkpoint files as read back: ``checkpoints/TAG.json`` naming and hashing its
``TAG.<generation>.params`` and ``.states``. At the bottom of the house so that restore
(``weights: runs/NAME``) and detection's class reuse read a run without importing the loop that
writes it (``data/checkpoint.py``)."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from .errors import TrainError
from .readers import read_json


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_files(folder: Path, tag: str, meta: dict[str, Any]) -> dict[str, Path]:
    """The params/states files the checkpoint names (TAG.params/.states before generations);
    only plain names inside the checkpoint folder count."""
    out = {}
    for kind in ("params", "states", *(("ema",) if "ema_file" in meta else ())):  # ema: train.ema's average
        name = str(meta.get(f"{kind}_file", f"{tag}.{kind}"))
        if Path(name).name != name or name in ("", ".."):  # "." has no name: caught by the first test
            raise TrainError(f"Checkpoint '{folder / tag}.json' names '{name}' as its {kind} file, which is not "
                             f"a file of {folder}; refusing to read it. The JSON was edited by hand or is damaged.")
        out[kind] = folder / name
    return out


def read_checkpoint(folder: Path, tag: str) -> dict[str, Any]:
    """The checkpoint's counters, after checking its files are the ones it recorded."""
    meta_path = folder / f"{tag}.json"
    if not meta_path.is_file():
        raise TrainError(f"No checkpoint '{tag}' in {folder}: '{meta_path.name}' is missing. "
                         f"Resume needs a run folder written by gluontl finetune.")
    meta = read_json(meta_path, TrainError, "the checkpoint record")
    if not isinstance(meta, dict):
        raise TrainError(f"Checkpoint file '{meta_path}' is not a checkpoint record (a JSON object); refusing it.")
    for kind, path in checkpoint_files(folder, tag, meta).items():
        if not path.is_file() or file_sha256(path) != meta.get(f"{kind}_sha256"):
            raise TrainError(f"Checkpoint '{path}' does not match the hash recorded in '{meta_path.name}' "
                             f"(missing, modified or from another run); refusing to load it.")
    return meta


def run_weights(ref: str | Path) -> Path | None:
    """The params file of a run checkpoint named as ``RUN`` (its best), ``RUN/best`` or
    ``RUN/last``, hash-checked; None when ``ref`` names no run folder."""
    path, tag = Path(ref), "best"
    if path.name in ("best", "last") and not path.is_dir() and (path.parent / "recipe.yaml").is_file():
        path, tag = path.parent, path.name
    if not (path / "recipe.yaml").is_file():
        return None
    folder = path / "checkpoints"
    if not (folder / f"{tag}.json").is_file():
        raise TrainError(f"Run '{path}' has no '{tag}' checkpoint ({folder / tag}.json is missing) to start from: "
                         f"it stopped before finishing an epoch. Finish it with `gluontl finetune --resume {path}`"
                         f"{', or name RUN/last' if tag == 'best' and (folder / 'last.json').is_file() else ''}.")
    return checkpoint_files(folder, tag, read_checkpoint(folder, tag))["params"]


def discard_unstarted(run_dir: Path) -> bool:
    """Remove a new run's folder when the run ended before its first checkpoint: nothing in it can
    be resumed, and each failed attempt would leave one more (``NAME``, ``NAME-2``, ...)."""
    if (run_dir / "checkpoints" / "last.json").exists():
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True
