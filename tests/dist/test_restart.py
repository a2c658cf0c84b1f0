"""gluontl launch --max-restarts: a job whose worker is killed twice restarts from its last
checkpoint each time and ends bit-identical to the same job never interrupted; a host taken out of
the hosts file before a restart leaves the job on fewer workers, with the same global batch; bad
values exit 2."""
import json
import os
import signal
import threading

import numpy as np
import pytest
import yaml

from tests import helpers
from tests.dist.test_launch import Launch, descendants, environ, launched, survivors  # noqa: F401 (a fixture)
from tests.helpers import assert_one_paragraph

from gluontl.dist.launch import Elastic, restart
from gluontl.errors import LaunchError
from gluontl.runfolder import RunFolder


@pytest.mark.parametrize("args, says", [
    (["--max-restarts", "-1"], "--max-restarts -1"),
    (["--max-restarts", "1", "--restart-delay", "-2"], "--restart-delay -2"),
])
def test_bad_restart_values_exit_2(capsys, args, says):
    code, out, err = helpers.run_cli(capsys, "launch", *args, "-n", "2", "--", "finetune", "-r", "r.yaml")
    assert out == ""
    assert_one_paragraph(code, out, err, [says, "0 or more"])


def _worker(job, index):
    """The PID of the running worker ``index`` of the job's current attempt."""
    found = [p for p in descendants(job.popen.pid) if environ(p).get("DMLC_ROLE") == "worker"
             and environ(p).get("GLUONTL_LAUNCH_INDEX") == str(index)]
    assert len(found) == 1, found
    return found[0]


def test_a_new_run_restarted_on_fewer_workers_keeps_the_global_batch_or_is_refused(tmp_path, capsys):
    """Before the first checkpoint a restart starts the run again: on the workers the hosts file
    leaves, with the per-worker batch that keeps workers × batch_size, refused when it does not divide."""
    from typer.main import get_command

    from gluontl.cli import app

    (tmp_path / "r.yaml").write_text(yaml.safe_dump(helpers.tiny_recipe("tiny", data={"batch_size": 5})))
    commands, args = get_command(app).commands, ["finetune", "-r", str(tmp_path / "r.yaml"), "-q"]
    assert restart(args, None, commands, 1, 2, "why", Elastic(2, 1, tmp_path / "hosts", ["a"])) == \
        [*args, "--set", "data.batch_size=10"]
    with pytest.raises(LaunchError) as e:
        restart(args, None, commands, 1, 2, "why", Elastic(3, 2, tmp_path / "hosts", ["a", "b"]))
    msg = " ".join(str(e.value).split())
    assert e.value.exit_code == 2 and f"--hosts {tmp_path / 'hosts'} lists 2 host(s) at the restart" in msg
    assert "global batch of 15 images (3 × data.batch_size 5) cannot be shared equally by 2" in msg, msg


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """A folder with r.yaml (the tiny net, 2 classes: 4 epochs of 9 steps of 2 workers × 16), the
    job's uninterrupted run on 2 workers and the elastic job (:func:`_elastic`), both started in the
    background: they run beside the first test's job (their processes are not that job's
    descendants). ``wait()`` returns the uninterrupted run folder."""
    folder = tmp_path_factory.mktemp("restart")
    prefix = helpers.tiny_symbol(folder)
    r = helpers.tiny_recipe(prefix, name="r", export=[], data={"classes": ["5", "6"]}, epochs=4, lr=0.05, seed=3,
                            log_every=1, guards="off", distributed={"backend": "kvstore"})
    r["surgery"] = {"head": {"classes": 2}}  # 2 classes: 9 steps an epoch
    (folder / "r.yaml").write_text(yaml.safe_dump(r))
    full = Launch(folder, "-n", "2", "--", "finetune", "-r", "r.yaml", "--runs", "full", "-q")
    elastic = _elastic(folder)
    done = []

    def wait():
        if not done:
            code, out, err = full.finish(timeout=180)
            assert code == 0, out[-3000:] + err[-3000:]
            done.extend((folder / "full").iterdir())
        return done[0]
    try:
        yield folder, wait, elastic
    finally:
        for job in (full, elastic[0]):
            if job.popen.poll() is None:  # a test failed before it waited: the job goes
                job.started.update(descendants(job.popen.pid))
                job.cleanup()


def _elastic(folder):
    """``--max-restarts 1 -n 2`` over a hosts file of ``localhost`` and ``127.0.0.1`` (two hosts
    that run here, without ssh: the ssh path is test_multihost's); after rank 0's epoch-2 line a
    thread takes ``127.0.0.1`` out of the file and kills worker 1. Returns the Launch, the thread
    and a list that gets the thread's error, if any."""
    (folder / "hosts").write_text("localhost\n127.0.0.1\n")
    job = Launch(folder, "--max-restarts", "1", "--restart-delay", "0", "-n", "2", "--hosts", "hosts", "--",
                 "finetune", "-r", "r.yaml", "--runs", "elastic", "-q")
    errors = []

    def kill():
        try:
            job.wait_for(r"^\[worker \d\] epoch 2/4", timeout=240)
            (folder / "hosts").write_text("localhost  # 127.0.0.1 is gone\n")  # read again at the restart
            job.started.update(descendants(job.popen.pid))
            os.kill(_worker(job, 1), signal.SIGKILL)
        except BaseException as e:  # the test reports it
            errors.append(e)
    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return job, thread, errors


def test_a_worker_killed_twice_restarts_and_ends_as_the_uninterrupted_job(uninterrupted, launched):  # noqa: F811
    folder, full, _ = uninterrupted
    job = launched(folder, "--max-restarts", "2", "--restart-delay", "0", "-n", "2", "--", "finetune",
                   "-r", "r.yaml", "--runs", "killed", "-q")
    killed = []
    for epoch in (2, 3):  # rank 0's line: epoch 1 (then 2) is checkpointed, every worker trains on
        job.wait_for(rf"^\[worker \d\] epoch {epoch}/4", timeout=180)
        job.started.update(descendants(job.popen.pid))
        killed.append(_worker(job, 1))
        os.kill(killed[-1], signal.SIGKILL)
    code, out, err = job.finish(timeout=120)
    assert code == 0, out[-3000:] + err[-3000:]
    assert err.count("gluontl launch: worker 1 (rank ") == 2, err
    assert "Restart 1 of 2 in 0 s, from step" in err and "Restart 2 of 2 in 0 s, from step" in err
    a, (b,) = full(), (folder / "killed").iterdir()  # one run folder, resumed
    rows = [json.loads(line) for line in RunFolder(b).restarts_path.read_text().splitlines()]
    assert [row["restart"] for row in rows] == [1, 2] and all(row["of"] == 2 for row in rows)
    assert all(f"pid {pid}" in row["reason"] and "SIGKILL" in row["reason"] for row, pid in zip(rows, killed))
    # from the checkpoint of epoch 1 or 2, then 2 or 3 (the kill may come before rank 0 saved)
    assert [row["from_epoch"] for row in rows] in ([1, 2], [1, 3], [2, 2], [2, 3]), rows
    steps = json.loads(RunFolder(a).plan_json_path.read_text())["epoch_data"]["batches"]
    assert all(row["from_step"] == steps * row["from_epoch"] for row in rows)
    assert rows[0]["command"][:3] == ["finetune", "--resume", str(b.resolve())]
    for tag in ("best", "last"):
        assert RunFolder(a).checkpoint_params(tag).read_bytes() == RunFolder(b).checkpoint_params(tag).read_bytes()
    want, got = (helpers.without_timings(json.loads(line) for line in RunFolder(x).metrics_path.read_text()
                                         .splitlines()) for x in (a, b))
    assert got == want and len(want) == 4 * steps + 4
    assert {RunFolder(b).worker_digest(k).read_text() for k in (0, 1)} == {RunFolder(a).worker_digest(0).read_text()}
    assert survivors(job.started) == []



def test_a_host_taken_out_of_the_file_before_a_restart_leaves_the_job_on_fewer_workers(uninterrupted):
    """The elastic job of the fixture: the file read again at the restart, and the elastic resume.
    The result agrees with the uninterrupted run within float32 summation error (docs/distributed.md:
    only the order in which a step's 32 per-image gradients are added changes)."""
    folder, full, (job, thread, errors) = uninterrupted
    thread.join(240)
    assert not thread.is_alive() and errors == [], errors
    code, out, err = job.finish(timeout=180)
    assert code == 0, out[-3000:] + err[-3000:]
    assert "lists 1 host(s) now: restart 1 runs 1 worker(s) instead of 2" in " ".join(err.split()), err
    assert "resuming on 1 worker(s) a run trained on 2: data.batch_size 32 per worker, 32 images a step" in out
    (run,) = (folder / "elastic").iterdir()
    (row,) = [json.loads(line) for line in RunFolder(run).restarts_path.read_text().splitlines()]
    assert row["workers"] == 1 and row["hosts"] == ["localhost"] and row["from_epoch"] in (1, 2), row
    assert row["command"][:3] == ["finetune", "--resume", str(run.resolve())]
    a = full()
    got, want = helpers.checkpoint_params(run), helpers.checkpoint_params(a)
    assert got.keys() == want.keys()
    # each step after the resume sums its 32 per-image gradients in another order: f32_tol's
    # bound for a 32-term sum, once per step, at the size of the values (the rounding passed on)
    after = 4 * 9 - row["from_step"]
    for k in want:
        helpers.assert_f32_close(got[k], want[k], terms=32, depth=after, err_msg=k)
    rows = [[r for r in map(json.loads, RunFolder(x).metrics_path.read_text().splitlines()) if "loss" in r]
            for x in (run, a)]
    assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]] and len(rows[1]) == 4 * 9
    before = row["from_step"]  # the steps before the checkpoint are the 2-worker job's own rows: equal
    assert [r["loss"] for r in rows[0][:before]] == [r["loss"] for r in rows[1][:before]]
    helpers.assert_f32_close([r["loss"] for r in rows[0]], [r["loss"] for r in rows[1]], terms=32, depth=after)
    assert survivors(job.started) == []
