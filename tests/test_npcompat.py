"""gluontl.npcompat: numpy's removed aliases come back for mxnet, and nothing numpy has is touched.

The imports run in a fresh interpreter (this one imported the module in conftest.py); on the
pinned numpy (1.23, which still has the aliases) the module must change nothing, on 1.26 add
exactly the six builtins.
"""
import json
import subprocess
import sys

import mxnet as mx
import numpy as np

SIX = ("bool", "int", "float", "complex", "object", "str")

# numpy's namespace before and after the import, compared object by object
PROBE = """
import builtins, json, sys, warnings
import numpy
{prepare}
def has(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            getattr(numpy, name)
            return True
        except AttributeError:
            return False
missing = [n for n in {six!r} if not has(n)]
before = dict(vars(numpy))
import gluontl.npcompat as c
after = vars(numpy)
json.dump({{
    "missing": missing, "added": list(c.ADDED), "new_keys": sorted(set(after) - set(before)),
    "changed": sorted(k for k in before if after.get(k, None) is not before[k]),
    "builtins": [n for n in c.ADDED if after[n] is getattr(builtins, n)],
    "bool_is_bool_": numpy.bool is numpy.bool_,
}}, sys.stdout)
"""


def _probe(prepare: str = "") -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE.format(prepare=prepare, six=SIX)],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return json.loads(out)


def test_only_missing_aliases_are_added_and_numpys_own_attributes_are_untouched():
    r = _probe()
    assert r["changed"] == []  # every attribute numpy had is the same object afterwards
    assert r["added"] == r["missing"]
    assert r["new_keys"] == sorted(r["missing"])
    assert r["builtins"] == r["missing"]  # np.int is int again, as before numpy 1.24
    if np.lib.NumpyVersion(np.__version__) < "1.24.0":
        assert r["missing"] == []
    else:
        assert r["missing"] == list(SIX)


def test_an_alias_numpy_has_is_left_as_numpy_has_it():
    """numpy 2 has ``np.bool`` again, as its own bool_ type: a name numpy defines, by whatever
    meaning, is never replaced by the builtin."""
    r = _probe("numpy.bool = numpy.bool_")
    assert "bool" not in r["missing"] and "bool" not in r["added"]
    assert r["bool_is_bool_"] and r["changed"] == []


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
