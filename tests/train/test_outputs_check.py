"""A model trained without a new head must output one score per data class, checked before any run folder exists."""
import pytest
from tests import helpers

from gluontl.errors import TrainError
from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune


def _recipe(**model):
    return parse_recipe({"name": "t", "model": {"input_shape": [3, 16, 16], **model},
                         "data": helpers.DIGITS_5_9, "train": {"epochs": 1, "guards": "off"}})


def test_a_1000_way_zoo_model_on_5_classes_without_a_head_is_refused_up_front(tmp_path):
    with pytest.raises(TrainError, match=r"output has shape \(1, 1000\).*5 classes.*surgery\.head: \{classes: 5\}"):
        finetune(_recipe(source="zoo:mobilenetv2_0.25"), runs_root=tmp_path, quiet=True)
    assert not (tmp_path / "t").exists()


def test_a_model_whose_output_fits_the_classes_trains(tmp_path):
    res = finetune(_recipe(source="zoo:mobilenetv2_0.25", kwargs={"classes": 5}), runs_root=tmp_path, quiet=True)
    assert res.last_epoch["epoch"] == 1
