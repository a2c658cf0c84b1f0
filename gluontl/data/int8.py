"""The frozen prefix in int8: onnxruntime's static QDQ quantization of its float ONNX export,
calibrated on training images as the cache feeds them (the run's own transforms), so the cache
fill runs on onnxruntime's integer kernels.

The quantized prefix is an approximation by design (every activation moves by up to half a
quantization step); ``prefix.choose_engine`` accepts it only when its features agree with
MXNet's on the probe batch within ``INT8_AGREE_RTOL`` and pass the collapsed-features guard.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np

from ..export.quantize import quiet_onnxruntime

class _Batches:
    """onnxruntime's CalibrationDataReader protocol over a sequence of preprocessed batches, made
    one at a time (``set_range`` lets the calibrator reduce each batch's ranges before the next)."""

    def __init__(self, name: str, batches: Sequence[np.ndarray]) -> None:
        self.name, self.batches, self.images = name, batches, 0
        self.set_range(0, len(batches))

    def __len__(self) -> int:
        return len(self.batches)

    def set_range(self, start_index: int, end_index: int) -> None:
        self._todo = iter(range(start_index, min(end_index, len(self.batches))))

    def get_next(self) -> dict[str, np.ndarray] | None:
        i = next(self._todo, None)
        if i is None:
            return None
        x = np.ascontiguousarray(self.batches[i], np.float32)
        self.images += len(x)
        return {self.name: x}


def quantize(model: bytes, input_name: str, batches: Sequence[np.ndarray], reduce: bool) -> tuple[bytes, int]:
    """``model`` (float ONNX) as static QDQ int8, and the number of images calibrated on: uint8
    activations with MinMax ranges over ``batches``, int8 weights per output channel (BatchNorm
    folded into the weights leaves channels of very different ranges: EfficientNet-Lite0's
    15-block prefix measured rel 0.6 from MXNet's features with one scale per tensor, 0.16-0.18 per
    channel)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    with tempfile.TemporaryDirectory(prefix="gluontl-int8-") as d, quiet_onnxruntime():
        out = Path(d) / "int8.onnx"
        reader = _Batches(input_name, batches)
        quantize_static(onnx.load_from_string(model), str(out), reader,
                        quant_format=QuantFormat.QDQ, per_channel=True, reduce_range=reduce,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        calibrate_method=CalibrationMethod.MinMax, extra_options={"CalibStridedMinMax": 1})
        return out.read_bytes(), reader.images
