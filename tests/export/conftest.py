"""Fixtures shared by the export tests."""
import shutil

import pytest

from gluontl.data.datasets import load_split
from gluontl.recipe import DataSpec, parse_recipe
from gluontl.train.loop import finetune
from tests import helpers


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """A tiny conv net trained on a private copy of the digits 5-9 (its images get edited)."""
    d = tmp_path_factory.mktemp("int8run")
    spec = DataSpec(**helpers.DIGITS_5_9)
    for split in ("train", "val"):
        ds = load_split(spec, split, check=False)
        for i in range(len(ds)):
            target = d / "digits" / split / ds.class_names[ds.labels[i]] / f"{i}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ds.name(i), target)
    prefix = helpers.tiny_symbol(d)
    recipe = helpers.tiny_recipe(prefix, data={"source": f"folder:{d / 'digits'}"}, epochs=8, lr=0.01,
                                 optimizer="adam", seed=0)
    r = parse_recipe({**recipe, "export": {"formats": ["onnx"], "quantize": {"max_drop": 5}}})
    return d, finetune(r, runs_root=d / "runs", quiet=True).run_dir
