"""Datasets and loaders for every ``data.source``, with an up-front bad-image pass.

A split is resolved to a list of items (file paths, or record keys of one ``.rec``) and
integer labels, then every item is checked once before training starts (see
``transforms.image_problem``): under ``on_bad_image: error`` the first bad file is a
``DataError`` naming it, under ``skip`` bad files are left out and listed in a
``BadImageReport``. This way a long run cannot die on a broken JPEG in epoch 7.

Determinism: the loaders are driven by :class:`EpochSampler`, whose sample order is a pure
function of ``(seed, epoch)`` and which hands the dataset ``(index, epoch)`` keys; random
transforms draw from ``sample_rng(seed, epoch, index)``. So batches do not depend on the
worker count, and resuming mid-epoch is ``set_epoch(e); skip(k)``.

Folder sources ignore hidden files and folders (``.DS_Store``, ``.ipynb_checkpoints``) and
read class folders recursively. Labels come out as float32 (MXNet's convention, what
``SoftmaxCrossEntropyLoss`` and the metrics take); images as float32 CHW.

A ``folder:`` source is either split folders (``PATH/<split>/<class>/...``) or plain class
folders (``PATH/<class>/...``, as torchvision's ImageFolder). Plain class folders and single-file
``list:`` and ``rec:`` sources (no ``{split}`` in the path) are split into train and val by a
stratified hold-out of ``data.val_fraction`` with the fixed ``SPLIT_SEED``, like the demos; the
loaders then carry a :class:`SplitRecord` that training writes to the run folder as
``split.json``, so which files were held out can be audited.
"""
from __future__ import annotations

import csv
import functools
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Literal

import numpy as np
from mxnet import gluon, nd, recordio
from mxnet.gluon.data.dataloader import default_batchify_fn, default_mp_batchify_fn

from ..console import progress
from ..errors import DataError
from ..readers import read_text
from ..recipe import DataSpec
from .sampler import EpochSampler
from .splits import SPLIT_SEED, stratified_holdout
from .transforms import Transform, build, decode_image, image_problem, sample_rng

_PROGRESS_MIN = 1000  # show a progress bar for the bad-image pass above this many items (on a terminal)
MAX_LIST_LABEL = 99_999  # a list: label makes labels 0..label classes: a bound, or one mistyped line asks for 10^11


@dataclass
class BadImageReport:
    """Items left out under ``on_bad_image: skip``, as ``(path, reason)``."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, path: str, reason: str) -> None:
        self.items.append((path, reason))

    def extend(self, other: "BadImageReport") -> None:
        self.items.extend(other.items)

    def __len__(self) -> int:
        return len(self.items)

    def summary(self) -> str:
        if not self.items:
            return "no bad images"
        first = "; ".join(f"{p} ({r})" for p, r in self.items[:3])
        more = f"; and {len(self.items) - 3} more" if len(self.items) > 3 else ""
        return f"skipped {len(self.items)} bad item(s): {first}{more}"


class ImageDataset(gluon.data.Dataset):
    """One split: ``ds[i]`` or ``ds[(i, epoch)]`` -> ``(float32 CHW, float32 label)``.

    Items are file paths, or record keys when ``rec`` names a RecordIO file (the reader is
    reopened per process by MXNet, so forked workers do not share a file position).
    """

    def __init__(self, items: list[str] | list[int], labels: np.ndarray, class_names: list[str],
                 transform: Transform, seed: int, bad: BadImageReport, rec: str | None = None,
                 held_out: bool = False) -> None:
        self.items = items
        self.held_out = held_out  # the split is a stratified hold-out of one pool (see SplitRecord)
        self.labels = labels.astype(np.int64)
        self.class_names = class_names
        self.transform = transform
        self.seed = seed
        self.bad = bad
        self.rec_path = rec
        self._rec = _open_rec(rec) if rec else None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[np.ndarray, np.float32]:
        index, epoch = (key, 0) if isinstance(key, (int, np.integer)) else key
        rng = sample_rng(self.seed, epoch, index) if self.transform.random else None
        return self.transform(self.image(index), rng), np.float32(self.labels[index])

    def image(self, index: int) -> np.ndarray:
        """The decoded HWC uint8 RGB image, before transforms."""
        if self._rec is None:
            return decode_image(self.items[index])
        _, payload = recordio.unpack(self._rec.read_idx(self.items[index]))
        return decode_image(payload, self.name(index))

    def name(self, index: int) -> str:
        """Where item ``index`` comes from: a file path or ``file.rec#key``."""
        return f"{self.rec_path}#{self.items[index]}" if self._rec is not None else str(self.items[index])


@dataclass
class SplitRecord:
    """An automatic train/val split, for audits: written as the run folder's ``split.json``."""

    source: str
    val_fraction: float
    counts: dict[str, dict[str, int]]  # split -> class -> usable images
    val: list[str]  # the held-out items (paths, or file.rec#key), in dataset order
    seed: int = SPLIT_SEED
    method: str = "stratified_holdout"

    def to_json(self) -> dict:
        return {"source": self.source, "method": self.method, "seed": self.seed,
                "val_fraction": self.val_fraction, "counts": self.counts, "val": self.val}

    def summary(self, train: int, val: int, shown: int = 12) -> str:
        """One line for the console: small data needs its split's counts in view, not only in split.json."""
        per = self.counts.get("train", {})
        pairs = [f"{c} {n}/{self.counts.get('val', {}).get(c, 0)}" for c, n in per.items()]
        more = f", and {len(pairs) - shown} more classes" if len(pairs) > shown else ""
        return (f"automatic split of {self.source} (data.val_fraction {self.val_fraction:g}, seed {self.seed}): "
                f"train {train} images, val {val}; images per class (train/val): {', '.join(pairs[:shown])}{more}")


@dataclass
class Loaders:
    """What the training loop needs; a loader not asked for is None."""

    train: gluon.data.DataLoader | None
    val: gluon.data.DataLoader | None
    class_names: list[str]
    num_classes: int
    train_size: int
    val_size: int
    bad: BadImageReport
    train_sampler: EpochSampler | None = None
    val_sampler: EpochSampler | None = None
    split: SplitRecord | None = None  # set when train/val come from an automatic hold-out

    def train_epoch(self, epoch: int, skip_batches: int = 0) -> gluon.data.DataLoader:
        """The train loader set to ``epoch``, starting at batch ``skip_batches`` (resume)."""
        self.train_sampler.set_epoch(epoch)
        self.train_sampler.skip(skip_batches)
        return self.train


SOURCES: dict[str, Callable[..., ImageDataset]] = {}  # more sources (a scheme "x:" or a whole name), by their modules


def load_split(spec: DataSpec, split: str, *, train: bool = False, seed: int = 0,
               check: bool = True) -> ImageDataset:
    """The dataset of split ``split``, checked for bad images (``check=False``: listed only).

    ``train=True`` applies ``train_transform`` with its random steps (seeded by ``seed``);
    otherwise ``val_transform``, deterministically (evaluate, predict).
    """
    transform = build(spec.train_transform, True) if train else build(spec.val_transform, False)
    scheme, _, rest = spec.source.partition(":")
    other = next((f for k, f in SOURCES.items() if spec.source == k or (k.endswith(":") and scheme + ":" == k)), None)
    if other is not None:
        return other(spec, split, transform, seed, check)
    if scheme == "demo":
        from .demo import demo_folder
        return _folder(demo_folder(rest, spec.val_fraction), split, spec, transform, seed, check)
    if scheme == "folder":
        return _folder(Path(rest).expanduser(), split, spec, transform, seed, check)
    if scheme == "list":
        return _listfile(rest, split, spec, transform, seed, check)
    return _recfile(rest, split, spec, transform, seed, check)


def make_loaders(spec: DataSpec, *, seed: int, shuffle_train: bool = True,
                 which: Iterable[Literal["train", "val"]] = ("train", "val")) -> Loaders:
    """Train/val loaders; train drops its last partial batch unless data.last_batch: keep (BatchNorm-friendly)."""
    sets = {w: load_split(spec, getattr(spec, w), train=(w == "train"), seed=seed)
            for w in dict.fromkeys(which)}
    class_names = max((ds.class_names for ds in sets.values()), key=len)
    bad = BadImageReport()
    loaders: dict[str, gluon.data.DataLoader | None] = {"train": None, "val": None}
    samplers: dict[str, EpochSampler | None] = {"train": None, "val": None}
    for w, ds in sets.items():
        ds.class_names = class_names
        bad.extend(ds.bad)
        sampler = split_sampler(spec, w, len(ds), seed=seed, shuffle_train=shuffle_train)
        if w == "train" and shuffle_train and spec.sampler != "uniform":
            from .balance import class_sampler
            sampler = class_sampler(ds.labels, class_names, mode=spec.sampler, batch_size=spec.batch_size, seed=seed,
                                    last_batch=sampler.last_batch, where=f"the train split '{spec.train}' of "
                                    f"{spec.source}")
        batchify = functools.partial(_batchify, shared=spec.workers > 0, split=getattr(spec, w))
        loaders[w] = gluon.data.DataLoader(ds, batch_sampler=sampler, batchify_fn=batchify,
                                           num_workers=spec.workers, thread_pool=False)
        samplers[w] = sampler
    return Loaders(train=loaders["train"], val=loaders["val"], class_names=class_names,
                   num_classes=len(class_names),
                   train_size=len(sets["train"]) if "train" in sets else 0,
                   val_size=len(sets["val"]) if "val" in sets else 0, bad=bad,
                   train_sampler=samplers["train"], val_sampler=samplers["val"], split=_split_record(spec, sets))


def require_two_classes(spec: DataSpec, class_names: list[str] | None = None) -> None:
    """A classifier of one class has nothing to learn: softmax over one logit is 1.0 whatever the
    image, so training reaches val_acc 1.0 and predict answers that class for anything. Refused
    (``plan`` and ``finetune``) rather than trained; ``class_names`` lists the train split when not given."""
    if class_names is None:
        if spec.classes is not None:
            class_names = spec.classes
        elif spec.source.startswith("demo:"):  # the demo sets have their classes
            return
        else:
            class_names = load_split(spec, spec.train, check=False).class_names
    if len(class_names) >= 2:
        return
    found = f"one class ({class_names[0]!r})" if class_names else "no class"
    raise DataError(f"data.source {spec.source} has {found}, but a classifier needs at least two: with one "
                    f"class every image scores 1.0 for it, so training learns nothing (val accuracy 1.0) and "
                    f"predict answers that class for any image. Add a folder of images that are not "
                    f"{class_names[0] if class_names else 'the class'} (e.g. 'other'), or list two or more in "
                    f"data.classes; to flag unusual images use a detector of outliers, not a one-class "
                    f"classifier.")


def split_sampler(spec: DataSpec, which: Literal["train", "val"], n: int, *, seed: int,
                  shuffle_train: bool) -> EpochSampler:
    """The sampler of split ``which`` (val: in order, all batches); no batch at all is a DataError."""
    is_train = which == "train"
    # a split smaller than one batch trains as one smaller batch rather than none (a first folder of
    # a few photos); larger splits keep data.last_batch, so their epochs are what they always were
    last = spec.last_batch if is_train and n >= spec.batch_size else "keep"
    sampler = EpochSampler(n, spec.batch_size, seed=seed, shuffle=is_train and shuffle_train, last_batch=last)
    if len(sampler) == 0:
        raise DataError(f"The {which} split '{getattr(spec, which)}' of {spec.source} has {n} usable "
                        f"images, fewer than data.batch_size {spec.batch_size}, so an epoch would "
                        f"have no batches. Lower data.batch_size or add images.")
    return sampler


def _split_record(spec: DataSpec, sets: dict[str, ImageDataset]) -> SplitRecord | None:
    if "val" not in sets or not sets["val"].held_out:
        return None
    counts = {w: {c: int(np.sum(ds.labels[:, i]) if ds.labels.ndim == 2 else np.sum(ds.labels == i))  # multi-hot rows
                  for i, c in enumerate(ds.class_names)} for w, ds in sets.items()}
    val = sets["val"]
    return SplitRecord(spec.source, spec.val_fraction, counts, [val.name(i) for i in range(len(val))])


def split_preview(spec: DataSpec) -> tuple[SplitRecord, int, int] | None:
    """The automatic split (and its train/val sizes) as listed, before finetune's bad-image pass
    (``gluontl plan``); None for sources that come split."""
    if spec.source.startswith("demo:"):  # made as split folders: nothing to list cheaply or to split
        return None
    sets = {w: load_split(spec, getattr(spec, w), check=False) for w in ("train", "val")}
    record = _split_record(spec, sets)
    return None if record is None else (record, len(sets["train"]), len(sets["val"]))


# ---------------------------------------------------------------- batching

def _batchify(samples: list[tuple[np.ndarray, np.float32]], shared: bool, split: str) -> list[nd.NDArray]:
    """MXNet's batchify, after checking shapes so a missing resize is a clear error."""
    shapes = {s[0].shape for s in samples}
    if len(shapes) > 1:
        raise DataError(f"Images of split '{split}' come out of the transforms with different sizes "
                        f"({', '.join(map(str, sorted(shapes)))}), so they cannot form a batch. Set "
                        f"resize, center_crop or random_resized_crop in the data transform.")
    return (default_mp_batchify_fn if shared else default_batchify_fn)(samples)


# ---------------------------------------------------------------- checking

def screen_images(names: list[str], problem, spec: DataSpec, what: str) -> tuple[np.ndarray, BadImageReport]:
    """Run ``problem(i)`` over every item; keep-mask plus the report (or raise under ``error``)."""
    keep = np.ones(len(names), bool)
    bad = BadImageReport()
    rows: Iterable[int] = range(len(names))
    if len(names) >= _PROGRESS_MIN:
        rows = progress(rows, False, desc=f"checking {what}", unit="img")
    for i in rows:
        reason = problem(i)
        if reason is None:
            continue
        if spec.on_bad_image == "error":
            raise DataError(f"Bad image '{names[i]}' in {what}: {reason}. Replace or delete it, or "
                            f"set data.on_bad_image: skip to leave bad images out (they are reported).")
        keep[i] = False
        bad.add(names[i], reason)
    return keep, bad


def require_classes(labels: np.ndarray, class_names: list[str], where: list[str], spec: DataSpec,
                     what: str, bad: BadImageReport) -> None:
    """A class with no usable item is an error (or a report line under ``skip``)."""
    empty = [i for i in range(len(class_names)) if not np.any(labels == i)]
    if not empty:
        return
    if spec.on_bad_image == "error":
        raise DataError(f"{what}: class(es) {', '.join(where[i] for i in empty)} have no usable images. "
                        f"Add images, drop them from data.classes, or set data.on_bad_image: skip.")
    for i in empty:
        bad.add(where[i], "class has no usable images")


def _finish(items: list, labels: np.ndarray, names: list[str], problem, class_names: list[str],
            class_where: list[str] | None, spec: DataSpec, what: str, transform: Transform, seed: int,
            rec: str | None = None, held_out: bool = False, check: bool = True) -> ImageDataset:
    keep, bad = screen_images(names, problem, spec, what) if check else (np.ones(len(names), bool), BadImageReport())
    labels = labels[keep]
    if class_where is not None:  # classes were declared (folders, data.classes), not inferred
        require_classes(labels, class_names, class_where, spec, what, bad)
    if len(labels) == 0:
        raise DataError(f"{what} has no usable images. Check data.source and the split names "
                        f"data.train / data.val.")
    return ImageDataset([it for it, k in zip(items, keep) if k], labels, class_names, transform,
                        seed, bad, rec, held_out)


def _file_problem(path: Path) -> str | None:
    # os.path.isfile, not Path.is_file: a listed name too long for the file system is "does not exist", not OSError
    return image_problem(path) if os.path.isfile(path) else "file does not exist"


# ---------------------------------------------------------------- folder:

def _class_dirs(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))


def _files(d: Path) -> list[Path]:
    """Every non-hidden file under ``d``, recursively, sorted."""
    return sorted(p for p in d.rglob("*") if p.is_file() and not any(s.startswith(".") for s in p.relative_to(d).parts))


def _has_split_folders(root: Path, spec: DataSpec) -> bool:
    """Which folder layout ``root`` has: split folders (True) or plain class folders (False)."""
    trees = (f"either class folders, split automatically by data.val_fraction (PATH/<class>/<image>, e.g. "
             f"PATH/cat/001.jpg, PATH/dog/002.jpg), or split folders (PATH/{spec.train}/<class>/<image> and "
             f"PATH/{spec.val}/<class>/<image>, named by data.train and data.val)")
    if not root.is_dir():
        raise DataError(f"Image folder '{root}' {'is a file' if root.exists() else 'does not exist'}. A folder: "
                        f"source takes {trees}. Fix data.source.")
    dirs = _class_dirs(root)
    if not dirs:
        loose = [p.name for p in root.iterdir() if p.is_file() and not p.name.startswith(".")]
        raise DataError(f"Image folder '{root}' has no sub-folders ({len(loose)} loose file(s)), so it has no "
                        f"classes. A folder: source takes {trees}. Move the images into one folder per class, "
                        f"or use a list: CSV of path,label lines.")
    splits = {spec.train, spec.val} & set(dirs)
    if not splits:
        return False
    mixed = [d for d in dirs if d not in splits and any(p.is_file() and not p.name.startswith(".")
                                                      for p in (root / d).iterdir())]
    if mixed:
        raise DataError(f"Image folder '{root}' mixes split folders ({', '.join(sorted(splits))}) with class "
                        f"folders holding images ({', '.join(mixed[:5])}), so gluontl cannot tell which layout "
                        f"it is. A folder: source takes {trees}. Move the class folders into the split folders, "
                        f"or point data.source at a folder with one layout.")
    return True


def _folder(root: Path, split: str, spec: DataSpec, transform: Transform, seed: int, check: bool) -> ImageDataset:
    if not _has_split_folders(root, spec):
        return _class_folders(root, split, spec, transform, seed, check)
    split_dir = root / split
    if not split_dir.is_dir():
        have = _class_dirs(root) if root.is_dir() else []
        raise DataError(f"Image folder '{split_dir}' does not exist. A folder source needs "
                        f"PATH/<split>/<class>/<images>; folders found under '{root}': "
                        f"{', '.join(have) or 'none'}. Fix data.source or data.{_role(spec, split)}.")
    present = _class_dirs(split_dir)
    if spec.classes is not None:
        classes = spec.classes
        missing = [c for c in classes if c not in present]
        if missing:
            raise DataError(f"data.classes names {', '.join(missing)}, which are not class folders of "
                            f"'{split_dir}'. Valid class folder names: {', '.join(present) or 'none'}.")
    else:
        train_dir = root / spec.train
        classes = _class_dirs(train_dir) if train_dir.is_dir() else present
        extra = sorted(set(present) - set(classes))
        if extra:
            raise DataError(f"'{split_dir}' has class folders {', '.join(extra)} that '{train_dir}' lacks, "
                            f"so they have no label. Add them to the train split or list the classes "
                            f"to use in data.classes.")
    paths: list[Path] = []
    labels: list[int] = []
    for label, c in enumerate(classes):
        files = _files(split_dir / c)
        paths += files
        labels += [label] * len(files)
    return _finish([str(p) for p in paths], np.array(labels, np.int64), [str(p) for p in paths],
                   lambda i: _file_problem(paths[i]), list(classes), [str(split_dir / c) for c in classes],
                   spec, f"'{split_dir}'", transform, seed, check=check)


def _class_folders(root: Path, split: str, spec: DataSpec, transform: Transform, seed: int,
                   check: bool) -> ImageDataset:
    """``root/<class>/...`` split into train/val by a stratified hold-out over all class folders,
    so the split does not move when data.classes picks a subset."""
    if split not in (spec.train, spec.val):
        raise DataError(f"Image folder '{root}' holds class folders without split folders, so its only splits "
                        f"are {spec.train} and {spec.val} (a hold-out of data.val_fraction); it has no split "
                        f"'{split}'. Use {spec.train} or {spec.val}, or arrange PATH/{split}/<class>/<image>.")
    present = _class_dirs(root)
    classes = spec.classes if spec.classes is not None else present
    missing = [c for c in classes if c not in present]
    if missing:
        raise DataError(f"data.classes names {', '.join(missing)}, which are not class folders of '{root}'. "
                        f"Valid class folder names: {', '.join(present)}.")
    files = {c: _files(root / c) for c in present}
    few = [f"{c} ({len(files[c])})" for c in classes if len(files[c]) < 2]
    if few:
        raise DataError(f"Class folder(s) {', '.join(few)} of '{root}' have fewer than 2 images; the automatic "
                        f"train/val split needs one of each. Add images, leave the class out with data.classes, "
                        f"or give the split yourself as {root}/{spec.train}/<class>/ and {root}/{spec.val}/<class>/.")
    pool = [(p, c) for c in present for p in files[c]]
    is_val = stratified_holdout(np.array([present.index(c) for _, c in pool]), spec.val_fraction)
    want = split == spec.val
    chosen = [(p, c) for (p, c), v in zip(pool, is_val) if v == want and c in classes]
    paths = [p for p, _ in chosen]
    return _finish([str(p) for p in paths], np.array([classes.index(c) for _, c in chosen], np.int64),
                   [str(p) for p in paths], lambda i: _file_problem(paths[i]), list(classes),
                   [str(root / c) for c in classes], spec, f"split '{split}' of '{root}'", transform, seed,
                   held_out=True, check=check)


def _role(spec: DataSpec, split: str) -> str:
    return "train" if split == spec.train else "val"


# ---------------------------------------------------------------- list: and rec:

def _split_file(path: str, split: str, spec: DataSpec, ext: str) -> tuple[Path, bool]:
    """The file for ``split`` and whether it holds all splits (then hold out val_fraction)."""
    if "{split}" in path:
        return Path(path.replace("{split}", split)).expanduser(), False
    p = Path(path).expanduser()
    if p.is_dir():
        return p / f"{split}{ext}", False
    if split not in (spec.train, spec.val):
        raise DataError(f"'{p}' is a single file holding train and val ({spec.train}/{spec.val}); it has "
                        f"no split '{split}'. Put {{split}} in the path to use one file per split.")
    return p, True


def _label_map(spec: DataSpec, labels: Iterable[int]) -> tuple[dict[int, int], list[str]]:
    """Raw integer label -> training label, and class names; ``data.classes`` picks and orders."""
    if spec.classes is None:
        top = max(labels, default=-1)
        return {i: i for i in range(top + 1)}, [str(i) for i in range(top + 1)]
    bad = [c for c in spec.classes if not c.lstrip("-").isdigit()]
    if bad:
        raise DataError(f"data.classes {bad} are not integer labels; for list: and rec: sources list "
                        f"the integer labels to use, in label order, e.g. classes: [5, 6, 7].")
    return {int(c): i for i, c in enumerate(spec.classes)}, list(spec.classes)


def _declared(spec: DataSpec, names: list[str], f: Path) -> list[str] | None:
    """Where each class is expected, when data.classes declares them; inferred labels may be absent."""
    return [f"label {c} in {f}" for c in names] if spec.classes is not None else None


def _select(raw: np.ndarray, whole: bool, split: str, spec: DataSpec) -> tuple[np.ndarray, dict[int, int], list[str]]:
    """Rows of this split whose label is in use, plus the label map."""
    mapping, names = _label_map(spec, raw.tolist())
    rows = np.array([int(r) in mapping for r in raw], bool)
    if whole:
        val = np.zeros(len(raw), bool)
        val[rows] = stratified_holdout(raw[rows], spec.val_fraction)
        rows &= val if split == spec.val else ~val
    return np.flatnonzero(rows), mapping, names


def _listfile(path: str, split: str, spec: DataSpec, transform: Transform, seed: int, check: bool) -> ImageDataset:
    f, whole = _split_file(path, split, spec, ".csv")
    if not f.is_file():
        raise DataError(f"List file '{f}' does not exist. A list source is a CSV of path,label lines "
                        f"(paths relative to the list's folder); put {{split}} in the path for one file "
                        f"per split.")
    paths, raw = [], []
    for line_no, row in enumerate(csv_rows(f, "path,label lines"), 1):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if line_no == 1 and [c.strip().lower() for c in row] == ["path", "label"]:
            continue
        if len(row) != 2:
            raise DataError(f"{f}, line {line_no}: expected 'path,label', got {len(row)} field(s). "
                            f"Quote paths that contain commas.")
        label = row[1].strip()
        if not (label.isascii() and label.lstrip("-").isdigit()):  # '²' is a digit to str.isdigit, not to int()
            raise DataError(f"{f}, line {line_no}: label '{label[:40]}' is not an integer. Labels are "
                            f"class indices 0, 1, 2, ...")
        if label.startswith("-") or len(label) > len(str(MAX_LIST_LABEL)) or int(label) > MAX_LIST_LABEL:
            raise DataError(f"{f}, line {line_no}: label {label[:40]} is out of range; labels are class "
                            f"indices 0 to {MAX_LIST_LABEL}.")
        paths.append(listed_path(row[0].strip(), f, f"{f}, line {line_no}"))
        raw.append(int(label))
    rows, mapping, names = _select(np.array(raw, np.int64), whole, split, spec)
    chosen = [paths[r] for r in rows]
    return _finish([str(p) for p in chosen], np.array([mapping[raw[r]] for r in rows], np.int64),
                   [str(p) for p in chosen], lambda i: _file_problem(chosen[i]), names,
                   _declared(spec, names, f), spec, f"split '{split}' of list '{f}'",
                   transform, seed, held_out=whole, check=check)


def csv_rows(f: Path, layout: str) -> list[list[str]]:
    """The rows of a CSV label file, read size-bounded as UTF-8 text; a file that is not text or a
    CSV csv can read (a field over its size limit) is one DataError naming the file."""
    text = read_text(f, DataError, "the label file")
    try:
        return list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise DataError(f"{f}: not a CSV this reader can read ({e}). Write one image per line as {layout}.") from None


def listed_path(cell: str, f: Path, where: str) -> Path:
    """An image path as a label file lists it: ``~`` expanded, relative to the file's folder."""
    try:
        p = Path(cell).expanduser()
    except RuntimeError:  # ~user of a user this machine does not have
        raise DataError(f"{where}: image path '{cell[:80]}' starts with ~ but names no home folder on "
                        f"this machine. Write the path relative to the label file's folder, or in full.") from None
    return p if p.is_absolute() else f.parent / p


def _open_rec(rec: str) -> recordio.MXIndexedRecordIO:
    idx = os.path.splitext(rec)[0] + ".idx"
    if not os.path.isfile(rec) or not os.path.isfile(idx):
        raise DataError(f"RecordIO file '{rec}' needs its index '{idx}' next to it; "
                        f"{'the index' if os.path.isfile(rec) else 'the .rec'} is missing. Pack images "
                        f"with MXNet's im2rec.py (it writes both) or fix data.source.")
    try:
        return recordio.MXIndexedRecordIO(idx, rec, "r")
    except Exception as e:
        raise DataError(f"Cannot open RecordIO '{rec}' with index '{idx}': {e}. Re-create the index "
                        f"with im2rec.py.") from None


def _recfile(path: str, split: str, spec: DataSpec, transform: Transform, seed: int, check: bool) -> ImageDataset:
    f, whole = _split_file(path, split, spec, ".rec")
    reader = _open_rec(str(f))
    keys, raw, problems = list(reader.keys), [], []
    for key in keys:
        try:
            header, payload = recordio.unpack(reader.read_idx(key))
        except Exception as e:
            raise DataError(f"{f}: record {key} cannot be read ({e}); the file or its index is "
                            f"corrupt. Re-pack it with im2rec.py.") from None
        label = np.atleast_1d(np.asarray(header.label, np.float64))
        if label.size != 1 or label[0] != round(label[0]) or label[0] < 0:
            raise DataError(f"{f}: record {key} has label {label.tolist()}; labels must be one integer "
                            f"class index >= 0.")
        raw.append(int(label[0]))
        problems.append(image_problem(payload) if check else None)
    reader.close()
    rows, mapping, names = _select(np.array(raw, np.int64), whole, split, spec)
    chosen = [keys[r] for r in rows]
    return _finish(chosen, np.array([mapping[raw[r]] for r in rows], np.int64),
                   [f"{f}#{k}" for k in chosen], lambda i: problems[rows[i]], names,
                   _declared(spec, names, f), spec, f"split '{split}' of '{f}'",
                   transform, seed, rec=str(f), held_out=whole, check=check)
