"""Early stopping with Lightning's EarlyStopping semantics, counted in validations: each parameter
against a metric sequence worked out by hand, then in real runs (where it stops, the best
checkpoint, the record, and a resume that does nothing)."""
import json
import math

import pytest
from tests import helpers

from gluontl.recipe import EarlyStoppingSpec, parse_recipe
from gluontl.train.callbacks import EarlyStopping, RunInfo
from gluontl.train.loop import finetune


def stops_at(values, monitor="val_top1", **settings):
    """The 1-based validation after which the callback asks to stop (None: never), and its reason."""
    es = EarlyStopping(EarlyStoppingSpec(monitor=monitor, **settings))
    info = RunInfo(parse_recipe({"name": "x", "model": {"source": "zoo:resnet18_v1"}}), None, 0, 1)
    es.on_run_start(info)
    for i, v in enumerate(values, start=1):
        es.on_validation(info, {"epoch": i, "step": 10 * i, monitor: v})
        if info.stop_reason:
            return i, info.stop_reason
    return None, None


def test_patience_counts_validations_without_improvement():
    # best 0.6 at 2; 0.55 and 0.58 do not beat it: the 2nd of them is patience 2
    assert stops_at([0.5, 0.6, 0.55, 0.58, 0.9], patience=2)[0] == 4
    assert stops_at([0.5, 0.6, 0.55, 0.7, 0.65], patience=2)[0] is None  # 0.7 resets the count
    assert stops_at([0.5, 0.5], patience=0)[0] == 2  # a tie is no improvement
    assert stops_at([0.5, 0.5], patience=1)[0] == 2


def test_direction_comes_from_the_registry_and_mode_overrides_it():
    seq = [0.5, 0.6, 0.55, 0.58]
    assert stops_at(seq, patience=2)[0] == 4  # val_top1: higher is better
    # val_loss: lower is better: 0.6 and 0.55 are both worse than 0.5
    assert stops_at(seq, monitor="val_loss", patience=2)[0] == 3
    assert stops_at(seq, monitor="val_loss", mode="max", patience=2)[0] == 4


def test_min_delta_needs_more_than_it_to_count():
    # best 0.5; 0.54 is not > 0.55 (wait 1); 0.56 is (best 0.56); 0.57, 0.60 are not > 0.61: stop at 5
    n, reason = stops_at([0.5, 0.54, 0.56, 0.57, 0.60], patience=2, min_delta=0.05)
    assert n == 5 and "0.56" in reason and "patience 2" in reason
    # lower is better: 0.46 is not < 0.45; 0.44 is
    assert stops_at([0.5, 0.46, 0.44, 0.43], monitor="val_loss", patience=2, min_delta=0.05)[0] is None
    assert stops_at([0.5, 0.46, 0.44, 0.43, 0.43], monitor="val_loss", patience=2, min_delta=0.05)[0] == 5


def test_stopping_threshold_stops_once_it_is_passed():
    n, reason = stops_at([0.5, 0.9, 0.95], patience=10, stopping_threshold=0.9)
    assert n == 3 and "stopping_threshold" in reason  # 0.9 itself is not past it (Lightning: strictly better)
    assert stops_at([2.0, 1.0, 0.4], monitor="val_loss", patience=10, stopping_threshold=0.5)[0] == 3


def test_divergence_threshold_stops_once_it_is_worse():
    n, reason = stops_at([1.0, 4.9, 5.0, 5.1], monitor="val_loss", patience=10, divergence_threshold=5.0)
    assert n == 4 and "divergence_threshold" in reason
    assert stops_at([0.5, 0.3, 0.1], patience=10, divergence_threshold=0.2)[0] == 3


def test_check_finite_stops_at_nan_and_inf():
    n, reason = stops_at([0.5, math.nan], patience=10)
    assert n == 2 and "not finite" in reason
    assert stops_at([0.5, math.inf], monitor="val_loss", patience=10)[0] == 2
    assert stops_at([0.5, math.nan, 0.6], patience=10, check_finite=False)[0] is None  # NaN is then no improvement
    assert stops_at([0.5, math.nan, 0.4], patience=2, check_finite=False)[0] == 3


def test_state_round_trips():
    es = EarlyStopping(EarlyStoppingSpec(patience=3))
    es.load_state_dict(json.loads(json.dumps({"best": 0.7, "wait": 2, "stopped": None})))
    assert (es.best, es.wait) == (0.7, 2) and es.state_dict() == {"best": 0.7, "wait": 2, "stopped": None}


# ---------------------------------------------------------------- real runs

DATA = helpers.DIGITS_5_9


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("es")
    prefix = helpers.tiny_symbol(d, deep=False)

    def recipe(**train):
        return parse_recipe({"name": "t", "model": {"source": f"symbol:{prefix}", "input_shape": [3, 16, 16]},
                             "data": DATA, "export": {"formats": []},
                             "train": {"epochs": 5, "lr": 0.05, "log_every": 5, **train}})

    ref = finetune(recipe(), runs_root=d / "ref", quiet=True)
    return recipe, [r for r in ref.metrics if "epoch" in r]


def test_a_run_stops_where_the_rule_says_and_keeps_its_best(tiny, tmp_path, capsys):
    recipe, ref = tiny
    top1 = [r["val_top1"] for r in ref]
    threshold = max(top1[:-1]) - 1e-6  # reached at the first epoch with that value, before the last
    want = next(i for i, v in enumerate(top1, start=1) if v > threshold)
    r = recipe(callbacks=[{"early_stopping": {"stopping_threshold": threshold, "patience": 100}}])
    result = finetune(r, runs_root=tmp_path, quiet=True)
    rows = [x for x in result.metrics if "epoch" in x]
    assert [x["epoch"] for x in rows] == list(range(1, want + 1)) and not result.stopped_early
    assert [x["val_top1"] for x in rows] == top1[:want]  # the same training up to there
    assert result.best["epoch"] == max(range(want), key=lambda i: (top1[i], -i)) + 1
    summary = json.loads((result.run_dir / "summary.json").read_text())
    card = json.loads((result.run_dir / "preprocess.json").read_text())
    assert summary["stopped"]["epoch"] == want == card["stopped"]["epoch"]
    assert "stopping_threshold" in summary["stopped"]["reason"] and result.stop_reason == summary["stopped"]["reason"]
    best = json.loads((result.run_dir / "checkpoints" / "best.json").read_text())
    assert best["epoch"] == result.best["epoch"]
    out = capsys.readouterr().out
    assert f"stopped after epoch {want} of 5" in out
    # a resume of it does nothing and says so
    last = (result.run_dir / "checkpoints" / "last.json").read_text()
    again = finetune(r, runs_root=tmp_path, resume=result.run_dir, quiet=True)
    assert again.finished_before and "nothing to do" in capsys.readouterr().out
    assert (result.run_dir / "checkpoints" / "last.json").read_text() == last


def test_patience_in_a_real_run_matches_its_own_metrics(tiny, tmp_path):
    recipe, ref = tiny
    top1 = [r["val_top1"] for r in ref]
    want, best, wait = None, None, 0  # patience 1 on val_top1 (higher is better), by hand over the rows
    for i, v in enumerate(top1, start=1):
        if best is None or v > best:
            best, wait = v, 0
        else:
            wait += 1
            if wait >= 1:
                want = i
                break
    assert want is not None and want < 5, top1  # this seed's run has an epoch worse than the one before
    r = recipe(callbacks=[{"early_stopping": {"monitor": "val_top1", "patience": 1}}])
    result = finetune(r, runs_root=tmp_path, quiet=True)
    assert [x["epoch"] for x in result.metrics if "epoch" in x][-1] == want
    assert result.stop_reason.startswith("early stopping: val_top1 did not improve")
