"""train.mixup with a focal or class-weighted train.loss is refused by name (mixup's soft targets train
with plain cross-entropy, which would silently drop the chosen loss)."""
import pytest

from gluontl.errors import RecipeError
from gluontl.recipe import parse_recipe
from tests.helpers import tiny_recipe


@pytest.mark.parametrize("loss", [{"kind": "focal"}, {"class_weights": "balanced"}])
def test_mixup_with_a_focal_or_weighted_loss_is_refused(loss):
    data = tiny_recipe("/nonexistent/model", mixup={"mixup_alpha": 0.4}, loss=loss)
    with pytest.raises(RecipeError, match=r"train\.mixup.*train\.loss"):
        parse_recipe(data)


def test_mixup_with_plain_cross_entropy_parses():
    data = tiny_recipe("/nonexistent/model", mixup={"mixup_alpha": 0.4}, loss={"kind": "cross_entropy"})
    assert parse_recipe(data).train.mixup.mixup_alpha == 0.4
