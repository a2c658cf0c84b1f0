"""Prediction outputs: boxes drawn on images, and a ``detections.json`` a program can read.

Detections arrive in network-input pixels (the model sees every image resized to its input
shape, without keeping the aspect ratio); the outputs are in each ORIGINAL image's pixels, clipped
to the image, because that is what a user overlays or crops.
"""
from __future__ import annotations

import colorsys
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..atomic import atomic_write, write_text
from ..errors import DataError
from .metrics import check_class_ids


def class_color(class_id: int) -> tuple[int, int, int]:
    """A fixed RGB colour per class; golden-ratio hue steps keep neighbouring ids far apart."""
    r, g, b = colorsys.hsv_to_rgb((class_id * 0.618033988749895) % 1.0, 0.85, 0.95)
    return int(r * 255), int(g * 255), int(b * 255)


def kept(dets: np.ndarray, score_thresh: float) -> np.ndarray:
    """The rows worth showing, best first: not padding (class -1), score >= ``score_thresh``."""
    dets = np.asarray(dets, np.float64).reshape(-1, 6)
    dets = dets[(dets[:, 0] >= 0) & (dets[:, 1] >= score_thresh)]
    return dets[np.argsort(-dets[:, 1], kind="stable")]


def to_image_pixels(dets: np.ndarray, input_hw: Sequence[int], image_hw: Sequence[int]) -> np.ndarray:
    """Boxes from network-input pixels to the original image's (plain resize), clipped to it."""
    out = np.asarray(dets, np.float64).reshape(-1, 6).copy()
    sy, sx = image_hw[0] / input_hw[0], image_hw[1] / input_hw[1]
    out[:, [2, 4]] = np.clip(out[:, [2, 4]] * sx, 0, image_hw[1])
    out[:, [3, 5]] = np.clip(out[:, [3, 5]] * sy, 0, image_hw[0])
    return out


def draw_detections(image: np.ndarray, dets: np.ndarray, class_names: Sequence[str], score_thresh: float = 0.5,
                    thickness: int | None = None) -> np.ndarray:
    """A copy of ``image`` (HWC uint8 RGB) with each kept detection's box and "name 0.87" label
    in its class colour; ``dets`` are in this image's pixels. Lowest scores are drawn first, so
    the best box stays on top where boxes overlap."""
    import cv2

    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"draw_detections takes an HWC uint8 RGB image, got {image.dtype} {image.shape}")
    rows = kept(dets, score_thresh)
    check_class_ids(rows[:, 0], class_names, "detection")
    out = np.ascontiguousarray(image).copy()
    h, w = out.shape[:2]
    thick = thickness or max(1, round(min(h, w) / 250))
    font, scale = cv2.FONT_HERSHEY_SIMPLEX, max(0.35, min(h, w) / 800)
    for c, score, *box in rows[::-1]:
        color = class_color(int(c))
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        cv2.rectangle(out, (x1, y1), (x2, y2), color, thick)
        label = f"{class_names[int(c)]} {score:.2f}"
        (tw, th), base = cv2.getTextSize(label, font, scale, 1)
        top = y1 - th - base - 2 if y1 - th - base - 2 >= 0 else y1  # above the box, or inside at the top
        cv2.rectangle(out, (x1, top), (x1 + tw + 2, top + th + base + 2), color, -1)
        ink = (0, 0, 0) if sum(color) > 382 else (255, 255, 255)
        cv2.putText(out, label, (x1 + 1, top + th + 1), font, scale, ink, 1, cv2.LINE_AA)
    return out


def write_predictions(out_dir: str | Path, items: Sequence[tuple[str | Path, np.ndarray, np.ndarray]],
                      class_names: Sequence[str], input_hw: Sequence[int], score_thresh: float = 0.5) -> Path:
    """For each ``(source file, original HWC uint8 RGB image, detections in input_hw pixels)``,
    ``out_dir/NAME.jpg`` with the boxes drawn (NAME_2.jpg, ... when names repeat), and one
    ``out_dir/detections.json`` listing every image's kept detections in original pixels."""
    from PIL import Image

    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"Cannot create the predictions folder '{out}': {e.strerror}. Choose a writable folder "
                        f"that is not a file.") from None
    records: list[dict[str, Any]] = []
    used: set[str] = set()
    for source, image, dets in items:
        stem, n = Path(source).stem, 1
        while f"{stem}{'' if n == 1 else f'_{n}'}.jpg" in used:
            n += 1
        name = f"{stem}{'' if n == 1 else f'_{n}'}.jpg"
        used.add(name)
        target = out / name
        if target.resolve() == Path(source).resolve():
            raise DataError(f"Writing predictions to '{out}' would overwrite the input image '{source}'. "
                            f"Choose an output folder other than the images' folder.")
        h, w = image.shape[:2]
        rows = kept(to_image_pixels(dets, input_hw, (h, w)), score_thresh)
        drawn = draw_detections(image, rows, class_names, score_thresh)
        atomic_write(target, lambda tmp: Image.fromarray(drawn).save(tmp, format="JPEG", quality=90), DataError)
        records.append({"file": str(source), "output": name, "width": w, "height": h, "detections": [
            {"class": class_names[int(c)], "class_id": int(c), "score": float(s), "box": [float(v) for v in box]}
            for c, s, *box in rows]})
    doc = {"classes": list(class_names), "score_thresh": score_thresh, "images": records}
    return write_text(out / "detections.json", json.dumps(doc, indent=1), DataError)
