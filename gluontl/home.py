"""``$GLUONTL_HOME``: one folder for what gluontl makes once (demo datasets, converted models,
pretrains), read by the recipe schema and by the modules that write there, below both."""
from __future__ import annotations

import os
from pathlib import Path


def gluontl_home() -> Path:
    """Where gluontl keeps what it makes once: demo datasets, converted models."""
    return Path(os.environ.get("GLUONTL_HOME") or "~/.cache/gluontl").expanduser()
