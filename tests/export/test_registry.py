"""The exporter registry is open: a format registered here, by one module-level call and nothing in
gluontl, exports through the CLI and the task exporters like gluontl's own; tasks add only their
graph finisher (a segmenter's arg-max), which reaches the new format once."""
import tempfile
from pathlib import Path

import mxnet as mx
import numpy as np
import onnx

from gluontl.atomic import write_text
from gluontl.errors import ExportError
from gluontl.export import registry
from gluontl.export.artifacts import Artifact
from gluontl.segment.export import export_segmenter
from tests import helpers


def _write_text(job: registry.ExportJob, result) -> None:
    """The task's verified ONNX graph, printed (a toy stand-in for a runtime's own format)."""
    with tempfile.TemporaryDirectory(dir=job.out) as scratch:
        model = onnx.load(str(job.graph.write_onnx(Path(scratch), True)))
    path = write_text(job.out / f"{job.name}.onnx.txt", onnx.helper.printable_graph(model.graph), ExportError)
    result.add(Artifact("onnxtext", "float", (path,), "the verified ONNX graph, printed"))


TOY = registry.register(registry.ExportFormat("onnxtext", "NAME.onnx.txt", "the verified ONNX graph, printed",
                                              None, "onnx", _write_text))


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
