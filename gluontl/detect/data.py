"""Detection datasets and loaders, driven by the training loop exactly like classification's.

Sources (``data.source``):

- ``voc:PATH``: ``PATH/Annotations/*.xml``, images in ``PATH/JPEGImages`` (the XML's
  ``<filename>``), splits listed in ``PATH/ImageSets/Main/<split>.txt``. Without
  ``ImageSets/Main`` every XML is pooled and split by the automatic hold-out.
- ``coco:PATH``: a folder with ``annotations/instances_<split>.json`` and images in
  ``PATH/<split>/`` (COCO's own layout); or one ``.json`` file, image ``file_name`` relative to
  its folder (Roboflow's export), split by the automatic hold-out.
- ``yolo:PATH``: ``PATH/data.yaml`` (``names``; or ``classes.txt``), ``PATH/images/<split>/``
  and ``PATH/labels/<split>/<stem>.txt``; with images directly in ``PATH/images`` (labels in
  ``PATH/labels``) the automatic hold-out splits them.
- ``demo:digits_det``: the offline demo (gluontl.detect.synth), read as VOC.

Classes: COCO and YOLO declare theirs (category id order, ``names`` order); VOC's are the
sorted names found in the train split. ``data.classes`` picks and orders them (a name the
source lacks is an error, with a did-you-mean): boxes of other classes are dropped, and an
image left without boxes by that is left out (kept, it would teach the net that those objects
are background - the demo's pretrain and fine-tune images are told apart this way). Images
annotated with no objects at all are kept as negatives.

The automatic hold-out (``data.val_fraction``, fixed ``SPLIT_SEED``) is stratified on each
image's first object's class (negatives as one more group), over all images before
``data.classes`` picks, so the split does not move with the class selection; it is recorded
in ``split.json`` like classification's.

Items are checked once before training (``on_bad_image``): a missing or unreadable image, or
one whose size differs from its annotation's, is a ``DataError`` or, under ``skip``, left out
and reported. Annotation errors (boxes outside the image, empty boxes, unknown classes,
malformed files) are always errors: skipping them would train on wrong boxes.

Batches: ``x`` float32 ``(B, 3, H, W)`` (H, W = the model's input), ``y`` float32 ``(B, M, 6)``
``[xmin, ymin, xmax, ymax, class_id, difficult]`` in network-input pixels, rows padded with
-1 up to M = the most objects any image of the loaded splits has (at least 1), so a
hybridized net sees one shape. Both are plain ``cpu`` NDArrays even with ``workers > 0``
(workers return numpy; ``cpu_shared`` arrays, what MXNet's worker batches are, are refused
by a hybridized net). Box IoU is unchanged by the per-axis resize, so mAP on network-input
boxes equals mAP on the original ones.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Literal, Sequence

import mxnet as mx
import numpy as np
from mxnet import gluon, nd

from ..errors import DataError
from ..readers import read_text
from ..recipe import DataSpec, suggest
from ..data.datasets import BadImageReport, Loaders, SplitRecord, require_classes, screen_images, split_sampler
from ..data.sampler import EpochSampler
from ..data.splits import stratified_holdout
from ..data.transforms import decode_image, image_problem, sample_rng
from .augment import DetectionTransform
from .formats import (Annotation, image_size, images_in, read_coco, read_voc_xml, read_yolo, unknown_class,
                      yolo_names)

SCHEMES = ("voc", "coco", "yolo")
DEMOS = ("digits_det",)


class DetectionDataset(gluon.data.Dataset):
    """One split: ``ds[(i, epoch)]`` -> ``(float32 CHW, float32 (M, 6) padded with -1)``."""

    def __init__(self, anns: list[Annotation], class_names: list[str], transform: DetectionTransform,
                 seed: int, bad: BadImageReport, held_out: bool = False) -> None:
        self.annotations = anns
        self.class_names = class_names
        self.transform = transform
        self.seed = seed
        self.bad = bad
        self.held_out = held_out
        self.max_objects = max(1, max((len(a.labels) for a in anns), default=0))

    def __len__(self) -> int:
        return len(self.annotations)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        index, epoch = (key, 0) if isinstance(key, (int, np.integer)) else key
        rng = sample_rng(self.seed, epoch, index) if self.transform.random else None
        x, boxes = self.transform(self.image(index), self.annotations[index].labels, rng)
        y = np.full((self.max_objects, 6), -1, np.float32)
        y[:len(boxes)] = boxes
        return x, y

    def image(self, index: int) -> np.ndarray:
        """The decoded HWC uint8 RGB image, before transforms."""
        return decode_image(self.annotations[index].image)

    def name(self, index: int) -> str:
        return str(self.annotations[index].image)


class CpuLoader(gluon.data.DataLoader):
    """A DataLoader whose batches are plain ``cpu`` NDArrays whatever the worker count."""

    def __iter__(self) -> Iterator[list[nd.NDArray]]:
        for batch in super().__iter__():
            yield [nd.array(a, ctx=mx.cpu(), dtype=np.float32) for a in batch]


def _stack(samples: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """numpy batches: a worker's NDArrays would reach the main process as ``cpu_shared``."""
    return np.stack([s[0] for s in samples]), np.stack([s[1] for s in samples])


def load_detection_split(spec: DataSpec, split: str, input_shape: Sequence[int], *, train: bool = False,
                         seed: int = 0) -> DetectionDataset:
    """The dataset of split ``split``, checked; ``train=True`` augments (seeded by ``seed``),
    otherwise it only resizes (evaluate, predict). ``input_shape`` ends with (H, W)."""
    hw = (int(input_shape[-2]), int(input_shape[-1]))
    transform = (DetectionTransform(spec.train_transform, hw, True) if train else
                 DetectionTransform(spec.val_transform, hw, False, where="data.val_transform"))
    anns, names, held_out, where = _split(spec, split)
    anns, classes = _select(anns, names, spec, split)
    return _finish(anns, classes, spec, f"split '{split}' of {where}", transform, seed, held_out)


def make_detection_loaders(spec: DataSpec, input_shape: Sequence[int], *, seed: int, shuffle_train: bool = True,
                           which: Iterable[Literal["train", "val"]] = ("train", "val")) -> Loaders:
    """Train/val loaders (see the module doc for the batches); train drops its last partial batch
    unless data.last_batch: keep."""
    sets = {w: load_detection_split(spec, getattr(spec, w), input_shape, train=(w == "train"), seed=seed)
            for w in dict.fromkeys(which)}
    names = {w: ds.class_names for w, ds in sets.items()}
    if len({tuple(n) for n in names.values()}) > 1:
        listed = "; ".join(f"{w}: {', '.join(n)}" for w, n in names.items())
        raise DataError(f"The splits of {spec.source} declare different classes ({listed}), so a class id would "
                        f"mean different things. Make the class lists agree, or pick classes with data.classes.")
    m = max(ds.max_objects for ds in sets.values())
    bad = BadImageReport()
    loaders: dict[str, CpuLoader | None] = {"train": None, "val": None}
    samplers: dict[str, EpochSampler | None] = {"train": None, "val": None}
    for w, ds in sets.items():
        ds.max_objects = m
        bad.extend(ds.bad)
        sampler = split_sampler(spec, w, len(ds), seed=seed, shuffle_train=shuffle_train)
        loaders[w] = CpuLoader(ds, batch_sampler=sampler, batchify_fn=_stack, num_workers=spec.workers,
                               thread_pool=False)
        samplers[w] = sampler
    first = next(iter(sets.values()))
    return Loaders(train=loaders["train"], val=loaders["val"], class_names=first.class_names,
                   num_classes=len(first.class_names),
                   train_size=len(sets["train"]) if "train" in sets else 0,
                   val_size=len(sets["val"]) if "val" in sets else 0, bad=bad,
                   train_sampler=samplers["train"], val_sampler=samplers["val"], split=_split_record(spec, sets))


def _split_record(spec: DataSpec, sets: dict[str, DetectionDataset]) -> SplitRecord | None:
    if "val" not in sets or not sets["val"].held_out:
        return None
    counts = {w: {c: sum(bool(np.any(a.labels[:, 4] == i)) for a in ds.annotations)
                  for i, c in enumerate(ds.class_names)} for w, ds in sets.items()}
    val = sets["val"]
    return SplitRecord(spec.source, spec.val_fraction, counts, [val.name(i) for i in range(len(val))])


# ---------------------------------------------------------------- sources

def _split(spec: DataSpec, split: str) -> tuple[list[Annotation], list[str], bool, str]:
    """Split ``split`` of the source: annotations (class ids index the names), the source's
    class names, whether it is an automatic hold-out, and how to name the source."""
    scheme, _, rest = spec.source.partition(":")
    if scheme == "demo":
        if rest not in DEMOS:
            raise DataError(f"Unknown demo dataset 'demo:{rest}' for detection. Available: "
                            f"{', '.join('demo:' + d for d in DEMOS)}.")
        from .synth import digits_det_folder
        return _voc(digits_det_folder(), split, spec)
    if scheme not in SCHEMES:
        raise DataError(f"data.source '{spec.source}' is not a detection source; use voc:PATH, coco:PATH, "
                        f"yolo:PATH or demo:digits_det.")
    root = Path(rest).expanduser()
    if not root.exists():
        raise DataError(f"{scheme.upper()} dataset '{root}' does not exist. Fix data.source.")
    return {"voc": _voc, "coco": _coco, "yolo": _yolo}[scheme](root, split, spec)


def _holdout(anns: list[Annotation], num_names: int, split: str, spec: DataSpec, where: str) -> list[Annotation]:
    if split not in (spec.train, spec.val):
        raise DataError(f"{where} has no split folders or files, so its only splits are {spec.train} and "
                        f"{spec.val} (a hold-out of data.val_fraction); it has no split '{split}'.")
    groups = np.array([int(a.labels[0, 4]) if len(a.labels) else num_names for a in anns], np.int64)
    is_val = stratified_holdout(groups, spec.val_fraction)
    return [a for a, v in zip(anns, is_val) if v == (split == spec.val)]


def _voc(root: Path, split: str, spec: DataSpec) -> tuple[list[Annotation], list[str], bool, str]:
    where = f"VOC dataset '{root}'"
    ann_dir, sets = root / "Annotations", root / "ImageSets" / "Main"
    if not ann_dir.is_dir():
        raise DataError(f"{where} has no Annotations folder. A voc: source needs PATH/Annotations/*.xml, "
                        f"PATH/JPEGImages/ and optionally PATH/ImageSets/Main/<split>.txt.")
    if sets.is_dir():
        anns, names = _voc_split(root, split, where)
        classes = sorted(names if split == spec.train else _voc_split(root, spec.train, where)[1])
        return _voc_classes(anns, names, classes, spec), classes, False, where
    pool, names = _voc_files(root, sorted(ann_dir.glob("*.xml")))
    classes = sorted(set(names))
    anns = _voc_classes(pool, names, classes, spec)
    return _holdout(anns, len(classes), split, spec, where), classes, True, where


def _voc_split(root: Path, split: str, where: str) -> tuple[list[Annotation], list[str]]:
    listing = root / "ImageSets" / "Main" / f"{split}.txt"
    if not listing.is_file():
        have = sorted(p.stem for p in listing.parent.glob("*.txt"))
        raise DataError(f"{where} has no split file '{listing}'; split files found: {', '.join(have) or 'none'}. "
                        f"Fix data.train / data.val.")
    ids = [line.split()[0] for line in read_text(listing, DataError, "the VOC split list").splitlines() if line.strip()]
    missing = [i for i in ids if not (root / "Annotations" / f"{i}.xml").is_file()]
    if missing:
        raise DataError(f"{listing} lists {len(missing)} image id(s) without an annotation file, e.g. "
                        f"'{root / 'Annotations' / (missing[0] + '.xml')}'. Add the XML or remove the line.")
    return _voc_files(root, [root / "Annotations" / f"{i}.xml" for i in ids])


def _voc_files(root: Path, xmls: list[Path]) -> tuple[list[Annotation], list[str]]:
    """The files' annotations with class ids indexing one name list shared by all of them."""
    anns, index = [], {}
    for xml in xmls:
        ann, obj_names = read_voc_xml(xml, root / "JPEGImages")
        for k, n in enumerate(obj_names):
            ann.labels[k, 4] = index.setdefault(n, len(index))
        anns.append(ann)
    return anns, sorted(index, key=index.get)


def _voc_classes(anns: list[Annotation], names: list[str], classes: list[str], spec: DataSpec) -> list[Annotation]:
    """Class ids re-indexed from ``names`` to ``classes`` (VOC's sorted train names); a name
    outside them is an error unless ``data.classes`` will drop it."""
    out = []
    for a in anns:
        labels = a.labels.copy()
        for k, c in enumerate(labels[:, 4].astype(int)):
            if names[c] in classes:
                labels[k, 4] = classes.index(names[c])
            elif spec.classes is None:
                raise DataError(f"{a.source}: class {names[c]!r} does not occur in the train split "
                                f"'{spec.train}'{suggest(names[c], classes)}, so it has no label. Fix the "
                                f"name, or list the classes to use in data.classes.")
            else:
                labels[k, 4] = -1  # dropped by _select
        out.append(Annotation(a.image, a.size, labels, a.source))
    return out


def _coco(root: Path, split: str, spec: DataSpec) -> tuple[list[Annotation], list[str], bool, str]:
    where = f"COCO dataset '{root}'"
    if root.is_file():
        anns, names = read_coco(root, root.parent)
        return _holdout(anns, len(names), split, spec, where), names, True, where
    js = root / "annotations" / f"instances_{split}.json"
    if not js.is_file():
        have = sorted(p.name for p in (root / "annotations").glob("*.json")) if (root / "annotations").is_dir() else []
        raise DataError(f"{where} has no '{js}' (found: {', '.join(have) or 'none'}). A coco: source is a folder "
                        f"with annotations/instances_<split>.json and images in <split>/, or one .json file with "
                        f"images beside it. Fix data.source or data.train / data.val.")
    anns, names = read_coco(js, root / split)
    return anns, names, False, where


def _yolo(root: Path, split: str, spec: DataSpec) -> tuple[list[Annotation], list[str], bool, str]:
    where = f"YOLO dataset '{root}'"
    names = yolo_names(root)
    images = root / "images"
    if (images / split).is_dir():
        return read_yolo(images / split, root / "labels" / split, len(names)), names, False, where
    if images.is_dir() and images_in(images) and not (images / spec.train).is_dir():
        anns = read_yolo(images, root / "labels", len(names))
        return _holdout(anns, len(names), split, spec, where), names, True, where
    raise DataError(f"{where} has no image folder '{images / split}'. A yolo: source needs data.yaml, "
                    f"images/<split>/ and labels/<split>/ (or images/ and labels/ without splits, split "
                    f"automatically). Fix data.source or data.train / data.val.")


def _select(anns: list[Annotation], names: list[str], spec: DataSpec, split: str) -> tuple[list[Annotation], list[str]]:
    """``data.classes`` applied: other boxes dropped, images that only had those left out."""
    if spec.classes is None:
        return anns, names
    unknown = [c for c in spec.classes if c not in names]
    if unknown:
        raise unknown_class(unknown[0], names, f"data.classes (source {spec.source})")
    remap = np.full(len(names) + 1, -1, np.float32)  # index -1 (VOC names outside classes) stays -1
    for i, c in enumerate(spec.classes):
        remap[names.index(c)] = i
    out = []
    for a in anns:
        labels = a.labels.copy()
        labels[:, 4] = remap[labels[:, 4].astype(int)]
        kept = labels[labels[:, 4] >= 0]
        if len(kept) or not len(labels):
            out.append(Annotation(a.image, a.size, kept, a.source))
    return out, list(spec.classes)


def _finish(anns: list[Annotation], classes: list[str], spec: DataSpec, what: str, transform: DetectionTransform,
            seed: int, held_out: bool) -> DetectionDataset:
    def problem(i: int) -> str | None:
        a = anns[i]
        if not a.image.is_file():
            return "file does not exist"
        reason = image_problem(a.image)
        if reason is not None:
            return reason
        actual = image_size(a.image)
        if actual is None or a.size is None:
            return "its size cannot be read"
        if actual != a.size:
            return f"the image is {actual[0]}x{actual[1]} but {a.source} says {a.size[0]}x{a.size[1]}"
        return None

    keep, bad = screen_images([str(a.image) for a in anns], problem, spec, what)
    anns = [a for a, k in zip(anns, keep) if k]
    if not anns:
        raise DataError(f"{what} has no usable images. Check data.source, data.classes and the split names "
                        f"data.train / data.val.")
    if spec.classes is not None:
        boxes = np.concatenate([a.labels[:, 4] for a in anns])
        require_classes(boxes, classes, [f"class {c!r} ({what})" for c in classes], spec, what, bad)
    return DetectionDataset(anns, classes, transform, seed, bad, held_out)
