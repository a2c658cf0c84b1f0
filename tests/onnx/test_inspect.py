"""inspect_onnx: a description that works even for models import would refuse."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from gluontl.errors import OnnxImportError
from gluontl.onnx import format_report, import_model, inspect_onnx
from test_importer import make_model, node, weights_model


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
