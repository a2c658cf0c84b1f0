"""Masks against hostile files (issue 36): a decompression bomb used as a mask is an input error
naming the file (exit 2 through finetune; on main an internal error, exit 1), and the mask reader
fuzzed (tests/fuzzing.py) with mutations of a real palette mask gluontl writes."""
from __future__ import annotations

import io

from tests import helpers
import numpy as np
import pytest
import yaml
from hypothesis import given
from PIL import Image

from tests.fuzzing import bomb_png, fuzz, fuzz_settings, mutated
from gluontl.errors import DataError
from gluontl.segment.formats import mask_image, read_mask, write_mask


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return bomb_png()


def test_a_mask_that_is_a_decompression_bomb_is_a_data_error_naming_it(tmp_path, bomb):
    path = tmp_path / "masks" / "s00.png"
    path.parent.mkdir()
    path.write_bytes(bomb)
    with pytest.raises(DataError, match="pixels") as e:
        read_mask(path, 3)
    assert str(path) in str(e.value)


def test_finetune_on_a_bomb_mask_exits_2_naming_it(tmp_path, capsys, bomb):
    """As a user meets it: a segmentation run whose masks/ holds the bomb."""
    rng = np.random.default_rng(0)
    for sub in ("images", "masks"):
        (tmp_path / "pairs" / sub).mkdir(parents=True)
    for k in range(6):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3)).astype(np.uint8)).save(tmp_path / "pairs" / "images" / f"s{k}.png")
        write_mask(tmp_path / "pairs" / "masks" / f"s{k}.png", rng.integers(0, 3, (32, 32)).astype(np.uint8))
    (tmp_path / "pairs" / "masks" / "s3.png").write_bytes(bomb)
    recipe = {"name": "seg", "task": "segmentation",
              "model": {"source": f"symbol:{helpers.tiny_symbol(tmp_path)}", "input_shape": [3, 32, 32]},
              "segmentation": {"head_channels": 8},
              "data": {"source": f"masks:{tmp_path / 'pairs'}", "classes": ["a", "b", "c"], "batch_size": 2},
              "train": {"epochs": 1, "guards": "off"}, "export": {"formats": []}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    code, out, err = helpers.run_cli(capsys, "finetune", "--recipe", str(tmp_path / "r.yaml"), "--runs",
                                     str(tmp_path / "runs"), "-q")
    assert code == 2, err
    assert str(tmp_path / "pairs" / "masks" / "s3.png") in " ".join(err.split()) and "pixels" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_predict_on_a_bomb_image_exits_2_naming_it(tmp_path, capsys, bomb):
    """predict refused it on main already; the same door now serves images and masks."""
    (tmp_path / "bomb.png").write_bytes(bomb)
    (tmp_path / "run").mkdir()
    code, out, err = helpers.run_cli(capsys, "predict", str(tmp_path / "run"), str(tmp_path / "bomb.png"))
    assert code == 2 and str(tmp_path / "bomb.png") in " ".join(err.split()) and "pixels" in err, err


def _mask_png() -> bytes:
    buf = io.BytesIO()
    mask = np.zeros((12, 16), np.uint8)
    mask[2:8, 3:9], mask[-1] = 1, 255
    mask_image(mask).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.fuzz
@fuzz_settings(40)
@given(mutated(_mask_png(), (b"IHDR\x00\x00\xff\xff\x00\x00\xff\xff", b"PLTE", b"IEND")))
def test_fuzz_mask(tmp_path_factory, data):
    fuzz("mask", tmp_path_factory.getbasetemp(), {"mask.png": data})
