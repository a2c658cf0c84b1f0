import random
import zlib

import gluontl.npcompat  # noqa: F401  (numpy >= 1.24 lacks the aliases mxnet imports)
import mxnet as mx
import numpy as np
import pytest

from tests import helpers


def pytest_configure(config):
    """pytest-randomly shuffles the order; the seeds are the fixture's below (it would reseed
    from the order's seed before each test body), so a test's data never depends on the order."""
    if hasattr(config.option, "randomly_reset_seed"):
        config.option.randomly_reset_seed = False


@pytest.fixture(autouse=True)
def _independent_of_order(request):
    """Each test starts from the same global state whatever ran before it (pytest-randomly
    shuffles the order): Python's, numpy's and MXNet's global RNGs seeded from the test's
    id, and Gluon's block-name counters (``dense0_``, ``conv3_``) restarted."""
    seed = zlib.crc32(request.node.nodeid.encode())
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed & 0x7FFFFFFF)
    with mx.name.NameManager():
        yield


@pytest.fixture(scope="module")
def resnet_weights(tmp_path_factory):
    """``helpers.resnet18_weights``' params file (a stand-in pretrained backbone), once per module."""
    return helpers.resnet18_weights(tmp_path_factory.mktemp("w") / "resnet.params")
