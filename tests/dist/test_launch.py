"""gluontl launch: the process plan, bad input, and real jobs that succeed, fail or lose a worker,
after which no process the launcher started may survive."""
import os
import queue
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from tests import helpers
import pytest
import yaml
from tests.helpers import assert_one_paragraph

from gluontl.dist.launch import Host, plan, read_hosts
from gluontl.errors import LaunchError

ARGS = ["finetune", "--recipe", "r.yaml"]


def by_name(procs):
    return {p.name: p for p in procs}


# ----------------------------------------------------------------- the plan (pure)

def test_plan_on_this_machine_splits_the_cores_over_the_workers():
    procs = by_name(plan(ARGS, workers=3, servers=2, root_uri="127.0.0.1", port=4242, cpus=7, python="PY"))
    assert list(procs) == ["scheduler", "server 0", "server 1", "worker 0", "worker 1", "worker 2"]
    for p in procs.values():
        assert p.host is None
        assert {k: p.env[k] for k in ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_WORKER", "DMLC_NUM_SERVER",
                                      "DMLC_NODE_HOST")} == {
            "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "4242", "DMLC_NUM_WORKER": "3",
            "DMLC_NUM_SERVER": "2", "DMLC_NODE_HOST": "127.0.0.1"}
        assert p.env["DMLC_ROLE"] == p.role
        assert "PORT" not in p.env
    for name in ("scheduler", "server 0", "server 1"):
        assert procs[name].argv == ("PY", "-c", "import gluontl.npcompat, mxnet")
        assert procs[name].env["OMP_NUM_THREADS"] == "1" and "GLUONTL_LAUNCH_INDEX" not in procs[name].env
    for i in range(3):
        w = procs[f"worker {i}"]
        assert w.argv == ("PY", "-m", "gluontl", *ARGS)
        assert w.env["GLUONTL_LAUNCH_INDEX"] == str(i) and w.env["OMP_NUM_THREADS"] == "2"  # 7 // 3
    many = plan(ARGS, workers=5, cpus=2)
    assert {p.env["OMP_NUM_THREADS"] for p in many if p.role == "worker"} == {"1"}  # never 0
    mine = plan(ARGS, workers=2, cpus=8, threads="3")  # the user's OMP_NUM_THREADS wins
    assert [p.env["OMP_NUM_THREADS"] for p in mine] == ["1", "1", "3", "3"]


def test_environ_drops_port_and_adds_the_plan_only_for_local_processes():
    local, = [p for p in plan(ARGS, workers=1) if p.name == "worker 0"]
    env = local.environ({"PORT": "9000", "PATH": "/bin", "OMP_NUM_THREADS": "8"})
    assert "PORT" not in env and env["PATH"] == "/bin"
    assert env["OMP_NUM_THREADS"] == local.env["OMP_NUM_THREADS"] and env["DMLC_ROLE"] == "worker"
    remote, = [p for p in plan(ARGS, workers=1, hosts=[Host("far")]) if p.name == "worker 0"]
    assert remote.environ({"PORT": "9000", "PATH": "/bin"}) == {"PATH": "/bin"}  # its variables travel in argv


def test_plan_over_hosts_round_robin_with_ssh():
    hosts = [Host("me@a.example"), Host("b.example", cpus=16), Host("localhost")]
    procs = by_name(plan(ARGS, workers=4, servers=2, hosts=hosts, root_uri="10.0.0.1", port=5000, cpus=6,
                         python="/opt/py", cwd="/data/my runs", ssh=("ssh", "-o", "BatchMode=yes")))
    where = {n: p.host.name if p.host else None for n, p in procs.items()}
    assert where == {"scheduler": None, "server 0": "me@a.example", "server 1": "b.example",
                     "worker 0": "me@a.example", "worker 1": "b.example", "worker 2": None, "worker 3": "me@a.example"}
    threads = {n: p.env["OMP_NUM_THREADS"] for n, p in procs.items() if p.role == "worker"}
    assert threads == {"worker 0": "3", "worker 1": "16", "worker 2": "6", "worker 3": "3"}  # a: 2 workers of 6 cores
    node = {n: p.env["DMLC_NODE_HOST"] for n, p in procs.items()}
    assert node == {"scheduler": "10.0.0.1", "server 0": "a.example", "server 1": "b.example",
                    "worker 0": "a.example", "worker 1": "b.example", "worker 2": "10.0.0.1", "worker 3": "a.example"}
    w = procs["worker 3"]
    assert w.argv[:4] == ("ssh", "-o", "BatchMode=yes", "me@a.example")
    words = shlex.split(w.argv[4])
    assert words[:3] == ["cd", "/data/my runs", "&&"]  # quoted: the path has a space
    run = words[len(words) - words[::-1].index("exec") - 1:]
    assert run[:4] == ["exec", "env", "-u", "PORT"]
    assert dict(a.split("=", 1) for a in run[4:-9]) == w.env
    assert run[-9:] == ["/opt/py", "-m", "gluontl", *ARGS, "<", "/dev/null", "3<&-"]  # stdin: the watcher's
    assert procs["worker 2"].argv == ("/opt/py", "-m", "gluontl", *ARGS)  # localhost: no ssh
    twice = plan(ARGS, workers=2, hosts=[Host("a"), Host("a")], cpus=4)
    assert [p.env["OMP_NUM_THREADS"] for p in twice if p.role == "worker"] == ["2", "2"]  # one machine, 2 workers


def test_hosts_file(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# the cluster\n\nnode1\n  node2 cpus=8   # the big one\nme@node3\n")
    assert read_hosts(f) == [Host("node1"), Host("node2", 8), Host("me@node3")]
    f.write_text("# nobody\n\n")
    with pytest.raises(LaunchError, match="lists no host"):
        read_hosts(f)
    f.write_text("node1\nnode2 slots=2\n")
    with pytest.raises(LaunchError, match=r"hosts, line 2: 'node2 slots=2' is not HOST or HOST cpus=N"):
        read_hosts(f)
    f.write_text("node1 cpus=0\n")
    with pytest.raises(LaunchError, match="line 1"):
        read_hosts(f)
    with pytest.raises(LaunchError, match=r"missing: cannot read the file \(No such file"):
        read_hosts(tmp_path / "missing")


# ----------------------------------------------------------------- bad input: exit 2, one paragraph

@pytest.mark.parametrize("args, says", [
    (["-n", "0", "--", "finetune"], "at least one worker"),
    (["-n", "2", "--servers", "0", "--", "finetune"], "at least one worker and one server"),
    (["-n", "2"], "after `--`"),
    (["-n", "2", "--"], "after `--`"),
    (["-n", "2", "--", "python", "train.py"], "'python' is not one"),
    (["-n", "2", "--", "launch", "-n", "2"], "'launch' is not one"),
    (["-n", "2", "--hosts", "no-such-file", "--", "finetune"], "--hosts no-such-file: cannot read"),
    (["-n", "2", "--root-uri", "192.0.2.1", "--", "finetune"], "--root-uri 192.0.2.1: not an address of this"),
])
def test_bad_input(capsys, args, says):
    code, out, err = helpers.run_cli(capsys, "launch", *args)
    assert out == ""
    assert_one_paragraph(code, out, err, [says])


def test_bad_hosts_line_names_file_and_line(capsys, tmp_path):
    (tmp_path / "hosts").write_text("a\nb c d\n")
    code, out, err = helpers.run_cli(capsys, "launch", "-n", "1", "--hosts", str(tmp_path / "hosts"), "--", "plan")
    assert_one_paragraph(code, out, err, [f"{tmp_path / 'hosts'}, line 2: 'b c d'"])


# ----------------------------------------------------------------- real jobs

@pytest.fixture(scope="module")
def job_dir(tmp_path_factory):
    """A folder with r.yaml: the tiny symbol net on 16×16 digits trained by the parameter server,
    long enough to be killed mid-run (--set train.epochs=1 for a short job)."""
    folder = tmp_path_factory.mktemp("job")
    prefix = helpers.tiny_symbol(folder)
    recipe = helpers.tiny_recipe(prefix, epochs=200, lr=0.05, guards="off", distributed={"backend": "kvstore"})
    (folder / "r.yaml").write_text(yaml.safe_dump(recipe))
    return folder


def _stat(pid):
    """(state, parent pid, start time) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return fields[0], int(fields[1]), fields[19]


def descendants(root):
    """Every process below ``root`` now, as pid -> start time (a pid may be reused later)."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (s := _stat(int(name))) is not None:
            parent[int(name)] = s[1]
    found, todo = {}, [root]
    while todo:
        p = todo.pop()
        for child, up in parent.items():
            if up == p and child not in found and (s := _stat(child)) is not None:
                found[child] = s[2]
                todo.append(child)
    return found


def survivors(procs):
    return [p for p, start in procs.items() if (s := _stat(p)) is not None and s[0] != "Z" and s[2] == start]


class Launch:
    """``gluontl launch ARGS`` in a subprocess; its stdout lines come through a queue, so a test
    waits for a line with a timeout instead of sleeping."""

    def __init__(self, cwd, *args, env=None, prefix=()):
        self.popen = subprocess.Popen([*prefix, sys.executable, "-m", "gluontl", "launch", *args], cwd=cwd,
                                      env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True)
        self.lines, self.out, self.err = queue.Queue(), [], []
        threading.Thread(target=self._read, args=(self.popen.stdout, self.lines), daemon=True).start()
        self._err = threading.Thread(target=lambda: self.err.extend(self.popen.stderr), daemon=True)
        self._err.start()
        self.started = {}

    @staticmethod
    def _read(stream, q):
        for line in stream:
            q.put(line)
        q.put(None)

    def wait_for(self, pattern, timeout=90.0):
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            assert line is not None, f"launch ended before {pattern!r}:\n{''.join(self.out + self.err)}"
            self.out.append(line)
            if re.search(pattern, line):
                return line

    def finish(self, timeout):
        """Exit code, stdout, stderr once the launcher exits within ``timeout`` seconds."""
        code = self.popen.wait(timeout)
        while (line := self.lines.get(timeout=timeout)) is not None:
            self.out.append(line)
        self._err.join(timeout)
        return code, "".join(self.out), "".join(self.err)

    def cleanup(self):
        """Whatever a failed test left: the launcher and every process it started."""
        for pid in [*survivors(self.started), self.popen.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.popen.wait()


@pytest.fixture
def launched():
    runs = []

    def start(*args, **kw):
        runs.append(Launch(*args, **kw))
        return runs[-1]

    yield start
    for r in runs:
        r.cleanup()


def environ(pid):
    with open(f"/proc/{pid}/environ", "rb") as fh:
        return dict(v.decode().partition("=")[::2] for v in fh.read().split(b"\0") if v)


def test_a_killed_worker_stops_the_whole_job(job_dir, launched):
    job = launched(job_dir, "-n", "2", "--", "finetune", "-r", "r.yaml", "--runs", "runs", "-q", env={"PORT": "80"})
    job.wait_for(r"^\[worker \d\] epoch 1/")
    job.started = descendants(job.popen.pid)
    children = {p: environ(p) for p in job.started if _stat(p)[1] == job.popen.pid}
    assert sorted(e["DMLC_ROLE"] for e in children.values()) == ["scheduler", "server", "worker", "worker"]
    assert not any("PORT" in e for e in children.values())  # ps-lite would bind it in every process
    workers = {e["GLUONTL_LAUNCH_INDEX"]: p for p, e in children.items() if e["DMLC_ROLE"] == "worker"}
    assert set(workers) == {"0", "1"}
    os.kill(workers["1"], signal.SIGKILL)
    killed = time.monotonic()
    code, out, err = job.finish(timeout=30)  # worker 0 waits for worker 1's gradients: it takes SIGKILL
    assert time.monotonic() - killed < 30
    assert code == 1, err
    rank, = re.findall(r"^\[worker 1\] gluontl worker: rank (\d) of 2$", out, re.M)  # the scheduler's choice
    msg = " ".join(err.split())
    assert re.search(rf"^error: worker 1 \(rank {rank}, pid {workers['1']}\) was killed by SIGKILL; stopped the 3 "
                     rf"other processes of the job\. .*\[worker 1\]\) and in logs/worker-{rank}\.log", msg), msg
    assert "Traceback" not in err and msg.count("error:") == 1
    assert survivors(job.started) == []


def test_a_worker_refusing_its_recipe_exits_2(job_dir, launched):
    job = launched(job_dir, "-n", "2", "--", "finetune", "-r", "r.yaml", "--set", "train.epochs=0")
    code, out, err = job.finish(timeout=60)
    assert code == 2, err
    assert re.search(r"^\[worker [01]\] error: .*train\.epochs", out, re.M), out
    msg = " ".join(err.split())
    assert re.match(r"error: worker [01] \(pid \d+\) exited with code 2; .*refused its input", msg), msg
    assert "--set" not in err  # the worker's own message names it; launch's --set would be another's
    assert "Traceback" not in out + err


def test_workers_that_finish_end_the_job_with_0(job_dir, launched):
    job = launched(job_dir, "-n", "2", "--", "finetune", "-r", "r.yaml", "--set", "train.epochs=1",
                   "--runs", "ok", "-q")
    job.wait_for(r"^\[worker \d\] epoch 1/1")
    job.started = descendants(job.popen.pid)
    code, out, err = job.finish(timeout=60)
    assert code == 0, out + err
    assert err == ""
    # rank 0 alone prints its epoch lines and result; the other worker's go to its log only
    (root, line), = re.findall(r"^\[worker (\d)\] (epoch 1/1 .*)$", out, re.M)
    assert re.search(rf"^\[worker {root}\] done: best", out, re.M) and "done (rank 1)" not in out, out
    assert re.search(r"^\[worker \d\] gluontl worker: rank 1 of 2$", out, re.M)  # how launch names a failing rank
    run, = (job_dir / "ok").iterdir()  # one job: rank 0 writes the run folder
    other = (run / "logs" / "worker-1.log").read_text()
    assert "epoch 1/1 train_loss" in other and "done (rank 1); rank 0 wrote the run folder" in other
    assert line in (run / "logs" / "worker-0.log").read_text()
    assert survivors(job.started) == []


FAKE_SSH = """#!/bin/sh
# ssh stand-in: logs the host and command, drops the options, and runs the command in a new
# session as sshd does (so stopping the local ssh process does not stop it)
while [ $# -gt 0 ]; do case "$1" in -o) shift 2 ;; -*) shift ;; *) break ;; esac; done
host=$1; shift
printf '%s %s\\n' "$host" "$*" >> "$FAKE_SSH_LOG"
exec setsid -w sh -c "$*"
"""


def test_hosts_over_ssh(job_dir, launched, tmp_path):
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    log = tmp_path / "ssh.log"
    (tmp_path / "hosts").write_text("# two machines\n127.0.0.2\n\n127.0.0.3 cpus=1\n")
    job = launched(job_dir, "-n", "2", "--servers", "2", "--hosts", str(tmp_path / "hosts"), "--ssh",
                   f"{ssh} -o BatchMode=yes", "--", "plan", "-r", "r.yaml", env={"FAKE_SSH_LOG": str(log)})
    job.wait_for(r"^\[worker \d\] ")
    job.started = descendants(job.popen.pid)
    code, out, err = job.finish(timeout=60)
    assert code == 0, out + err
    assert re.search(r"^\[worker 0\] .*conv", out, re.M) and re.search(r"^\[worker 1\] .*conv", out, re.M)
    assert "gluontl launch: pid" not in out  # the remote PID line is the launcher's, not shown
    starts = [l.split(" ", 1) for l in log.read_text().splitlines() if "DMLC_ROLE" in l]
    where = sorted((host, re.search(r"DMLC_ROLE=(\w+)", cmd).group(1)) for host, cmd in starts)
    assert where == [("127.0.0.2", "server"), ("127.0.0.2", "worker"), ("127.0.0.3", "server"),
                     ("127.0.0.3", "worker")]
    for host, cmd in starts:
        assert f"DMLC_NODE_HOST={host}" in cmd and "DMLC_PS_ROOT_URI=127.0.0.1" in cmd  # the route to 127.0.0.2
    # the servers outlive workers that never connect: stopped on their hosts, by PID, through ssh
    kills = re.findall(r"^(\S+) kill -TERM -(\d+)$", log.read_text(), re.M)
    assert sorted(h for h, _ in kills) == ["127.0.0.2", "127.0.0.3"]
    assert all(int(pid) in job.started for _, pid in kills)
    assert survivors(job.started) == []


def test_a_stopped_launcher_lets_the_workers_checkpoint(job_dir, launched):
    job = launched(job_dir, "-n", "2", "--", "finetune", "-r", "r.yaml", "--runs", "stop", "-q")
    job.wait_for(r"^\[worker \d\] epoch 1/")
    job.started = descendants(job.popen.pid)
    job.popen.send_signal(signal.SIGTERM)
    code, out, err = job.finish(timeout=60)
    assert code == 143, err
    assert " ".join(err.split()).startswith("error: stopped by SIGTERM: the workers were asked to checkpoint")
    for i in "01":  # each finetune got SIGTERM, checkpointed and said how to resume
        assert re.search(rf"^\[worker {i}\] interrupted: stopped by SIGTERM; the checkpoint is in", out, re.M), out
    run, = (job_dir / "stop").iterdir()
    assert (run / "checkpoints" / "last.json").is_file()
    assert survivors(job.started) == []


def test_a_scheduler_that_cannot_bind_stops_the_job(job_dir, launched):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        job = launched(job_dir, "-n", "2", "--port", str(taken.getsockname()[1]), "--", "finetune", "-r", "r.yaml",
                       "--runs", "bind", "-q")
        code, out, err = job.finish(timeout=60)
    assert code == 1, err
    assert re.search(r"^\[scheduler\] .*bind failed", out, re.M), out
    assert re.match(r"error: scheduler \(pid \d+\) exited with code 1; stopped the 3 other processes",
                    " ".join(err.split())), err


def test_a_worker_killed_on_its_host_stops_every_host(job_dir, launched, tmp_path):
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    (tmp_path / "hosts").write_text("127.0.0.2 cpus=1\n127.0.0.3 cpus=1\n")  # both on this machine's cores
    job = launched(job_dir, "-n", "2", "--hosts", str(tmp_path / "hosts"), "--ssh", str(ssh), "--",
                   "finetune", "-r", "r.yaml", "--runs", "remote", "-q", env={"FAKE_SSH_LOG": str(tmp_path / "log")})
    job.wait_for(r"^\[worker \d\] epoch 1/")  # rank 0's: every worker is training
    job.started = descendants(job.popen.pid)
    worker, = [p for p in job.started if environ(p).get("GLUONTL_LAUNCH_INDEX") == "1"
               and environ(p).get("DMLC_ROLE") == "worker"]
    assert _stat(worker)[1] != job.popen.pid  # it runs in its own session on the "host", not under the launcher
    os.kill(worker, signal.SIGKILL)
    code, out, err = job.finish(timeout=30)
    assert code == 1, err
    assert re.match(rf"error: worker 1 \(rank \d, host 127\.0\.0\.3, pid {worker}\) exited with code \d+",
                    " ".join(err.split())), err
    assert survivors(job.started) == []


def test_the_launcher_makes_a_weights_from_pretrain_once_and_an_unset_backend_trains(tmp_path, launched):
    """The documented recipes as written: no train.distributed (kvstore under launch) and weights
    made by another recipe on first use, made by the launcher before any worker starts; on two
    (fake ssh) hosts, which see the launcher's working folder as a shared file system would."""
    prefix = helpers.tiny_symbol(tmp_path)
    short = {"epochs": 1, "lr": 0.05, "guards": "off"}
    pre = helpers.tiny_recipe(prefix, name="pre", export=[], **short)
    (tmp_path / "pre.yaml").write_text(yaml.safe_dump(pre))
    weights = ".cache/pretrain/tiny.params"
    r = {**pre, "name": "t", "model": {**pre["model"], "weights": weights, "weights_from": "pre.yaml"}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(r))
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(0o755)
    (tmp_path / "hosts").write_text("127.0.0.2 cpus=1\n127.0.0.3 cpus=1\n")
    job = launched(tmp_path, "-n", "2", "--hosts", "hosts", "--ssh", str(ssh), "--", "finetune", "-r", "r.yaml",
                   "--runs", "runs", env={"FAKE_SSH_LOG": str(tmp_path / "ssh.log")})
    code, out, err = job.finish(timeout=240)
    assert code == 0, out[-4000:] + err
    made = [line for line in out.splitlines() if "does not exist yet: making it with pre.yaml" in line]
    assert made == [f"'{weights}' does not exist yet: making it with pre.yaml (one time)"]  # the launcher's own line
    assert out.index(made[0]) < out.index("[worker")  # before any worker started
    assert (tmp_path / weights).is_file()
    assert len(list((tmp_path / ".cache" / "pretrain" / "runs").iterdir())) == 1  # one pretrain, not one per worker
    run, = (tmp_path / "runs").iterdir()
    assert yaml.safe_load((run / "recipe.yaml").read_text())["train"]["distributed"]["backend"] == "kvstore"
    assert len({(run / "logs" / f"worker-{k}.sha256").read_text() for k in (0, 1)}) == 1


def test_the_launcher_makes_a_missing_imagenet_onnx_once(tmp_path, monkeypatch, capsys):
    """A recipe on the ImageNet EfficientNet-Lite0 ONNX with an empty GLUONTL_HOME: the launcher
    converts it before the workers start (each would otherwise convert it at the same time)."""
    from typer.main import get_command

    from gluontl.cli import app
    from gluontl.convert import efficientnet_lite as lite
    from gluontl.dist.launch import make_weights

    monkeypatch.setenv("GLUONTL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    r = {"name": "lite", "model": {"source": f"onnx:$GLUONTL_HOME/models/{lite.ONNX_NAME}",
                                   "input_shape": [3, 224, 224]},
         "surgery": {"head": {"classes": 5}}, "train": {"epochs": 1},
         "data": {**helpers.DIGITS_5_9, "train_transform": {"resize": 224}, "val_transform": {"resize": 224}}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(r))
    made = tmp_path / "home" / "models" / lite.ONNX_NAME
    make_weights(["finetune", "-r", "r.yaml", "--runs", "runs"], get_command(app).commands)
    assert "does not exist yet: making it from the ImageNet weights" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # nothing trained in the launcher
    before = made.stat().st_mtime_ns
    assert lite.ensure_imagenet_onnx() == made and made.stat().st_mtime_ns == before  # valid: not rebuilt
