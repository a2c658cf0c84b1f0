"""Small shared helpers for tests: real models, real steps, no mocks."""
from __future__ import annotations

import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

from gluontl import cli
from gluontl.rules import trainable_params
from gluontl.sources.restore import snapshot  # noqa: F401  (re-exported for tests)

REPO = Path(__file__).resolve().parents[1]  # the checkout: README.md, docs/, recipes/, gluontl/
ONNX_FIXTURES = REPO / "tests" / "onnx" / "fixtures"  # real exported models, see its MANIFEST.json


def sgd_step(net, x, y, lr=0.1, momentum=0.0, wd=0.0, steps=1):
    """``steps`` plain SGD steps with softmax CE, the Trainer given only trainable params."""
    params = trainable_params(net)
    trainer = mx.gluon.Trainer(params, "sgd", {"learning_rate": lr, "momentum": momentum, "wd": wd})
    loss_fn = mx.gluon.loss.SoftmaxCrossEntropyLoss()
    for _ in range(steps):
        with mx.autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(x.shape[0])
    return trainer


def run_cli(capsys, *args):
    """``gluontl ARGS`` through the console script's main(), in this process: (exit code, stdout, stderr)."""
    old = sys.argv
    sys.argv = ["gluontl", *args]
    try:
        with pytest.raises(SystemExit) as e:
            cli.main()
            raise SystemExit(0)
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


def assert_one_paragraph(code, out, err, needles):
    """Bad input's answer from the CLI: exit 2 and one paragraph on stderr (``error: ``, then
    lines wrapped with a 7-space indent, no blank line, no traceback) that names every needle."""
    assert code == 2, (out, err)
    assert err.startswith("error: "), err
    assert "Traceback" not in err
    lines = err.rstrip("\n").split("\n")
    assert all(line.startswith(" " * 7) and line.strip() for line in lines[1:]), err  # wrapped, no blank line
    flat = " ".join(err.split())
    for n in needles:
        assert n in flat, (n, flat)


def ort_session(model, *, optimization: str = "basic", threads: int = 1, quiet: bool = False):
    """onnxruntime on its CPU float kernels: the tests' one way to run an ONNX file as a reference.

    ``model`` is a path, serialized bytes or a ``ModelProto``.
    ``optimization``: ``"basic"`` (the default) allows only onnxruntime's exact rewrites (constant
    folding, redundant nodes, semantics-preserving fusions). Its own default, ``"all"``, also fuses
    QuantizeLinear/DequantizeLinear pairs into integer kernels whose uint8×int8 products saturate on
    CPUs without VNNI (the reference would depend on the machine, as gluontl.export.verify.ort_session
    says), and its extended rewrites turned a reversed Range into an empty tensor in onnxruntime 1.31
    (tests/onnx/ops/test_ops_shape.py). ``"all"`` is for a test of what a deployment runs, as
    gluontl's int8 verification does (gluontl.export.verify.deploy_session).
    ``threads``: intra-op threads; one, as each of the suite's workers has one core's worth
    (scripts/test.sh sets OMP_NUM_THREADS=1 for them).
    ``quiet``: errors only in onnxruntime's log (mx.onnx lists initializers as graph inputs, and
    onnxruntime warns once per name).
    """
    import onnxruntime as ort

    level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    options = ort.SessionOptions()
    options.graph_optimization_level = level[optimization]
    options.intra_op_num_threads = threads
    if quiet:
        options.log_severity_level = 3
    source = model.SerializeToString() if hasattr(model, "SerializeToString") else model
    return ort.InferenceSession(source if isinstance(source, bytes) else str(source), options,
                                providers=["CPUExecutionProvider"])


def ort_run(model, feeds, **options) -> list:
    """All outputs of ``model`` in an ``ort_session(model, **options)``; ``feeds`` maps input names
    to arrays, or is one array for a model's only input."""
    session = ort_session(model, **options)
    if not isinstance(feeds, dict):
        feeds = {session.get_inputs()[0].name: feeds}
    return session.run(None, feeds)


def onnx_cut(model, inputs: list[str], outputs: list[str]):
    """``model`` (a ``ModelProto``) cut between tensors ``inputs`` and ``outputs`` by onnx's own
    extractor, shapes inferred first: onnx 1.20's ``Extractor`` no longer infers them itself and
    refuses a cut tensor with no value_info (onnx 1.17's inferred them)."""
    import onnx
    import onnx.utils

    return onnx.utils.Extractor(onnx.shape_inference.infer_shapes(model)).extract_model(inputs, outputs)


def batch(n=4, c=3, hw=32, classes=5, seed=0):
    rs = np.random.RandomState(seed)
    return mx.nd.array(rs.randn(n, c, hw, hw)), mx.nd.array(rs.randint(0, classes, n))


DIGITS_5_9 = {"source": "demo:digits", "classes": ["5", "6", "7", "8", "9"], "batch_size": 16,
              "train_transform": {"resize": 16}, "val_transform": {"resize": 16}}


def without_timings(rows) -> list[dict]:
    """metrics.jsonl rows less their timings (``img_per_s``, ``seconds``): what two runs of one
    recipe must share."""
    return [{k: v for k, v in r.items() if k not in ("img_per_s", "seconds")} for r in rows]


def checkpoint_params(run_dir, tag: str = "last") -> dict:
    """A run folder's ``checkpoints/TAG.params`` as numpy arrays by name."""
    return {k: v.asnumpy() for k, v in mx.nd.load(str(Path(run_dir) / "checkpoints" / f"{tag}.params")).items()}


def tiny_recipe(prefix, *, name: str = "t", rules: list | None = None, data: dict | None = None,
                export: list | None = None, **train) -> dict:
    """The recipe dict the training tests start from: ``tiny_symbol``'s net (``symbol:PREFIX``,
    3x16x16) on the demo's digits 5-9. ``train`` keys go into ``train:`` as given (no defaults are
    hidden here); ``data`` updates ``DIGITS_5_9``; ``export`` lists the formats (``[]``: none)."""
    recipe = {"name": name, "model": {"source": f"symbol:{prefix}", "input_shape": [3, 16, 16]}}
    if rules is not None:
        recipe["rules"] = rules
    recipe["data"] = {**DIGITS_5_9, **(data or {})}
    if train:
        recipe["train"] = train
    if export is not None:
        recipe["export"] = {"formats": list(export)}
    return recipe


def tiny_symbol(folder, deep=True) -> str:
    """A small BN-free conv net for 16×16 digits, exported as an MXNet symbol checkpoint. Its names
    are always conv0_/conv1_/dense0_, whatever the process built before (a module-scoped fixture
    runs before the per-test fixture that restarts Gluon's name counters)."""
    mx.random.seed(1)
    with mx.name.NameManager():
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Conv2D(8, 3, padding=1, activation="relu"))
        if deep:
            net.add(mx.gluon.nn.MaxPool2D(2), mx.gluon.nn.Conv2D(16, 3, padding=1, activation="relu"))
        net.add(mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(5))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, 3, 16, 16)))
    net.export(str(folder / "tiny"))
    return str(folder / "tiny")


# ----------------------------------------------------------------- float32 tolerances

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23 = twice float32's unit roundoff u


def resnet18_weights(path) -> str:
    """A ResNet-18 (2 classes) params file whose BN statistics moved off 0/1: a stand-in for a
    pretrained backbone file."""
    from gluoncv.model_zoo import get_model

    mx.random.seed(0)
    net = get_model("resnet18_v1", classes=2)
    net.initialize(mx.init.Xavier())
    with mx.autograd.record():
        net(mx.nd.random.uniform(shape=(8, 3, 16, 16)))
    net.save_parameters(str(path))
    return str(path)


def other_file_system(near, monkeypatch):
    """A new folder on a file system other than ``near``'s (/dev/shm), where ``os.link`` across
    fails; on a machine without one, ``os.link`` is made to fail the same way (EXDEV), so the
    copy path runs everywhere. The caller removes the folder."""
    import errno
    import os
    import tempfile
    from pathlib import Path

    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and os.stat(shm).st_dev != os.stat(near).st_dev:
        return Path(tempfile.mkdtemp(dir=shm))

    def cross_device(src, dst, *args, **kwargs):
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(dst))

    monkeypatch.setattr(os, "link", cross_device)
    return Path(tempfile.mkdtemp(dir=near))


def f32_tol(scale, terms: int, depth: int = 1):
    """The absolute difference two correct float32 evaluations of one value may show.

    Results differ by summation order only: oneDNN picks kernels, blocking and vector width
    per CPU (AVX2 and AVX-512 add in different orders, DNNL_MAX_CPU_ISA changes it again),
    and onnxruntime or numpy use their own. A float32 sum of ``terms`` products aᵢbᵢ is off
    by at most terms·u·Σ|aᵢbᵢ| (Higham, *Accuracy and Stability*, §3.1) and, roundings
    being independent, by about sqrt(terms)·u·Σ|aᵢbᵢ|; two implementations differ by about
    sqrt(2) times that. The bound is 8·sqrt(terms)·eps32·scale per layer (8·eps32 = 16·u:
    a safety factor of ~10 over the typical error, far below any wrong-number error).

    ``scale``: Σ|aᵢbᵢ| per output where the test can compute it (|a|@|b|, elementwise),
    else the size of the output (max |reference|). ``depth``: the number of such layers in
    sequence (a normalised network passes each layer's error on at about its size).
    """
    return 8.0 * depth * EPS32 * np.sqrt(terms) * np.asarray(scale, np.float64)


def assert_f32_close(got, want, scale=None, terms: int = 1, depth: int = 1, err_msg: str = ""):
    """``got`` equals ``want`` within :func:`f32_tol`; ``scale`` defaults to max |want| (over
    finite values). NaN and ±inf must sit at the same places."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.where(finite, 0.0, got), np.where(finite, 0.0, want),
                                  err_msg=f"{err_msg} NaN/inf differ")
    if scale is None:
        scale = np.abs(want[finite]).max(initial=0.0)
    tol = f32_tol(scale, terms, depth)
    diff = np.abs(np.where(finite, got, 0.0) - np.where(finite, want, 0.0))
    bad = ~(diff <= tol)  # NaN in got where want is finite is bad too
    assert not bad.any(), (f"{err_msg} {int(bad.sum())}/{bad.size} elements differ by more than "
                           f"the float32 bound (terms={terms}, depth={depth}); max |diff| "
                           f"{np.nanmax(diff, initial=0.0):.3g}, bound {np.max(tol):.3g}")


def assert_same_training(a: dict, b: dict, start: dict, steps: int, grad_err: float):
    """Parameters after ``steps`` SGD steps from ``start``, trained two ways that differ only in
    float rounding (summation order, contexts, cached features). Each step rounds the weights
    at their size (:func:`f32_tol` of |w| over ``steps`` roundings) and each step's gradient
    differs by the relative ``grad_err`` (``f32_tol(1, terms, depth)`` for another summation
    order), which the updates carry into the weights at the size of the total update |w - start|.
    A wrong number (a lost step, a wrong lr scale, other features) moves a weight by about the
    update itself."""
    assert a.keys() == b.keys()
    for k in a:
        start_k = start.get(k, np.zeros_like(a[k]))
        bound = f32_tol(np.abs(a[k]).max(), steps) + 8 * grad_err * np.abs(a[k] - start_k).max()
        diff = np.abs(a[k].astype(np.float64) - b[k]).max()
        assert diff <= bound, f"{k}: the runs differ by {diff:.3g}, more than float rounding ({bound:.3g})"


# ----------------------------------------------------------------- exact quantized arithmetic
# The ONNX spec's formulas in numpy, integers held in int64: the oracle for every quantized
# converter (onnxruntime's uint8×int8 kernels saturate int16 pair sums on CPUs without VNNI).

QRANGE = {np.dtype(np.uint8): (0, 255), np.dtype(np.int8): (-128, 127)}


def _along(v, ndim: int, axis: int):
    """A per-tensor scalar or a per-axis vector shaped to broadcast along ``axis``."""
    v = np.asarray(v)
    if v.size == 1:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return v.reshape(shape)


def quantize_ref(x, scale, zero_point, axis: int = 1) -> np.ndarray:
    """QuantizeLinear: saturate(round_half_even(x / scale) + zero_point), x / scale in float32."""
    zp = np.asarray(zero_point)
    lo, hi = QRANGE[zp.dtype]
    q = np.rint(np.float32(x) / _along(np.float32(scale), np.ndim(x), axis)).astype(np.int64)
    return np.clip(q + _along(zp.astype(np.int64), np.ndim(x), axis), lo, hi).astype(zp.dtype)


def dequantize_ref(q, scale, zero_point=0, axis: int = 1) -> np.ndarray:
    """DequantizeLinear: (q - zero_point) * scale in float32."""
    centered = np.asarray(q, np.int64) - _along(np.asarray(zero_point, np.int64), np.ndim(q), axis)
    return (centered.astype(np.float32) * _along(np.float32(scale), np.ndim(q), axis)).astype(np.float32)


def dynamic_quantize_ref(x):
    """DynamicQuantizeLinear (uint8): scale from the range including 0, zero point rounded
    and saturated, then QuantizeLinear."""
    x = np.asarray(x, np.float32)
    lo, hi = np.float32(min(0.0, x.min())), np.float32(max(0.0, x.max()))
    scale = np.float32((hi - lo) if hi != lo else 1.0) / np.float32(255)
    zp = np.uint8(np.rint(np.clip(np.float32(0) - lo / scale, 0, 255)))
    return quantize_ref(x, scale, zp), scale, zp


def matmul_integer_ref(a, b, a_zero=0, b_zero=0) -> np.ndarray:
    """MatMulInteger: (a - a_zero) @ (b - b_zero), accumulated exactly in int64."""
    return (np.asarray(a, np.int64) - np.int64(a_zero)) @ (np.asarray(b, np.int64) - np.int64(b_zero))


def conv_integer_ref(x, w, x_zero=0, w_zero=0, pads=(0, 0, 0, 0)) -> np.ndarray:
    """ConvInteger, 2-D, stride 1, group 1: exact int64 correlation of the centered operands
    (per-output-channel ``w_zero`` allowed)."""
    xc = np.asarray(x, np.int64) - np.int64(x_zero)
    wc = np.asarray(w, np.int64) - _along(np.asarray(w_zero, np.int64), 4, 0)
    xc = np.pad(xc, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    n, c, h, wd = xc.shape
    m, _, kh, kw = wc.shape
    oh, ow = h - kh + 1, wd - kw + 1
    cols = np.stack([xc[:, :, i:i + oh, j:j + ow] for i in range(kh) for j in range(kw)], axis=2)
    # cols: (n, c, kh*kw, oh, ow); weights: (m, c, kh*kw)
    return np.einsum("nckhw,mck->nmhw", cols, wc.reshape(m, c, kh * kw))


def requantize_ref(acc, multiplier, zero_point):
    """QLinear* output: saturate(round_half_even(acc * multiplier) + zero_point), with the
    real-valued ``acc * multiplier`` computed in float64 (also returned: how close each
    output is to a rounding tie decides what a float implementation may round otherwise)."""
    zp = np.asarray(zero_point)
    lo, hi = QRANGE[zp.dtype]
    real = np.asarray(acc, np.float64) * np.asarray(multiplier, np.float64)
    return np.clip(np.rint(real) + zp.astype(np.int64), lo, hi).astype(zp.dtype), real


def requantize_slack(abs_acc, multiplier, terms: int, real):
    """How far (in output steps) a float32 dequantize → op → quantize may be from ``real``:
    the accumulation's :func:`f32_tol` (``abs_acc``: the sum of |products| of the centered
    integers) plus a few roundings of the scales."""
    return f32_tol(np.asarray(abs_acc) * np.asarray(multiplier), terms) + 4 * EPS32 * np.abs(real)


def assert_requantized(got, want, real, slack: float, err_msg: str = ""):
    """Quantized outputs equal the exact ones, except by one step where the exact real value
    lies within ``slack`` (in quantization steps: the float error of a float implementation's
    accumulation) of a rounding tie, where float rounding may fall either way."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.int64)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.array_equal(got, np.round(got)), f"{err_msg} outputs are not integers"
    near_tie = np.abs(np.abs(real - np.floor(real)) - 0.5) <= slack
    diff = np.abs(got - want)
    wrong = (diff > 1) | ((diff == 1) & ~near_tie)
    assert not wrong.any(), (f"{err_msg} {int(wrong.sum())}/{wrong.size} outputs differ from exact "
                             f"integer arithmetic (max step diff {diff.max():.0f}; "
                             f"{int(near_tie.sum())} near ties allowed ±1)")


def conv3x3_np(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3x3 convolution with padding 1, stride 1, written out in float64 (a reference for
    gradients and BatchNorm statistics of layers behind a conv)."""
    n, _, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for a in range(3):
        for b in range(3):
            out += np.einsum("nchw,oc->nohw", xp[:, :, a:a + h, b:b + wd], w[:, :, a, b].astype(np.float64))
    return out


def voc_subset(root, train: int, val: int):
    """The first ``train``/``val`` images of the detection demo's digits 0-4 task as a VOC folder
    of its own (annotations and images linked, not copied)."""
    import os

    from gluontl.detect.synth import digits_det_folder

    demo = digits_det_folder()
    for sub in ("Annotations", "JPEGImages"):
        os.symlink(demo / sub, root / sub)
    sets = root / "ImageSets" / "Main"
    sets.mkdir(parents=True)
    for split, n in (("train", train), ("val", val)):
        ids = (demo / "ImageSets" / "Main" / f"{split}.txt").read_text().split()[:n]
        (sets / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return root


# The first lines of a script run as a deployment: gluontl, OpenCV, MXNet, onnx and GluonCV
# cannot be imported (a deployed model has onnxruntime, numpy and Pillow only).
WITHOUT_GLUONTL = r'''
import importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):  # a deployment has none of these
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("gluontl", "cv2", "mxnet", "onnx", "gluoncv"):
            raise ImportError(f"{name} is not installed here")

sys.meta_path.insert(0, Refuse())
'''
