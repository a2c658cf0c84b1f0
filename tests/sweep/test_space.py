"""A sweep's space is checked against the recipe schema before any trial: bad input is exit 2, one
paragraph naming the key, and nothing written."""
import pytest

from gluontl.errors import SweepError
from gluontl.sweep.space import Dim, parse_space
from tests import helpers
from tests.sweep import common


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    return helpers.tiny_symbol(tmp_path_factory.mktemp("net"))


@pytest.mark.parametrize("space, needles", [
    ({"train.learning_rate": {"log_uniform": [1e-4, 1e-1]}}, ["train.learning_rate", "log_uniform"]),
    ({"train.epochs": {"uniform": [1, 5]}}, ["train.epochs", "uniform [1, 5]", "2.52"]),
    ({"train.optimizer": {"log_uniform": [1e-3, 1.0]}}, ["train.optimizer"]),
    ({"train.lr": {"log_uniform": [0, 1.0]}}, ["train.lr", "low > 0"]),
    ({"train.lr": {"normal": [0, 1.0]}}, ["train.lr", "log_uniform, uniform, int, choice"]),
    ({"train.lr": {"uniform": [0.1, 0.01]}}, ["train.lr", "low < high"]),
    ({"train.epochs": {"int": [1.5, 3]}}, ["train.epochs", "integers"]),
])
def test_bad_space_exits_2_before_any_trial(tmp_path, capsys, monkeypatch, prefix, space, needles):
    monkeypatch.chdir(tmp_path)
    r = common.write(tmp_path, common.recipe(prefix), "r.yaml")
    s = common.write(tmp_path, space, "s.yaml")
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = helpers.run_cli(capsys, "sweep", "--recipe", str(r), "--space", str(s), "--trials", "2")
    helpers.assert_one_paragraph(code, out, err, needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no sweeps/ folder, no run


def test_probes_reach_inside_the_range():
    """A float range on an integer key is caught by its inner point, whatever its ends are."""
    assert Dim("train.epochs", "uniform", (1, 5)).probes() == [1, 5, 1 + 4 * 0.381966]
    assert Dim("train.lr", "log_uniform", (1e-4, 1e-2)).probes()[2] == pytest.approx(1e-4 * 100 ** 0.381966, rel=1e-12)
    assert Dim("train.epochs", "int", (1, 5)).probes() == [1, 5]


def test_choices_of_lists_go_to_optuna_as_json_and_come_back():
    import optuna

    dim = parse_space({"rules": {"choice": [common.CUT1, common.CUT2]}}, "s")[0]
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    got = {str(dim.suggest(study.ask())) for _ in range(12)}
    assert got == {str(common.CUT1), str(common.CUT2)}


def test_space_must_be_a_mapping():
    with pytest.raises(SweepError, match="mapping of dotted recipe keys"):
        parse_space([1, 2], "s.yaml")
