"""Segmentation datasets and loaders, driven by the training loop like the other tasks'.

Sources (``data.source``):

- ``voc:PATH``: ``JPEGImages/``, ``SegmentationClass/`` palette PNGs and the split lists
  ``ImageSets/Segmentation/<split>.txt`` (data.train / data.val name them).
- ``masks:PATH``: ``PATH/images/`` + ``PATH/masks/`` (a mask named like its image, ``.png``);
  with ``PATH/<split>/images`` + ``PATH/<split>/masks`` for data.train and data.val those are
  the splits, otherwise the automatic hold-out (``data.val_fraction``, the fixed split seed
  every task uses) splits the pairs and ``split.json`` records it.
- ``demo:digits_seg``: the offline demo (gluontl.segment.synth), read as VOC.

Classes: ``data.classes`` names the mask values in order (value i is the i-th name); without
it, ``PATH/classes.txt`` (one name a line), else for voc: the 21 VOC names, for the demo
background and the ten digits. Every mask is read once before training: a value that is
neither a class nor ``segmentation.ignore_label`` is an error naming the file and the value,
and so is an image whose size differs from its mask's. An unreadable image follows
``data.on_bad_image``.

Batches: ``x`` float32 ``(B, 3, H, W)``, ``y`` float32 ``(B, H, W)`` class ids (ignored
pixels = the ignore label); training crops are ``segmentation.crop``, validation images are
resized to ``model.input_shape``'s H x W; both padded to a multiple of ``segmentation.stride``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Sequence

import numpy as np
from mxnet import gluon

from ..detect.data import CpuLoader
from ..errors import DataError
from ..readers import read_text
from ..recipe import DataSpec, SegmentationSpec
from ..data.datasets import BadImageReport, Loaders, SplitRecord, screen_images, split_sampler
from ..data.splits import stratified_holdout
from ..data.transforms import decode_image, image_problem, mean_std, open_image, sample_rng
from .augment import SegmentationTransform
from .formats import Sample, read_mask, read_pairs, read_voc

DEMOS = ("digits_seg",)
VOC_CLASSES = ["background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair",
               "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa",
               "train", "tvmonitor"]


class SegmentationDataset(gluon.data.Dataset):
    """One split: ``ds[(i, epoch)]`` -> ``(float32 CHW image, float32 HW class ids)``."""

    def __init__(self, samples: list[Sample], class_names: list[str], transform: SegmentationTransform,
                 seed: int, ignore: int, bad: BadImageReport, pixels: np.ndarray,
                 held_out: bool = False) -> None:
        self.samples, self.class_names, self.transform = samples, class_names, transform
        self.seed, self.ignore, self.bad, self.held_out = seed, ignore, bad, held_out
        self.pixels = pixels  # (samples, classes) labelled pixels: split.json's counts, balanced class weights

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key: int | tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        index, epoch = (key, 0) if isinstance(key, (int, np.integer)) else key
        rng = sample_rng(self.seed, epoch, index) if self.transform.train else None
        x, mask = self.transform(self.image(index), self.mask(index), rng)
        return x, mask.astype(np.float32)

    def image(self, index: int) -> np.ndarray:
        """The decoded HWC uint8 RGB image, before transforms."""
        return decode_image(self.samples[index].image)

    def mask(self, index: int) -> np.ndarray:
        """The (H, W) uint8 class ids, checked."""
        return read_mask(self.samples[index].mask, len(self.class_names), self.ignore)

    def name(self, index: int) -> str:
        return str(self.samples[index].image)


def _stack(samples: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """numpy batches: a worker's NDArrays would reach the main process as ``cpu_shared``."""
    return np.stack([s[0] for s in samples]), np.stack([s[1] for s in samples])


def transform_for(spec: DataSpec, seg: SegmentationSpec, input_shape: Sequence[int], train: bool
                  ) -> SegmentationTransform:
    """Training: random scale, crop (default: the input H, W), flip; otherwise a resize to the input H, W."""
    hw = (int(input_shape[-2]), int(input_shape[-1]))
    mean, std = mean_std(spec.train_transform if train else spec.val_transform)
    if train:
        return SegmentationTransform(True, mean, std, crop=seg.crop or hw, scale=seg.scale, flip=seg.flip,
                                     stride=seg.stride, ignore=seg.ignore_label)
    return SegmentationTransform(False, mean, std, size=hw, stride=seg.stride, ignore=seg.ignore_label)


def load_segmentation_split(spec: DataSpec, seg: SegmentationSpec, split: str, input_shape: Sequence[int], *,
                            train: bool = False, seed: int = 0) -> SegmentationDataset:
    """The dataset of split ``split``, every mask checked; ``train=True`` augments (seeded by ``seed``)."""
    samples, classes, held_out, where = _split(spec, split)
    what = f"split '{split}' of {where}"
    keep, bad = screen_images([str(s.image) for s in samples], lambda i: _problem(samples[i].image), spec, what)
    samples = [s for s, k in zip(samples, keep) if k]
    if not samples:
        raise DataError(f"{what} has no usable images. Check data.source and the split names data.train / data.val.")
    pixels = np.stack([_checked(s, len(classes), seg.ignore_label) for s in samples])
    return SegmentationDataset(samples, classes, transform_for(spec, seg, input_shape, train), seed,
                               seg.ignore_label, bad, pixels, held_out)


@dataclass
class SegmentationLoaders(Loaders):
    """Loaders plus the training masks' (images, classes) labelled-pixel counts, which balanced
    class weights are computed from (None without a train loader)."""

    train_pixels: np.ndarray | None = None


def make_segmentation_loaders(spec: DataSpec, seg: SegmentationSpec, input_shape: Sequence[int], *, seed: int,
                              shuffle_train: bool = True,
                              which: Iterable[Literal["train", "val"]] = ("train", "val")) -> SegmentationLoaders:
    """Train/val loaders (see the module doc for the batches)."""
    sets = {w: load_segmentation_split(spec, seg, getattr(spec, w), input_shape, train=(w == "train"), seed=seed)
            for w in dict.fromkeys(which)}
    bad = BadImageReport()
    loaders: dict[str, CpuLoader | None] = {"train": None, "val": None}
    samplers = {"train": None, "val": None}
    for w, ds in sets.items():
        bad.extend(ds.bad)
        samplers[w] = split_sampler(spec, w, len(ds), seed=seed, shuffle_train=shuffle_train)
        loaders[w] = CpuLoader(ds, batch_sampler=samplers[w], batchify_fn=_stack, num_workers=spec.workers,
                               thread_pool=False)
    names = next(iter(sets.values())).class_names
    return SegmentationLoaders(train=loaders["train"], val=loaders["val"], class_names=names, num_classes=len(names),
                               train_size=len(sets["train"]) if "train" in sets else 0,
                               val_size=len(sets["val"]) if "val" in sets else 0, bad=bad,
                               train_sampler=samplers["train"], val_sampler=samplers["val"],
                               split=_split_record(spec, sets),
                               train_pixels=sets["train"].pixels if "train" in sets else None)


def class_names(spec: DataSpec) -> list[str]:
    """The names of the mask values of ``spec``'s source (see the module doc), without reading masks."""
    return _split(spec, spec.train)[1]


def _split_record(spec: DataSpec, sets: dict[str, SegmentationDataset]) -> SplitRecord | None:
    if "val" not in sets or not sets["val"].held_out:
        return None
    counts = {w: {c: int((ds.pixels[:, i] > 0).sum()) for i, c in enumerate(ds.class_names)}
              for w, ds in sets.items()}
    val = sets["val"]
    return SplitRecord(spec.source, spec.val_fraction, counts, [val.name(i) for i in range(len(val))])


def _problem(path: Path) -> str | None:
    return image_problem(path) if path.is_file() else "file does not exist"


def _checked(sample: Sample, num_classes: int, ignore: int) -> np.ndarray:
    """The labelled pixels of each class in ``sample``'s mask; a bad value or a size that is not the
    image's is an error."""
    mask = read_mask(sample.mask, num_classes, ignore)
    with open_image(sample.image) as im:
        w, h = im.size
    if mask.shape != (h, w):
        raise DataError(f"The mask '{sample.mask}' is {mask.shape[1]}x{mask.shape[0]} (W x H) but its image "
                        f"'{sample.image}' is {w}x{h}; a mask labels its image's pixels one to one. Fix or "
                        f"remove the pair.")
    return np.bincount(mask[mask != ignore].ravel(), minlength=num_classes)[:num_classes]


# ---------------------------------------------------------------- sources

def _split(spec: DataSpec, split: str) -> tuple[list[Sample], list[str], bool, str]:
    """Split ``split``'s samples, the class names, whether it is an automatic hold-out, and how to
    name the source."""
    scheme, _, rest = spec.source.partition(":")
    if scheme == "demo":
        if rest not in DEMOS:
            raise DataError(f"Unknown demo dataset 'demo:{rest}' for segmentation. Available: "
                            f"{', '.join('demo:' + d for d in DEMOS)}.")
        from ..home import gluontl_home
        from .synth import CLASSES, digits_seg_folder

        root = digits_seg_folder(gluontl_home())
        return read_voc(root, split), _classes(spec, root, CLASSES), False, f"demo:{rest}"
    if scheme not in ("voc", "masks"):
        raise DataError(f"data.source '{spec.source}' is not a segmentation source; use voc:PATH, masks:PATH or "
                        f"demo:digits_seg.")
    root = Path(rest).expanduser()
    if not root.is_dir():
        raise DataError(f"Segmentation dataset '{root}' {'is a file' if root.exists() else 'does not exist'}; "
                        f"fix data.source.")
    where = f"{scheme} dataset '{root}'"
    if scheme == "voc":
        return read_voc(root, split), _classes(spec, root, VOC_CLASSES), False, where
    classes = _classes(spec, root, None)
    if (root / spec.train / "images").is_dir() and (root / spec.val / "images").is_dir():
        return read_pairs(root / split), classes, False, where
    if split not in (spec.train, spec.val):
        raise DataError(f"{where} has no split folders, so its only splits are {spec.train} and {spec.val} "
                        f"(a hold-out of data.val_fraction); it has no split '{split}'.")
    pool = read_pairs(root)
    is_val = stratified_holdout(np.zeros(len(pool), np.int64), spec.val_fraction)
    return [s for s, v in zip(pool, is_val) if v == (split == spec.val)], classes, True, where


def _classes(spec: DataSpec, root: Path, default: list[str] | None) -> list[str]:
    if spec.classes is not None:
        return list(spec.classes)
    listing = root / "classes.txt"
    if listing.is_file():
        names = [line.strip() for line in read_text(listing, DataError, "the class list").splitlines() if line.strip()]
        if names:
            return names
    if default is None:
        raise DataError(f"'{root}' does not say what its mask values mean: list the class names in data.classes "
                        f"(mask value i is the i-th name, background usually first) or in {listing}, one a line.")
    return list(default)
