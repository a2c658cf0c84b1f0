"""The OpenVINO frozen prefix (train.prefix_engine: openvino / openvino-int8): the float prefix
against exact float64 numpy of the convolution, the int8 one within its agreement bound or
refused, checked against MXNet as the onnxruntime engine is. Skipped where OpenVINO is not
installed (the optional [openvino] extra)."""
import mxnet as mx
import numpy as np
import pytest

from gluontl.data.prefix import INT8_AGREE_RTOL, OvEngine, OrtEngine, choose_engine
from tests.data.test_int8_prefix import SHAPE, conv_relu_prefix, images, windows

openvino = pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'gluontl[openvino]')")


def test_the_openvino_prefix_computes_the_convolution_in_float32():
    prefix = conv_relu_prefix()
    x = images()
    got = OvEngine(OrtEngine(prefix, SHAPE, mx.cpu()))(x).astype(np.float64)
    w = prefix[0].weight.data().asnumpy().astype(np.float64)
    b = prefix[0].bias.data().asnumpy().astype(np.float64)
    want = np.maximum(np.einsum("nhwcij,ocij->nohw", windows(x.astype(np.float64)), w) + b[None, :, None, None], 0)
    # 27 float32 products per output, |x| < 5 and |w| <= 0.5: a float32 sum is off by far less than 1e-5
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_choose_engine_runs_openvino_when_asked_and_says_how_it_agrees():
    x = images()
    engine, line = choose_engine("openvino", conv_relu_prefix(), SHAPE, mx.cpu(), x)
    assert engine.name == "openvino" and engine.key == {}
    assert line.startswith("prefix engine: openvino (agrees with mxnet: rel")


def test_openvino_int8_is_kept_within_the_agreement_bound_or_refused_with_the_float_prefix():
    pytest.importorskip("nncf", reason="NNCF is not installed (gluontl[openvino-int8])")
    x = images(32)
    prefix = conv_relu_prefix()
    engine, line = choose_engine("openvino-int8", prefix, SHAPE, mx.cpu(), x, calibration=[x[:16], x[16:]])
    with mx.autograd.predict_mode():
        want = prefix(mx.nd.array(x)).asnumpy()
    rel = np.linalg.norm(engine(x) - want) / np.linalg.norm(want)
    if engine.name == "openvino-int8":
        assert rel <= INT8_AGREE_RTOL and engine.key == {"engine": "openvino-int8"}
        assert "calibrated on 32 training images" in line
    else:
        assert engine.name == "openvino" and "openvino-int8 refused" in line


def test_auto_times_openvino_beside_mxnet_and_onnxruntime():
    x = images(8)
    engine, line = choose_engine("auto", conv_relu_prefix(), SHAPE, mx.cpu(), x)
    assert "openvino" in line.split("auto:")[1] and engine.name in ("mxnet", "onnxruntime", "openvino")
