"""Logs people use: one plain line per epoch off a terminal, TensorBoard events equal to
metrics.jsonl (read by tensorboard's own reader), and runs extended by a resume or started
from another run's checkpoint."""
import fcntl
import json
import math
import os
import pty
import re
import shutil
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

import numpy as np
import pytest
import yaml
from tests import helpers
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from gluontl.errors import ModelSourceError, TrainError
from gluontl.naming import named_params
from gluontl.pipeline import prepare
from gluontl.recipe import parse_recipe
from gluontl.train.loop import finetune
from gluontl.train.runs import init_from

REPO = Path(__file__).resolve().parents[2]
EPOCH_LINE = re.compile(r"epoch (\d+)/(\d+) train_loss (\d+\.\d{4}) train_acc (\d\.\d{4}) val_loss (\d+\.\d{4}) "
                        r"val_acc (\d\.\d{4}) val_balanced_acc (\d\.\d{4}) lr (\S+) time \d+\.\ds")


def spec(prefix, **train):
    return helpers.tiny_recipe(prefix, export=[], **{"epochs": 2, "lr": 0.05, "log_every": 1, **train})


def recipe(prefix, **train):
    return parse_recipe(spec(prefix, **train))


def rows(run_dir):
    return [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]


def events(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})  # 0: keep every event
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def assert_events_equal_metrics(run_dir):
    """Every numeric value of every metrics.jsonl row is one event at the row's step, as the
    float32 TensorBoard stores, and there is no other event."""
    want: dict[str, list] = {}
    for row in rows(run_dir):
        kind = "epoch" if "epoch" in row else "step"
        for key, value in row.items():
            if key not in ("step", "epoch", "epoch_f"):
                want.setdefault(f"{kind}/{key}", []).append((row["step"], float(np.float32(value))))
    got = events(run_dir)
    assert sorted(got) == sorted(want)
    for tag in want:
        assert got[tag] == want[tag], tag


def test_tensorboard_events_carry_the_metrics(tiny_symbol, tmp_path):
    run = finetune(recipe(tiny_symbol), runs_root=tmp_path, quiet=True).run_dir
    assert len(list(run.glob("events.out.tfevents.*"))) == 1
    assert_events_equal_metrics(run)
    got = events(run)
    assert [s for s, _ in got["step/loss"]] == list(range(1, 89))  # 2 epochs of 44 steps, each once
    assert {"epoch/train_acc", "epoch/val_top1", "epoch/lr"} <= set(got)


def test_resume_after_lost_rows_shows_each_step_once(tiny_symbol, tmp_path):
    """kill -9 after rows were logged but before the next checkpoint: resuming produces those
    steps again, and neither metrics.jsonl nor TensorBoard may show them twice."""
    full = finetune(recipe(tiny_symbol), runs_root=tmp_path / "a", quiet=True)
    run = finetune(recipe(tiny_symbol), runs_root=tmp_path / "b", quiet=True, stop_after_steps=13).run_dir
    saved = tmp_path / "checkpoints-at-13"
    shutil.copytree(run / "checkpoints", saved)
    finetune(recipe(tiny_symbol), runs_root=tmp_path / "b", quiet=True, resume=run, stop_after_steps=20)
    assert rows(run)[-1]["step"] == 33
    shutil.rmtree(run / "checkpoints")
    shutil.copytree(saved, run / "checkpoints")  # the state a kill -9 at step 33 leaves: rows 14..33 unsaved
    done = finetune(recipe(tiny_symbol), runs_root=tmp_path / "b", quiet=True, resume=run)
    assert len(list(run.glob("events.out.tfevents.*"))) == 3
    assert helpers.without_timings(rows(run)) == helpers.without_timings(done.metrics) == helpers.without_timings(full.metrics)
    assert_events_equal_metrics(run)


def _cli(args, cwd, **kw):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "gluontl", *args], cwd=cwd, env=env, **kw)


def _write_recipe(prefix, folder, **train):
    path = folder / "r.yaml"
    path.write_text(yaml.safe_dump(spec(prefix, **train)))
    return path


def test_redirected_output_is_one_line_per_epoch(tiny_symbol, tmp_path):
    r = _write_recipe(tiny_symbol, tmp_path)
    for quiet in ([], ["-q"]):
        with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
            proc = _cli(["finetune", "-r", str(r), "--runs", str(tmp_path / "runs"), *quiet], tmp_path,
                        stdout=out, stderr=err)
        text, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
        assert proc.returncode == 0, err
        assert "\r" not in text + err and "it/s" not in text + err and err == ""
        lines = text.splitlines()
        epochs = [l for l in lines if l.startswith("epoch ")]
        assert len(epochs) == 2 and lines[-1].startswith("done: best val_acc ")
        if quiet:
            assert lines == [*epochs, lines[-1]]  # -q: the epoch lines and the result, nothing else
        run = Path(lines[-1].rsplit("run folder ", 1)[1])
        for line, row in zip(epochs, [m for m in rows(run) if "epoch" in m]):
            m = EPOCH_LINE.fullmatch(line)
            assert m, line
            assert int(m[1]) == row["epoch"] and m[2] == "2"
            assert [float(m[i]) for i in (3, 4, 5, 6, 7)] == [round(row[k], 4) for k in (
                "train_loss", "train_acc", "val_loss", "val_top1", "val_balanced_acc")]
            assert float(m[8]) == float(f"{row['lr']:.3g}")


def test_progress_bars_only_on_a_terminal(tiny_symbol, tmp_path):
    r = _write_recipe(tiny_symbol, tmp_path, epochs=1)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # tqdm draws nothing 0 wide
    chunks = []

    def drain():
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain)
    reader.start()
    with open(tmp_path / "out", "w") as out:
        proc = _cli(["finetune", "-r", str(r), "--runs", str(tmp_path / "runs")], tmp_path, stdout=out, stderr=slave)
    os.close(slave)
    reader.join(timeout=60)
    os.close(master)
    tty = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, tty
    assert "epoch 1/1:" in tty and "\r" in tty and "it/s" in tty  # a tqdm bar drawn on the terminal
    assert sum(l.startswith("epoch 1/1 train_loss") for l in (tmp_path / "out").read_text().splitlines()) == 1


@pytest.mark.parametrize("echo", [True, False])
def test_a_worker_log_keeps_every_line_and_only_rank_0_echoes(tmp_path, capsys, echo):
    """A job's console gets rank 0's lines once; every worker's log gets its own, those from before
    the run folder existed first, then the error that ended it. The watchdog's alert always shows."""
    from gluontl.console import WorkerLog, alert, say, show

    path = tmp_path / "logs" / "worker-1.log"
    with pytest.raises(TrainError):
        with WorkerLog(echo=echo) as log:
            say(False, "threads: 1")
            log.open(path)
            show("epoch 1/1 train_loss 0.5000", quiet=True)
            alert("error: rank 1: a step did not finish")
            raise TrainError("stuck")
    out, err = capsys.readouterr()
    assert out == ("threads: 1\nepoch 1/1 train_loss 0.5000\n" if echo else "")
    assert err == "error: rank 1: a step did not finish\n"
    assert path.read_text().splitlines() == ["threads: 1", "epoch 1/1 train_loss 0.5000",
                                             "error: rank 1: a step did not finish", "error: TrainError: stuck"]
    show("after the run")  # the log is closed and out of the way
    assert capsys.readouterr().out == "after the run\n" and "after" not in path.read_text()


def test_digits_demo_log_is_small_when_redirected(tmp_path):
    """The demo recipe (2 epochs; no pretraining run, guards warn about the random backbone)
    redirected to files: before, the bars wrote about 6 KB per epoch; now one line."""
    args = ["finetune", "-r", "recipes/resnet18_freeze.yaml", "--runs", str(tmp_path / "runs"),
            "--set", "model.weights=null", "--set", "model.weights_from=null", "--set", "train.epochs=2",
            "--set", "train.guards=warn", "--set", "export.formats=[]"]
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = _cli(args, REPO, stdout=out, stderr=err)
    text = (tmp_path / "out").read_bytes() + (tmp_path / "err").read_bytes()
    assert proc.returncode == 0, text.decode()
    assert b"\r" not in text
    assert len(text) < 2500 and text.count(b"\n") <= 12, text.decode()
    assert len(re.findall(rb"^epoch \d/2 train_loss", text, re.M)) == 2


# ------------------------------------------------------------------ extending runs

def test_resume_with_more_epochs_equals_the_longer_run(tiny_symbol, tmp_path):
    """Constant lr: a 2-epoch run extended to 3 is the 3-epoch run, number for number."""
    three = finetune(recipe(tiny_symbol, epochs=3), runs_root=tmp_path / "a", quiet=True)
    two = finetune(recipe(tiny_symbol), runs_root=tmp_path / "b", quiet=True)
    more = finetune(recipe(tiny_symbol, epochs=3), runs_root=tmp_path / "b", quiet=True, resume=two.run_dir)
    assert more.run_dir == two.run_dir
    assert helpers.without_timings(rows(two.run_dir)) == helpers.without_timings(three.metrics)
    assert [r["epoch"] for r in rows(two.run_dir) if "epoch" in r] == [1, 2, 3]
    for k, v in helpers.checkpoint_params(three.run_dir).items():
        np.testing.assert_array_equal(helpers.checkpoint_params(two.run_dir)[k], v)
    assert yaml.safe_load((two.run_dir / "recipe.yaml").read_text())["train"]["epochs"] == 3
    assert_events_equal_metrics(two.run_dir)


def test_cli_extends_a_cosine_run_along_the_longer_schedule(tiny_symbol, tmp_path):
    r = _write_recipe(tiny_symbol, tmp_path, schedule={"kind": "cosine"})
    runs = tmp_path / "runs"
    assert _cli(["finetune", "-r", str(r), "--runs", str(runs), "-q"], tmp_path, capture_output=True).returncode == 0
    run = runs / "t"
    before = rows(run)
    proc = _cli(["finetune", "--resume", str(run), "--set", "train.epochs=3"], tmp_path, capture_output=True,
                text=True)
    assert proc.returncode == 0, proc.stderr
    assert f"extending {run}: train.epochs: 2 -> 3" in proc.stdout
    after = rows(run)
    assert after[:len(before)] == before
    steps = [m["step"] for m in after if "loss" in m]
    assert steps == list(range(1, 133))  # 3 epochs of 44 steps, none twice
    for m in after[len(before):]:
        if "loss" in m:  # the lr of step s (logged as s + 1) on the 3-epoch cosine, by hand
            assert m["lr"] == pytest.approx(0.05 * 0.5 * (1 + math.cos(math.pi * (m["step"] - 1) / 132)), rel=1e-12)
    assert [m["epoch"] for m in after if "epoch" in m] == [1, 2, 3]


def _files(run_dir):
    """Every file of a run folder (exports included) with its modification time and bytes."""
    return {p.relative_to(run_dir): (p.stat().st_mtime_ns, p.read_bytes()) for p in run_dir.rglob("*") if p.is_file()}


def test_resuming_a_finished_run_says_so_and_rewrites_nothing(tiny_symbol, tmp_path):
    """It used to print "done" and silently export again over the run's ONNX file."""
    r = tmp_path / "r.yaml"
    r.write_text(yaml.safe_dump({**spec(tiny_symbol, epochs=1), "export": {"formats": ["onnx"]}}))
    runs = tmp_path / "runs"
    assert _cli(["finetune", "-r", str(r), "--runs", str(runs), "-q"], tmp_path, capture_output=True).returncode == 0
    run = runs / "t"
    before = _files(run)
    assert Path("export/t.onnx") in before
    proc = _cli(["finetune", "--resume", str(run)], tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    best = rows(run)[-1]["val_top1"]
    assert proc.stdout == (f"{run} already finished its 1 epoch (best val_acc {best:.4f} at epoch 1); nothing to do, "
                           f"nothing rewritten. To train it longer: `gluontl finetune --resume {run} --set "
                           f"train.epochs=6`.\n")
    assert _files(run) == before
    proc = _cli(["finetune", "--resume", str(run), "--set", "train.epochs=2", "-q"], tmp_path, capture_output=True,
                text=True)
    assert proc.returncode == 0, proc.stderr
    assert [m["epoch"] for m in rows(run) if "epoch" in m] == [1, 2]
    assert f"exported {run / 'export' / 't.onnx'} (verified)" in proc.stdout
    assert _files(run)[Path("export/t.onnx")] != before[Path("export/t.onnx")]


def test_a_run_killed_before_its_summary_is_finished_by_a_resume(tiny_symbol, tmp_path):
    """The last checkpoint alone does not make a run finished: killed before it wrote its
    summary (and exports), a resume trains nothing but writes them."""
    run = finetune(recipe(tiny_symbol, epochs=1), runs_root=tmp_path, quiet=True).run_dir
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").unlink()
    again = finetune(recipe(tiny_symbol, epochs=1), runs_root=tmp_path, quiet=True, resume=run)
    assert not again.finished_before
    written = json.loads((run / "summary.json").read_text())
    assert (written["best"], written["last"]) == (summary["best"], summary["last"])
    assert finetune(recipe(tiny_symbol, epochs=1), runs_root=tmp_path, quiet=True, resume=run).finished_before


def test_resume_refuses_other_changes_and_a_shorter_run(tiny_symbol, tmp_path):
    run = finetune(recipe(tiny_symbol), runs_root=tmp_path, quiet=True).run_dir
    with pytest.raises(TrainError, match=r"recipe differs .*train\.lr: 0\.05 -> 0\.1\).*--init-from"):
        finetune(recipe(tiny_symbol, epochs=4, lr=0.1), runs_root=tmp_path, quiet=True, resume=run)
    with pytest.raises(TrainError, match=r"train\.epochs=1: it has already trained 2 epochs\. Set train\.epochs "
                                         r"to 2 or more"):
        finetune(recipe(tiny_symbol, epochs=1), runs_root=tmp_path, quiet=True, resume=run)
    assert yaml.safe_load((run / "recipe.yaml").read_text())["train"]["epochs"] == 2  # refused: unchanged


def test_new_run_from_another_runs_checkpoint(tiny_symbol, tmp_path):
    first = finetune(recipe(tiny_symbol), runs_root=tmp_path, quiet=True).run_dir
    for ref, tag in ((first, "best"), (first / "last", "last")):
        start = prepare(init_from(recipe(tiny_symbol), ref)).block
        want = helpers.checkpoint_params(first, tag)
        got = {n: e.param.data().asnumpy() for n, e in named_params(start).items()}
        assert sorted(got) == sorted(want)
        for n in want:
            np.testing.assert_array_equal(got[n], want[n])
    # The same through model.weights: a run folder is a weights source.
    start = prepare(parse_recipe({**spec(tiny_symbol), "model": {**spec(tiny_symbol)["model"], "weights": str(first)}}))
    for n, want in helpers.checkpoint_params(first, "best").items():  # names follow Gluon's counters when the net was built
        np.testing.assert_array_equal(named_params(start.block)[n].param.data().asnumpy(), want)
    assert start.restore.file == str(first)
    with pytest.raises(TrainError, match="not a run folder"):
        init_from(recipe(tiny_symbol), tmp_path)
    with pytest.raises(ModelSourceError, match="is a directory"):
        prepare(parse_recipe({**spec(tiny_symbol), "model": {**spec(tiny_symbol)["model"], "weights": str(tmp_path)}}))


def test_cli_init_from_starts_a_new_run(tiny_symbol, tmp_path):
    r = _write_recipe(tiny_symbol, tmp_path, epochs=1)
    runs = tmp_path / "runs"
    assert _cli(["finetune", "-r", str(r), "--runs", str(runs), "-q"], tmp_path, capture_output=True).returncode == 0
    proc = _cli(["finetune", "-r", str(r), "--runs", str(runs), "-q", "--init-from", str(runs / "t" / "last")],
                tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    second = runs / "t-2"
    assert yaml.safe_load((second / "recipe.yaml").read_text())["model"]["weights"] == str(runs / "t" / "last")
    assert [m["epoch"] for m in rows(second) if "epoch" in m] == [1] and rows(second)[0]["step"] == 1
    assert json.loads((second / "summary.json").read_text())["restore"].startswith(
        f"restored 6 from {runs / 't' / 'last'}")
    both = _cli(["finetune", "--resume", str(runs / "t"), "--init-from", str(runs / "t")], tmp_path,
                capture_output=True, text=True)
    assert both.returncode == 2 and "--init-from starts a new run" in both.stderr
