"""gluontl's image preprocessing in numpy and Pillow alone: copy this file next to a deployed model.

An exported ONNX file records its preprocessing (metadata_props ``gluontl.preprocess``), including
OpenCV's resize (INTER_AREA to shrink, INTER_LINEAR to enlarge). Pillow has no filter that computes
either: its closest ones differ by several grey levels on many pixels, enough to change a top-1.
This module computes the same tensor as ``gluontl.preprocess`` bit for bit (tested on many sizes:
gray, non-square, EXIF-rotated, integer and non-integer ratios, shrinking and enlarging) without
OpenCV or gluontl::

    import json, onnxruntime as ort
    from deploy_preprocess import preprocess
    options = ort.SessionOptions()  # float kernels, as gluontl predict runs the file
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession("elpv.onnx", options, providers=["CPUExecutionProvider"])
    meta = session.get_modelmeta().custom_metadata_map
    record, classes = json.loads(meta["gluontl.preprocess"]), json.loads(meta["gluontl.classes"])
    logits = session.run(None, {record["input"]["name"]: preprocess("cell.png", record)[None]})[0]

It follows OpenCV 4's uint8 kernels: INTER_AREA sums float32 weights per source pixel in OpenCV's
order (an integer ratio averages whole blocks; a 2x2 block rounds half up), INTER_LINEAR uses
11-bit fixed-point weights. Checked against the opencv-python gluontl installs (4.10), with its
CPU-specific code paths on and off. Imports numpy and Pillow only.
"""
from __future__ import annotations

import io
import os
from typing import Any, Callable, Mapping, Sequence, Union

import numpy as np
from PIL import Image, ImageOps

ImageLike = Union[str, os.PathLike, bytes, np.ndarray, Image.Image]
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")
_DBL_EPSILON = 2.220446049250313e-16
FORMAT, VERSION = "gluontl.preprocess", 1
INTERPOLATION = {"library": "opencv", "shrink": "INTER_AREA", "enlarge": "INTER_LINEAR"}


def preprocess(image: ImageLike, record: Mapping[str, Any]) -> np.ndarray:
    """The C,H,W float32 tensor a gluontl model takes for ``image`` (add ``[None]`` for a batch).

    ``record``: the ``gluontl.preprocess`` record (the ONNX metadata's JSON, parsed), version 1.
    ``image``: a file path, encoded bytes, a Pillow image, or an H,W,3 RGB / H,W gray uint8 array.
    """
    if record.get("format") != FORMAT or record.get("version") != VERSION:
        raise ValueError("not a version-1 gluontl.preprocess record; this file reproduces version 1 only")
    img = image if isinstance(image, np.ndarray) else decode(image)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    for step in record["steps"]:
        if step["op"] == "resize_shorter":
            img = resize_shorter(img, step["size"])
        elif step["op"] == "resize_cover":
            img = resize_cover(img, step["size"])
        elif step["op"] == "center_crop":
            img = center_crop(img, step["size"])
        else:
            raise ValueError(f"unknown step {step!r}")
    x = np.ascontiguousarray(img.astype(np.float32).transpose(2, 0, 1)) / np.float32(record["scale"])
    mean = np.array(record["mean"], np.float32).reshape(3, 1, 1)
    std = np.array(record["std"], np.float32).reshape(3, 1, 1)
    return (x - mean) / std


Size = Union[int, Sequence[int]]  # S (S x S) or [H, W]


def make_record(input_name: str, input_shape: Sequence[int | None], steps: Sequence[tuple[str, Size]],
                mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]:
    """The record :func:`preprocess` reads (gluontl writes it into every export, and converted
    models build it here without gluontl's training code); ``input_shape`` batch first (None:
    any batch size, JSON null)."""
    return {"format": FORMAT, "version": VERSION,
            "input": {"name": input_name, "shape": list(input_shape), "layout": "NCHW", "dtype": "float32"},
            "color": "RGB", "steps": [{"op": op, "size": size if isinstance(size, int) else list(size)}
                                     for op, size in steps],
            "interpolation": dict(INTERPOLATION), "scale": 255.0, "mean": list(mean), "std": list(std),
            "output": "logits"}


def decode(image: str | os.PathLike | bytes | Image.Image) -> np.ndarray:
    """H,W,3 uint8 RGB, upright per EXIF: gray replicated, alpha dropped, 16-bit gray / 257 rounded."""
    if isinstance(image, Image.Image):
        return to_rgb(image)
    with Image.open(io.BytesIO(image) if isinstance(image, bytes) else image) as im:
        return to_rgb(im)


def to_rgb(im: Image.Image) -> np.ndarray:
    """An opened Pillow image as gluontl decodes it (see :func:`decode`)."""
    im = ImageOps.exif_transpose(im)
    if im.mode in _SIXTEEN_BIT:  # Pillow's own conversion would clip 16-bit values at 255
        gray = np.clip(np.rint(np.asarray(im, np.float64) / 257.0), 0, 255).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)
    if im.mode in ("P", "PA"):
        im = im.convert("RGBA")
    return np.array(im.convert("RGB") if im.mode != "RGB" else im, np.uint8)


def resize(img: np.ndarray, w: int, h: int) -> np.ndarray:
    """``cv2.resize(img, (w, h))`` of an H,W,C uint8 image: INTER_AREA when the area shrinks (as
    gluontl resizes, both sides then shrink), else INTER_LINEAR."""
    if w * h < img.shape[0] * img.shape[1]:
        return _area(img, w, h)
    return _linear(img, w, h)


Resize = Callable[[np.ndarray, int, int], np.ndarray]


def resize_shorter(img: np.ndarray, size: int, resize: Resize = resize) -> np.ndarray:
    """Shorter side to ``size``, the longer to ``round(long * size / short)`` (Python's round).
    (gluontl itself passes OpenCV as ``resize``: only the kernel differs, never the geometry.)"""
    h, w = img.shape[:2]
    if min(h, w) == size:
        return img
    if h <= w:
        return resize(img, max(1, round(w * size / h)), size)
    return resize(img, size, max(1, round(h * size / w)))


def resize_cover(img: np.ndarray, size: Size, resize: Resize = resize) -> np.ndarray:
    """Scaled, keeping the aspect ratio, to the smallest size that covers ``size`` ([H, W]): the side
    that binds becomes exactly H (or W), the other ``round(side * H / h)`` (Python's round). For
    S x S this is :func:`resize_shorter` to S."""
    th, tw = _hw(size)
    h, w = img.shape[:2]
    if th * w >= tw * h:  # height binds (integer comparison: no float ties)
        out = (th, max(tw, round(w * th / h)))
    else:
        out = (max(th, round(h * tw / w)), tw)
    return img if out == (h, w) else resize(img, out[1], out[0])


def center_crop(img: np.ndarray, size: Size, resize: Resize = resize) -> np.ndarray:
    """The centre ``size`` x ``size`` (or H x W for ``[H, W]``), after :func:`resize_cover` to it if
    the image is smaller."""
    th, tw = _hw(size)
    if img.shape[0] < th or img.shape[1] < tw:
        img = resize_cover(img, (th, tw), resize)
    h, w = img.shape[:2]
    y, x = (h - th) // 2, (w - tw) // 2
    return img[y:y + th, x:x + tw]


def _hw(size: Size) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def _area(img: np.ndarray, w: int, h: int) -> np.ndarray:
    H, W = img.shape[:2]
    sx, sy = 1.0 / (w / W), 1.0 / (h / H)  # OpenCV's scale: the inverse of dst/src, in double
    ix, iy = int(round(sx)), int(round(sy))
    if abs(sx - ix) < _DBL_EPSILON and abs(sy - iy) < _DBL_EPSILON:  # whole blocks, integer sums
        total = img[:h * iy, :w * ix].astype(np.int64).reshape(h, iy, w, ix, -1).sum(axis=(1, 3))
        if ix == iy == 2:
            return ((total + 2) >> 2).astype(np.uint8)
        return _round_u8(total.astype(np.float32) * np.float32(1.0 / (ix * iy)))
    xi, xw = _area_weights(W, w, sx)
    yi, yw = _area_weights(H, h, sy)
    src = img.astype(np.float32)
    rows = np.zeros((H, w, img.shape[2]), np.float32)
    for j in range(xi.shape[1]):  # float32 sums in OpenCV's order; unused slots add 0 * pixel
        rows = rows + src[:, xi[:, j]] * xw[:, j][None, :, None]
    out = yw[:, 0][:, None, None] * rows[yi[:, 0]]
    for j in range(1, yi.shape[1]):
        out = out + yw[:, j][:, None, None] * rows[yi[:, j]]
    return _round_u8(out)


def _area_weights(src: int, dst: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """For each output pixel, the source pixels it covers and their float32 weights, in order
    (padded with weight 0): the part-covered first pixel, the whole ones, the part-covered last."""
    taps = []
    for d in range(dst):
        f1 = d * scale
        f2 = f1 + scale
        cell = min(scale, src - f1)
        s2 = min(int(np.floor(f2)), src - 1)
        s1 = min(int(np.ceil(f1)), s2)
        row = [(s1 - 1, (s1 - f1) / cell)] if s1 - f1 > 1e-3 else []
        row += [(s, 1.0 / cell) for s in range(s1, s2)]
        if f2 - s2 > 1e-3:
            row.append((s2, min(f2 - s2, 1.0, cell) / cell))
        taps.append(row)
    idx = np.zeros((dst, max(map(len, taps))), np.int64)
    weight = np.zeros(idx.shape, np.float32)
    for d, row in enumerate(taps):
        for j, (s, a) in enumerate(row):
            idx[d, j], weight[d, j] = s, a
    return idx, weight


def _linear(img: np.ndarray, w: int, h: int) -> np.ndarray:
    H, W = img.shape[:2]
    x0, fx = _linear_taps(W, w)
    outside = x0 < 0, x0 >= W - 1  # columns outside the pixel centres take the edge pixel whole
    x0[outside[0]], fx[outside[0]] = 0, 0
    x0[outside[1]], fx[outside[1]] = W - 1, 0
    x1 = np.minimum(x0 + 1, W - 1)
    a0, a1 = _fixed(np.float32(1) - fx), _fixed(fx)
    src = img.astype(np.int64)
    rows = src[:, x0] * a0[None, :, None] + src[:, x1] * a1[None, :, None]  # x 2048, exact
    y0, fy = _linear_taps(H, h)  # rows outside keep their weights and read the edge row twice
    b0, b1 = _fixed(np.float32(1) - fy)[:, None, None], _fixed(fy)[:, None, None]
    r0, r1 = rows[np.clip(y0, 0, H - 1)], rows[np.clip(y0 + 1, 0, H - 1)]
    out = ((((r0 >> 4) * b0) >> 16) + (((r1 >> 4) * b1) >> 16) + 2) >> 2
    return np.clip(out, 0, 255).astype(np.uint8)


def _linear_taps(src: int, dst: int) -> tuple[np.ndarray, np.ndarray]:
    """First source pixel and its float32 fraction per output pixel (half-pixel centres)."""
    f = ((np.arange(dst) + 0.5) * (1.0 / (dst / src)) - 0.5).astype(np.float32)
    i = np.floor(f).astype(np.int64)
    return i, (f - i.astype(np.float32)).astype(np.float32)


def _fixed(weight: np.ndarray) -> np.ndarray:
    return np.rint(weight * np.float32(2048)).astype(np.int64)


def _round_u8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)
