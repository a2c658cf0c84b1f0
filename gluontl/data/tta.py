"""Test-time augmentation: a classifier's probabilities averaged over views of each image.

``evaluate --tta`` and ``predict --tta`` take ``flip`` (the image and its mirror image),
``five_crop`` (the four corner crops and the centre crop, each ``CROP`` of the height and width,
resized back to the model input), ``ten_crop`` (those five and their mirror images) or
``scales=S1,S2,...`` (the image zoomed by each factor about its centre: larger than 1 crops the
middle ``1/S`` and enlarges it, smaller than 1 shrinks it into a zero border, zero being the mean
pixel after normalization). Views act on the preprocessed tensor (after the run's val transform),
so every view has the model's input shape and a run folder and its ONNX file see the same pixels.
Resizes are OpenCV bilinear. The averaged quantity is the probability (softmax or sigmoid), never
the logit, as timm's and mmengine's TTA do.
"""
from __future__ import annotations

from typing import Callable

import cv2
import numpy as np

from ..errors import DataError

CROP = 0.875  # the crop side of five_crop/ten_crop as a fraction of the input side (224 of 256)
View = Callable[[np.ndarray], np.ndarray]  # N x C x H x W float32 -> the same shape


def hflip(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x[..., ::-1])


def _resize(x: np.ndarray, h: int, w: int) -> np.ndarray:
    """Each C x H x W image of the batch bilinearly resized to h x w."""
    return np.stack([cv2.resize(np.ascontiguousarray(im.transpose(1, 2, 0)), (w, h), interpolation=cv2.INTER_LINEAR)
                     .reshape(h, w, -1).transpose(2, 0, 1) for im in x]).astype(np.float32)


def crop(top: float, left: float, frac: float = CROP) -> View:
    """The crop of side ``frac`` whose top-left corner sits at (top, left) of the free margin, resized back."""
    def view(x: np.ndarray) -> np.ndarray:
        h, w = x.shape[2:]
        ch, cw = max(1, round(h * frac)), max(1, round(w * frac))
        y0, x0 = round((h - ch) * top), round((w - cw) * left)
        return _resize(x[:, :, y0:y0 + ch, x0:x0 + cw], h, w)
    return view


def scale(s: float) -> View:
    """The image zoomed by ``s`` about its centre, at the input's size."""
    def view(x: np.ndarray) -> np.ndarray:
        h, w = x.shape[2:]
        if s >= 1:
            return crop(0.5, 0.5, 1 / s)(x)
        sh, sw = max(1, round(h * s)), max(1, round(w * s))
        out = np.zeros_like(x)
        y0, x0 = (h - sh) // 2, (w - sw) // 2
        out[:, :, y0:y0 + sh, x0:x0 + sw] = _resize(x, sh, sw)
        return out
    return view


def _identity(x: np.ndarray) -> np.ndarray:
    return x


CORNERS = ((0.0, 0.0), (0.0, 1.0), (1.0, 0.0), (1.0, 1.0), (0.5, 0.5))


def views(spec: str | None) -> list[View]:
    """The views of a ``--tta`` value (None or ``none``: the image alone)."""
    if spec in (None, "", "none"):
        return [_identity]
    if spec == "flip":
        return [_identity, hflip]
    if spec in ("five_crop", "ten_crop"):
        five = [crop(t, l) for t, l in CORNERS]
        return five + [lambda x, v=v: hflip(v(x)) for v in five] if spec == "ten_crop" else five
    if spec.startswith("scales="):
        try:
            factors = [float(f) for f in spec.removeprefix("scales=").split(",")]
        except ValueError:
            factors = []
        if factors and all(0.1 <= f <= 10 for f in factors):
            return [scale(f) for f in factors]
    raise DataError(f"--tta {spec!r} is not a test-time augmentation; use flip, five_crop, ten_crop or "
                    f"scales=S1,S2,... (zoom factors between 0.1 and 10, e.g. scales=0.9,1,1.1).")


def average(probs: Callable[[np.ndarray], np.ndarray], x: np.ndarray, spec: str | None) -> np.ndarray:
    """The mean over the views of ``spec`` of ``probs(view(x))`` (float64)."""
    vs = views(spec)
    return sum(np.asarray(probs(v(x)), np.float64) for v in vs) / len(vs)


class TTANet:
    """A classifier network called like one (NDArray in, NDArray out) whose output is the view
    average of its probabilities: ``act`` ``softmax`` answers log-probabilities (softmax of them
    gives the average back, so top-1, loss and softmax-reading code stay as they are), ``sigmoid``
    the probabilities themselves."""

    def __init__(self, net, spec: str, act: str) -> None:
        self.net, self.spec, self.act = net, spec, act
        views(spec)  # a bad value fails before any work

    def __call__(self, x):
        import mxnet as mx

        def probs(v: np.ndarray) -> np.ndarray:
            out = self.net(mx.nd.array(v, ctx=x.context))
            return (mx.nd.softmax(out, axis=1) if self.act == "softmax" else mx.nd.sigmoid(out)).asnumpy()

        p = average(probs, x.asnumpy(), self.spec)
        return mx.nd.array(np.log(p) if self.act == "softmax" else p, ctx=x.context)
