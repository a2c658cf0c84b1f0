"""GluonCV's private fields: an SSD anchor generator's geometry (GluonCV 0.10, pinned)."""
from __future__ import annotations

from typing import Any

import numpy as np


def ssd_anchor_geometry(gen: Any) -> tuple[Any, Any, Any]:
    """``(base image size, anchor sizes, aspect ratios)`` of a ``SSDAnchorGenerator``, sizes in base pixels."""
    return gen._im_size, gen._sizes, gen._ratios


def ssd_anchors(gen: Any, sizes: Any, ratios: Any, step: float, alloc_size: Any, offsets: tuple[float, float]
                ) -> np.ndarray:
    """The anchors ``gen`` would make with these sizes and step (``SSDAnchorGenerator._generate_anchors``)."""
    return gen._generate_anchors(sizes, ratios, step, alloc_size, offsets)
