"""`grad_req: null` unquoted is YAML's "no value": refused, never silently read as "not set"."""
import mxnet as mx
import pytest
import yaml
from tests import helpers

from gluontl.errors import RecipeError
from gluontl.recipe import Rule, load_recipe, parse_recipe
from gluontl.rules import make_plan

GOOD = {"name": "t", "model": {"source": "zoo:mobilenetv2_0.25", "input_shape": [3, 16, 16]},
        "rules": [{"match": "*", "grad_req": "null"}, {"type": "BatchNorm", "bn": "frozen"}],
        "data": helpers.DIGITS_5_9}


def test_unquoted_null_next_to_another_setting_is_refused(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: t\nmodel: {source: 'zoo:mobilenetv2_0.25', input_shape: [3, 32, 32]}\n"
                    "rules:\n  - {match: '*', grad_req: null, bn: frozen}\n"
                    "data: {source: 'demo:digits'}\n")
    with pytest.raises(RecipeError, match=r"r\.yaml: rules\.1\.grad_req is empty.*grad_req: \"null\" \(quoted\)"):
        load_recipe(path)
    assert parse_recipe(GOOD).rules[0].grad_req == "null"  # quoted: the mode


def test_rules_as_python_objects_round_trip_with_grad_req_unset():
    """In Python, None is "not set" (what Rule.model_dump writes), never refused."""
    rule = Rule(match="a.*", lr_mult=0.1)
    assert Rule.model_validate(rule.model_dump()) == rule
    plan = make_plan(mx.gluon.nn.Dense(2, in_units=3), [{"match": "*", "grad_req": None, "lr_mult": 2}])
    assert {r.grad_req for r in plan.rows} == {"write"} and {r.lr_mult for r in plan.rows} == {2}


def test_a_run_folder_written_before_unset_fields_were_dropped_still_loads(tmp_path):
    recipe = parse_recipe(GOOD)
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False))
    assert "grad_req: null" in (run / "recipe.yaml").read_text()  # the old layout: rule 2 says null for "not set"
    again = load_recipe(run / "recipe.yaml")
    assert again.rules[1].grad_req is None and again.rules[0].grad_req == "null"
    assert again.differences(recipe) == []
    (run / "elsewhere.yaml").write_text((run / "recipe.yaml").read_text())
    with pytest.raises(RecipeError, match="quoted"):  # outside a run folder the same text is a user's recipe
        load_recipe(run / "elsewhere.yaml")


def test_on_off_yes_no_stay_words_where_a_field_takes_words(tmp_path):
    """YAML 1.1 reads off/on/yes/no as booleans; recipes read them as YAML 1.2 does (words), and
    boolean fields still take them."""
    path = tmp_path / "r.yaml"
    path.write_text("name: t\nmodel: {source: 'zoo:mobilenetv2_0.25', input_shape: [3, 32, 32]}\n"
                    "data: {source: 'demo:digits', train_transform: {resize: 32, flip: yes}}\n"
                    "train: {cache_features: off, guards: off, hybridize: no}\n")
    r = load_recipe(path)
    assert r.train.cache_features == "off" and r.train.hybridize is False
    assert set(r.train.guards.model_dump().values()) == {"off"}
    assert r.data.train_transform.flip is True
    again = load_recipe(path, ["train.guards=warn", "train.cache_features=on", "train.hybridize=true"])
    assert set(again.train.guards.model_dump().values()) == {"warn"}
    assert again.train.cache_features == "on" and again.train.hybridize is True
