"""Hostile recipes: any YAML value yields a Recipe or one RecipeError — nothing else."""
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gluontl.errors import RecipeError
from gluontl.recipe import Recipe, load_recipe, parse_recipe

KEYS = ["name", "model", "source", "rules", "match", "grad_req", "lr_mult", "bn", "train", "epochs", "lr",
        "data", "batch_size", "surgery", "head", "classes", "export", "opset", "stage", "type", "weights",
        "restore", "expect_missing", "ctx", "schedule", "kind", "bogus"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(string.printable, max_size=12),
                    st.sampled_from(["zoo:resnet18_v1", "write", "null", "frozen", "cpu", "demo:digits", "*"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(KEYS), inner, max_size=5)), max_leaves=25)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=8))
def test_any_mapping_gives_recipe_or_recipe_error(data):
    try:
        r = parse_recipe(data, origin="fuzz.yaml")
    except RecipeError as e:
        assert str(e).startswith("fuzz.yaml: ")
    else:
        assert isinstance(r, Recipe)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(max_size=200))
def test_any_text_file_gives_recipe_or_recipe_error(tmp_path_factory, text):
    p = tmp_path_factory.mktemp("fz") / "r.yaml"
    p.write_text(text, encoding="utf-8")
    try:
        load_recipe(p)
    except RecipeError as e:
        assert str(p) in str(e)


@pytest.mark.parametrize("text, needle", [
    ("a: &a [1, 2]\nb: *a\n", "aliases"),
    ("name: t\nmodel: {source: 'zoo:x'}\ntrain: {epochs: 100000000000000000000000}\n", None),
    ("name: t\nmodel: {source: 'zoo:x'}\ntrain: {lr: .nan}\n", "train.lr"),
    ("!!python/object/apply:os.system ['echo hacked']\n", "not valid YAML"),
    ("name: t\n" + "x: " + "[" * 200 + "]" * 200 + "\n", None),
])
def test_hostile_yaml(tmp_path, text, needle):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    with pytest.raises(RecipeError) as e:
        load_recipe(p)
    if needle:
        assert needle in str(e.value)


def test_oversized_recipe_file(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text("name: t\n# " + "x" * (2 << 20) + "\n")
    with pytest.raises(RecipeError, match="bytes"):
        load_recipe(p)
