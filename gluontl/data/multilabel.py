"""Multi-label data (``task: multilabel``): every image has a set of labels, possibly empty.

Sources:

- ``labels:FILE.csv``: a header naming an ``image`` column and a ``labels`` column (``path``/``label``
  accepted as synonyms), labels separated by ``;`` (``a;b``; empty: no label). Paths relative to the
  file's folder.
- ``labels:FILE.json``: a list of ``{"image": PATH, "labels": [..]}`` (or a ``{PATH: [..]}`` mapping).
- ``labels:FOLDER``: one folder per label, ``FOLDER/<label>/<image>``; the same relative file name in
  several label folders is one image with all those labels (hard links or copies; the first label
  folder's file is read).
- ``demo:elpv_multilabel``: ELPV's 2,624 solar cells with labels {defective (p >= 0.5),
  polycrystalline}, on demo:elpv's own train/val split.

A path with ``{split}`` (or a folder holding ``train.csv``/``val.csv``) gives one file per split; a
single file or label folder is split by ``stratified_holdout`` on each image's label set (held out:
the run folder's ``split.json`` records it, counting images per label). Class names
are ``data.classes`` (a label outside them is an error naming the file and line), else the sorted
labels of the train split. Labels come out as float32 multi-hot vectors, so the feature cache and
``feature_batches`` carry them like class indices.
"""
from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..readers import read_json
from ..recipe import DataSpec
from .datasets import (SOURCES, BadImageReport, ImageDataset, _class_dirs, _file_problem, _files, csv_rows, listed_path,
                       screen_images)
from .demo import _cache_dir, elpv_labels, materialize
from .splits import stratified_holdout
from .transforms import Transform, sample_rng

MULTILABEL_DEMOS = {"demo:elpv_multilabel": ("defective", "polycrystalline")}
IMAGE_KEYS, LABEL_KEYS = ("image", "path"), ("labels", "label")
SEPARATOR = ";"
MAX_LABEL_CELLS = 1 << 26  # images x labels of the multi-hot matrix (512 MB as int64); beyond it a file is refused


class MultiLabelDataset(ImageDataset):
    """An :class:`ImageDataset` whose ``labels`` is an (N, classes) 0/1 matrix."""

    def __getitem__(self, key):
        index, epoch = (key, 0) if isinstance(key, (int, np.integer)) else key
        rng = sample_rng(self.seed, epoch, index) if self.transform.random else None
        return self.transform(self.image(index), rng), self.labels[index].astype(np.float32)


def load_multilabel(spec: DataSpec, split: str, transform: Transform, seed: int, check: bool) -> MultiLabelDataset:
    """Split ``split`` of a multi-label source, checked for bad images like every split."""
    source = spec.source
    if source in MULTILABEL_DEMOS:
        source = "labels:" + str(elpv_multilabel_folder(spec.val_fraction) / "{split}.csv")
    where, whole = _split_path(source.partition(":")[2], split, spec)
    paths, sets, lines = _read(where)
    _first_seen(paths, lines, where)
    names = list(spec.classes) if spec.classes is not None else _names(spec, split, where, whole, sets)
    labels = _multi_hot(sets, names, lines, where, spec)
    rows = np.arange(len(paths))
    if whole:
        combo = np.unique(labels, axis=0, return_inverse=True)[1].reshape(-1)
        is_val = stratified_holdout(combo, spec.val_fraction)
        rows = rows[is_val == (split == spec.val)]
    chosen = [paths[r] for r in rows]
    keep, bad = screen_images([str(p) for p in chosen], lambda i: _file_problem(chosen[i]), spec,
                              f"split '{split}' of '{where}'") if check else (np.ones(len(chosen), bool),
                                                                              BadImageReport())
    if not keep.any():
        raise DataError(f"Split '{split}' of '{where}' has no usable images. Check data.source and the split "
                        f"names data.train / data.val.")
    items = [str(p) for p, k in zip(chosen, keep) if k]
    return MultiLabelDataset(items, labels[rows][keep], names, transform, seed, bad, held_out=whole)


def _split_path(rest: str, split: str, spec: DataSpec) -> tuple[Path, bool]:
    if "{split}" in rest:
        return Path(rest.replace("{split}", split)).expanduser(), False
    p = Path(rest).expanduser()
    if p.is_dir() and (p / f"{spec.train}.csv").is_file():
        return p / f"{split}.csv", False
    if split not in (spec.train, spec.val):
        raise DataError(f"'{p}' holds train and val in one ({spec.train}/{spec.val}); it has no split '{split}'. "
                        f"Put {{split}} in data.source to use one file per split.")
    return p, True


def _read(where: Path) -> tuple[list[Path], list[list[str]], list[str]]:
    """(image paths, their label lists, where each was listed) of a CSV, JSON or label-folder source."""
    if where.is_dir():
        return _read_folders(where)
    if not where.is_file():
        raise DataError(f"Label file '{where}' does not exist. data.source labels:PATH takes a CSV (image,labels "
                        f"with labels a;b), a JSON list of {{image, labels}}, or a folder of label folders.")
    if where.suffix.lower() == ".json":
        return _read_json(where)
    return _read_csv(where)


def _read_csv(f: Path) -> tuple[list[Path], list[list[str]], list[str]]:
    rows = csv_rows(f, f"image,labels with the labels separated by '{SEPARATOR}'")
    header = [c.strip().lower() for c in rows[0]] if rows else []
    image_col = next((header.index(k) for k in IMAGE_KEYS if k in header), None)
    label_col = next((header.index(k) for k in LABEL_KEYS if k in header), None)
    if image_col is None or label_col is None:
        missing = "labels" if image_col is not None else "image" if label_col is not None else "image and labels"
        raise DataError(f"{f}, line 1: the header {rows[0] if rows else '(empty file)'} has no {missing} column. "
                        f"A multi-label CSV starts with the header 'image,labels' and lists one image per line "
                        f"with its labels separated by '{SEPARATOR}' (e.g. cell1.png,defective;polycrystalline).")
    paths, sets, lines = [], [], []
    for line_no, row in enumerate(rows[1:], 2):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if len(row) <= max(image_col, label_col):
            raise DataError(f"{f}, line {line_no}: expected {len(header)} fields ({','.join(header)}), got "
                            f"{len(row)}. Quote paths that contain commas.")
        paths.append(listed_path(row[image_col].strip(), f, f"{f}, line {line_no}"))
        sets.append([s.strip() for s in row[label_col].split(SEPARATOR) if s.strip()])
        lines.append(f"{f}, line {line_no}")
    return paths, sets, lines


def _read_json(f: Path) -> tuple[list[Path], list[list[str]], list[str]]:
    data = read_json(f, DataError, "the label file")
    if isinstance(data, dict):
        data = [{"image": k, "labels": v} for k, v in data.items()]
    paths, sets, lines = [], [], []
    for i, item in enumerate(data if isinstance(data, list) else [None]):
        labels = item.get("labels") if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(item.get("image"), str) or not isinstance(labels, list) \
                or not all(isinstance(x, str) for x in labels):
            raise DataError(f"{f}, item {i}: expected {{\"image\": PATH, \"labels\": [names]}} (a list of them, or a "
                            f"mapping of image paths to label lists), got {str(item)[:80]}. Fix the file.")
        paths.append(listed_path(item["image"], f, f"{f}, item {i}"))
        sets.append(labels)
        lines.append(f"{f}, item {i}")
    return paths, sets, lines


def _read_folders(root: Path) -> tuple[list[Path], list[list[str]], list[str]]:
    found: dict[Path, list[str]] = {}
    first: dict[Path, Path] = {}
    for label in _class_dirs(root):
        for p in _files(root / label):
            rel = p.relative_to(root / label)
            found.setdefault(rel, []).append(label)
            first.setdefault(rel, p)
    if not found:
        raise DataError(f"Label folder '{root}' has no images in label folders. labels:FOLDER takes "
                        f"FOLDER/<label>/<image>, the same file name under each of an image's labels.")
    order = sorted(found)
    return [first[r] for r in order], [found[r] for r in order], [f"{root}/*/{r}" for r in order]


def _first_seen(paths: list[Path], lines: list[str], where: Path) -> None:
    """An image listed twice is refused: its two label sets would disagree or double its weight."""
    seen: dict[str, int] = {}
    for i, p in enumerate(paths):
        key = str(p.resolve()) if os.path.exists(p) else str(p)  # a name too long to stat does not exist
        if key in seen:
            raise DataError(f"{lines[i]}: image '{p}' is listed twice in '{where}' (first at "
                            f"{lines[seen[key]].rpartition(', ')[2]}). List each image once, with all its "
                            f"labels separated by '{SEPARATOR}'.")
        seen[key] = i


def _names(spec: DataSpec, split: str, where: Path, whole: bool, sets: list[list[str]]) -> list[str]:
    """The sorted labels of the train split (its file when there is one per split)."""
    if whole or split == spec.train:
        return sorted({s for labels in sets for s in labels})
    train, _ = _split_path(spec.source.partition(":")[2], spec.train, spec) if spec.source not in MULTILABEL_DEMOS \
        else (where.with_name(f"{spec.train}.csv"), False)
    return sorted({s for labels in _read(train)[1] for s in labels})


def _multi_hot(sets: list[list[str]], names: list[str], lines: list[str], where: Path, spec: DataSpec) -> np.ndarray:
    index = {n: i for i, n in enumerate(names)}
    if len(sets) * len(names) > MAX_LABEL_CELLS:  # e.g. another separator than ';' makes every label set one label
        raise DataError(f"'{where}' lists {len(sets):,} images with {len(names):,} different labels "
                        f"({', '.join(n[:40] for n in names[:3])}, ...): a multi-hot table of "
                        f"{len(sets) * len(names):,} cells, over gluontl's "
                        f"{MAX_LABEL_CELLS:,}. Check that labels are separated by '{SEPARATOR}', or list fewer labels "
                        f"in data.classes.")
    out = np.zeros((len(sets), len(names)), np.int64)
    for row, (labels, line) in enumerate(zip(sets, lines)):
        for name in labels:
            if name not in index:
                said = "data.classes" if spec.classes is not None else "the train split's labels"
                shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
                raise DataError(f"{line}: unknown label '{name[:80]}' (the labels are {said}: {shown}). "
                                f"Fix the label, or add it to data.classes.")
            out[row, index[name]] = 1
    if len(names) < 1:
        raise DataError(f"'{where}' lists no labels at all; a multi-label source needs at least one label name.")
    return out


def elpv_multilabel_folder(val_fraction: float) -> Path:
    """``train.csv``/``val.csv`` of ELPV with labels defective;polycrystalline (absolute paths to
    the installed images), on demo:elpv's split (the same stratified hold-out)."""
    def fill(tmp: Path) -> None:
        paths, probs, types = elpv_labels()
        levels = np.rint(probs * 3).astype(np.int64)
        kinds = np.unique(types, return_inverse=True)[1]
        is_val = stratified_holdout(levels * (kinds.max() + 1) + kinds, val_fraction)
        for split, want in (("train", False), ("val", True)):
            with open(tmp / f"{split}.csv", "w", newline="", encoding="utf-8") as fh:
                w = csv.writer(fh)
                w.writerow(["image", "labels"])
                for src, p, t, v in zip(paths, probs, types, is_val):
                    if v == want:
                        w.writerow([str(src), SEPARATOR.join(
                            [n for n, on in zip(MULTILABEL_DEMOS["demo:elpv_multilabel"], (p >= 0.5, t == "poly"))
                             if on])])

    return materialize(_cache_dir("elpv_multilabel", val_fraction, None), "elpv_multilabel", fill)


SOURCES.update({"labels:": load_multilabel, **{name: load_multilabel for name in MULTILABEL_DEMOS}})
