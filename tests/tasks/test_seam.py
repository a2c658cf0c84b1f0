"""The task seam over a run's whole life (issue 20): the run-folder code and the CLI never name a
task, every registered task implements the whole protocol, a finished run's files say which task
reads them, and what a received run folder says is checked."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from gluontl.errors import GluontlError, RestoreError
from gluontl.recipe import TASK_SCHEMAS, parse_recipe
from gluontl.tasks import TASKS, Task, task_named
from tests.helpers import REPO

PACKAGE = REPO / "gluontl"


@pytest.mark.parametrize("module", ["train/runs.py", "cli.py", "train/loop.py", "api.py"])
def test_generic_code_names_no_task(module):
    """No string constant equal to a task's name: what differs is asked of the task."""
    tree = ast.parse((PACKAGE / module).read_text())
    named = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in TASKS]
    assert named == [], f"{module} names tasks {named}"


def test_every_registered_task_implements_the_whole_protocol():
    wanted = {name: inspect.signature(getattr(Task, name)) for name in dir(Task)
              if not name.startswith("_") and callable(getattr(Task, name))}
    assert TASK_SCHEMAS is TASKS  # a task is one registry entry: the schema reads the same one
    for name in TASKS:
        task = task_named(name)
        assert task.name == name and tuple(task.metrics) == TASKS[name].metrics and task.curves
        for method, sig in wanted.items():
            got = inspect.signature(getattr(type(task), method))
            assert list(got.parameters) == list(sig.parameters), (name, method, got, sig)


def test_every_task_entry_agrees_with_the_metric_registry_and_the_recipe_schema():
    """What a task's entry names exists: its metrics registered as its own (selectable, with a
    direction, the default first), its curves registered (a plot legend's title), its section a
    Recipe field; and a metric registered for a task is one its entry names."""
    from gluontl.metrics import _REGISTRY, find_metric
    from gluontl.recipe import Recipe

    for name, entry in TASKS.items():
        for key in entry.metrics:
            m = find_metric(key)
            assert m is not None and m.of(name) and m.selectable and m.direction in ("max", "min"), (name, key)
        for key in entry.shown:
            assert find_metric(key) is not None and find_metric(key).of(name) and not find_metric(key).selectable
        for key in entry.curves:
            assert find_metric(key) is not None and find_metric(key).title, (name, key)
        assert entry.section is None or entry.section in Recipe.model_fields, (name, entry.section)
        assert parse_recipe({"name": "r", "task": name, "model": {"source": "zoo:resnet18_v1"}}
                            ).train.select == entry.metrics[0]
    for m in _REGISTRY.values():
        assert m.task is None or all(m.key in TASKS[t].metrics + TASKS[t].shown for t in m.task), m


FOURTH = """
import json, sys
from gluontl.task_registry import TASKS, TaskEntry

class Counting:  # the task's code; the seam only imports it here
    pass

TASKS["counting"] = TaskEntry("counting", "__main__:Counting", metrics=("val_loss",), sources=("counts:",),
                              source_help="counts:PATH", curves=("val_loss",))

from gluontl.errors import RecipeError
from gluontl.recipe import parse_recipe
from gluontl.tasks import every_curve, task_named

model = {"source": "zoo:resnet18_v1"}
r = parse_recipe({"name": "r", "task": "counting", "model": model, "data": {"source": "counts:/x"}})
refused = []
for task, source in (("counting", "folder:/x"), ("classification", "counts:/x")):
    try:
        parse_recipe({"name": "r", "task": task, "model": model, "data": {"source": source}})
    except RecipeError as e:
        refused.append(str(e))
task = task_named("counting")
print(json.dumps({"select": r.train.select, "refused": refused, "name": task.name, "cls": type(task).__name__,
                  "metrics": list(task.metrics), "curves": "val_loss" in every_curve()}))
"""


def test_a_fourth_task_is_its_code_and_one_registry_entry(tmp_path):
    """An entry added before the schema is built is a task the recipe, the seam and plot know:
    nothing else names it."""
    import json
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FOURTH], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["select"] == "val_loss" and got["name"] == "counting" and got["cls"] == "Counting"
    assert got["metrics"] == ["val_loss"] and got["curves"]
    wrong, foreign = got["refused"]
    assert "folder:/x is classification data, not counting data" in wrong and "counts:PATH" in wrong
    assert "counts:/x is counting data, not classification data" in foreign


def _run_folder(tmp_path: Path) -> Path:
    """A run folder with a real (tiny) best checkpoint, as finetune leaves one."""
    import mxnet as mx

    from gluontl.data import checkpoint

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "recipe.yaml").write_text("name: r\n")
    net = mx.gluon.nn.Dense(2, in_units=3)
    net.initialize(mx.init.Constant(0.5))
    checkpoint.save(run / "checkpoints", "best", net, mx.gluon.Trainer(net.collect_params(), "sgd"), {"epoch": 1})
    return run


def test_init_from_starts_from_the_whole_run_whatever_the_original_restore_said(tmp_path):
    from gluontl.train.runs import init_from

    run = _run_folder(tmp_path)
    recipe = parse_recipe({"name": "d", "task": "detection", "model": {
        "source": "zoo:ssd_300_mobilenet0.25_custom", "weights": str(tmp_path / "old.params"),
        "restore": {"type": "classification", "only": ["a*"], "prefix_map": {"a": "b"}}},
        "data": {"source": "demo:digits_det"}}, origin="test")
    restore = init_from(recipe, run).model.restore
    assert (restore.type, restore.reuse, restore.only, restore.prefix_map) == (None, {}, [], {})


def test_a_run_card_that_is_gone_is_recomputed_only_for_classifiers(tmp_path):
    from gluontl.data.card import stored_card

    recipe = parse_recipe({"name": "s", "task": "segmentation", "model": {"source": "zoo:resnet18_v1",
                                                                           "input_shape": [3, 64, 64]},
                           "data": {"source": "demo:digits_seg"}}, origin="test")
    with pytest.raises(GluontlError, match="preprocess.json' is missing: a segmentation run writes it"):
        stored_card(tmp_path, recipe)


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"classes": "a"}'])
def test_a_received_card_that_is_no_card_is_refused_or_ignored_by_name(tmp_path, text):
    from gluontl.sources.restore import old_classes

    run = _run_folder(tmp_path)
    (run / "preprocess.json").write_text(text)
    try:
        assert old_classes(str(run)) is None  # a card without a class list: no names to reuse by
    except RestoreError as e:
        assert str(run / "preprocess.json") in str(e)
