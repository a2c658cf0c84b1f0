import numpy as np
from opcheck import check


def test_relu():
    x = np.random.RandomState(0).randn(2, 3, 4).astype("f")
    check("Relu", {"x": x}, grad=True)
