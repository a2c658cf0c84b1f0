"""Fixtures shared by the training-loop tests."""
import pytest

from tests import helpers


@pytest.fixture(scope="module")
def tiny_symbol(tmp_path_factory):
    """The prefix of ``helpers.tiny_symbol``'s net (deep), written once per test module."""
    return helpers.tiny_symbol(tmp_path_factory.mktemp("tiny"))
