"""Write the ImageNet EfficientNet-Lite0 ONNX file and show its top-1 on three sample photos.

Usage: python scripts/make_imagenet_onnx.py [--out PATH]

Without ``--out`` the file goes to ``$GLUONTL_HOME/models/efficientnet_lite0_imagenet.onnx``
(reused if already there); a recipe points at it with
``source: onnx:~/.cache/gluontl/models/efficientnet_lite0_imagenet.onnx`` (or the GLUONTL_HOME
you use). The photos (sklearn's china.jpg and flower.jpg, matplotlib's grace_hopper.jpg) are
fed through the preprocessing recorded in the file itself, in onnxruntime.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def _photos() -> dict[str, np.ndarray]:
    import matplotlib.cbook
    from sklearn.datasets import load_sample_image

    from gluontl.data.transforms import load_image

    return {"china.jpg": load_sample_image("china.jpg"), "flower.jpg": load_sample_image("flower.jpg"),
            "grace_hopper.jpg": load_image(matplotlib.cbook.get_sample_data("grace_hopper.jpg", asfileobj=False))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write here instead of $GLUONTL_HOME/models/")
    args = ap.parse_args()

    import onnx
    import onnxruntime as ort

    from gluontl.convert.efficientnet_lite import ensure_imagenet_onnx, write_onnx
    from gluontl.data.transforms import META_CLASSES, preprocess

    t0 = time.perf_counter()
    path = write_onnx(args.out) if args.out else ensure_imagenet_onnx()
    print(f"{path}  ({path.stat().st_size / 1e6:.1f} MB, {time.perf_counter() - t0:.1f} s)")
    classes = json.loads({p.key: p.value for p in onnx.load(str(path)).metadata_props}[META_CLASSES])
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for name, img in _photos().items():
        logits = sess.run(None, {"input": preprocess(img, path)[None]})[0][0].astype(np.float64)
        prob = np.exp(logits - logits.max())
        prob /= prob.sum()
        top = np.argsort(-prob)[:3]
        print(f"{name:18s} " + ", ".join(f"{classes[i]} {prob[i]:.3f}" for i in top))


if __name__ == "__main__":
    main()
