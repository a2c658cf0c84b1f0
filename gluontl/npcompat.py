"""The numpy type aliases mxnet 1.9.1 still uses, put back where numpy removed them.

numpy 1.24 removed ``np.bool``, ``np.int``, ``np.float``, ``np.complex``, ``np.object`` and ``np.str``
(aliases of the builtins, deprecated since 1.20). mxnet 1.9.1 reads ``np.bool`` at import
(``mxnet/numpy/utils.py``) and at run time (assignment through a boolean mask, ``mx.np.full`` of a
bool), GluonCV 0.10.5's COCO metric and R-CNN anchors read ``np.float``; and numpy 1.26 is the
first with Python 3.12 wheels. So gluontl imports this module before anything imports mxnet
(first thing in ``gluontl/__init__.py``; tests and ``dist.launch``'s server processes import it
by name).

Only a name numpy does not have is defined, as the builtin it stood for before 1.24: numpy 1.23
still has all six (deprecated), and this module then changes nothing. ``np.long`` and ``np.unicode``,
also removed in 1.24, are left out: nothing gluontl runs uses them.
"""
from __future__ import annotations

import builtins
import warnings

import numpy

REMOVED_IN_1_24 = ("bool", "int", "float", "complex", "object", "str")


def _define_missing() -> tuple[str, ...]:
    with warnings.catch_warnings():  # numpy < 1.24 warns that an alias is deprecated when it is read
        warnings.simplefilter("ignore")
        missing = [name for name in REMOVED_IN_1_24 if not hasattr(numpy, name)]
    for name in missing:
        setattr(numpy, name, getattr(builtins, name))
    return tuple(missing)


ADDED = _define_missing()
"""The aliases this process got from here; empty where numpy still has them."""
