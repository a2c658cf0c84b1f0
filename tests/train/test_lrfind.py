"""lr-find: the range test against a quadratic whose best lr is known by hand, fastai's
suggestions on hand-made curves, the CLI, weights untouched, and train.lr: auto."""
import json
import time

import mxnet as mx
import numpy as np
import pytest
import yaml
from tests import helpers

from gluontl import api
from gluontl.errors import TrainError
from gluontl.recipe import parse_recipe
from gluontl.train.lrfind import BETA, Found, figure, lr_find, plot, ramp, steep, suggest, sweep, valley


def recipe_dict(prefix, **train):
    return helpers.tiny_recipe(prefix, export=[], **{"epochs": 1, "lr": 0.05, "log_every": 1, **train})


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


def smoothed(raw):
    """fastai's smoothed loss in closed form: the (1-β)β^k-weighted mean of the losses so far."""
    out = []
    for i in range(len(raw)):
        w = [(1 - 0.98) * 0.98 ** (i - j) for j in range(i + 1)]
        out.append(sum(wj * r for wj, r in zip(w, raw)) / sum(w))
    return out


def lrs_of(steps, n):
    return [1e-7 * 1e8 ** (i / steps) for i in range(n)]


@pytest.mark.parametrize("last, stops", [(3.9, False), (4.1, True)])
def test_sweep_stops_once_the_smoothed_loss_passes_4x_its_minimum(last, stops):
    """Losses fall to 1, rise to 2, then jump on the last step so that the smoothed loss lands at
    `last` x its minimum: 4x the minimum, not 4x the latest or the first, ends the test."""
    raw = [10 - 9 * i / 25 for i in range(26)] + [1 + i / 13 for i in range(1, 14)]
    smooth = smoothed(raw)
    best = min(smooth)
    w = (1 - 0.98) / (1 - 0.98 ** 40)  # the weight of the 40th loss in the 40th smoothed value
    raw.append((last * best - (smooth[-1] * (1 - 0.98 ** 39) * 0.98) / (1 - 0.98 ** 40)) / w)
    seen = []
    found = sweep(lambda lr: seen.append(lr) or raw[len(seen) - 1], 40, 1e-7, 10.0)
    assert smoothed(raw)[-1] == pytest.approx(last * best, rel=1e-9)
    np.testing.assert_allclose(found.losses, smoothed(raw), rtol=1e-12)
    assert found.raw == raw and found.lrs == seen and len(seen) == 40
    np.testing.assert_allclose(seen, [1e-7 * 1e8 ** (i / 40) for i in range(40)], rtol=1e-12)
    if stops:
        assert found.stopped == (f"diverged at step 40 (lr {seen[-1]:.3g}): smoothed loss "
                                 f"{smoothed(raw)[-1]:.4g} > 4× its minimum")
    else:
        assert found.stopped == "all 40 steps"


def test_a_non_finite_loss_ends_the_sweep_at_its_step():
    raw = [5.0 - 0.1 * i for i in range(30)] + [float("nan")]
    seen = []
    found = sweep(lambda lr: seen.append(lr) or raw[len(seen) - 1], 100, 1e-7, 10.0)
    assert len(found.lrs) == len(seen) == 31 and found.stopped.startswith("diverged at step 31 (lr ")
    assert "smoothed loss nan > 4× its minimum" in found.stopped
    want = smoothed(raw[:30])  # the suggestions use points 10..25 (steps // 10 = 10, the last five left out)
    assert found.minimum == pytest.approx(found.lrs[int(np.argmin(want[10:26])) + 10] / 10, rel=1e-12)


@pytest.mark.parametrize("at", [10, 94])
def test_suggestions_leave_out_the_first_tenth_and_the_last_five_points(at):
    """A flat curve with dips: the lowest ones just outside (points 9 and 95 of 100) are not
    seen; the one at ``at``, the first or last point inside, is fastai's minimum and ends the
    steepest fall."""
    lrs = lrs_of(100, 100)
    losses = [5.0] * 100
    losses[3], losses[9], losses[95], losses[99] = -3.0, -1.0, -2.0, -4.0
    losses[at] = 0.5
    losses[50] = 1.0
    found = suggest(lrs, losses, [7.0] * 100, 100, "why")
    assert found.minimum == pytest.approx(lrs[at] / 10, rel=1e-12)
    assert found.steep == lrs[93 if at == 94 else 49]  # the fall 5 -> 0.5 into point 94, else 5 -> 1
    assert (found.lrs, found.losses, found.raw, found.stopped) == (lrs, losses, [7.0] * 100, "why")
    assert found.suggested == found.minimum


@pytest.mark.parametrize("n, points", [(10, 3), (9, 2), (1, 0)])
def test_three_points_are_the_fewest_to_suggest_from(n, points):
    lrs, losses = lrs_of(20, n), [1.0 - 0.01 * i for i in range(n)]
    if points == 3:  # steps // 10 = 2 left out at the start, 5 at the end: points 2, 3, 4
        found = suggest(lrs, losses, losses, 20, "why")
        assert found.minimum == pytest.approx(lrs[4] / 10, rel=1e-12) and found.valley == lrs[2]
        return
    with pytest.raises(TrainError) as e:
        suggest(lrs, losses, losses, 20, "diverged at step 9")
    assert str(e.value).startswith(f"lr-find: the loss diverged at step 9 after {n} steps, leaving {points} points "
                                   f"to suggest from (the first tenth and the last five are left out). Lower --end")


def test_valley_is_fastais_on_more_hand_made_curves():
    # strictly falling, 12 points: the run ends at 11 and is 12 long, so fastai's start is -1 and the
    # valley -1 + int(12/3) + int(12/3/2) = 5
    assert valley(np.arange(12.0)[::-1]) == 5
    # ties do not fall: 3, 2, 1 (indices 0, 1, 3) is the longest run, ending at 3 with length 3:
    # 0 + int(1) + int(0.5) = 1
    assert valley(np.array([3.0, 2.0, 2.0, 1.0])) == 1
    # two runs of length 3: the first found stays (ends at 2): -1 + 1 + 0 = 0
    assert valley(np.array([5.0, 4.0, 3.0, 9.0, 8.0, 7.0])) == 0
    # a longer run past a rise: 9, 8, 7, 6, 5, 4 (0, 1, 2, 4, 5, 6; length 6, end 6): 0 + 2 + 1 = 3
    assert valley(np.array([9.0, 8.0, 7.0, 10.0, 6.0, 5.0, 4.0])) == 3
    assert valley(np.array([1.0, 2.0, 3.0])) == 0  # nothing falls: the first point


def test_steep_measures_the_fall_against_log_lr():
    lrs = np.array([1.0, 10.0, 11.0, 1000.0])
    losses = np.array([4.0, 3.0, 2.5, 0.0])  # falls 1, 0.5, 2.5 over log-lr steps ln 10, ln 1.1, ln 90.9
    assert steep(lrs, losses) == 1


def found_by_hand(**kw):
    lrs = lrs_of(100, 30)
    losses = [3.0 - 0.05 * i for i in range(30)]
    return Found(lrs, losses, [l + 0.5 for l in losses], lrs[12], lrs[14], lrs[20] / 10, "all 100 steps", **kw)


def test_record_holds_the_suggestions_and_the_curves(tmp_path):
    f = found_by_hand(seconds=1.23456, feed={"cache": False})
    assert f.to_json() == {"suggested": f.minimum, "method": "minimum", "valley": f.valley, "steep": f.steep,
                           "minimum": f.minimum, "stopped": "all 100 steps", "seconds": 1.235, "lrs": f.lrs,
                           "losses": f.losses, "raw_losses": f.raw, "feature_cache": {"cache": False}, "plot": None}
    f.plot = tmp_path / "p.png"
    assert f.to_json()["plot"] == str(tmp_path / "p.png")


def test_plot_shows_both_curves_the_three_suggestions_and_fills_with_the_smoothed_one(tmp_path):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import LogFormatter
    from PIL import Image

    f = found_by_hand()
    fig = figure(f, "t: lr-find")
    ax = fig.axes[0]
    raw, smooth, *marks = ax.lines
    assert list(raw.get_xdata()) == f.lrs and list(raw.get_ydata()) == f.raw
    assert (raw.get_linewidth(), raw.get_alpha(), raw.get_label()) == (0.6, 0.4, "loss")
    assert list(smooth.get_xdata()) == f.lrs and list(smooth.get_ydata()) == f.losses
    assert smooth.get_linewidth() == 1.5
    assert smooth.get_label() == f"smoothed (β {BETA})" == "smoothed (β 0.98)"
    assert [(m.get_marker(), m.get_label()) for m in marks] == [
        ("o", f"valley {f.valley:.2g}"), ("s", f"steep {f.steep:.2g}"), ("^", f"minimum {f.minimum:.2g}")]
    for m, i in zip(marks, (12, 14)):  # valley and steep sit on points of the curve
        assert m.get_xdata()[0] == f.lrs[i] and m.get_ydata()[0] == pytest.approx(f.losses[i], rel=1e-12)
    # the minimum, a tenth of point 20's lr, is 12.5 points (of 10^0.08 each) lower: halfway between
    # points 7 and 8 in log lr, on the straight curve at 3 - 0.05 * 7.5
    assert marks[2].get_xdata()[0] == f.minimum and marks[2].get_ydata()[0] == pytest.approx(2.625, rel=1e-12)
    lo, hi = min(f.losses), max(f.losses)
    assert ax.get_ylim() == pytest.approx((lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo)), rel=1e-12)
    assert (ax.get_xscale(), ax.get_xlabel(), ax.get_ylabel(), ax.get_title()) == (
        "log", "learning rate", "training loss", "t: lr-find")
    assert type(ax.xaxis.get_major_formatter()) is LogFormatter
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [l.get_label() for l in ax.lines]
    plt.close(fig)
    for losses, pad in (([2.0] * 30, 0.2), ([0.0] * 30, 1.0)):  # flat curves still get a margin
        fig = figure(Found(f.lrs, losses, losses, f.valley, f.steep, f.minimum, "x"), "flat")
        assert fig.axes[0].get_ylim() == pytest.approx((losses[0] - pad, losses[0] + pad), rel=1e-12)
        plt.close(fig)
    before = plt.get_fignums()
    path = plot(f, tmp_path / "lr_find.png", "t")
    assert path == tmp_path / "lr_find.png" and plt.get_fignums() == before  # saved and closed
    with Image.open(path) as im:
        assert (im.format, im.size) == ("PNG", (704, 440))  # 6.4 x 4 inches at 110 dpi
    assert path.read_bytes() == png_of(figure(f, "t"))  # the figure with its title
    with pytest.raises(TrainError):
        plot(f, tmp_path / "missing" / "lr_find.png", "t")


def png_of(fig) -> bytes:
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


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


@pytest.mark.parametrize("kw, words", [
    ({"steps": 19}, "(got start 1e-07, end 10, steps 19)"), ({"start": 0.0}, "(got start 0, end 10, steps 100)"),
    ({"start": 0.5, "end": 0.5}, "(got start 0.5, end 0.5, steps 100)")])
def test_lr_find_refuses_a_ramp_too_short_or_not_rising(tiny_symbol, tmp_path, kw, words):
    with pytest.raises(TrainError) as e:
        lr_find(parse_recipe(recipe_dict(tiny_symbol)), runs_root=tmp_path, **kw)
    assert str(e.value) == (f"lr-find needs 0 < --start < --end and --steps of 20 or more {words}: fewer steps "
                            f"leave nothing to suggest from.")
    assert not any(tmp_path.iterdir())


def test_lr_find_needs_training_data_and_a_writable_place(tiny_symbol, tmp_path):
    no_data = {k: v for k, v in recipe_dict(tiny_symbol).items() if k != "data"}
    with pytest.raises(TrainError) as e:
        lr_find(parse_recipe(no_data), runs_root=tmp_path)
    assert str(e.value) == ("The recipe has no data: section; lr-find trains on the training data (e.g. data: "
                            "{source: demo:digits}).")
    (tmp_path / "file").write_text("")
    with pytest.raises(TrainError) as e:
        lr_find(parse_recipe(recipe_dict(tiny_symbol)), runs_root=tmp_path / "file")
    assert str(e.value).startswith(f"Cannot create '{tmp_path / 'file' / 't-lr-find'}' for lr-find's plot: ")
    assert str(e.value).endswith(". Pick a writable place with --runs DIR.")


def test_twenty_steps_from_start_write_the_plot_and_the_record(tiny_symbol, tmp_path):
    (tmp_path / "t-lr-find").mkdir()  # a folder an earlier range test left
    began = time.perf_counter()
    found = lr_find(parse_recipe(recipe_dict(tiny_symbol)), runs_root=tmp_path, steps=20, start=1e-4, end=1.0,
                    quiet=True)
    assert 0 < found.seconds <= time.perf_counter() - began
    assert found.plot.read_bytes() == png_of(figure(found, "t: lr-find"))
    np.testing.assert_allclose(found.lrs, [1e-4 * 1e4 ** (i / 20) for i in range(len(found.lrs))], rtol=1e-12)
    assert found.plot == tmp_path / "t-lr-find" / "lr_find.png" and found.plot.is_file()
    assert found.record == tmp_path / "t-lr-find" / "lr_find.json"
    assert json.loads(found.record.read_text()) == json.loads(json.dumps(found.to_json()))


def test_weights_from_are_made_first_and_lr_find_chatters_unless_quiet(tiny_symbol, tmp_path, monkeypatch,
                                                                            capsys):
    """``model.weights_from`` runs first, as finetune runs it; ``quiet`` drops the chatter of both,
    and a second range test writes over the first one's folder."""
    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path))
    source = tmp_path / "source.yaml"
    source.write_text(yaml.safe_dump(recipe_dict(tiny_symbol)))
    r = recipe_dict(tiny_symbol)
    r["model"].update(weights=str(tmp_path / "w" / "made.params"), weights_from=str(source))
    found = lr_find(parse_recipe(r), runs_root=tmp_path / "runs", steps=20, quiet=True)
    assert (tmp_path / "w" / "made.params").is_file() and found.plot.is_file()
    out = capsys.readouterr().out  # the weights' run logs its epochs, as finetune -q does; no chatter
    assert "epoch 1/1 " in out and "does not exist yet" not in out and "feature cache" not in out
    monkeypatch.chdir(tmp_path)
    again = lr_find(parse_recipe(r), steps=20)  # the weights exist now; runs/ by default
    assert again.plot.resolve() == found.plot and "feature cache: " in capsys.readouterr().out


def test_two_contexts_accumulating_half_batches_find_as_one_context_on_whole_batches(tiny_symbol, tmp_path):
    """Batches of 8 on cpu:1,2 (4 images each), 2 batches a step: each step is the mean over the 16
    images one context sees in a batch of 16 (the same images: the order is the sampler's, batches
    are its consecutive slices). Only float32 summation order differs: at most one gradient's
    rounding (the tiny net's largest sum, 16 images x 16 x 16 positions) per step."""
    one = lr_find(parse_recipe(recipe_dict(tiny_symbol)), runs_root=tmp_path / "a", steps=20, start=1e-3,
                  end=0.1, quiet=True)
    r = recipe_dict(tiny_symbol, ctx="cpu:1,2", accumulate=2)
    r["data"] = {**r["data"], "batch_size": 8}
    two = lr_find(parse_recipe(r), runs_root=tmp_path / "b", steps=20, start=1e-3, end=0.1, quiet=True)
    assert len(two.raw) == len(one.raw) == 20
    np.testing.assert_allclose(two.raw, one.raw, rtol=0, atol=20 * helpers.f32_tol(1.0, 16 * 16 * 16))


def test_the_feature_cache_changes_nothing_but_the_time_over_more_than_one_pass(tiny_symbol, tmp_path, capsys):
    """The first convolution frozen: its features cached (and dropped after) or recomputed each
    step, over 60 steps of batches of 16 (the training split is about 44: a second pass, in a new
    order, is read from the cache too). Only float32 summation order may differ."""
    found = {}
    for cache in ("on", "off"):
        r = {**recipe_dict(tiny_symbol, cache_features=cache, prefix_engine="mxnet"),
             "rules": [{"stage": ["stem"], "grad_req": "null"}]}  # the first convolution
        found[cache] = lr_find(parse_recipe(r), runs_root=tmp_path / cache, steps=60, start=1e-4, end=0.1,
                               quiet=True)
        assert sorted(p.name for p in (tmp_path / cache / "t-lr-find").iterdir()) == ["lr_find.json", "lr_find.png"]
    assert found["on"].feed["cache"] and not found["off"].feed["cache"]
    assert capsys.readouterr() == ("", "")  # quiet: no chatter, no bar filling the cache
    assert len(found["on"].raw) == len(found["off"].raw) == 60
    np.testing.assert_allclose(found["on"].raw, found["off"].raw, rtol=0, atol=60 * helpers.f32_tol(1.0, 16 * 16 * 16))


def test_each_step_draws_dropout_and_reads_the_batch_that_finetune_does(tmp_path):
    """A net with dropout, at learning rates too small to move it (1e-9): lr-find's raw loss of
    step i is finetune's loss of step i (the same batch, the same dropout draw), over 50 steps
    (into the second pass over the 44 batches, in its new order). Seed 2**31 + 1 makes the draws'
    seeds wrap: modulo 2**31 they start at 1_000_003, modulo 2**32 they would start 2**31 higher."""
    mx.random.seed(2)
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 3, padding=1, activation="relu"), mx.gluon.nn.Dropout(0.5),
            mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(5))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, 3, 16, 16)))
    net.export(str(tmp_path / "drop"))
    r = recipe_dict(tmp_path / "drop", lr=1e-9, epochs=2, seed=2**31 + 1, guards="off")
    steps = [m["loss"] for m in api.finetune(r, runs_root=tmp_path / "ft", quiet=True, stop_after_steps=50).metrics
             if "loss" in m]
    found = lr_find(parse_recipe(r), runs_root=tmp_path, steps=50, start=1e-9, end=2e-9, quiet=True)
    assert len(steps) == len(found.raw) == 50
    # the two runs differ only in float32 rounding of the same few additions
    np.testing.assert_allclose(found.raw, steps, rtol=0, atol=helpers.f32_tol(2.0, 16 * 16 * 16))
