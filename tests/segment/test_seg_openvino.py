"""A segmenter's OpenVINO IR: its masks against MXNet's arg-max of the logits (the acceptance bound,
99.9 % of pixels), skipped where OpenVINO is not installed."""
import mxnet as mx
import numpy as np
import pytest

from gluontl.segment.export import export_segmenter
from tests.segment.test_seg_export import CARD, SHAPE, _images, small  # noqa: F401  (the fixture)

pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'gluontl[openvino]')")


def test_the_ir_masks_equal_mxnets_arg_max_on_999_per_mille_of_pixels(small, tmp_path):  # noqa: F811
    from openvino import Core

    written = export_segmenter(small, tmp_path, "seg", SHAPE, formats=["openvino"], sample=_images(5, 1), card=CARD)
    [ir] = written.artifacts
    assert ir.format == "openvino" and [p.name for p in ir.files] == ["seg.xml", "seg.bin"]
    assert not (tmp_path / "seg.onnx").exists()  # the ONNX it came from was made in a scratch folder
    x = _images(6, 7)
    logits = small(mx.nd.array(x))
    want = np.argmax((logits[0] if isinstance(logits, (list, tuple)) else logits).asnumpy(), axis=1)
    compiled = Core().compile_model(str(ir.path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    outs = {o.get_any_name(): compiled(x)[o] for o in compiled.outputs}
    assert np.mean(outs["mask"] == want) >= 0.999
    assert Core().read_model(str(ir.path)).get_rt_info()["gluontl.task"].astype(str) == "segmentation"
