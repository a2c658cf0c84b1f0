"""The int8 frozen prefix (train.prefix_engine: onnxruntime-int8): within the quantization error
of the float prefix, refused when its calibration is broken, recorded in the run folder."""
import json

import mxnet as mx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from gluontl.export.cpu import cpu_flags, reduce_range
from gluontl.data.prefix import Int8Engine, OrtEngine, choose_engine

SHAPE = (3, 8, 8)
AVX512_VNNI = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n\nprocessor\t: 1\nflags\t\t: fpu\n"
AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"


def conv_relu_prefix():
    """One 3x3 convolution (3 -> 4 channels, bias) and a ReLU: a prefix whose int8 error can be
    bounded by hand."""
    mx.random.seed(3)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(4, 3, in_channels=3, activation="relu"))
    net.initialize(mx.init.Uniform(0.5))
    net[0].bias.set_data(mx.nd.array([0.1, -0.2, 0.3, 0.0]))
    return net


def images(n=16, seed=0):
    return np.random.default_rng(seed).standard_normal((n, *SHAPE)).astype(np.float32)


def windows(x):
    """N, C, H, W -> N, H-2, W-2, C, 3, 3: the inputs of each output position of a 3x3 convolution."""
    return np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3)).transpose(0, 2, 3, 1, 4, 5)


def qdq_scales(model_bytes):
    """The scales of the quantized file: the graph input's, the weight's, and the activations'
    quantized after the convolution (its output and/or the ReLU's)."""
    model = onnx.load_from_string(model_bytes)
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    data = model.graph.input[0].name
    quant = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    x_scale = [float(init[n.input[1]]) for n in quant if n.input[0] == data]
    after = [float(init[n.input[1]]) for n in quant if n.input[0] != data and n.input[0] not in init]
    weight = [init[n.input[1]] for n in model.graph.node
              if n.op_type == "DequantizeLinear" and n.input[0] in init and init[n.input[0]].dtype == np.int8]
    return x_scale, [float(np.max(w)) for w in weight], after


@pytest.mark.parametrize("cpuinfo", [AVX512_VNNI, AVX2_ONLY])
def test_int8_features_are_within_the_quantization_error_of_the_float_prefix(cpuinfo):
    prefix = conv_relu_prefix()
    x = images()
    engine = Int8Engine(OrtEngine(prefix, SHAPE, mx.cpu()), [x[:8], x[8:]], mx.cpu(), flags=cpu_flags(cpuinfo))
    assert "calibrated on 16 training images" in engine.note
    got = engine(x).astype(np.float64)
    w = prefix[0].weight.data().asnumpy().astype(np.float64)
    b = prefix[0].bias.data().asnumpy().astype(np.float64)
    win = windows(x.astype(np.float64))
    want = np.maximum(np.einsum("nhwcij,ocij->nohw", win, w) + b[None, :, None, None], 0)
    (s_x,), (s_w,), after = qdq_scales(engine.model)
    # 8-bit weights with VNNI, 7-bit without (onnxruntime's symmetric ranges: [-127, 127], [-64, 64])
    assert s_w == pytest.approx(np.abs(w).max() / (127 if "avx512_vnni" in cpuinfo else 64), rel=1e-6)
    assert 1 <= len(after) <= 2
    if "avx512_vnni" in cpuinfo and "avx512_vnni" not in cpu_flags():
        # This machine only pretends to have VNNI: onnxruntime's u8s8 kernels then saturate int16 pair
        # sums on 8-bit weights (docs/testing.md), so the numbers are checked where the CPU has it,
        # and here only the choice above is (gluontl itself picks 7-bit weights on this CPU).
        return
    # |conv(x^, w^) - conv(x, w)| <= sum |w| |x^ - x| + sum |x^| |w^ - w| (+ the bias's rounding), ReLU
    # is 1-Lipschitz, and each activation quantized after it adds its rounding. Activations get a
    # whole step: min/max ranges are widened to hold 0 and the zero point is rounded, which may clip
    # an extreme value by up to half a step beyond the half step of rounding.
    terms = s_x * np.abs(w).sum(axis=(1, 2, 3))[None, :, None, None] \
        + s_w / 2 * np.einsum("nhwcij->nhw", np.abs(win) + s_x)[:, None] + s_x * s_w / 2
    bound = terms + sum(after)
    assert np.all(np.abs(got - want) <= bound)
    assert bound.max() < 0.1 * (want.max() - want.min())  # the bound says something
    assert np.abs(got - want).max() > 1e-4  # it is the quantized prefix, not the float one


def test_reduce_range_follows_the_cpu_flags():
    assert reduce_range(cpu_flags(AVX512_VNNI))[0] is False
    assert reduce_range(cpu_flags(AVX2_ONLY))[0] is True
    assert reduce_range(cpu_flags("processor : 0\nflags : avx2 avx_vnni\n"))[0] is False
    assert reduce_range(cpu_flags(""))[0] is True  # no flags known: the safe choice
    assert "no VNNI" in reduce_range(set())[1]


@pytest.mark.parametrize("broken", [False, True])
def test_the_probe_refuses_an_int8_prefix_that_disagrees(broken):
    prefix = conv_relu_prefix()
    x = images(32, seed=1)
    calibration = [np.zeros((4, *SHAPE), np.float32)] if broken else [x[:16], x[16:]]  # a black image
    engine, log = choose_engine("onnxruntime-int8", prefix, SHAPE, mx.cpu(), x[:8], calibration=calibration)
    if broken:
        assert engine.name == "onnxruntime"  # the float prefix, verified by the same probe
        assert "onnxruntime-int8 refused: its features differ from MXNet's by rel" in log
        assert np.abs(engine(x[:8]) - prefix(mx.nd.array(x[:8])).asnumpy()).max() < 1e-5
    else:
        assert engine.name == "onnxruntime-int8"
        assert log.startswith("prefix engine: onnxruntime-int8 (QDQ int8 calibrated on 32 training images")


def test_the_run_folder_records_the_int8_engine(tmp_path):
    from gluontl.recipe import parse_recipe
    from gluontl.train.loop import finetune

    r = parse_recipe({"name": "q", "model": {"source": "zoo:resnet18_v1", "input_shape": [3, 16, 16]},
                      "surgery": {"head": {"classes": 2}}, "rules": [{"preset": "freeze_all_but_head"}],
                      "data": {"source": "demo:digits", "classes": ["5", "6"], "batch_size": 16,
                               "train_transform": {"resize": 16}, "val_transform": {"resize": 16}},
                      "train": {"epochs": 1, "lr": 0.05, "prefix_engine": "onnxruntime-int8",
                                "guards": "off"}})
    run = finetune(r, runs_root=tmp_path, quiet=True).run_dir
    cache = json.loads((run / "summary.json").read_text())["feature_cache"]
    assert cache["cache"] is True
    assert cache["prefix_engine"] in ("onnxruntime-int8", "onnxruntime")
    assert cache["log"].count("onnxruntime-int8") == 1
    said = "prefix engine: onnxruntime-int8 (" if cache["prefix_engine"] == "onnxruntime-int8" else \
        "onnxruntime-int8 refused: "
    assert said in cache["log"] and said in (run / "plan.txt").read_text()
    assert json.loads((run / "plan.json").read_text())["feature_cache"]["prefix_engine"] == cache["prefix_engine"]
    # int8 val features are not the float network's: none are kept for evaluate
    assert (run / "feature_cache").exists() == (cache["prefix_engine"] == "onnxruntime")
