"""gluontl launch --max-restarts: a job whose worker is killed twice restarts from its last
checkpoint each time and ends bit-identical to the same job never interrupted; bad values exit 2."""
import json
import os
import signal

import pytest
import yaml

from tests import helpers
from tests.dist.test_launch import descendants, environ, launched, survivors  # noqa: F401 (a fixture)
from tests.helpers import assert_one_paragraph

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


def test_a_worker_killed_twice_restarts_and_ends_as_the_uninterrupted_job(tmp_path, launched):  # noqa: F811
    prefix = helpers.tiny_symbol(tmp_path)
    r = helpers.tiny_recipe(prefix, name="r", export=[], data={"classes": ["5", "6"]}, epochs=4, lr=0.05, seed=3,
                            log_every=1, guards="off", distributed={"backend": "kvstore"})
    r["surgery"] = {"head": {"classes": 2}}  # 2 classes: 9 steps an epoch
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(r))
    # the uninterrupted job runs alongside the killed one (its processes are not the killed job's descendants)
    full = launched(tmp_path, "-n", "2", "--", "finetune", "-r", "r.yaml", "--runs", "full", "-q")
    try:
        job = launched(tmp_path, "--max-restarts", "2", "--restart-delay", "0", "-n", "2", "--", "finetune",
                       "-r", "r.yaml", "--runs", "killed", "-q")
        killed = []
        for epoch in (2, 3):  # rank 0's line: epoch 1 (then 2) is checkpointed, every worker trains on
            job.wait_for(rf"^\[worker \d\] epoch {epoch}/4", timeout=180)
            job.started.update(descendants(job.popen.pid))
            killed.append(_worker(job, 1))
            os.kill(killed[-1], signal.SIGKILL)
        code, out, err = job.finish(timeout=120)
        full_code, full_out, full_err = full.finish(timeout=120)
    finally:
        if full.popen.poll() is None:  # a failure above: the fixture's cleanup ends these too
            full.started.update(descendants(full.popen.pid))
    assert full_code == 0, full_out[-3000:] + full_err[-3000:]
    assert code == 0, out[-3000:] + err[-3000:]
    assert err.count("gluontl launch: worker 1 (rank ") == 2, err
    assert "Restart 1 of 2 in 0 s, from step" in err and "Restart 2 of 2 in 0 s, from step" in err
    (a,), (b,) = (tmp_path / "full").iterdir(), (tmp_path / "killed").iterdir()  # one run folder, resumed
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

