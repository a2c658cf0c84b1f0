"""Segmenter export (gluontl.segment.export): the ONNX file's logits and arg-max mask in
onnxruntime (float kernels) against the MXNet block at an input size that is no multiple of the
stride, its metadata, the symbol pair reloaded, the near-tie rule of the mask check on hand-made
logits, and refusals that write nothing."""
from __future__ import annotations

import json

import mxnet as mx
import numpy as np
import onnx
import pytest
from tests.helpers import assert_f32_close

from gluontl.errors import ExportError
from gluontl.export.verify import ort_session
from gluontl.recipe import ModelSpec
from gluontl.segment.export import export_segmenter, mask_disagreement
from gluontl.segment.models import SegmenterSpec, build_segmenter

SHAPE = (3, 61, 75)  # a multiple of no stride
CARD = {"classes": ["background", "digit", "edge"],
        "preprocess": {"input": "data", "shape": [None, *SHAPE], "steps": []}}


@pytest.fixture(scope="module")
def small():
    """An LR-ASPP with an aux head on MobileNetV2-0.25 with trained-looking BatchNorm statistics."""
    with mx.name.NameManager():
        mx.random.seed(0)
        net, _ = build_segmenter(ModelSpec(source="zoo:mobilenetv2_0.25", input_shape=(3, 64, 64)),
                                 SegmenterSpec("lraspp", aux=True, head_channels=16), 3)
    with mx.autograd.record():  # a few batches move the BN statistics off 0/1
        for seed in range(3):
            net(mx.nd.array(np.random.default_rng(seed).normal(size=(4, *SHAPE))))
    net.hybridize()
    return net


def _images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, *SHAPE)).astype(np.float32)


def test_onnx_logits_and_mask_match_mxnet_on_float_kernels(small, tmp_path):
    sample = _images(5, 1)
    files = export_segmenter(small, tmp_path, "seg", SHAPE, formats=["onnx"], sample=sample, card=CARD)
    assert [f.name for f in files] == ["seg.onnx"]
    session = ort_session(str(files[0]), "test")
    assert [(o.name, o.type) for o in session.get_outputs()] == [("logits", "tensor(float)"), ("mask", "tensor(int64)")]
    x = _images(3, 2)  # images the export was not verified on
    logits, mask = session.run(None, {session.get_inputs()[0].name: x})
    with mx.autograd.predict_mode():
        want = small(mx.nd.array(x)).asnumpy()
    assert logits.shape == (3, 3, 61, 75) and mask.shape == (3, 61, 75)
    # depth: the backbone's ~20 conv layers and the head; terms: the widest 3x3 depthwise/1x1 sums
    assert_f32_close(logits, want, terms=64 * 9, depth=24)
    assert np.array_equal(mask, logits.argmax(1))  # ArgMax of its own logits, ties to the lower id
    gap = np.sort(want, 1)[:, -1] - np.sort(want, 1)[:, -2]
    clear = gap > 1e-4 * (want.max() - want.min())
    assert np.array_equal(mask[clear], want.argmax(1)[clear])
    assert clear.mean() > 0.999


def test_metadata_names_the_task_classes_and_preprocessing(small, tmp_path):
    path = export_segmenter(small, tmp_path, "seg", SHAPE, formats=["onnx"], card=CARD)[0]
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert meta["gluontl.task"] == "segmentation"
    assert json.loads(meta["gluontl.classes"]) == CARD["classes"]
    assert json.loads(meta["gluontl.preprocess"]) == CARD["preprocess"]


def test_symbol_pair_reloads_to_the_same_logits_with_the_card_beside_it(small, tmp_path):
    files = export_segmenter(small, tmp_path, "seg", SHAPE, formats=["symbol"], card=CARD)
    assert sorted(f.name for f in files) == ["seg-0000.params", "seg-preprocess.json", "seg-symbol.json"]
    assert json.loads((tmp_path / "seg-preprocess.json").read_text()) == CARD
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = mx.gluon.SymbolBlock.imports(str(tmp_path / "seg-symbol.json"), ["data"],
                                            str(tmp_path / "seg-0000.params"))
    x = mx.nd.array(_images(2, 3))
    with mx.autograd.predict_mode():
        got, want = back(x).asnumpy(), small(x).asnumpy()
    assert_f32_close(got, want, terms=64 * 9, depth=24)


def test_a_mask_differs_only_at_near_ties():
    """Hand-made logits (1 image, 3 classes, 1 x 4 pixels): pixel 0 a clear win of class 2, pixel 1
    a tie within 1e-6 of classes 0 and 1, pixel 2 a clear win of class 0, pixel 3 clear class 1."""
    want = np.array([[[[0.0, 1.0, 5.0, 0.0]], [[0.0, 1.0 + 5e-7, 0.0, 3.0]], [[4.0, 0.0, 0.0, 0.0]]]], np.float32)
    agreed = np.array([[[2, 1, 0, 1]]])
    assert not mask_disagreement(agreed, want, 1e-6).any()
    tie_other_way = np.array([[[2, 0, 0, 1]]])
    assert not mask_disagreement(tie_other_way, want, 1e-6).any()
    assert mask_disagreement(tie_other_way, want, 1e-7).tolist() == [[[False, True, False, False]]]
    wrong = np.array([[[2, 1, 1, 1]]])
    assert mask_disagreement(wrong, want, 1e-6).tolist() == [[[False, False, True, False]]]


def test_refusals_write_nothing(small, tmp_path):
    with pytest.raises(ExportError, match="card names 2 classes but the network predicts 3"):
        export_segmenter(small, tmp_path, "seg", SHAPE, card={**CARD, "classes": ["a", "b"]})
    with pytest.raises(ExportError, match=r"sample has shape \(2, 3, 64, 64\)"):
        export_segmenter(small, tmp_path, "seg", SHAPE, sample=np.zeros((2, 3, 64, 64), np.float32))
    with pytest.raises(ExportError, match="'tflite', which is no export format"):
        export_segmenter(small, tmp_path, "seg", SHAPE, formats=["tflite"])
    assert list(tmp_path.iterdir()) == []


def test_pspnet_pyramid_pooling_has_no_onnx_form_and_nothing_is_written(tmp_path):
    net, _ = build_segmenter(ModelSpec(source="zoo:resnet50_v1s", input_shape=(3, 64, 64)), SegmenterSpec("psp"), 3)
    with pytest.raises(ExportError, match="AdaptiveAvgPooling2D"):
        export_segmenter(net, tmp_path / "out", "psp", (3, 64, 64))
    assert not (tmp_path / "out").exists()
