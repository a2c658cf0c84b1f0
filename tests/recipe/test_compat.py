"""Recipes from older gluontl: schema_version and one migration per change (gluontl/recipe/compat.py).

The stored recipes in old/ are real ones: recipes/ files as git history had them just before each
change (``before-COMMIT-NAME.yaml``, from ``git show COMMIT^:recipes/NAME.yaml``) and the
recipe.yaml of a run main (7a6ec71) wrote (its checkpoints recorded the resume digest
c04c865bf5195a7f). old/digests.json holds their digests as main's code computed them
(``PYTHONPATH=/work/main python scripts/recipe_digests.py``): the reference is the old code, not this.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gluontl.errors import RecipeError
from gluontl.recipe import SCHEMA_VERSION, load_recipe, parse_recipe
from gluontl.recipe import compat
from gluontl.train.loop import _resume_digest

OLD = Path(__file__).parent / "old"
MAIN = {k: v for k, v in json.loads((OLD / "digests.json").read_text()).items() if not k.startswith("_")}
# each change and the stored recipes from before it that its migration keeps
BEFORE = {2: ["before-de45187-resnet18_freeze.yaml", "before-c247d34-per_type.yaml"],
          3: ["before-de45187-resnet18_freeze.yaml", "before-1a99bf7-mobilenetv2_accumulate.yaml"],
          4: ["before-c247d34-per_type.yaml", "before-a80b625-resnet18_last_stage.yaml",
              "before-a80b625-onnx_resnet_cut.yaml"],
          5: ["before-a80b625-resnet18_last_stage.yaml", "before-d06fb41-segment_digits.yaml"],
          6: ["before-de45187-resnet18_freeze.yaml", "run-7a6ec71-elpv_efficientnet_lite0.yaml"],
          7: ["before-de45187-resnet18_freeze.yaml", "before-d06fb41-segment_digits.yaml"],
          8: ["before-d06fb41-segment_digits.yaml", "run-7a6ec71-elpv_efficientnet_lite0.yaml"],
          9: ["run-7a6ec71-elpv_efficientnet_lite0.yaml", "before-d06fb41-segment_digits.yaml"]}


def _digests(name: str) -> dict[str, str]:
    r = load_recipe(OLD / name)
    return {"digest": r.digest(), "resume": _resume_digest(r), "data cache": r.digest("model", "surgery", "data")}


@pytest.mark.parametrize("name", sorted(MAIN))
def test_an_old_recipe_hashes_as_main_hashed_it(name):
    assert _digests(name) == MAIN[name]


def test_the_old_run_resumes_by_the_digest_its_checkpoints_recorded():
    recorded = "c04c865bf5195a7f"  # checkpoints/last.json and best.json of that run, written by main's training
    assert _resume_digest(load_recipe(OLD / "run-7a6ec71-elpv_efficientnet_lite0.yaml")) == recorded


def test_every_change_is_listed_once_with_a_stored_recipe_from_before_it():
    assert [c.version for c in compat.CHANGES] == list(range(2, SCHEMA_VERSION + 1)) == sorted(BEFORE)


@pytest.mark.parametrize("version, name", [(v, n) for v, names in BEFORE.items() for n in names])
def test_each_migration_is_what_keeps_an_old_recipes_digest(version, name, monkeypatch):
    """Without change ``version``'s migration, a recipe from before it hashes differently."""
    assert _digests(name)["digest"] == MAIN[name]["digest"]
    monkeypatch.setattr(compat, "CHANGES", tuple(c for c in compat.CHANGES if c.version != version))
    assert load_recipe(OLD / name).digest() != MAIN[name]["digest"]


def test_a_recipe_without_schema_version_is_version_1_and_read_as_the_current_one(tmp_path):
    r = load_recipe(OLD / "before-de45187-resnet18_freeze.yaml")
    assert r.schema_version == SCHEMA_VERSION
    written = r.as_written()
    assert written["schema_version"] == SCHEMA_VERSION and next(iter(written)) == "schema_version"
    again = parse_recipe(written)
    assert again == r and again.digest() == r.digest() == MAIN["before-de45187-resnet18_freeze.yaml"]["digest"]
    assert parse_recipe({**written, "schema_version": 1}) == r


@pytest.mark.parametrize("version, words", [
    (SCHEMA_VERSION + 1, f"newer than this gluontl's ({SCHEMA_VERSION})"),
    (0, "not a schema version"), ("2", "not a schema version"), (True, "not a schema version")])
def test_a_schema_version_this_gluontl_does_not_know_is_one_paragraph(version, words):
    data = {"schema_version": version, "name": "t", "model": {"source": "zoo:resnet18_v1"}}
    with pytest.raises(RecipeError) as e:
        parse_recipe(data, origin="r.yaml")
    msg = str(e.value)
    assert msg.startswith("r.yaml: invalid recipe: ") and words in msg and "schema_version" in msg, msg
    assert "\n" not in msg and "Traceback" not in msg


def test_the_digest_form_of_version_1_is_that_of_the_one_rule_model():
    """A plain rule and a preset hash with every key the one Rule model had (unset: null), the keys
    added at version 4 only when set."""
    r = parse_recipe({"name": "t", "model": {"source": "zoo:resnet18_v1"},
                      "rules": [{"preset": "layer_decay", "rate": 0.5}, {"match": "a*", "lr_mult": 2}]})
    rules = compat.digest_form(r.model_dump(mode="json"))["rules"]
    assert rules[0] == {"match": None, "type": None, "stage": None, "grad_req": None, "lr_mult": None,
                        "wd_mult": None, "bn": None, "optional": False, "from_epoch": 0, "preset": "layer_decay",
                        "until_stage": None, "note": None, "rate": 0.5}
    assert rules[1] == {"match": ["a*"], "type": None, "stage": None, "grad_req": None, "lr_mult": 2.0,
                        "wd_mult": None, "bn": None, "optional": False, "from_epoch": 0, "preset": None,
                        "until_stage": None, "note": None}
