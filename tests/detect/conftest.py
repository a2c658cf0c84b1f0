import pytest
from tests.helpers import voc_subset


@pytest.fixture(scope="module")
def small_voc(tmp_path_factory):
    """24 train / 24 val images of the demo's digits 0-4 task."""
    return voc_subset(tmp_path_factory.mktemp("voc"), 24, 24)
