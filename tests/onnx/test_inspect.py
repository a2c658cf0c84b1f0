"""inspect_onnx: a description that works even for models import would refuse."""
from __future__ import annotations

import mxnet as mx
import numpy as np
import onnx
import pytest

from gluontl.errors import OnnxImportError
from gluontl.onnx import format_report, import_model, inspect_onnx
from tests.helpers import run_cli
from tests.onnx.test_importer import make_model, node, weights_model


def test_report_describes_a_supported_model(tmp_path):
    model = weights_model()
    model.producer_name, model.producer_version = "pytorch", "2.1"
    onnx.save(model, str(tmp_path / "w.onnx"))
    r = inspect_onnx(tmp_path / "w.onnx")
    assert r.inputs == [("x", ("N", 3, 6, 6), "float")] and r.outputs[0][0] == "y"
    assert r.opsets == {"ai.onnx": 17} and r.producer == "pytorch 2.1"
    assert {(o.op_type, o.count) for o in r.ops} == {("Conv", 1), ("Constant", 2), ("Mul", 1),
                                                     ("Add", 1), ("Relu", 1)}
    assert not r.unsupported
    assert r.parameter_count == 4 * 3 * 3 * 3 + 4 + 4 + 1  # conv weight, bias, scale, eps
    assert ("c", "Conv", "c") in r.cut_points
    text = format_report(r)
    assert "parameters: 117" in text and "UNSUPPORTED" not in text and "pytorch 2.1" in text


def test_report_lists_unsupported_ops_where_import_fails(tmp_path):
    nodes = [node("Relu", ["x"], ["a"]), node("FancyOp", ["a"], ["y"], domain="com.acme")]
    onnx.save(make_model(nodes, [("x", [1, 4])], [("y", None)], extra_opsets=[("com.acme", 1)]),
              str(tmp_path / "u.onnx"))
    with pytest.raises(OnnxImportError):
        import_model(str(tmp_path / "u.onnx"))
    r = inspect_onnx(str(tmp_path / "u.onnx"))
    assert [(o.domain, o.op_type) for o in r.unsupported] == [("com.acme", "FancyOp")]
    assert "FancyOp [com.acme] x1  UNSUPPORTED" in format_report(r)


def test_inspect_missing_file_is_import_error(tmp_path):
    with pytest.raises(OnnxImportError, match="does not exist"):
        inspect_onnx(tmp_path / "nope.onnx")


def test_inspect_works_when_external_data_is_missing(tmp_path):
    onnx.save(weights_model(), str(tmp_path / "w.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="w.data", size_threshold=0)
    (tmp_path / "w.data").unlink()
    with pytest.raises(OnnxImportError, match="external data file 'w.data'.*missing"):
        import_model(str(tmp_path / "w.onnx"))
    assert inspect_onnx(tmp_path / "w.onnx").parameter_count == 4 * 3 * 3 * 3 + 4 + 4 + 1


def test_ops_imported_by_rewriting_count_as_supported(tmp_path):
    nodes = [node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             node("MatMulInteger", ["xq", "w", "xz"], ["y"])]
    model = make_model(nodes, [("x", [1, 4])], [("y", None)], {"w": np.ones((4, 2), np.uint8)})
    onnx.save(model, str(tmp_path / "q.onnx"))
    assert not inspect_onnx(tmp_path / "q.onnx").unsupported


# ------------------------------------------------------------- graphs import refuses: inspect says why


def _cycle(d):
    nodes = [node("Relu", ["x"], ["y"]), node("Relu", ["a"], ["b"]), node("Relu", ["b"], ["a"])]
    onnx.save(make_model(nodes, [("x", [1, 4])], [("y", [1, 4])]), str(d / "m.onnx"))


def _dangling(d):
    onnx.save(make_model([node("MatMul", ["x", "w"], ["y"])], [("x", [1, 4])], [("y", [1, 2])]), str(d / "m.onnx"))


def _outside(d):
    """Initializer data saved next to the model, then moved to the parent folder and pointed at there."""
    model = make_model([node("MatMul", ["x", "w"], ["y"])], [("x", [1, 4])], [("y", [1, 2])],
                       {"w": np.ones((4, 2), np.float32)})
    onnx.save(model, str(d / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location="w.data", size_threshold=0)
    (d / "w.data").rename(d.parent / "w.data")
    model = onnx.load(str(d / "m.onnx"), load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = "../w.data"
    onnx.save(model, str(d / "m.onnx"))


def _unproduced_output(d):
    onnx.save(make_model([node("Relu", ["x"], ["a"])], [("x", [1, 4])], [("y", [1, 4])]), str(d / "m.onnx"))


def _no_inputs(d):
    nodes = [node("Constant", [], ["y"], value=onnx.numpy_helper.from_array(np.ones((1, 4), np.float32)))]
    onnx.save(make_model(nodes, [], [("y", [1, 4])]), str(d / "m.onnx"))


def _unsupported(d):
    onnx.save(make_model([node("Foo", ["x"], ["y"])], [("x", [1, 4])], [("y", [1, 4])]), str(d / "m.onnx"))


BROKEN = {"cycle": (_cycle, ["cycle through nodes ['b', 'a']"]),
          "unproduced output": (_unproduced_output, ["graph output 'y' is not a graph input"]),
          "no inputs": (_no_inputs, ["has no graph inputs"]),
          "unsupported op": (_unsupported, ["cannot convert: Foo (ai.onnx, 1 node, e.g. 'y')"]),
          "dangling": (_dangling, ["input 'w' of MatMul node 'y'", "dangling input"]),
          "outside": (_outside, ["initializer 'w'", "'../w.data' outside the model's folder"])}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_inspect_names_what_import_refuses_and_exits_2(case, refused_twice):
    make, words = BROKEN[case]
    path, refused, out, flat = refused_twice(make)
    lines = out.splitlines()
    assert lines[0] == "problems (1, import refuses the model):" and lines[1].strip() == str(refused)
    assert f"ONNX model {path}" in out and "cut points" in out  # the report is still there
    for w in words:
        assert w in lines[1] and w in flat


def test_checker_findings_are_shown_but_do_not_refuse_what_imports(tmp_path, capsys):
    """Nodes out of file order break the ONNX spec (the checker says so) but import sorts them."""
    nodes = [node("Relu", ["a"], ["y"]), node("Neg", ["x"], ["a"])]
    onnx.save(make_model(nodes, [("x", [1, 4])], [("y", [1, 4])]), str(tmp_path / "m.onnx"))
    x = np.array([[-2.0, -0.5, 0.5, 2.0]], np.float32)
    np.testing.assert_array_equal(import_model(str(tmp_path / "m.onnx"))(mx.nd.array(x)).asnumpy(),
                                  np.maximum(-x, 0))
    code, out, err = run_cli(capsys, "inspect", str(tmp_path / "m.onnx"))
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.startswith("onnx.checker: ") and "topologically sorted" in first
    assert "problems" not in out


def test_an_op_without_converter_that_folds_is_no_problem(tmp_path, capsys):
    """NonZero has no converter, but on an initializer it folds at import: inspect agrees with import."""
    c = np.array([0.0, 2.0, 0.0, 3.0], np.float32)
    nodes = [node("NonZero", ["c"], ["nz"]), node("Cast", ["nz"], ["f"], to=onnx.TensorProto.FLOAT),
             node("Add", ["x", "f"], ["y"])]
    onnx.save(make_model(nodes, [("x", [1, 2])], [("y", [1, 2])], {"c": c}), str(tmp_path / "m.onnx"))
    x = np.array([[10.0, 20.0]], np.float32)
    np.testing.assert_array_equal(import_model(str(tmp_path / "m.onnx"))(mx.nd.array(x)).asnumpy(),
                                  x + np.array([[1.0, 3.0]], np.float32))
    code, out, err = run_cli(capsys, "inspect", str(tmp_path / "m.onnx"))
    assert code == 0, err
    assert "problems" not in out and "UNSUPPORTED" not in out and "0 unsupported" in out
