"""The tiny recipe and space the sweep tests share: tiny_symbol's net on digits 5-9, two cut points."""
import yaml

from tests import helpers

CUT1 = [{"match": "conv0*", "grad_req": "null"}]  # prefix ends after conv0's pool
CUT2 = [{"match": ["conv0*", "conv1*"], "grad_req": "null"}]  # deeper: after conv1's pool
SPACE = {"train.lr": {"log_uniform": [1e-3, 0.3]}, "rules": {"choice": [CUT1, CUT2]}}


def recipe(prefix, epochs=3, **train):
    return helpers.tiny_recipe(prefix, rules=CUT1, epochs=epochs, lr=0.05, seed=0, export=[], **train)


def write(tmp_path, data, name):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path
