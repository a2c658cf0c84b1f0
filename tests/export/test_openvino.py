"""OpenVINO IR exports (gluontl.export.openvino_ir): the float IR against the run's own MXNet
network on its validation images, its runtime info against the ONNX metadata, predict on the IR
folder against predict on the ONNX file, the int8 IR's verdict, and the bad inputs. The tests
that run OpenVINO skip when it is not installed (it is the optional [openvino] extra; CI installs
it with the [test] extra; NNCF, for the int8 IR, it does not); the ones about its absence run
everywhere."""
import json
import subprocess
import sys

import mxnet as mx
import numpy as np
import onnx
import pytest

from tests import helpers
from gluontl.data.transforms import META_CLASSES, META_PREPROCESS, load_image, load_preprocess

try:
    import openvino  # noqa: F401
    HAVE_OPENVINO = True
except ImportError:
    HAVE_OPENVINO = False
try:
    import nncf  # noqa: F401
    HAVE_NNCF = True
except ImportError:
    HAVE_NNCF = False
needs_openvino = pytest.mark.skipif(not HAVE_OPENVINO, reason="OpenVINO is not installed (pip install "
                                    "'gluontl[openvino]'); the IR tests need it")


@pytest.fixture(scope="module")
def exported(digits_run, tmp_path_factory):
    """The run exported as ONNX and as OpenVINO IR, through the CLI."""
    d, run = digits_run
    out = tmp_path_factory.mktemp("ir")
    for fmt in ("onnx", "openvino"):
        code, printed, err = helpers.run_cli(_NoCapsys(), "export", str(run), "--format", fmt, "--out", str(out))
        # the run's recipe quantizes: without NNCF the int8 IR is refused (exit 2), the float IR written
        assert code == 0 or (fmt == "openvino" and not HAVE_NNCF), err
    return d, run, out, printed


class _NoCapsys:
    """run_cli's capsys for a module fixture: the output is read from pytest's capture instead."""

    def readouterr(self):
        class Out:
            out = err = ""
        return Out()


@needs_openvino
def test_the_float_ir_reproduces_the_runs_mxnet_network_and_carries_the_onnx_metadata(exported):
    from gluontl.train.runs import load_run
    from openvino import Core

    d, run, out, _ = exported
    xml, bin_ = out / "t-openvino" / "t.xml", out / "t-openvino" / "t.bin"
    assert xml.is_file() and bin_.is_file()
    model = Core().read_model(str(xml))
    info = model.get_rt_info()
    meta = {p.key: p.value for p in onnx.load(str(out / "t.onnx")).metadata_props}
    assert {k: info[k].astype(str) for k in (META_CLASSES, META_PREPROCESS)} == {k: meta[k] for k in (META_CLASSES,
                                                                                           META_PREPROCESS)}
    # float32 weights (save_model halves them to float16 unless told not to)
    assert not any(op.get_type_name() == "Convert" and str(op.get_output_element_type(0)) == "<Type: 'float32'>"
                   and str(op.input_value(0).get_element_type()) == "<Type: 'float16'>" for op in model.get_ops())
    # the reference: the run's MXNet network on val images through the recorded preprocessing
    recipe, net = load_run(run, "best")
    prep, _ = load_preprocess(json.loads(meta[META_PREPROCESS]))
    images = sorted((d / "digits" / "val").rglob("*.png"))[::12]
    x = np.stack([prep(load_image(p)) for p in images]).astype(np.float32)
    want = net(mx.nd.array(x)).asnumpy()
    compiled = Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    got = compiled(x)[compiled.output(0)]
    assert np.abs(got - want).max() <= 1e-4 * (want.max() - want.min())  # the acceptance bound, of the range
    assert (got.argmax(1) == want.argmax(1)).all()


@needs_openvino
def test_predict_on_the_ir_folder_answers_as_on_the_onnx_file(exported, capsys):
    d, run, out, _ = exported
    images = [str(p) for p in sorted((d / "digits" / "val").rglob("*.png"))[::30]]
    answers = []
    for model in (out / "t.onnx", out / "t-openvino"):
        code, printed, err = helpers.run_cli(capsys, "predict", str(model), *images, "--json")
        assert code == 0, err
        answers.append(json.loads(printed))
    (onnx_rows, ir_rows) = answers
    assert [[n for n, _ in r["top"]] for r in onnx_rows] == [[n for n, _ in r["top"]] for r in ir_rows]
    np.testing.assert_allclose([[p for _, p in r["top"]] for r in ir_rows],
                               [[p for _, p in r["top"]] for r in onnx_rows], atol=1e-5)


@needs_openvino
def test_an_ir_folder_without_its_bin_is_one_paragraph(exported, capsys, tmp_path):
    d, run, out, _ = exported
    broken = tmp_path / "t-openvino"
    broken.mkdir()
    (broken / "t.xml").write_bytes((out / "t-openvino" / "t.xml").read_bytes())
    image = str(next((d / "digits" / "val").rglob("*.png")))
    code, printed, err = helpers.run_cli(capsys, "predict", str(broken), image)
    helpers.assert_one_paragraph(code, printed, err, ["t.bin", "copy the whole folder"])


def test_bench_on_an_ir_folder_without_its_bin_is_one_paragraph(capsys, tmp_path):
    """A folder of files (the .xml alone, as a partial copy leaves it): one paragraph naming the
    missing weights before anything is timed (it was an internal error), OpenVINO or not."""
    (tmp_path / "t-openvino").mkdir()
    (tmp_path / "t-openvino" / "t.xml").write_text("<net/>")
    for target in (tmp_path, tmp_path / "t-openvino"):
        code, printed, err = helpers.run_cli(capsys, "bench", str(target))
        helpers.assert_one_paragraph(code, printed, err, ["t.bin", "copy the whole folder"])


@needs_openvino
@pytest.mark.skipif(not HAVE_NNCF, reason="NNCF is not installed (the [openvino-int8] extra; CI runs it in the numpy 2 pass)")
def test_int8_ir_is_written_only_with_its_verdict(digits_run, capsys, tmp_path):
    """NNCF's int8 IR, calibrated on the run's images: written with its numbers within max_drop
    (the run's 5 points), and refused, float IR kept and exit 2, with max_drop below what it loses."""
    from openvino import Core

    d, run = digits_run
    code, printed, err = helpers.run_cli(capsys, "export", str(run), "--format", "openvino", "--int8", "--out",
                                         str(tmp_path / "a"))
    if code == 0:
        xml = tmp_path / "a" / "t.int8-openvino" / "t.int8.xml"
        ops = {op.get_type_name() for op in Core().read_model(str(xml)).get_ops()}
        assert "FakeQuantize" in ops
        report = json.loads(Core().read_model(str(xml)).get_rt_info()["gluontl.int8"].astype(str))
        assert report["verification"]["drop"] <= 5 and "OpenVINO NNCF" in printed
    else:
        assert "max_drop 5" in " ".join(err.split())
    assert (tmp_path / "a" / "t-openvino" / "t.xml").is_file()  # the float IR whatever the int8 verdict


def test_an_unknown_format_is_one_paragraph(digits_run, capsys):
    d, run = digits_run
    code, out, err = helpers.run_cli(capsys, "export", str(run), "--format", "tflite", "--out", str(d / "x"))
    helpers.assert_one_paragraph(code, out, err, ["--format", "tflite", "openvino"])
    assert not (d / "x").exists()


def test_openvino_not_installed_is_one_paragraph_before_any_work(digits_run, tmp_path):
    """In a Python where ``import openvino`` fails (a finder refusing it, as a venv without the
    extra), the export names the extra and writes nothing."""
    d, run = digits_run
    code = ("import sys, importlib.abc\n"
            "class Block(importlib.abc.MetaPathFinder):\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'openvino' or name.startswith('openvino.'):\n"
            "            raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from gluontl.cli import main\n"
            f"sys.argv = ['gluontl', 'export', {str(run)!r}, '--format', 'openvino', '--out', {str(tmp_path / 'o')!r}]\n"
            "main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=helpers.REPO,
                          timeout=300)
    assert done.returncode == 2, done.stderr
    err = " ".join(done.stderr.split())
    assert "gluontl[openvino]" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@needs_openvino
def test_bench_times_the_ir_beside_the_onnx_file_and_gives_the_ratio_to_it(exported, capsys):
    """The run's export folder (ONNX and IR, float and int8: the run's recipe quantizes): every IR
    timed in OpenVINO, paired with its int8 IR, and each row's speed against the float ONNX file in
    onnxruntime; the float ONNX row's own ratio is 1 by definition."""
    d, run, out, _ = exported
    code, printed, err = helpers.run_cli(capsys, "bench", str(out), *["--int8"] * HAVE_NNCF, "--batch", "1,2",
                                         "--repeat", "2", "--json", str(d / "b.json"))
    assert code == 0, err
    report = json.loads((d / "b.json").read_text())
    by_file = {e["float"]["file"]: e for e in report["models"]}
    ir = by_file[str(out / "t-openvino" / "t.xml")]
    if HAVE_NNCF:
        assert ir["int8"]["file"] == str(out / "t.int8-openvino" / "t.int8.xml")
    assert ir["float"]["bytes"] == sum((out / "t-openvino" / f).stat().st_size for f in ("t.xml", "t.bin"))
    onnx_entry = by_file[str(out / "t.onnx")]
    for f, o in zip(ir["float"]["runs"], onnx_entry["float"]["runs"]):
        assert f["batch"] == o["batch"] and abs(f["vs_onnx"] - o["median_ms"] / f["median_ms"]) < 1e-12
    assert all(r["vs_onnx"] == 1.0 for r in onnx_entry["float"]["runs"])
    assert "OpenVINO" in printed and "vs float ONNX" in printed and report["openvino"].startswith("2026.4")
