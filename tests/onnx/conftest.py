"""Fixtures of the ONNX tests."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from gluontl.errors import OnnxImportError
from gluontl.onnx import import_model
from tests.helpers import run_cli


@pytest.fixture
def refused_twice(tmp_path, capsys) -> Callable:
    """``refused_twice(make)``: ``make(folder)`` writes ``m.onnx``; import refuses it and ``gluontl
    inspect`` exits 2 with one error paragraph naming the file, not a traceback. Returns ``(path,
    the import's error, inspect's stdout, its stderr as one line)`` for the case's own words."""
    def refused(make: Callable[[Path], object]) -> tuple[str, OnnxImportError, str, str]:
        d = tmp_path / "model"
        d.mkdir()
        make(d)
        path = str(d / "m.onnx")
        with pytest.raises(OnnxImportError) as error:  # plan, finetune and export go through import
            import_model(path)
        code, out, err = run_cli(capsys, "inspect", path)
        assert code == 2, out  # main (a460f11) printed the report of a negative-dims file and exited 0
        flat = " ".join(err.split())
        assert err.startswith("error: ") and "Traceback" not in err and path in flat
        return path, error.value, out, flat
    return refused
