import json

import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.onnx.opcheck import check, check_grad

from gluontl.errors import OnnxImportError
from gluontl.onnx import registry
from gluontl.onnx.registry import Node, Tensor

X = np.random.RandomState(4).randn(2, 3, 5, 6).astype(np.float32)
EMPTY = np.zeros(0, np.float32)


def f32(*v):
    return np.array(v, np.float32)


def tol(mode, antialias=False):
    """check()'s float32 bound: the taps summed per 2-D output (linear 2×2, cubic 4×4;
    antialiased downsampling widens the kernel by 1/scale ≤ 3 per axis), and depth 2 as the
    coordinate and weight arithmetic rounds before the sum does."""
    return {"terms": {"nearest": 1, "linear": 4, "cubic": 16}[mode] * (9 if antialias else 1), "depth": 2}


def resize(attrs, scales=None, sizes=None, x=X, opset=13, grad=True, roi=EMPTY, **kw):
    ins = {"x": x, "roi": roi, "scales": EMPTY if scales is None else f32(*scales)}
    if sizes is not None:
        ins["sizes"] = np.array(sizes, np.int64)
    return check("Resize", ins, attrs, consts=set(ins) - {"x"}, opset=opset, grad=grad, **kw)


@pytest.mark.parametrize("ctm", ["asymmetric", "half_pixel", "pytorch_half_pixel",
                                 "align_corners"])
@pytest.mark.parametrize("nearest_mode", ["floor", "round_prefer_floor", "round_prefer_ceil",
                                          "ceil"])
def test_nearest_modes(ctm, nearest_mode):
    attrs = {"mode": "nearest", "coordinate_transformation_mode": ctm,
             "nearest_mode": nearest_mode}
    resize(attrs, scales=(1, 1, 2, 2))
    resize(attrs, scales=(1, 1, 0.6, 1.5), grad=False)
    resize(attrs, sizes=(2, 3, 7, 4), grad=False)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("ctm", ["asymmetric", "half_pixel", "pytorch_half_pixel",
                                 "align_corners"])
def test_linear_and_cubic(mode, ctm):
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
    resize(attrs, scales=(1, 1, 2, 2), **tol(mode))
    resize(attrs, scales=(1, 1, 0.6, 1.7), **tol(mode))
    resize(attrs, sizes=(2, 3, 9, 1), **tol(mode))


def test_cubic_options_and_opset18_axes():
    resize({"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1},
           scales=(1, 1, 0.8, 1.6), **tol("cubic"))
    x3 = np.random.randn(2, 4, 7).astype(np.float32)
    check("Resize", {"x": x3, "roi": None, "scales": f32(2.5)}, {"mode": "linear", "axes": [-1]},
          consts={"scales"}, opset=18, grad=True, **tol("linear"))
    check("Resize", {"x": X, "roi": None, "scales": None, "sizes": np.array([8, 3], np.int64)},
          {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
          consts={"sizes"}, opset=18, grad=True, **tol("linear"))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_antialias_downsampling(mode):
    check("Resize", {"x": X, "roi": EMPTY, "scales": f32(1, 1, 0.5, 0.6)},
          {"mode": mode, "antialias": 1}, consts={"roi", "scales"}, opset=18, grad=True,
          **tol(mode, antialias=True))


def test_tf_crop_and_resize_extrapolates():
    resize({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
            "extrapolation_value": 2.5}, sizes=(2, 3, 4, 4),
           roi=f32(0, 0, -0.2, 0.3, 1, 1, 0.8, 1.4), **tol("linear"))


def test_legacy_forms():
    for opset in (7, 9):
        for mode in ("nearest", "linear"):
            scales = (1, 1, 2, 3)
            if opset == 7:
                check("Upsample", {"x": X}, {"mode": mode, "scales": list(map(float, scales))},
                      opset=7, grad=True, **tol(mode))
            else:
                check("Upsample", {"x": X, "s": f32(*scales)}, {"mode": mode}, consts={"s"},
                      opset=9, grad=True, **tol(mode))
    # Resize-10: asymmetric; onnxruntime rounds nearest down when upsampling, up when not
    for scales in [(1, 1, 2, 2), (1, 1, 0.6, 1.5)]:
        for mode in ("nearest", "linear"):
            check("Resize", {"x": X, "s": f32(*scales)}, {"mode": mode}, consts={"s"},
                  opset=10, grad=True, **tol(mode))


def test_integer_input_takes_the_general_path():
    x = np.arange(2 * 3 * 4, dtype=np.int32).reshape(1, 2, 3, 4)
    resize({"mode": "nearest", "coordinate_transformation_mode": "asymmetric"},
           scales=(1, 1, 2, 2), x=x, grad=False)
    resize({"mode": "nearest"}, scales=(1, 1, 0.7, 1.3), x=x, grad=False)


def _ops(sym):
    return [n["op"] for n in json.loads(sym.tojson())["nodes"] if n["op"] != "null"]


def _convert(attrs, scales, shape, opset=13):
    node = Node("Resize", "up", attrs, opset, ["x", "roi", "scales"], ["y"])
    ins = [Tensor("x", mx.sym.var("x"), shape=shape, dtype=np.float32),
           Tensor("roi", None, const=EMPTY, shape=(0,)),
           Tensor("scales", None, const=f32(*scales), shape=(4,))]
    return registry.get("Resize", opset)(node, ins)


def test_yolo_upsampling_is_one_op_with_free_dims():
    """Nearest x2 (asymmetric or half_pixel) is MXNet UpSampling, even with unknown N/H/W."""
    for ctm in ("asymmetric", "half_pixel"):
        sym = _convert({"mode": "nearest", "coordinate_transformation_mode": ctm,
                        "nearest_mode": "floor" if ctm == "asymmetric" else "round_prefer_floor"},
                       (1, 1, 2, 2), (None, 8, None, None))
        assert _ops(sym) == ["UpSampling"]
        out = sym.eval(x=mx.nd.array(X))[0].asnumpy()
        np.testing.assert_array_equal(out, X.repeat(2, axis=2).repeat(2, axis=3))
    # unequal integer factors, or integer data: one repeat per axis, still shape-free
    sym = _convert({"mode": "nearest", "coordinate_transformation_mode": "asymmetric",
                    "nearest_mode": "floor"}, (1, 1, 2, 3), (None, 8, None, None))
    assert _ops(sym) == ["repeat", "repeat"]
    out = sym.eval(x=mx.nd.array(X))[0].asnumpy()
    np.testing.assert_array_equal(out, X.repeat(2, axis=2).repeat(3, axis=3))
    bilinear = _convert({"mode": "linear", "coordinate_transformation_mode": "half_pixel"},
                        (1, 1, 2, 2), (2, 3, 5, 6))
    assert _ops(bilinear) == ["_contrib_BilinearResize2D"]


def test_unknown_size_for_non_integer_resize_is_a_clear_error():
    with pytest.raises(OnnxImportError, match="'up'.*axis 2.*unknown"):
        _convert({"mode": "linear"}, (1, 1, 1.5, 1.5), (None, 3, None, None))


def test_size_zero_keeps_a_free_axis():
    """The importer writes 0 for sizes entries that follow the free batch dimension."""
    node = Node("Resize", "up", {"mode": "nearest"}, 13, ["x", "", "", "sizes"], ["y"])
    ins = [Tensor("x", mx.sym.var("x"), shape=(None, 3, 5, 6), dtype=np.float32), None, None,
           Tensor("sizes", None, const=np.array([0, 3, 10, 12], np.int64), shape=(4,))]
    sym = registry.get("Resize", 13)(node, ins)
    for n in (1, 2):
        out = sym.eval(x=mx.nd.array(X[:n]))[0].asnumpy()
        np.testing.assert_array_equal(out, X[:n].repeat(2, axis=2).repeat(2, axis=3))


def test_gradients_match_central_differences():
    x = np.random.randn(1, 2, 3, 4).astype(np.float32)
    for attrs, scales in [({"mode": "linear"}, (1, 1, 1.5, 0.75)),
                          ({"mode": "cubic", "exclude_outside": 1}, (1, 1, 2, 1.25)),
                          ({"mode": "linear", "antialias": 1}, (1, 1, 0.7, 0.5)),
                          ({"mode": "nearest", "nearest_mode": "ceil"}, (1, 1, 1.4, 2))]:
        check_grad("Resize", {"x": x, "roi": EMPTY, "scales": f32(*scales)}, attrs,
                   consts={"roi", "scales"}, opset=18)


def test_float32_rounding_like_onnxruntime():
    """Output size is floor(float32(n * scale)); a size gives scale float32(m / n)."""
    x = np.random.randn(1, 1, 10, 7).astype(np.float32)
    resize({"mode": "nearest"}, scales=(1, 1, 2.6, 1), x=x)  # 26 rows, not 25
    resize({"mode": "nearest", "coordinate_transformation_mode": "half_pixel",
            "nearest_mode": "floor"}, sizes=(1, 1, 10, 1), x=x)  # 0.5 * 7 - 0.5 is a tie


def test_output_shape_equal_to_input_is_a_copy():
    """onnxruntime copies when the output shape equals the input, even if scale != 1."""
    resize({"mode": "nearest", "nearest_mode": "floor"}, scales=(1, 1, 1.1, 1.05))
    resize({"mode": "linear"}, scales=(1, 1, 1.1, 1.5), **tol("linear"))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(st.data())
def test_matches_onnxruntime_on_random_configurations(data):
    h, w = data.draw(st.integers(1, 7)), data.draw(st.integers(1, 7))
    x = np.random.RandomState(h * 8 + w).randn(1, 2, h, w).astype(np.float32)
    mode = data.draw(st.sampled_from(["nearest", "linear", "cubic"]))
    # Known float32 tie differences, left out here: onnxruntime rounds some ties of
    # round_prefer_ceil up (1 / (2/7) = 3.4999998 -> 4) and of half_pixel_symmetric
    # differently; we follow its documented formulas there.
    ctms = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]
    attrs = {"mode": mode, "coordinate_transformation_mode": data.draw(st.sampled_from(
        ctms + ([] if mode == "nearest" else ["half_pixel_symmetric"])))}
    if mode == "nearest":
        attrs["nearest_mode"] = data.draw(st.sampled_from(["floor", "ceil", "round_prefer_floor"]))
    else:
        attrs["antialias"] = data.draw(st.sampled_from([0, 1]))
        if mode == "cubic" or attrs["antialias"]:  # onnxruntime refuses it elsewhere
            attrs["exclude_outside"] = data.draw(st.sampled_from([0, 1]))
    if data.draw(st.booleans()):
        factors = st.sampled_from([0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 1 / 3])
        scales = (1, 1, max(data.draw(factors), 1 / h), max(data.draw(factors), 1 / w))
        ins, consts = {"x": x, "roi": None, "scales": f32(*scales)}, {"scales"}
    else:
        sizes = (1, 2, data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9)))
        ins = {"x": x, "roi": None, "scales": None, "sizes": np.array(sizes, np.int64)}
        consts = {"sizes"}
    check("Resize", ins, attrs, consts=consts, opset=19, **tol(mode, attrs.get("antialias", 0)))


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_align_corners_downsampling_by_a_fractional_length_follows_onnxruntime(mode):
    """5 x 0.7 = 3.5 rows become 3. align_corners maps row o to o * (5 - 1) / (3 - 1) in
    onnxruntime and PyTorch; onnx.reference (the backend data) divides by 3.5 - 1 instead.
    The converter follows onnxruntime, which deployed models run on."""
    from tests.onnx.opcheck import run_ort
    attrs = {"mode": mode, "coordinate_transformation_mode": "align_corners"}
    scales = (1, 1, 0.7, 0.8)
    got = resize(attrs, scales=scales, **tol(mode))[0]
    ins = {"x": X, "roi": None, "scales": f32(*scales)}  # (onnx.reference fails on an empty roi)
    _, ref = run_ort("Resize", ins, attrs, consts={"scales"}, opset=13, reference=True)
    assert got.shape == ref[0].shape == (2, 3, 3, 4)
    assert np.abs(got - ref[0]).max() > 0.01  # the two readings of the spec differ here
