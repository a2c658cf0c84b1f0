"""Box-aware augmentation for detection, seeded like classification's transforms.

Random steps draw only from the generator the loader hands in,
``gluontl.data.transforms.sample_rng(seed, epoch, index)``, so a sample's augmentation does
not depend on the worker count, and resuming reproduces it. The train pipeline follows
GluonCV's SSD preset (``gluoncv/data/transforms/presets/ssd.py``), in this order:

1. ``color_jitter: f``: brightness, contrast, saturation in [1-f, 1+f] (classification's).
2. Zoom out (``expand > 1``, off by default): with probability 1/2 the image is placed at a
   random spot of a canvas up to ``expand`` times its size, filled with the normalization
   mean (so it becomes 0 after normalizing), boxes shifted.
3. IoU-constrained random crop (SSD paper): one trial crop each of scale [0.3, 1] and aspect
   [1/2, 2] whose IoU with every box is at least 0.1, 0.3, 0.5, 0.7, 0.9, or at most 1, plus the
   whole image; one of these at random. Boxes whose centre falls outside it are dropped, the
   others clipped to it (GluonCV's ``bbox_crop(allow_outside_center=False)``).
4. Resize to the network input (H, W), aspect not kept, boxes scaled (area interpolation
   when shrinking, bilinear when enlarging, as classification).
5. ``flip``: left-right with probability 1/2.

Validation, evaluation and predict only resize (step 4), deterministically. Normalization is
the recipe's ``normalize`` as in classification. ``resize``, ``center_crop`` and
``random_resized_crop`` are refused: a detector's input size is the model's ``input_shape``,
and a centre crop would cut boxes.
"""
from __future__ import annotations

import numpy as np

from ..errors import DataError
from ..recipe import TransformSpec
from ..data.transforms import color_jitter_image, mean_std, resize_image, to_tensor, describe_normalize

CROP_CONSTRAINTS = ((0.1, None), (0.3, None), (0.5, None), (0.7, None), (0.9, None), (None, 1.0))
CROP_SCALE = (0.3, 1.0)
CROP_MAX_ASPECT = 2.0
CROP_TRIALS = 50


class DetectionTransform:
    """``t(img_hwc_uint8, labels_n6, rng) -> (float32 CHW, float32 (M, 6))`` with M <= N.

    ``input_hw`` is the network input (height, width). ``rng`` is needed only when ``random``
    is true.
    """

    def __init__(self, spec: TransformSpec, input_hw: tuple[int, int], train: bool, *,
                 expand: float = 1.0, crop: bool = True, where: str = "data.train_transform") -> None:
        sizes = [k for k in ("resize", "center_crop", "random_resized_crop") if getattr(spec, k)]
        if sizes:
            raise DataError(f"{where} sets {', '.join(sizes)}, which detection does not use: images are "
                            f"resized to the model's input_shape {tuple(input_hw)} (H, W), and crops are the "
                            f"IoU-constrained SSD crops. Remove {' and '.join(sizes)}.")
        if expand < 1:
            raise ValueError(f"expand is a zoom-out ratio >= 1, got {expand}")
        self.spec, self.input_hw, self.train = spec, (int(input_hw[0]), int(input_hw[1])), train
        self.expand, self.crop = float(expand), crop
        self.mean, self.std = mean_std(spec)
        self.random = train and bool(crop or expand > 1 or spec.flip or spec.color_jitter)

    def __call__(self, img: np.ndarray, labels: np.ndarray,
                 rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        if self.random and rng is None:
            raise ValueError("this transform is random; pass rng=sample_rng(seed, epoch, index)")
        img, labels = img.astype(np.float32), labels.astype(np.float32, copy=True)
        if self.random:
            if self.spec.color_jitter:
                img = color_jitter_image(img, self.spec.color_jitter, rng)
            if self.expand > 1 and rng.random() < 0.5:
                img, labels = zoom_out(img, labels, self.expand, np.array(self.mean, np.float32) * 255, rng)
            if self.crop:
                img, labels = ssd_crop(img, labels, rng)
        img, labels = resize(img, labels, self.input_hw)
        if self.random and self.spec.flip and rng.random() < 0.5:
            img, labels = hflip(img, labels)
        return to_tensor(img, self.mean, self.std), labels


def describe(spec: TransformSpec, input_hw: tuple[int, int], train: bool) -> str:
    """The pipeline :class:`DetectionTransform` runs (default crop, no zoom-out), as the plan and
    the run card show it."""
    resize_to = f"resize to {input_hw[0]}x{input_hw[1]} (H x W, aspect not kept)"
    parts = ([f"colour jitter {spec.color_jitter:g}"] if spec.color_jitter else []) + \
        ["SSD IoU-constrained random crop", resize_to] + (["horizontal flip (p 1/2)"] if spec.flip else []) \
        if train else [resize_to]
    return ", ".join([*parts, describe_normalize(spec)])


def resize(img: np.ndarray, labels: np.ndarray, hw: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """The image at (H, W) with boxes scaled to it."""
    h, w = img.shape[:2]
    out = labels.copy()
    out[:, [0, 2]] *= np.float32(hw[1] / w)
    out[:, [1, 3]] *= np.float32(hw[0] / h)
    return (img if (h, w) == hw else resize_image(img, hw[1], hw[0])), out


def hflip(img: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = img.shape[1]
    out = labels.copy()
    out[:, 0], out[:, 2] = w - labels[:, 2], w - labels[:, 0]
    return img[:, ::-1], out


def zoom_out(img: np.ndarray, labels: np.ndarray, max_ratio: float, fill: np.ndarray,
             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The image at a random spot of a canvas ``ratio`` times larger (ratio in [1, max_ratio])."""
    h, w, c = img.shape
    ratio = rng.uniform(1, max_ratio)
    oh, ow = int(h * ratio), int(w * ratio)
    y, x = int(rng.integers(oh - h + 1)), int(rng.integers(ow - w + 1))
    canvas = np.empty((oh, ow, c), np.float32)
    canvas[:] = fill
    canvas[y:y + h, x:x + w] = img
    out = labels.copy()
    out[:, [0, 2]] += x
    out[:, [1, 3]] += y
    return canvas, out


def box_iou(boxes: np.ndarray, crops: np.ndarray) -> np.ndarray:
    """IoU ``(K, N)`` of K ``[xmin, ymin, xmax, ymax]`` crops with N ``(N, 4+)`` boxes."""
    a, b = crops[:, None, :4], boxes[None, :, :4]
    iw = np.maximum(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0)
    ih = np.maximum(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0)
    inter = iw * ih
    area = lambda r: (r[..., 2] - r[..., 0]) * (r[..., 3] - r[..., 1])  # noqa: E731
    return inter / (area(a) + area(b) - inter)


def crop_boxes(labels: np.ndarray, crop: tuple[int, int, int, int]) -> np.ndarray:
    """Boxes in a crop ``(x, y, w, h)``: centres outside are dropped, the rest clipped and shifted."""
    x, y, w, h = crop
    centres = (labels[:, :2] + labels[:, 2:4]) / 2
    keep = ((centres >= (x, y)) & (centres < (x + w, y + h))).all(axis=1)
    out = labels[keep].copy()
    out[:, [0, 2]] = np.clip(out[:, [0, 2]], x, x + w) - x
    out[:, [1, 3]] = np.clip(out[:, [1, 3]], y, y + h) - y
    return out[(out[:, 0] < out[:, 2]) & (out[:, 1] < out[:, 3])]


def ssd_crop(img: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The SSD paper's IoU-constrained random crop (see the module doc); an image keeps at
    least one box if it had one."""
    h, w = img.shape[:2]
    candidates = [(0, 0, w, h)]
    for lo, hi in CROP_CONSTRAINTS:  # CROP_TRIALS trials at once; the first that qualifies counts
        scale = rng.uniform(*CROP_SCALE, size=CROP_TRIALS)
        aspect = rng.uniform(np.maximum(1 / CROP_MAX_ASPECT, scale ** 2), np.minimum(CROP_MAX_ASPECT, 1 / scale ** 2))
        ch, cw = (h * scale / np.sqrt(aspect)).astype(int), (w * scale * np.sqrt(aspect)).astype(int)
        y, x = rng.integers(h - ch + 1), rng.integers(w - cw + 1)
        ok = (ch > 0) & (cw > 0)
        if len(labels):
            iou = box_iou(labels, np.stack([x, y, x + cw, y + ch], 1).astype(np.float32))
            ok &= (iou.min(1) >= (-np.inf if lo is None else lo)) & (iou.max(1) <= (np.inf if hi is None else hi))
        if ok.any():
            k = int(np.argmax(ok))
            candidates.append((int(x[k]), int(y[k]), int(cw[k]), int(ch[k])))
    # the whole image keeps every box, so some candidate always qualifies
    kept = ((candidates[k], crop_boxes(labels, candidates[k])) for k in rng.permutation(len(candidates)))
    (x, y, cw, ch), out = next((c, b) for c, b in kept if len(b) or not len(labels))
    return img[y:y + ch, x:x + cw], out
