"""The Gluon DataLoader's private fields (MXNet 1.9.1, pinned)."""
from __future__ import annotations

from typing import Any

from mxnet.gluon.data import DataLoader


def loader_dataset(loader: DataLoader) -> Any:
    """The dataset a DataLoader reads (Gluon keeps it as ``_dataset`` and offers no public getter)."""
    return loader._dataset
