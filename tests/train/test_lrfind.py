"""lr-find: the range test against a quadratic whose best lr is known by hand, fastai's
suggestions on hand-made curves, the CLI, weights untouched, and train.lr: auto."""
import json

import mxnet as mx
import numpy as np
import pytest
import yaml
import helpers

from gluontl import api
from gluontl.errors import TrainError
from gluontl.recipe import parse_recipe
from gluontl.train.lrfind import ramp, steep, sweep, valley

DATA = helpers.DIGITS_5_9


@pytest.fixture(scope="module")
def tiny_symbol(tmp_path_factory):
    return helpers.tiny_symbol(tmp_path_factory.mktemp("tiny"))


def recipe_dict(prefix, **train):
    return {"name": "t", "model": {"source": f"symbol:{prefix}", "input_shape": [3, 16, 16]}, "data": DATA,
            "train": {"epochs": 1, "lr": 0.05, "log_every": 1, **train}, "export": {"formats": []}}


def test_on_a_quadratic_minimum_and_steep_are_within_3x_of_1_over_L_and_valley_below():
    """Full-batch gradient descent on least squares: loss ½·mean((Xw - y)²), Hessian XᵀX/n; the
    best constant step is 1/L, L its largest eigenvalue (numpy's eigvalsh). The ramp runs to 100 so
    the loss diverges inside it (to 10 it is still falling at the end). fastai's valley is the
    cautious suggestion: far below 1/L here, where the loss falls from the first step on."""
    rs = np.random.RandomState(0)
    n, d = 500, 8
    x = rs.randn(n, d)
    y = x @ rs.randn(d) + 0.1 * rs.randn(n)
    best = 1 / np.linalg.eigvalsh(x.T @ x / n).max()
    w = np.zeros(d)

    def step(lr):
        nonlocal w
        r = x @ w - y
        w = w - lr * x.T @ r / n
        return 0.5 * float(np.mean(r ** 2))

    found = sweep(step, 100, 1e-7, 100.0)
    assert "diverged" in found.stopped
    assert best / 3 <= found.minimum <= 3 * best, (found.minimum, best)
    assert best / 3 <= found.steep <= 3 * best, (found.steep, best)
    assert found.valley < best / 100
    np.testing.assert_allclose(found.lrs[:3], [1e-7, 1e-7 * 10 ** 0.09, 1e-7 * 10 ** 0.18], rtol=1e-12)
    # the smoothing, by hand: bias-corrected exponential average with β = 0.98
    avg = 0.98 * (0.98 * 0.0 + 0.02 * found.raw[0]) + 0.02 * found.raw[1]
    assert found.losses[1] == pytest.approx(avg / (1 - 0.98 ** 2), rel=1e-12)


def test_valley_and_steep_on_hand_made_curves():
    # the longest decreasing subsequence is 5.1, 5.0, 4.8, ..., 1.0 (indices 1..9, length 9); fastai
    # starts the valley at end - length = 0 and suggests start + int(9/3) + int(9/3/2) = 4
    losses = np.array([5.0, 5.1, 5.0, 4.8, 4.3, 3.5, 2.6, 1.8, 1.2, 1.0, 1.5, 3.0])
    assert valley(losses) == 4
    lrs = np.geomspace(1e-4, 1, len(losses))
    assert steep(lrs, losses) == 5  # 3.5 -> 2.6 and 2.6 -> 1.8 fall 0.9 and 0.8: the first is steepest
    assert ramp(1e-7, 10, 100, 50) == pytest.approx(1e-7 * 1e4)


def test_a_loss_that_diverges_at_once_is_a_clear_error():
    with pytest.raises(TrainError, match="Lower --end"):
        sweep(lambda lr: 1.0 if lr < 1e-6 else 100.0, 100, 1e-7, 10.0)


def test_the_cli_prints_the_suggestion_and_the_plot_and_writes_no_weights(tiny_symbol, tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe_dict(tiny_symbol)))
    before = open(f"{tiny_symbol}-0000.params", "rb").read()
    code, out, err = helpers.run_cli(capsys, "lr-find", "--recipe", str(path), "--runs", str(tmp_path / "runs"),
                                     "--steps", "40", "-q")
    assert code == 0, err
    line = next(l for l in out.splitlines() if "suggested" in l)
    lr = float(line.split()[2])
    assert 1e-7 <= lr <= 10
    plot = tmp_path / "runs" / "t-lr-find" / "lr_find.png"
    assert f"plot: {plot}" in out and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((plot.parent / "lr_find.json").read_text())
    assert record["suggested"] == pytest.approx(lr, rel=1e-2) and len(record["lrs"]) <= 40
    assert sorted(p.name for p in plot.parent.iterdir()) == ["lr_find.json", "lr_find.png"]  # no cache, no checkpoint
    assert open(f"{tiny_symbol}-0000.params", "rb").read() == before
    code, out, err = helpers.run_cli(capsys, "lr-find", "--recipe", str(path), "--start", "1", "--end", "0.1")
    assert code == 2 and "--start < --end" in err


def test_train_lr_auto_trains_with_the_suggestion_and_records_it(tiny_symbol, tmp_path):
    res = api.finetune(recipe_dict(tiny_symbol, lr="auto"), runs_root=tmp_path, quiet=True)
    found = json.loads((res.run_dir / "lr_find.json").read_text())
    written = yaml.safe_load((res.run_dir / "recipe.yaml").read_text())
    assert written["train"]["lr"] == found["suggested"] == found["minimum"]
    assert [r["lr"] for r in res.metrics if "epoch" in r] == [found["suggested"]]  # schedule: constant
    assert (tmp_path / "t-lr-find" / "lr_find.png").is_file()


def test_train_lr_auto_is_refused_where_it_cannot_run(tiny_symbol):
    from gluontl.errors import RecipeError
    from gluontl.train.loop import finetune

    with pytest.raises(TrainError, match="resolved by gluontl finetune"):
        finetune(parse_recipe(recipe_dict(tiny_symbol, lr="auto")))
    with pytest.raises(RecipeError, match="every worker"):
        parse_recipe(recipe_dict(tiny_symbol, lr="auto", distributed={"backend": "kvstore"}))
