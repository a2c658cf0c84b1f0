"""The exporter registry is open: a format registered here, by one module-level call and nothing in
gluontl, exports through the CLI and the task exporters like gluontl's own; tasks add only their
graph finisher (a segmenter's arg-max), which reaches the new format once. Its int8 step is part
of the same line: a toy one is run by the int8 export, and a format without one is refused by
name with the formats that have one."""
import json
import tempfile
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx
import pytest

from gluontl.atomic import write_text
from gluontl.errors import ExportError
from gluontl.export import registry
from gluontl.export.artifacts import Artifact
from gluontl.segment.export import export_segmenter
from tests import helpers


def _text_writer(fmt: str):
    def write(job: registry.ExportJob, result) -> None:
        """The task's verified ONNX graph, printed (a toy stand-in for a runtime's own format)."""
        with tempfile.TemporaryDirectory(dir=job.out) as scratch:
            model = onnx.load(str(job.graph.write_onnx(Path(scratch), True)))
        path = write_text(job.out / f"{job.name}.onnx.txt", onnx.helper.printable_graph(model.graph), ExportError)
        result.add(Artifact(fmt, "float", (path,), "the verified ONNX graph, printed"))
    return write


def _int8_text(job: registry.Int8Job, float_file: Artifact) -> registry.Int8Made:
    """A toy int8 step: the float file's text and the calibration the export drew for it."""
    _, indices, what = job.calibration
    path = job.scratch / f"{job.name}.int8.onnx.txt"
    path.write_text(float_file.path.read_text() + f"# int8, calibrated on {what}: {indices}\n")
    report = {"verification": {"summary": "toy"}}
    return registry.Int8Made(Artifact("onnxtext8", "int8", (path,), "toy int8"), float_file.path, "toy.int8.json",
                             report)


def _refuse(job: registry.Int8Job, float_file: Artifact) -> registry.Int8Made:
    raise ExportError(f"The toy int8 of {float_file.path.name} was not written: by construction.")


TOY = registry.register(registry.ExportFormat("onnxtext", "NAME.onnx.txt", "the verified ONNX graph, printed",
                                              None, "onnx", _text_writer("onnxtext")))
# one line each, with an int8 step: one that writes a checkable file, one that refuses
TOY8 = registry.register(registry.ExportFormat("onnxtext8", "NAME.onnx.txt", "the verified ONNX graph, printed",
                                               registry.Int8Step("toy", lambda name: (f"{name}.int8.onnx.txt",),
                                                                 _int8_text), "onnx", _text_writer("onnxtext8")))
TOYNO = registry.register(registry.ExportFormat("onnxtextno", "NAME.onnx.txt", "the verified ONNX graph, printed",
                                                registry.Int8Step("refuses", make=_refuse), "onnx",
                                                _text_writer("onnxtextno")))


def test_a_format_registered_outside_gluontl_exports_through_the_cli(tmp_path, capsys):
    prefix = helpers.tiny_symbol(tmp_path)
    model = ["export", f"symbol:{prefix}", "--input-shape", "3,16,16"]
    code, out, err = helpers.run_cli(capsys, *model, "--format", "onnxtext", "--out", str(tmp_path / "t"))
    assert code == 0, err
    assert out.splitlines() == [f"exported {tmp_path / 't' / 'tiny.onnx.txt'} (the verified ONNX graph, printed)"]
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["tiny.onnx.txt"]  # the ONNX made in scratch only
    # the reference: gluontl's own onnx format of the same model, printed by onnx itself
    code, _, err = helpers.run_cli(capsys, *model, "--format", "onnx", "--out", str(tmp_path / "o"))
    assert code == 0, err
    want = onnx.helper.printable_graph(onnx.load(str(tmp_path / "o" / "tiny.onnx")).graph)
    assert (tmp_path / "t" / "tiny.onnx.txt").read_text() == want
    # a format without an int8 engine: --int8 is one paragraph naming those that have one, nothing written
    code, out, err = helpers.run_cli(capsys, *model, "--format", "onnxtext", "--int8", "--out", str(tmp_path / "q"))
    helpers.assert_one_paragraph(code, out, err, ["--int8", "onnxtext has no int8 export", "onnx", "openvino"])
    assert not (tmp_path / "q").exists()
    # which formats have int8 is the registry's data: the toy one registered with an int8 step is named
    use = " ".join(err.split()).split("; use ", 1)[1]
    assert sorted(use.rstrip(".").split(", ")) == ["onnx", "onnxtext8", "onnxtextno", "openvino", "symbol"]


def test_a_task_finisher_reaches_a_registered_format_once(tmp_path):
    """export_segmenter names no format: the toy one gets the segmenter's logits + arg-max graph."""
    with mx.name.NameManager():
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Conv2D(3, 1))  # a per-pixel classifier: (N, 3, H, W) logits at the input's size
    net.initialize(mx.init.Xavier())
    sample = np.random.default_rng(0).normal(size=(2, 3, 8, 8)).astype(np.float32)
    written = export_segmenter(net, tmp_path, "seg", (3, 8, 8), formats=["onnxtext"], sample=sample)
    [artifact] = written.artifacts
    assert (artifact.format, artifact.precision, artifact.files) == ("onnxtext", "float", (tmp_path / "seg.onnx.txt",))
    text = artifact.path.read_text()
    assert text.count("= ArgMax[") == 1 and text.splitlines()[-2].strip() == "return %logits, %mask"  # the finisher, once, and its output


class _Images:
    """Decoded images by index (quantize.Images); the toy int8 step reads only how many there are."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def image(self, index: int) -> np.ndarray:
        return np.full((8, 8, 3), index, np.uint8)


def _tiny_classifier():
    with mx.name.NameManager():
        net = mx.gluon.nn.HybridSequential()
        net.add(mx.gluon.nn.Conv2D(4, 3), mx.gluon.nn.Flatten(), mx.gluon.nn.Dense(2))
    net.initialize(mx.init.Xavier())
    return net


def test_an_int8_step_registered_with_its_format_is_run_and_a_refusal_keeps_the_float_file(tmp_path):
    """export_with_int8 names no format: the toy's int8 step gets the calibration it draws and its
    file lands beside the float one with its report in the run folder; a toy whose step refuses
    keeps its float file, and the refusal names the format and says why."""
    from gluontl.export.exporters import export_block
    from gluontl.export.quantize import classification_metric, export_with_int8
    from gluontl.recipe import QuantizeSpec

    net = _tiny_classifier()

    def float_of(fmt):
        return lambda folder: export_block(net, folder, "tiny", {"data": (1, 3, 8, 8)}, formats=[fmt])

    train, val = _Images(10), _Images(4)
    spec = QuantizeSpec(calibration=3)
    (tmp_path / "run").mkdir()
    written = export_with_int8(float_of("onnxtext8"), tmp_path / "out", "tiny", spec, train, val, [0, 1, 0, 1],
                               classification_metric, report_dir=tmp_path / "run")
    assert [(a.format, a.precision) for a in written.artifacts] == [("onnxtext8", "float"), ("onnxtext8", "int8")]
    assert not written.refused
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["tiny.int8.onnx.txt", "tiny.onnx.txt"]  # no scratch left
    drawn = sorted(np.random.default_rng(0).permutation(10)[:3].tolist())  # three of ten, the fixed draw
    assert (out / "tiny.int8.onnx.txt").read_text() == (
        (out / "tiny.onnx.txt").read_text() + f"# int8, calibrated on 3 training images (a fixed draw of 10): {drawn}\n")
    report = json.loads((tmp_path / "run" / "toy.int8.json").read_text())
    assert report["file"] == str(out / "tiny.int8.onnx.txt") and report["verification"] == {"summary": "toy"}
    assert report["int8_bytes"] == (out / "tiny.int8.onnx.txt").stat().st_size
    assert report["float_bytes"] == (out / "tiny.onnx.txt").stat().st_size

    refused = export_with_int8(float_of("onnxtextno"), tmp_path / "no", "tiny", spec, train, val, [0, 1, 0, 1],
                               classification_metric)
    assert [(a.format, a.precision) for a in refused.artifacts] == [("onnxtextno", "float")]
    assert [(r.format, r.precision) for r in refused.refused] == [("onnxtextno", "int8")]
    assert sorted(p.name for p in (tmp_path / "no").iterdir()) == ["tiny.onnx.txt"]
    assert "The toy int8 of tiny.onnx.txt was not written: by construction." in str(refused.failure())

    # a format without an int8 step: int8 has nothing to quantize, one paragraph naming those that have one
    with pytest.raises(ExportError, match="add one of ") as err:
        export_with_int8(float_of("onnxtext"), tmp_path / "none", "tiny", spec, train, val, [0, 1, 0, 1],
                         classification_metric)
    named = str(err.value).split("add one of ", 1)[1].split(" to export.formats")[0]
    assert sorted(named.split(", ")) == ["onnx", "onnxtext8", "onnxtextno", "openvino", "symbol"]
    assert not (tmp_path / "none").exists()


def test_a_registered_format_is_a_recipe_export_format_and_an_unknown_one_is_named(tmp_path):
    """The recipe schema reads the registry's names: the toy formats registered above need no schema
    edit; an unknown one is a recipe error naming the key, the value and the registered names."""
    from gluontl.errors import RecipeError
    from gluontl.recipe import parse_recipe

    recipe = helpers.tiny_recipe(helpers.tiny_symbol(tmp_path))
    assert parse_recipe({**recipe, "export": {"formats": ["onnx", "onnxtext8"]}}).export.formats == ["onnx",
                                                                                                       "onnxtext8"]
    with pytest.raises(RecipeError) as err:
        parse_recipe({**recipe, "export": {"formats": ["onnx", "onnxtxt"]}})
    text = " ".join(str(err.value).split())
    assert "'export.formats'" in text and "'onnxtxt' is no export format" in text
    named = text.split("the registered formats are ", 1)[1].split(" (got", 1)[0]
    assert sorted(named.split(", ")) == ["onnx", "onnxtext", "onnxtext8", "onnxtextno", "openvino", "symbol"]
