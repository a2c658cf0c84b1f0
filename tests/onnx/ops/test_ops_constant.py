"""Dropout: identity in inference (onnxruntime's default), real dropout when the
``training_mode`` input is true, as onnxruntime computes it (random draws, so checked by
their structure and rate, and exactly against onnxruntime where no draw matters)."""
import numpy as np
import pytest
from tests.onnx.opcheck import check, run_mx, run_ort

X = np.random.RandomState(0).randn(4, 5).astype(np.float32)


@pytest.mark.parametrize("opset", [7, 10, 13])
def test_dropout_without_training_mode_is_identity_with_a_full_mask(opset):
    ins = {"x": X} if opset < 12 else {"x": X, "r": np.array(0.3, np.float32)}
    check("Dropout", ins, consts={"r"}, opset=opset, n_outputs=2, grad=True)


@pytest.mark.parametrize("const", [True, False], ids=["const-training", "runtime-training"])
def test_dropout_training_false_and_ratio_zero_match_onnxruntime(const):
    for r, t in ((0.4, False), (0.0, True)):
        ins = {"x": X, "r": np.array(r, np.float32), "t": np.array(t)}
        check("Dropout", ins, consts={"r", "t"} if const else {"r"}, opset=13, n_outputs=2)


def _check_dropped(x, y, mask, draws_by_ort):
    kept = mask.astype(bool)
    np.testing.assert_allclose(y[kept], x[kept] / 0.7, rtol=1e-6)
    assert not y[~kept].any()
    # 10,000 draws: the dropped share is 0.3 within 5 standard deviations (0.023)
    for drop in (1 - kept.mean(), 1 - draws_by_ort.mean()):
        assert abs(drop - 0.3) < 5 * np.sqrt(0.3 * 0.7 / x.size), drop


def test_dropout_in_training_mode_drops_at_the_ratio_and_scales_the_rest():
    x = np.random.RandomState(1).uniform(1, 2, (200, 50)).astype(np.float32)
    ins = {"x": x, "r": np.array(0.3, np.float32), "t": np.array(True)}
    model, ref = run_ort("Dropout", ins, {}, {"r", "t"}, opset=13, n_outputs=2)
    (y, mask), grads = run_mx(model, ins, {"r", "t"}, opset=13, grad=True)
    _check_dropped(x, y, mask, ref[1])
    np.testing.assert_allclose(grads["x"], mask / 0.7, rtol=1e-6)  # d(sum y)/dx


def test_dropout_with_run_time_ratio_and_training_mode():
    """Both as graph inputs of an imported model (rank-0 values travel as shape (1,))."""
    import mxnet as mx
    from gluontl.onnx import import_model
    x = np.random.RandomState(2).uniform(1, 2, (200, 50)).astype(np.float32)
    ins = {"x": x, "r": np.array(0.3, np.float32), "t": np.array(True)}
    model, ref = run_ort("Dropout", ins, {}, (), opset=13, n_outputs=2)
    block = import_model(model)
    for training in (True, False):
        y, mask = (o.asnumpy() for o in block(mx.nd.array(x), mx.nd.array([0.3]), mx.nd.array([training])))
        if training:
            _check_dropped(x, y, mask, ref[1])
        else:
            assert np.array_equal(y, x) and mask.all()
