"""int8 exports (gluontl.export.quantize) and `gluontl bench`, against independent references:
the calibration tensors against the standalone deploy_preprocess, the int8 file's arithmetic
against exact integer numpy from the scales and zero points read out of the file (never an
onnxruntime integer kernel: they saturate on CPUs without VNNI), the float model in float64."""
import json
import shutil
import subprocess
import sys

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

import gluontl
from tests import helpers
from gluontl import deploy_preprocess
from gluontl.export import cpu
from gluontl.export.quantize import CalibrationReader, calibration_indices, file_tensors, per_channel_choice, \
    quantize_onnx
from gluontl.export.verify import deploy_session, ort_session
from gluontl.recipe import QuantizeSpec
from gluontl.data.transforms import META_CLASSES, META_PREPROCESS, Preprocess, load_image


class Files:
    """Images by index, decoded by gluontl (what a run's dataset hands the reader)."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def image(self, i):
        return load_image(self.paths[i])


class Arrays(Files):
    def image(self, i):
        return self.paths[i]


# ------------------------------------------------------------------ reduce_range from the CPU

CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx {extra}\nbogomips\t: 4000\n"


@pytest.mark.parametrize("extra, reduce, vnni", [
    ("avx2 avx512f avx512_vnni", False, True),   # Cascade Lake and later servers
    ("avx2 avx_vnni", False, True),              # Alder Lake: VNNI without AVX-512
    ("avx2 avx512f avx512bw", True, False),      # Skylake-SP: AVX-512 but no VNNI
    ("avx2", True, False),
    ("", True, False),
])
def test_reduce_range_follows_the_vnni_flags(extra, reduce, vnni):
    flags = cpu.cpu_flags(CPUINFO.format(extra=extra))
    assert ("avx" in flags) and ("bogomips" not in flags)
    got, why = cpu.reduce_range(flags)
    assert got is reduce
    assert ("VNNI" in why) and (("off" in why) == (not reduce))
    assert cpu.flag_summary(flags)["vnni"] is vnni
    assert cpu.describe(flags).endswith("VNNI no" if not vnni else ")")


def test_no_cpuinfo_means_the_weakest_cpu():
    assert cpu.cpu_flags("") == set()
    assert cpu.reduce_range(set())[0] is True
    assert cpu.cpu_flags("Features\t: fp asimd asimddp\n") == {"fp", "asimd", "asimddp"}  # ARM's spelling


# ------------------------------------------------------------------ the calibration reader

def test_calibration_reader_feeds_what_deploy_preprocess_computes(tmp_path):
    rs = np.random.RandomState(3)
    paths = []
    for k, (h, w) in enumerate([(40, 30), (24, 57), (9, 7), (33, 33), (50, 20)]):
        arr = rs.randint(0, 256, (h, w) if k == 2 else (h, w, 3)).astype(np.uint8)  # one gray image
        paths.append(str(tmp_path / f"{k}.png"))
        Image.fromarray(arr).save(paths[-1])
    record = deploy_preprocess.make_record("img", (None, 3, 16, 16), [("resize_shorter", 20), ("center_crop", 16)],
                                           (0.4, 0.5, 0.6), (0.2, 0.25, 0.3))
    conv_model(tmp_path / "f.onnx", np.zeros((4, 3, 3, 3), np.float32), np.zeros(4, np.float32), record)
    reader = CalibrationReader(file_tensors(tmp_path / "f.onnx", Files(paths)), [4, 0, 2, 3, 1], "img", batch_size=2)
    got = list(reader)
    assert [sorted(b) for b in got] == [["img"]] * 3 and [len(b["img"]) for b in got] == [2, 2, 1]
    want = np.stack([deploy_preprocess.preprocess(paths[i], record) for i in [4, 0, 2, 3, 1]])
    np.testing.assert_array_equal(np.concatenate([b["img"] for b in got]), want)
    reader.set_range(1, 2)  # onnxruntime's strided calibration asks for one batch at a time
    np.testing.assert_array_equal(reader.get_next()["img"], want[2:4])
    assert reader.get_next() is None


def test_calibration_picks_a_fixed_draw_or_a_whole_split():
    train, val = Arrays(list(range(50))), Arrays(list(range(7)))
    images, idx, what = calibration_indices(20, train, val)
    assert images is train and len(set(idx)) == 20 and idx == sorted(idx) and max(idx) < 50
    assert calibration_indices(20, train, val)[1] == idx  # the same draw every export
    assert calibration_indices(500, train, val)[1] == list(range(50))
    assert calibration_indices("val", train, val)[:2] == (val, list(range(7)))
    assert "50" in calibration_indices("train", train, val)[2]


# ------------------------------------------------------------------ a one-layer model, exactly

def conv_model(path, w, b, record):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", w.shape[0], 8, 8])
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    graph = helper.make_graph([node], "one", [x], [y], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    model.metadata_props.add(key=META_PREPROCESS, value=json.dumps(record))
    model.metadata_props.add(key=META_CLASSES, value=json.dumps(["a", "b", "c", "d"]))
    onnx.save(model, str(path))


def qdq_params(model):
    """name -> (scale, zero point) of every QuantizeLinear/DequantizeLinear input, from the file."""
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    return {n.input[0]: (init[n.input[1]], init[n.input[2]] if len(n.input) > 2 else np.int8(0))
            for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")}, init


@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_int8_conv_is_exact_integer_arithmetic_within_a_step_of_float(tmp_path, per_channel, reduce_range):
    rs = np.random.RandomState(11)
    w = (rs.standard_normal((4, 3, 3, 3)) * np.array([0.05, 0.3, 1.0, 2.0]).reshape(4, 1, 1, 1)).astype(np.float32)
    b = rs.standard_normal(4).astype(np.float32)
    record = deploy_preprocess.make_record("x", (None, 3, 8, 8), [("resize_shorter", 8), ("center_crop", 8)],
                                           (0.5, 0.5, 0.5), (0.25, 0.25, 0.25))
    conv_model(tmp_path / "f.onnx", w, b, record)
    images = Arrays([rs.randint(0, 256, (8, 8, 3)).astype(np.uint8) for _ in range(12)])
    prep = Preprocess.from_json(record, "test")
    reader = CalibrationReader(lambda i: prep(images.image(i)), list(range(12)), "x", batch_size=4)
    model = quantize_onnx(tmp_path / "f.onnx", reader, QuantizeSpec(), reduce_range=reduce_range,
                          per_channel=per_channel, exclude=[])
    assert [n.op_type for n in model.graph.node].count("Conv") == 1
    params, init = qdq_params(model)
    sx, zx = params["x"]
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    wq_name, bq_name = [next(n.input[0] for n in model.graph.node if n.output[0] == i) for i in conv.input[1:]]
    wq, bq = init[wq_name], init[bq_name]
    sw, zw = params[wq_name]
    sb, _ = params[bq_name]
    assert wq.dtype == np.int8 and bq.dtype == np.int32 and zx.dtype == np.uint8
    assert np.asarray(sw).size == (4 if per_channel else 1)
    assert np.abs(wq).max() <= (64 if reduce_range else 127)  # 7-bit weights when reduced
    y_out = next(n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == conv.output[0])
    sy, zy = init[y_out.input[1]], init[y_out.input[2]]

    x = np.stack([prep(images.image(i)) for i in range(12)])  # inside the calibrated range
    xq = helpers.quantize_ref(x, sx, zx)
    acc = helpers.conv_integer_ref(xq, wq, zx, zw, pads=(1, 1, 1, 1))  # exact, int64
    real = (acc * (np.float64(sx) * helpers._along(np.float64(sw), 4, 1))
            + helpers._along(bq.astype(np.float64) * np.float64(sb), 4, 1))
    yq, real_steps = helpers.requantize_ref(real, 1.0 / np.float64(sy), zy)
    want = helpers.dequantize_ref(yq, sy, zy)

    # the file in onnxruntime's float kernels (QDQ as written) computes that integer arithmetic
    got = ort_session(model.SerializeToString(), "int8").run(None, {"x": x})[0]
    got_q = np.rint(got.astype(np.float64) / np.float64(sy)) + np.int64(zy)
    terms = 27
    slack = helpers.requantize_slack(helpers.conv_integer_ref(np.abs(xq.astype(np.int64) - np.int64(zx)),
                                                              np.abs(wq.astype(np.int64)), 0, 0, (1, 1, 1, 1))
                                     * np.float64(sx) * helpers._along(np.float64(sw), 4, 1) / np.float64(sy),
                                     1.0, terms, real_steps)
    helpers.assert_requantized(got_q, yq, real_steps, slack)

    # and that is the float layer to within the steps the rounding can cost
    y = sum(np.einsum("nchw,oc->nohw", np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))[:, :, i:i + 8, j:j + 8],
                      w[:, :, i, j].astype(np.float64)) for i in range(3) for j in range(3)) + b.reshape(1, 4, 1, 1)
    abs_x = np.abs(np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1))))
    w_err = helpers._along(np.float64(sw), 4, 0) / 2 * np.ones_like(w, np.float64)  # |w - dq(wq)| <= sw/2
    bound = (sum(np.einsum("nchw,oc->nohw", abs_x[:, :, i:i + 8, j:j + 8], w_err[:, :, i, j]) for i in range(3)
                 for j in range(3))  # weight rounding
             + np.float64(sx) / 2 * np.abs(w.astype(np.float64)).sum(axis=(1, 2, 3)).reshape(1, 4, 1, 1)  # input
             + np.float64(sx) / 2 * w_err.sum(axis=(1, 2, 3)).reshape(1, 4, 1, 1)
             + helpers._along(np.float64(sb), 4, 1) / 2 + np.float64(sy) / 2  # bias, output
             + 1e-5 * (1 + np.abs(y)))  # float32
    assert np.all(np.abs(want - y) <= bound), np.max(np.abs(want - y) / bound)
    assert np.mean(np.abs(want - y) <= np.float64(sy)) > 0.5, "most outputs within one output step"


def test_per_channel_auto_is_per_channel_and_counts_depthwise_convolutions():
    def model(groups):
        nodes, inits = [], []
        for k, g in enumerate(groups):
            w = np.zeros((8, 8 // g, 3, 3), np.float32)
            inits.append(numpy_helper.from_array(w, f"w{k}"))
            nodes.append(helper.make_node("Conv", [f"t{k}", f"w{k}"], [f"t{k + 1}"], group=g, name=f"c{k}"))
        return helper.make_model(helper.make_graph(nodes, "g", [], [], inits))

    assert per_channel_choice(model([1, 8, 1, 8]), "auto") == (True, "per-channel weights (auto; 2 of 4 "
                                                                     "convolutions depthwise)")
    assert "1 of 4" in per_channel_choice(model([1, 2, 1, 8]), "auto")[1]  # grouped is not depthwise
    assert per_channel_choice(model([1, 8]), False)[0] is False
    assert per_channel_choice(model([1, 8]), True)[0] is True


# ------------------------------------------------------------------ a run, through the CLI

def test_export_int8_writes_a_labelled_qdq_file_with_the_float_metadata_and_bench_compares(digits_run, capsys):
    d, run = digits_run
    code, out, err = helpers.run_cli(capsys, "export", str(run), "--int8", "--out", str(d / "good"), "--format", "onnx")
    assert code == 0, err
    assert "reduce_range" in out and "agreement" in out
    f, q = onnx.load(str(d / "good" / "t.onnx")), onnx.load(str(d / "good" / "t.int8.onnx"))
    assert any(n.op_type == "QuantizeLinear" for n in q.graph.node)
    assert not any(n.op_type == "QuantizeLinear" for n in f.graph.node)
    fm, qm = ({p.key: p.value for p in m.metadata_props} for m in (f, q))
    assert qm[META_CLASSES] == fm[META_CLASSES] and qm[META_PREPROCESS] == fm[META_PREPROCESS]
    report = json.loads(qm["gluontl.int8"])
    on_disk = json.loads((run / "t.int8.json").read_text())
    assert on_disk["verification"] == report["verification"]
    v = report["verification"]
    assert v["images"] == len(list((d / "digits" / "val").rglob("*.png")))
    assert abs(v["drop"] - 100 * (v["float"] - v["int8"])) < 1e-9
    assert report["reduce_range"] is cpu.reduce_range(cpu.cpu_flags())[0]

    code, out, err = helpers.run_cli(capsys, "bench", str(d / "good"), "--int8", "--batch", "1,2", "--repeat", "2")
    assert code == 0, err
    bench = json.loads((d / "good" / "bench.json").read_text())
    [entry] = bench["models"]
    assert [r["batch"] for r in entry["int8"]["runs"]] == [1, 2] and set(entry["speedup"]) == {"1", "2"}
    assert entry["float"]["bytes"] == (d / "good" / "t.onnx").stat().st_size
    assert "VNNI" in out and "t.int8.onnx" in out
    assert {r["threads"] for k in ("float", "int8") for r in entry[k]["runs"]} == {1}


def test_max_drop_refuses_a_black_calibration_image_and_keeps_the_float_file(digits_run, capsys):
    """``--format onnx --int8`` names the int8 ONNX file: refused, it is exit 2, but the float file
    (whose own check passed) is written and the refusal gives its numbers and what to try."""
    d, run = digits_run
    broken = d / "broken_digits"
    shutil.copytree(d / "digits", broken)
    for png in (broken / "train").rglob("*.png"):
        Image.new("RGB", (16, 16)).save(png)
    recipe = (run / "recipe.yaml").read_text()
    edited = yaml.safe_load(recipe)
    edited["data"]["source"] = f"folder:{broken}"
    edited["export"]["quantize"]["calibration"] = 1
    (run / "recipe.yaml").write_text(yaml.safe_dump(edited))
    before = sorted(p.name for p in run.iterdir())
    try:
        code, out, err = helpers.run_cli(capsys, "export", str(run), "--int8", "--out", str(d / "bad"),
                                         "--format", "onnx")
    finally:
        (run / "recipe.yaml").write_text(recipe)
    assert code == 2, err
    err = " ".join(err.split())
    assert "max_drop" in err and "not written" in err and "exclude" in err and "Traceback" not in err
    assert "1 training images" in err and "points" in err
    assert sorted(p.name for p in (d / "bad").iterdir()) == ["t.onnx"]  # no int8 file, no scratch folder
    assert f"exported {d / 'bad' / 't.onnx'} (verified)" in out
    assert sorted(p.name for p in run.iterdir()) == before  # no report of a refused file


def test_a_refused_int8_symbol_takes_nothing_else_down(digits_run, capsys, monkeypatch):
    """The README's case: the int8 ONNX file passes its verdict, the int8 symbol does not (here a
    judge that costs the second int8 model, the symbol, 1.12 points more than max_drop allows).
    The float files and the int8 ONNX file are written, the symbol is named with its numbers,
    and the export exits 0: int8 was asked for and one int8 model holds."""
    from gluontl.export import quantize

    d, run = digits_run
    calls, top1 = [], quantize.classification_metric

    def judge(float_out, int8_out, labels):
        v = top1(float_out, int8_out, labels)
        calls.append(v)
        if len(calls) == 2:  # onnxruntime's model is judged first, MXNet's second
            v = {**v, "drop": 5 + 1.12, "summary": "top-1 cost 6.12 points (by construction)"}
        return v

    monkeypatch.setattr(quantize, "classification_metric", judge)
    out_dir = d / "mixed"
    code, out, err = helpers.run_cli(capsys, "export", str(run), "--int8", "--out", str(out_dir))
    assert code == 0, err
    assert len(calls) == 2
    assert sorted(p.name for p in out_dir.iterdir()) == ["t-0000.params", "t-preprocess.json", "t-symbol.json",
                                                         "t.int8.onnx", "t.onnx"]
    err = " ".join(err.split())
    assert "refused (symbol int8" in err and "t-int8-symbol.json was not written" in err
    assert "6.12 points (by construction)" in err and "max_drop 5" in err and "Try" in err
    assert f"exported {out_dir / 't.int8.onnx'} (int8, checked on the validation split)" in out
    q = onnx.load(str(out_dir / "t.int8.onnx"))
    assert any(n.op_type == "QuantizeLinear" for n in q.graph.node)


def docs_int8_snippet():
    text = (helpers.REPO / "docs" / "export.md").read_text()
    section = text.split("\n## int8\n", 1)[1].split("\n## ", 1)[0]
    [block] = [b.split("\n", 1)[1] for b in section.split("```")[1::2] if b.startswith("python")]
    return block


def test_the_docs_int8_snippet_deploys_the_file_without_gluontl(digits_run, capsys, tmp_path):
    d, run = digits_run
    model = d / "docs" / "t.int8.onnx"
    if not model.is_file():
        code, _, err = helpers.run_cli(capsys, "export", str(run), "--int8", "--out", str(d / "docs"), "--format", "onnx")
        assert code == 0, err
    shutil.copy(model, tmp_path / "elpv.int8.onnx")
    shutil.copy(deploy_preprocess.__file__, tmp_path / "deploy_preprocess.py")
    # run as a script: Python puts its folder (with deploy_preprocess.py) on the path, as a user's would
    (tmp_path / "snippet.py").write_text(helpers.WITHOUT_GLUONTL + docs_int8_snippet())
    val = sorted((d / "digits" / "val").rglob("*.png"))
    answers = []
    for image in val[::40]:
        shutil.copy(image, tmp_path / "cell.png")
        done = subprocess.run([sys.executable, "snippet.py"], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        answers.append(done.stdout.strip())
    # the reference: gluontl's own preprocessing of each image into the same file, in the session
    # the int8 verification uses
    session = deploy_session(model)
    record = json.loads(session.get_modelmeta().custom_metadata_map[META_PREPROCESS])
    classes = json.loads(session.get_modelmeta().custom_metadata_map[META_CLASSES])
    want = [classes[int(np.argmax(session.run(None, {record["input"]["name"]: gluontl.preprocess(str(i), model)[None]})[0][0]))]
            for i in val[::40]]
    assert answers == want
    assert len(set(want)) > 1, "more than one class answered: the snippet's output is not a constant"


def test_bench_pairs_files_and_refuses_a_missing_int8_partner(tmp_path, capsys):
    record = deploy_preprocess.make_record("x", (None, 3, 8, 8), [("resize_shorter", 8)], (0, 0, 0), (1, 1, 1))
    conv_model(tmp_path / "m.onnx", np.ones((4, 3, 3, 3), np.float32), np.zeros(4, np.float32), record)
    code, out, err = helpers.run_cli(capsys, "bench", str(tmp_path), "--int8")
    assert code == 2 and "no int8 partner" in " ".join(err.split()) and "--int8" in err  # wrapped at any path length
    assert not (tmp_path / "bench.json").exists()
    code, out, err = helpers.run_cli(capsys, "bench", str(tmp_path / "m.onnx"), "--batch", "3", "--repeat", "2",
                                     "--json", str(tmp_path / "b.json"))
    assert code == 0, err
    [entry] = json.loads((tmp_path / "b.json").read_text())["models"]
    assert set(entry) == {"float"} and [r["batch"] for r in entry["float"]["runs"]] == [3]
    code, _, err = helpers.run_cli(capsys, "bench", str(tmp_path / "m.onnx"), "--batch", "0")
    assert code == 2 and "batch sizes >= 1" in err


def test_int8_needs_a_run_folder(tmp_path, capsys):
    record = deploy_preprocess.make_record("x", (None, 3, 8, 8), [("resize_shorter", 8)], (0, 0, 0), (1, 1, 1))
    conv_model(tmp_path / "m.onnx", np.ones((4, 3, 3, 3), np.float32), np.zeros(4, np.float32), record)
    code, _, err = helpers.run_cli(capsys, "export", str(tmp_path / "m.onnx"), "--int8", "--out", str(tmp_path / "o"))
    assert code == 2 and "not a run folder" in " ".join(err.split())
    assert not (tmp_path / "o").exists()


def test_a_missing_ml_dtypes_is_a_clear_error():
    import importlib.metadata

    if any(r.startswith("ml_dtypes") for r in importlib.metadata.requires("onnx") or []):
        pytest.skip("this onnx (>= 1.18, Python 3.13's) requires ml_dtypes itself: it cannot be missing "
                    "where onnx imports, and without it `import onnx` fails before gluontl runs")
    script = r'''
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "ml_dtypes":
            raise ImportError("No module named 'ml_dtypes'")
sys.meta_path.insert(0, Refuse())
from gluontl.errors import ExportError
try:
    import gluontl.export.quantize
except ExportError as e:
    print(e)
'''
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "ml_dtypes" in done.stdout and "setup.cfg" in done.stdout


def _clock(durations_ms):
    """A clock whose successive start/stop readings make the given call durations (warm-up calls untimed)."""
    readings, t = [], 0.0
    for d in durations_ms:
        readings += [t, t + d / 1000]
        t += 1.0
    it = iter(readings)
    return lambda: next(it)


def test_bench_repeats_until_the_spread_is_small_or_says_it_is_noisy():
    from gluontl.export.bench import MAX_ROUNDS, time_runs

    steady = time_runs(lambda: None, 10, clock=_clock([10.0 + 0.01 * i for i in range(10)]))
    assert steady["runs"] == 10 and steady["steady"] and steady["median_ms"] == pytest.approx(10.045)
    # a noisy first round (one in five runs slowed 20x), then a quiet machine: rounds are added until it settles
    noisy_then_quiet = [200.0 if i % 5 == 0 else 10.0 for i in range(10)] + [10.0] * 40
    settled = time_runs(lambda: None, 10, clock=_clock(noisy_then_quiet))
    assert settled["steady"] and 10 < settled["runs"] <= 50 and settled["p90_ms"] == pytest.approx(10.0)
    # noisy throughout: MAX_ROUNDS rounds, then marked so (p10-p90 as numpy computes it)
    loud = [200.0 if i % 3 == 0 else 10.0 for i in range(10 * MAX_ROUNDS)]
    stats = time_runs(lambda: None, 10, clock=_clock(loud))
    assert stats["runs"] == 10 * MAX_ROUNDS and not stats["steady"]
    assert stats["p90_ms"] == pytest.approx(np.percentile(loud, 90)) and stats["p10_ms"] == pytest.approx(10.0)


def test_bench_table_prints_the_spread_and_no_speed_up_from_noisy_figures():
    from gluontl.export.bench import table

    def row(file, ms, steady):
        return {"file": file, "batch": 1, "median_ms": ms, "p10_ms": ms * 0.9, "p90_ms": ms * (1.05 if steady else 3),
                "spread": 0.15 if steady else 2.1, "runs": 20 if steady else 100, "steady": steady,
                "images_per_s": 1000 / ms, "threads": 1}

    report = {"cpu": {"described": "x86-64"}, "onnxruntime": "1", "threads": 1, "repeat": 20, "warmup": 3,
              "max_spread": 0.1, "max_rounds": 5,
              "models": [{"float": {"file": "m.onnx", "bytes": 4, "runs": [row("m.onnx", 120.0, True)]},
                          "int8": {"file": "m.int8.onnx", "bytes": 1, "runs": [row("m.int8.onnx", 2.0, False)]},
                          "speedup": {"1": 60.0}, "speedup_steady": {"1": False}, "size_ratio": 4.0}]}
    text = table(report)
    assert "each on 1 thread(s)" in text and "108.00-126.00" in text and "15 %" in text
    assert "? (60.00x, noisy)" in text and "60.00x " not in text.replace("? (60.00x", "")
    assert "too noisy to tell: m.int8.onnx batch 1" in text
