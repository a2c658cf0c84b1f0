"""int8 symbol/params through MXNet's oneDNN path (gluontl.export.quantize_mx), against independent
references: a one-layer model's int8 outputs against the float64 result within the quantization
bound derived in numpy from the calibration ranges, the written files reloaded by MXNet itself,
the recorded verdict recomputed from the files and the images, and the CPU policy from its flags."""
import json
import shutil

import mxnet as mx
import numpy as np
import pytest
import yaml
from PIL import Image

import gluontl
from tests import helpers
from gluontl.export import cpu
from gluontl.export.quantize_mx import CalibrationIter, activation_policy, load_symbol, quantize_block
from gluontl.recipe import QuantizeSpec


def one_conv(w, b):
    data = mx.sym.var("data")
    block = mx.gluon.SymbolBlock(mx.sym.Convolution(data, num_filter=w.shape[0], kernel=w.shape[2:], name="c"), [data])
    block.initialize()
    block.collect_params()["c_weight"].set_data(mx.nd.array(w))
    block.collect_params()["c_bias"].set_data(mx.nd.array(b))
    return block


def vnni_here():
    return cpu.onednn_vnni(cpu.cpu_flags())[0]


@pytest.mark.parametrize("signed", [True, False])
def test_int8_conv_agrees_with_float_within_the_quantization_step(signed):
    """One 3x3 convolution over a 3x3 input (so each output is one dot product of 360 terms),
    calibrated on the very inputs it is then run on (nothing clips). Per-tensor scales give
    steps dx = max|x| / 127 (int8 input) or / 255 (uint8: the non-negative input on a VNNI CPU),
    dw = max|w| / 127 (/ 63.5 where oneDNN may halve weight scales: no VNNI), and the output is
    requantized to int8 over its calibrated range (dy = max|y| / 127). With x + ex, w + ew:
    |y_q - y| <= sum|w| dx/2 + sum|x| dw/2 + n dx dw/4 + (bias rounding) dx dw/2 + dy/2."""
    rng = np.random.default_rng(7)
    w = rng.uniform(-1, 1, (6, 40, 3, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, 6).astype(np.float32)
    x = rng.uniform(-1 if signed else 0, 1, (48, 40, 3, 3)).astype(np.float32)
    q = quantize_block(one_conv(w, b), CalibrationIter(lambda i: x[i], range(len(x)), "data"),
                       QuantizeSpec(per_channel=False))
    got = q(mx.nd.array(x)).asnumpy().astype(np.float64)[:, :, 0, 0]
    X, W = x.reshape(len(x), -1).astype(np.float64), w.reshape(6, -1).astype(np.float64)
    want = X @ W.T + b
    vnni = vnni_here()
    unsigned_input = not signed and vnni  # activation_policy: uint8 only where VNNI keeps it exact
    dx = np.abs(X).max() / (255 if unsigned_input else 127)
    dw = np.abs(W).max() / (127 if vnni else 63.5)
    dy = np.abs(want).max() / 127
    n = X.shape[1]
    bound = (dx / 2 * np.abs(W).sum(1)[None] + dw / 2 * np.abs(X).sum(1)[:, None] + n * dx * dw / 4 + dx * dw / 2
             + dy / 2 + helpers.f32_tol(np.abs(X) @ np.abs(W).T, n))
    err = np.abs(got - want)
    assert (err <= bound).all(), f"worst error {err.max():.4g} is {(err / bound).max():.2f}x the int8 bound"
    assert err.max() > 100 * helpers.f32_tol(np.abs(want).max(), n)  # really int8, not float noise


def test_written_int8_symbol_reloads_with_the_same_outputs(tmp_path):
    rng = np.random.default_rng(3)
    w = rng.uniform(-1, 1, (4, 3, 3, 3)).astype(np.float32)
    x = rng.uniform(-1, 1, (8, 3, 6, 6)).astype(np.float32)
    q = quantize_block(one_conv(w, np.zeros(4, np.float32)), CalibrationIter(lambda i: x[i], range(8), "data"),
                       QuantizeSpec())
    want = q(mx.nd.array(x)).asnumpy()  # export() needs the graph a forward pass builds
    q.export(str(tmp_path / "m-int8"), epoch=0)
    graph = json.loads((tmp_path / "m-int8-symbol.json").read_text())
    assert any(n["op"] == "_contrib_quantize_v2" for n in graph["nodes"])
    again = load_symbol(tmp_path / "m-int8-symbol.json", tmp_path / "m-int8-0000.params", "data")
    np.testing.assert_array_equal(again(mx.nd.array(x)).asnumpy(), want)


@pytest.mark.parametrize("flags, isa, dtype, fc_float", [
    ({"avx2", "avx512f", "avx512_vnni"}, "", "auto", False),
    ({"avx2", "avx_vnni"}, "", "auto", False),
    ({"avx2", "avx512f", "avx512_vnni"}, "AVX2", "int8", True),        # the suite's second run
    ({"avx2", "avx512f", "avx512_vnni"}, "avx512_core", "int8", True),
    ({"avx2", "avx512f", "avx512_vnni"}, "AVX512_CORE_VNNI", "auto", False),
    ({"avx2", "avx512f", "avx512bw"}, "", "int8", True),                # Skylake-SP
    ({"avx2", "avx512f"}, "AVX2_VNNI", "int8", True),
])
def test_activation_policy_follows_the_cpu_and_dnnl_max_cpu_isa(flags, isa, dtype, fc_float):
    got_dtype, float_ops, why = activation_policy(flags, isa)
    assert got_dtype == dtype
    assert ("FullyConnected" in float_ops) is fc_float
    assert ("VNNI" in why) and (fc_float is ("saturate" in why))


# ------------------------------------------------------------------ a run, through the CLI

def test_export_int8_symbol_writes_files_whose_recorded_verdict_recomputes(digits_run, capsys):
    d, run = digits_run
    out = d / "good"
    code, printed, err = helpers.run_cli(capsys, "export", str(run), "--int8", "--out", str(out), "--format", "symbol")
    assert code == 0, err
    assert "MXNet oneDNN" in printed and "agreement" in printed
    assert not list(out.glob("*.onnx"))
    report = json.loads((run / "t-int8-symbol.report.json").read_text())
    assert report["file"] == str(out / "t-int8-symbol.json")
    assert report["quantized_layers"] >= 2  # both convolutions
    graph = json.loads((out / "t-int8-symbol.json").read_text())
    assert any(n["op"] == "_contrib_quantize_v2" for n in graph["nodes"])
    # the verdict again, from the written files and the images alone
    classes = helpers.DIGITS_5_9["classes"]  # label order; the folder of each image names its class
    images = sorted((d / "digits" / "val").rglob("*.png"))
    labels = np.array([classes.index(f.parent.name) for f in images])
    x = mx.nd.array(np.stack([gluontl.preprocess(str(f), out / "t-preprocess.json") for f in images]))
    preds = [load_symbol(out / f"t{s}-symbol.json", out / f"t{s}-0000.params", "data")(x).asnumpy().argmax(1)
             for s in ("", "-int8")]
    v = report["verification"]
    assert v["images"] == len(images)
    assert v["float"] == pytest.approx(np.mean(preds[0] == labels), abs=1e-12)
    assert v["int8"] == pytest.approx(np.mean(preds[1] == labels), abs=1e-12)
    assert v["agreement"] == pytest.approx(np.mean(preds[0] == preds[1]), abs=1e-12)
    assert v["agreement"] >= 0.9

    code, printed, err = helpers.run_cli(capsys, "bench", str(out), "--int8", "--batch", "1,2", "--repeat", "2")
    assert code == 0, err
    [entry] = json.loads((out / "bench.json").read_text())["models"]
    assert [r["batch"] for r in entry["int8"]["runs"]] == [1, 2] and set(entry["speedup"]) == {"1", "2"}
    assert entry["float"]["bytes"] == (out / "t-symbol.json").stat().st_size + (out / "t-0000.params").stat().st_size
    assert "t-int8-symbol.json" in printed and "MXNet" in printed
    # MXNet on --threads (default 1) whatever this process's MXNet started with: timed in a child process
    assert {r["threads"] for k in ("float", "int8") for r in entry[k]["runs"]} == {1}
    assert all(r["runs"] >= 2 and r["p10_ms"] <= r["median_ms"] <= r["p90_ms"] for r in entry["int8"]["runs"])


def export_symbol_edited(run, capsys, out, changes):
    """``gluontl export RUN --int8 --format symbol`` with ``changes`` merged into the run's recipe
    (restored after): (exit code, stderr on one line)."""
    def merge(into, new):
        for key, value in new.items():
            merge(into[key], value) if isinstance(value, dict) else into.__setitem__(key, value)

    recipe = (run / "recipe.yaml").read_text()
    edited = yaml.safe_load(recipe)
    merge(edited, changes)
    (run / "recipe.yaml").write_text(yaml.safe_dump(edited))
    try:
        code, _, err = helpers.run_cli(capsys, "export", str(run), "--int8", "--out", str(out), "--format", "symbol")
    finally:
        (run / "recipe.yaml").write_text(recipe)
    return code, " ".join(err.split())


def test_max_drop_refuses_a_mean_gray_calibration_image_for_the_symbol_and_keeps_the_float_pair(digits_run, capsys):
    """MXNet's ranges are symmetric around 0, so a black image (about -2 after normalization)
    still spans most inputs; the mean color normalizes to about 0 and squeezes every range."""
    d, run = digits_run
    broken = d / "gray_digits"
    shutil.copytree(d / "digits", broken)
    for png in (broken / "train").rglob("*.png"):
        Image.new("RGB", (16, 16), (124, 116, 104)).save(png)
    before = sorted(p.name for p in run.iterdir())
    code, err = export_symbol_edited(run, capsys, d / "bad", {"data": {"source": f"folder:{broken}"},
                                                              "export": {"quantize": {"calibration": 1}}})
    assert code == 2, err
    assert "t-int8-symbol.json was not written" in err and "max_drop" in err and "Traceback" not in err
    assert "1 training images" in err
    assert sorted(p.name for p in (d / "bad").iterdir()) == ["t-0000.params", "t-preprocess.json", "t-symbol.json"]
    assert sorted(p.name for p in run.iterdir()) == before


def test_percentile_calibration_is_refused_for_the_symbol_by_name(digits_run, capsys):
    d, run = digits_run
    code, err = export_symbol_edited(run, capsys, d / "pct", {"export": {"quantize": {"method": "percentile"}}})
    assert code == 2
    assert "percentile has no MXNet counterpart" in err and "--format onnx" in err and "Traceback" not in err
    assert not (d / "pct").exists()
