"""gluontl.npcompat: numpy's removed names come back for mxnet, and nothing numpy has is touched.

The imports run in a fresh interpreter (this one imported the module in conftest.py); on the
pinned numpy (1.23, which still has every name) the module must change nothing, on numpy 2 add
exactly what is missing.
"""
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import gluontl.npcompat as c

ROOT = Path(__file__).resolve().parents[1]
NUMPY_2 = np.lib.NumpyVersion(np.__version__) >= "2.0.0"

# numpy's namespace before and after the import, compared object by object
PROBE = """
import json, sys, warnings
import numpy
{prepare}
names = {names!r}
def has(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            getattr(numpy, name)
            return True
        except AttributeError:
            return False
missing = [n for n in names if not has(n)]
before = dict(vars(numpy))
tostring = getattr(numpy.ndarray, "tostring", None)
meta_path = list(sys.meta_path)
import gluontl.npcompat as c
after = vars(numpy)
json.dump({{
    "missing": missing, "added": list(c.ADDED), "new_keys": sorted(set(after) - set(before)),
    "changed": sorted(k for k in before if after.get(k, None) is not before[k]),
    "bool_is_bool_": numpy.bool is numpy.bool_,
    "ndarray_tostring_same": getattr(numpy.ndarray, "tostring", None) is tostring,
    "new_finders": [type(f).__name__ for f in sys.meta_path if f not in meta_path],
}}, sys.stdout)
"""


def _run(code: str, **env) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                          env={**os.environ, **env}).stdout


def _probe(prepare: str = "") -> dict:
    return json.loads(_run(PROBE.format(prepare=prepare, names=list(c._replacements()))))


def test_only_missing_names_are_added_and_numpys_own_attributes_are_untouched():
    r = _probe()
    assert r["changed"] == []  # every attribute numpy had is the same object afterwards
    assert r["added"] == r["missing"] and r["new_keys"] == sorted(r["missing"])
    assert r["ndarray_tostring_same"]  # ndarray itself is never patched
    if np.lib.NumpyVersion(np.__version__) < "1.24.0":
        assert r["missing"] == [] and r["new_finders"] == []  # numpy 1.23: nothing defined, nothing patched
    if NUMPY_2:
        assert {"int", "float", "PZERO", "NaN", "Inf", "alltrue", "sometrue", "product", "compat"} <= set(r["added"])
        assert "bool" not in r["added"]  # numpy 2 has np.bool again (its bool_)


def test_an_alias_numpy_has_is_left_as_numpy_has_it():
    """A name numpy defines, by whatever meaning, is never replaced."""
    r = _probe("numpy.bool = numpy.bool_; numpy.Inf = 7.0")
    assert "bool" not in r["added"] and "Inf" not in r["added"]
    assert r["bool_is_bool_"] and r["changed"] == []


def test_each_definition_means_what_numpy_1_meant():
    """Checked on the functions themselves, so on every numpy (numpy 1.23 defines all of them)."""
    d = c._replacements()
    assert d["int"] is int and d["float"] is float and d["object"] is object and d["compat"].basestring is str
    assert d["PZERO"] == 0.0 and math.copysign(1, d["NZERO"]) == -1 and d["PINF"] == d["Inf"] == math.inf
    assert d["NINF"] == -math.inf and math.isnan(d["NAN"]) and math.isnan(d["NaN"])
    x = np.array([[3, 1, 2], [0, 5, 4]])
    assert d["alltrue"](x > 0) is np.False_ and d["sometrue"](x > 4) is np.True_
    assert d["product"](x, axis=1).tolist() == [6, 0] and d["round_"](np.array([1.26]), 1).tolist() == [1.3]
    assert d["msort"](x).tolist() == [[0, 1, 2], [3, 5, 4]] and x.tolist() == [[3, 1, 2], [0, 5, 4]]
    assert d["in1d"](x, [1, 4, 9]).tolist() == [False, True, False, False, False, True]
    assert d["in1d"](x, [1, 4], invert=True).sum() == 4
    if "trapz" in d:
        assert d["trapz"]([1.0, 2.0, 4.0]) == 4.5 and d["trapz"]([1.0, 2.0], dx=2.0) == 3.0
    with pytest.raises(RuntimeError, match="numpy_financial.npv"):
        d["npv"](0.1, [1, 2])
    # mxnet registers its operators by numpy function identity: an alias is a function of its own
    assert d["product"] is not np.prod and d["sometrue"] is not np.any


def test_mxnet_code_that_reads_np_bool_runs():
    """mxnet 1.9.1 reads ``np.bool`` when it assigns through a boolean mask and when it fills
    with a bool (numpy >= 1.24 raises AttributeError there without the alias)."""
    x = np.random.RandomState(24).rand(5, 3).astype(np.float32)
    mask = x[:, 0] > 0.5
    assert 0 < mask.sum() < len(mask)
    got = mx.np.array(x)
    got[mx.np.array(mask)] = 0
    want = x.copy()
    want[mask] = 0
    assert np.array_equal(got.asnumpy(), want)
    filled = mx.np.full((2,), True)
    assert filled.dtype == np.bool_ and filled.asnumpy().tolist() == [True, True]


def test_mx_np_pad_reads_np_compat():
    """``mx.np.pad`` checks ``isinstance(mode, np.compat.basestring)`` (numpy 2 has no np.compat)."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = mx.np.pad(mx.np.array(x), ((1, 0), (0, 2)), mode="constant")
    assert np.array_equal(got.asnumpy(), np.pad(x, ((1, 0), (0, 2)), mode="constant"))


def test_recordio_pack_and_pack_img_write_mxnets_bytes():
    """``pack``/``pack_img`` call ``ndarray.tostring`` (gone in numpy 2.3): the patched ones (or
    mxnet's own where numpy has it) write the header struct, the float32 label bytes and the image."""
    label = [1.5, -2.0, 7.0]
    header = mx.recordio.IRHeader(0, label, 42, 0)
    want = np.array([3], "<u4").tobytes() + np.array([0], "<f4").tobytes() + np.array([42, 0], "<u8").tobytes()
    want += np.array(label, "<f4").tobytes() + b"payload"
    assert mx.recordio.pack(header, b"payload") == want
    assert c._pack(header, b"payload") == want
    scalar = mx.recordio.pack(mx.recordio.IRHeader(0, 3.0, 1, 0), b"x")
    assert mx.recordio.unpack(scalar)[0].label == 3.0 and mx.recordio.unpack(scalar)[1] == b"x"
    img = np.random.RandomState(3).randint(0, 256, (5, 4, 3), dtype=np.uint8)
    for pack_img in (mx.recordio.pack_img, c._pack_img):
        h, got = mx.recordio.unpack_img(pack_img(header, img, quality=3, img_fmt=".png"))
        assert np.array_equal(got, img) and h.label.tolist() == label and h.id == 42
    assert (mx.recordio.pack is c._pack) == c.NEEDS_TOBYTES


IMPORT_ORDER = """
import sys
{first}
import numpy
print(numpy.__version__, "gluontl.npcompat" in sys.modules, hasattr(numpy, "PZERO"))
"""


@pytest.mark.parametrize("first", ["import mxnet", "import gluoncv", "import mxnet, gluoncv, gluontl"])
def test_the_startup_hook_makes_the_import_order_irrelevant(tmp_path, first):
    """``gluontl-npcompat.pth`` (installed with gluontl into site-packages) imports npcompat before
    the first ``import mxnet`` or ``import gluoncv``; here its site dir is a temporary one, so the
    test does not depend on how this venv was installed."""
    shutil.copy(ROOT / "gluontl-npcompat.pth", tmp_path)
    code = f"import site; site.addsitedir({str(tmp_path)!r})\n" + IMPORT_ORDER.format(first=first)
    version, loaded, has_pzero = _run(code, PYTHONPATH=str(ROOT)).split()
    assert loaded == "True" and has_pzero == "True"


def test_without_the_hook_mxnet_first_fails_only_where_numpy_lacks_the_names():
    """Why the hook exists: from numpy 1.24 on (np.bool), and on numpy 2 (np.PZERO), ``import mxnet``
    alone dies at import; on 1.23 it works."""
    code = "import sys; sys.meta_path = [f for f in sys.meta_path if getattr(f, '__name__', None) != 'NpcompatFirst']\n"
    proc = subprocess.run([sys.executable, "-c", code + "import mxnet"], capture_output=True, text=True, timeout=300)
    assert (proc.returncode != 0) == (np.lib.NumpyVersion(np.__version__) >= "1.24.0")


def test_the_rebuilt_onnx_mapping_agrees_with_onnxs_own():
    """``onnx.mapping`` (gone in onnx 1.19) is rebuilt from ``onnx.helper``; where onnx still has
    it (1.17, Python 3.11/3.12) every entry of onnx's own table is in the rebuilt one."""
    import types

    import onnx
    from onnx import TensorProto

    rebuilt = types.ModuleType("onnx")
    saved = sys.modules.pop("onnx.mapping", None)
    try:
        c.patch_onnx(rebuilt)
    finally:
        if saved is not None:
            sys.modules["onnx.mapping"] = saved
    to_tensor, to_np = rebuilt.mapping.NP_TYPE_TO_TENSOR_TYPE, rebuilt.mapping.TENSOR_TYPE_TO_NP_TYPE
    for dtype, code in [("float32", TensorProto.FLOAT), ("float16", TensorProto.FLOAT16), ("int64", TensorProto.INT64),
                        ("uint8", TensorProto.UINT8), ("bool", TensorProto.BOOL), ("float64", TensorProto.DOUBLE)]:
        assert to_tensor[np.dtype(dtype)] == code and to_np[code] == np.dtype(dtype)
    if saved is not None:
        assert saved.NP_TYPE_TO_TENSOR_TYPE.items() <= to_tensor.items()
        assert saved.TENSOR_TYPE_TO_NP_TYPE.items() <= to_np.items()
    from onnx import mapping  # the real one, or the rebuilt one where onnx has none
    assert mapping.NP_TYPE_TO_TENSOR_TYPE[np.dtype("float32")] == TensorProto.FLOAT and onnx.mapping is mapping
