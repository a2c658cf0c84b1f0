"""Forward + backward time of each segmentation head on the ImageNet EfficientNet-Lite0 backbone.

One run: batch 8 at 128x128, hybridized, every parameter trained (and, second column, the
backbone frozen: grad_req null, as a freeze rule leaves it), median of 5 steps after 2 warm-ups.
    python scripts/seg_head_timing.py
"""
from __future__ import annotations

import time

import mxnet as mx
import numpy as np

from gluontl.home import gluontl_home
from gluontl.recipe import ModelSpec
from gluontl.segment.loss import SegmentationLoss
from gluontl.segment.models import SegmenterSpec, build_segmenter

SOURCE = f"onnx:{gluontl_home()}/models/efficientnet_lite0_imagenet.onnx"
HEADS = {"fcn s32": SegmenterSpec("fcn", ("conv_head.relu6",)),
         "fcn s16": SegmenterSpec("fcn", ("blocks.11.expand.relu6",)),
         "fcn s32 + aux s16": SegmenterSpec("fcn", ("blocks.11.expand.relu6", "conv_head.relu6"), aux=True),
         "lraspp s8+s32": SegmenterSpec("lraspp", ("blocks.5.expand.relu6", "conv_head.relu6")),
         "lraspp s8+s16": SegmenterSpec("lraspp", ("blocks.5.expand.relu6", "blocks.11.expand.relu6"))}


def step_time(net, aux: bool, frozen: bool) -> float:
    for n, p in net.collect_params().items():
        p.grad_req = "null" if frozen and p in set(net.backbone.collect_params().values()) else "write"
    loss_fn = SegmentationLoss(aux_weight=0.4 if aux else None)
    rng = np.random.default_rng(0)
    x = mx.nd.array(rng.normal(size=(8, 3, 128, 128)))
    y = mx.nd.array(rng.integers(0, 11, (8, 128, 128)))
    times = []
    for i in range(7):
        t = time.perf_counter()
        with mx.autograd.record():
            out = net(x)
            loss = loss_fn(*out, y) if aux else loss_fn(out, y)
        loss.backward()
        mx.nd.waitall()
        times.append(time.perf_counter() - t)
    return float(np.median(times[2:]))


def main() -> None:
    spec = ModelSpec(source=SOURCE, input_shape=(3, 224, 224))
    print(f"{'head':20s} {'all trained':>12s} {'backbone frozen':>16s}  (s per batch of 8 at 128x128)")
    for label, seg in HEADS.items():
        net, _ = build_segmenter(spec, SegmenterSpec(seg.arch, seg.taps, seg.aux, 128), 11)
        net.hybridize(static_alloc=True)
        print(f"{label:20s} {step_time(net, seg.aux, False):12.3f} {step_time(net, seg.aux, True):16.3f}", flush=True)


if __name__ == "__main__":
    main()
