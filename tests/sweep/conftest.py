import pytest

pytest.importorskip("optuna", reason="gluontl sweep needs Optuna: pip install -e .[sweep]")
