"""The model zoo as a catalogue: its names and the input size each family is made for. Below the
recipe schema (which resolves ``zoo:`` names and sizes at load) and the model loaders alike."""
from __future__ import annotations

import functools
import re

DEFAULT_SHAPE = (3, 224, 224)
_ZOO_SHAPES = (  # C,H,W the zoo's own training/evaluation feeds, where it is not 224x224 (first match)
    (r"inceptionv3|xception", (3, 299, 299)), (r"nasnet_6_4032$", (3, 331, 331)), (r"resnest101$", (3, 256, 256)),
    (r"resnest200$", (3, 320, 320)), (r"resnest269$", (3, 416, 416)), (r"ssd_300", (3, 300, 300)),
    (r"ssd_512|center_net", (3, 512, 512)), (r"yolo3", (3, 416, 416)), (r".*rcnn", (3, 600, 600)),
    (r"fastscnn", (3, 1024, 1024)), (r"fcn|psp|deeplab|danet|icnet", (3, 480, 480)),
    (r"simple_pose|mobile_pose", (3, 256, 192)), (r"alpha_pose", (3, 320, 256)),
    (r"monodepth2.*_640x192", (3, 192, 640)),
)


def zoo_names() -> list[str]:
    """Every zoo model name.

    GluonCV's ``get_model`` also builds every ``mxnet.gluon.model_zoo.vision`` name
    (same architectures and parameter names; a test keeps that true), so one zoo serves both.
    """
    return list(_zoo_names())


@functools.lru_cache(maxsize=1)
def _zoo_names() -> tuple[str, ...]:
    from gluoncv.model_zoo import get_model_list

    return tuple(sorted({n.lower() for n in get_model_list()}))


def zoo_input_shape(name: str) -> tuple[int, ...]:
    """C,H,W a zoo model is made for: zoo models declare no input, and 224x224 fails
    segmentation models (480) and misrepresents detectors (SSD-512, YOLOv3 at 416)."""
    key = name.lower().removeprefix("zoo:")
    return next((shape for pattern, shape in _ZOO_SHAPES if re.match(pattern, key)), DEFAULT_SHAPE)
