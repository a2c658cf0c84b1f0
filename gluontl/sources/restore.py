"""Selective restore: load a params file where names and shapes match, report the rest.

The TF Object Detection API's ``fine_tune_checkpoint`` idea: a pretrained file rarely
fits the new model exactly (new head, renamed prefix), so we restore what fits and make
every other name an explicit, reviewable decision instead of a warning in a log.
"""
from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet.gluon import HybridBlock

from ..errors import ModelSourceError, RestoreError, short_reason
from ..naming import named_params, shape_of
from ..readers import read_json
from ..runfolder import RunFolder, run_weights


@dataclasses.dataclass
class RestoreReport:
    file: str
    restored: list[str] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)  # in model, not in file
    unexpected: list[str] = dataclasses.field(default_factory=list)  # in file, not used by model
    mismatched: list[tuple[str, tuple, tuple]] = dataclasses.field(default_factory=list)  # name, model, file
    # detectors: class-dependent layers rebuilt for new classes, some rows from the file (name, which)
    rebuilt: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def not_restored(self) -> list[str]:
        return self.missing + [m[0] for m in self.mismatched]

    def summary(self) -> str:
        return (f"restored {len(self.restored)} from {self.file}; missing {len(self.missing)}, "
                f"unexpected {len(self.unexpected)}, shape mismatch {len(self.mismatched)}"
                + (f", rebuilt for new classes {len(self.rebuilt)}" if self.rebuilt else ""))

    def lines(self) -> list[str]:
        out = [self.summary()]
        out += [f"  missing in file: {n}" for n in self.missing]
        out += [f"  unexpected in file: {n}" for n in self.unexpected]
        out += [f"  shape mismatch: {n} model {m} file {f}" for n, m, f in self.mismatched]
        out += [f"  rebuilt for new classes: {n} ({how})" for n, how in self.rebuilt]
        return out

    def check(self, expect_missing=(), expect_unexpected=(), expect_mismatch=()) -> None:
        """Raise unless every gap is covered by an expectation glob."""
        def uncovered(names, globs):
            return [n for n in names if not any(fnmatch.fnmatchcase(n, g) for g in globs)]

        problems = []
        if bad := uncovered(self.missing, expect_missing):
            problems.append(f"missing in the file: {_few(bad)} (declare with expect_missing)")
        if bad := uncovered(self.unexpected, expect_unexpected):
            problems.append(f"in the file but not in the model: {_few(bad)} (declare with expect_unexpected, "
                            f"or map names with prefix_map)")
        mism = {n: (m, f) for n, m, f in self.mismatched}
        if bad := uncovered(list(mism), expect_mismatch):
            shown = ", ".join(f"{n} model {mism[n][0]} file {mism[n][1]}" for n in bad[:5])
            problems.append(f"shape mismatch: {shown}{' …' if len(bad) > 5 else ''} (a new head? declare "
                            f"with expect_mismatch, e.g. ['{bad[0].rsplit('.', 1)[0]}.*'])")
        if problems:
            raise RestoreError(f"Restoring '{self.file}' left names the recipe did not expect — "
                               + "; ".join(problems) + ". Add the globs under model.restore in the recipe "
                               "if these are intended; otherwise the file does not belong to this model.")


def _few(names: list[str], k: int = 6) -> str:
    return ", ".join(names[:k]) + (f" … ({len(names)} in all)" if len(names) > k else "")


def read_params_file(path: str | Path) -> dict[str, mx.nd.NDArray]:
    """A ``.params`` file (or a run folder's checkpoint: ``runs/NAME[/best|/last]``) as
    {name: array}; ``arg:``/``aux:`` prefixes of exported files stripped."""
    p = Path(path)
    if not p.is_file():
        p = run_weights(p) or p
    if not p.is_file():
        raise ModelSourceError(f"Weights file '{p}' {'is a directory' if p.is_dir() else 'does not exist'}. Check "
                               f"model.weights in the recipe: a .params file or a run folder runs/NAME[/best|/last] "
                               f"(relative paths are resolved from the working directory).")
    try:
        loaded = mx.nd.load(str(p))
    except Exception as e:  # MXNetError for truncated or foreign files
        raise ModelSourceError(f"Weights file '{p}' is not a readable MXNet .params file "
                               f"({short_reason(e)}). Re-save it with save_parameters.") from None
    if not isinstance(loaded, dict):
        raise ModelSourceError(f"Weights file '{p}' holds an unnamed list of arrays; gluontl needs named "
                               f"parameters (save with net.save_parameters or HybridBlock.export).")
    return {k.split(":", 1)[1] if k[:4] in ("arg:", "aux:") else k: v for k, v in loaded.items()}


def restore(block: HybridBlock, path: str | Path, *, prefix_map: dict[str, str] | None = None,
            only: list[str] | None = None) -> RestoreReport:
    """Copy matching arrays from ``path`` into ``block`` (which must have concrete shapes).

    ``prefix_map`` maps a model-name prefix to the file-name prefix it is stored under
    (``{"backbone.": "features."}``); ``only`` restricts restoring to model names matching
    these globs (the rest count as missing-by-choice and are not reported).
    """
    arrays = read_params_file(path)
    entries = named_params(block)
    report = RestoreReport(file=str(path))
    keys = {}
    for name, e in entries.items():
        key = file_key(name, prefix_map or {})
        if key not in arrays and e.param.name in arrays:  # files written by export() use global names
            key = e.param.name
        keys[name] = key
    report.unexpected = sorted(set(arrays) - set(keys.values()))
    for name, e in entries.items():
        if only and not any(fnmatch.fnmatchcase(name, g) for g in only):
            continue
        key = keys[name]
        if key not in arrays:
            report.missing.append(name)
            continue
        src = arrays[key]
        if shape_of(e.param) != tuple(src.shape):
            report.mismatched.append((name, shape_of(e.param), tuple(src.shape)))
            continue
        e.param.set_data(src)  # casts to the parameter's dtype (a float64 file loads into float32)
        report.restored.append(name)
    return report


def file_key(name: str, prefix_map: dict[str, str]) -> str:
    for model_prefix in sorted(prefix_map, key=len, reverse=True):
        if name.startswith(model_prefix):
            return prefix_map[model_prefix] + name[len(model_prefix):]
    return name


def snapshot(block: HybridBlock) -> dict[str, np.ndarray]:
    """Copies of every parameter by structural name — the before/after of freezing checks."""
    mx.nd.waitall()  # oneDNN updates BN statistics asynchronously in backward
    return {n: e.param.data().asnumpy().copy() for n, e in named_params(block).items()}


def old_classes(weights: str) -> list[str] | None:
    """Class names of a run folder's model (its preprocess.json), for name-based reuse maps."""
    if run_weights(weights) is None:
        return None
    p = Path(weights)
    for card in (RunFolder(p).card_path, RunFolder(p.parent).card_path, RunFolder(p.parent.parent).card_path):
        if card.is_file():
            data = read_json(card, RestoreError, "the run card")
            classes = data.get("classes") if isinstance(data, dict) else None
            return [str(c) for c in classes] if isinstance(classes, list) else None
    return None


def reuse_map(reuse: dict[str, str], classes: list[str], old_names: list[str] | None, old_count: int
              ) -> dict[int, int]:
    """``restore.reuse`` as {new index: old index} for a class-dependent layer rebuilt for new classes;
    names resolve against the new classes and the old run's classes, integers as indices. Without a
    map, classes keep the rows of the old class of the same name (old names known) or of the same
    index (same count, names unknown)."""
    if not reuse:
        if old_names is not None:
            return {i: old_names.index(c) for i, c in enumerate(classes) if c in old_names}
        return {i: i for i in range(len(classes))} if old_count == len(classes) else {}
    return {_index(new, classes, "new", len(classes)): _index(old, old_names, "old", old_count)
            for new, old in reuse.items()}


def _index(label: str, names: list[str] | None, which: str, count: int) -> int:
    if names is not None and label in names:
        return names.index(label)
    if label.lstrip("-").isdigit() and 0 <= int(label) < count:
        return int(label)
    known = f"; {which} classes: {', '.join(names)}" if names else ""
    close = difflib.get_close_matches(label, names or [], n=1)
    raise RestoreError(f"model.restore.reuse names {which} class '{label}', which is not one of the {count} "
                       f"{which} classes{f' (did you mean {close[0]!r}?)' if close else ''}{known}. Use names "
                       f"(old names come from the weights' run folder) or indices 0..{count - 1}.")
