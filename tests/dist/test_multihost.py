"""gluontl launch across real network stacks: 3 hosts as network namespaces with sshd
(tests/dist/netns.py), the launcher and scheduler on the third, servers and workers on the other
two through the real ssh path; faults injected with iptables, tc tbf and links taken down. After
the module, no namespace, sshd or job process of it is left (checked here)."""
import json
import os
import re
import signal
import time

import pytest
import yaml

from tests import helpers
from tests.dist import netns
from tests.dist.test_launch import Launch, descendants, environ
from tests.helpers import assert_one_paragraph

from gluontl.runfolder import RunFolder

WHY_NOT = netns.unavailable()
pytestmark = [pytest.mark.multihost, pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))]
STEP_TIMEOUT = 20  # s: ssh's ServerAlive probes (6 s, netns.Cluster.ssh) name a silent host before a worker's watchdog fires


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster")
    c = netns.Cluster(folder, {"PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                               "GLUONTL_HOME": os.environ.get("GLUONTL_HOME", str(folder / "home"))})
    try:
        yield c
    finally:
        c.close()
        assert not set(c.hosts) & set(c.namespaces())
        assert not [p for p in _processes() if str(folder) in p[1] or "gluontl" in p[1] and str(folder.parent) in p[1]]
        assert not list(folder.glob("id_ed25519*"))


def _processes():
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                out.append((int(name), open(f"/proc/{name}/cmdline", "rb").read().replace(b"\0", b" ").decode()))
            except OSError:
                pass
    return out


class _Reference:
    """The job's run on loopback, started in the background: its processes are on this machine's
    own stack, not on the test hosts, so it overlaps the first test's job instead of preceding it.
    ``run()`` waits for it (once) and returns its run folder."""

    def __init__(self, folder):
        self.folder, self.folder_of = folder, None
        self.launch = Launch(folder, "-n", "2", "--servers", "2", "--", "finetune", "-r", "r.yaml",
                             "--runs", "loopback", "-q")

    def run(self):
        if self.folder_of is None:
            code, out, err = self.launch.finish(180)
            assert code == 0, out[-3000:] + err[-3000:]
            (self.folder_of,) = (self.folder / "loopback").iterdir()
        return self.folder_of

    def close(self):
        if self.launch.popen.poll() is None:  # a test failed before it waited: the job goes
            self.launch.started.update(descendants(self.launch.popen.pid))
            self.launch.cleanup()


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """A folder with r.yaml (the tiny net, 2 classes, 2 epochs of 9 steps of 2 workers × 16) and
    the same job's run on loopback: the reference (a :class:`_Reference`)."""
    folder = tmp_path_factory.mktemp("mhjob")
    prefix = helpers.tiny_symbol(folder)
    r = helpers.tiny_recipe(prefix, name="r", export=[], data={"classes": ["5", "6"]}, epochs=2, lr=0.05, seed=3,
                            log_every=1, guards="off",
                            distributed={"backend": "kvstore", "step_timeout": STEP_TIMEOUT})
    r["surgery"] = {"head": {"classes": 2}}
    (folder / "r.yaml").write_text(yaml.safe_dump(r))
    ref = _Reference(folder)
    try:
        yield folder, ref
    finally:
        ref.close()


def _start(cluster, folder, *args, runs):
    """``launch -n 2 --servers 2`` on the third host over the other two; ``args`` go to finetune."""
    (folder / "hosts").write_text("".join(f"{cluster.address[h]} cpus=1\n" for h in cluster.hosts[:2]))
    return Launch(folder, "-n", "2", "--servers", "2", "--hosts", "hosts", "--ssh", cluster.ssh(), "--",
                  "finetune", "-r", "r.yaml", "--runs", runs, "-q", *args,
                  prefix=("ip", "netns", "exec", cluster.hosts[2]))


def _same_run(a, b):
    assert RunFolder(a).checkpoint_params("best").read_bytes() == RunFolder(b).checkpoint_params("best").read_bytes()
    assert RunFolder(a).checkpoint_params("last").read_bytes() == RunFolder(b).checkpoint_params("last").read_bytes()
    rows = [helpers.without_timings(json.loads(x) for x in RunFolder(r).metrics_path.read_text().splitlines())
            for r in (a, b)]
    assert rows[0] == rows[1] and len(rows[0]) == 2 * 9 + 2


def _job_processes(cluster):
    """(host, pid) of every process on the worker hosts but their sshd listeners."""
    listeners = {int(p) for p in (s.pid for s in cluster.sshd)}
    out = []
    for h in cluster.hosts:
        for pid in cluster.pids(h):
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            if pid not in listeners and b"-D\0-e\0-f" not in cmd:
                out.append((h, pid))
    return out


def _finish(launch, timeout):
    try:
        return launch.finish(timeout)
    finally:
        if launch.popen.poll() is None:
            launch.popen.kill()
            launch.popen.wait()


def test_loss_and_a_slow_link_leave_the_weights_bit_identical(cluster, job):
    folder, ref = job
    for h in cluster.hosts[:2]:  # 1 % of the packets into each worker host dropped, a 5 Mbit/s link out of it
        cluster.exec(h, "iptables", "-A", "INPUT", "-m", "statistic", "--mode", "random", "--probability", "0.01",
                     "-j", "DROP")
        cluster.exec(h, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "5mbit", "burst", "32kbit",
                     "latency", "400ms")
    try:
        code, out, err = _finish(_start(cluster, folder, runs="lossy"), 240)
    finally:
        for h in cluster.hosts[:2]:
            cluster.exec(h, "iptables", "-F", "INPUT")
            cluster.exec(h, "tc", "qdisc", "del", "dev", "eth0", "root")
    assert code == 0, out[-3000:] + err[-3000:]
    starts = set(re.findall(r"^\[(?:worker|server) \d\] ", out, re.M))
    assert {"[worker 0] ", "[worker 1] "} <= starts
    (run,) = (folder / "lossy").iterdir()
    _same_run(ref.run(), run)
    assert _job_processes(cluster) == []


def test_an_ssh_client_killed_stops_its_remote_process(cluster, job):
    folder, _ = job
    launch = _start(cluster, folder, "--set", "train.epochs=200", runs="sshkill")
    try:
        launch.wait_for(r"^\[worker \d\] epoch 1/", timeout=180)
        host = cluster.hosts[1]
        remote = [p for p in cluster.pids(host) if environ(p).get("GLUONTL_LAUNCH_INDEX") == "1"]
        client = [p for p, cmd in _processes() if cmd.startswith("ssh ") and "GLUONTL_LAUNCH_INDEX=1" in cmd]
        assert len(remote) == 1 and len(client) == 1, (remote, client)
        os.kill(client[0], signal.SIGKILL)
        killed = time.monotonic()
        code, out, err = _finish(launch, 60)
    finally:
        launch.cleanup()
    assert code == 1, err
    assert re.match(rf"error: worker 1 \(rank \d, host {cluster.address[host]}, pid {remote[0]}\) was killed by "
                    r"SIGKILL; stopped the \d other processes", " ".join(err.split())), err
    assert time.monotonic() - killed < 30
    assert _job_processes(cluster) == []  # the remote worker too: not orphaned


def test_a_worker_host_that_drops_off_ends_the_job_and_resume_continues_exactly(cluster, job):
    folder, ref = job
    launch = _start(cluster, folder, runs="drop")
    host = cluster.hosts[1]
    try:
        launch.wait_for(r"^\[worker \d\] epoch 1/", timeout=180)  # rank 0 saves epoch 1 after this line
        deadline, run = time.monotonic() + 60, RunFolder(folder / "drop" / "r")
        while not run.has_checkpoint("last"):  # then epoch 2 trains
            assert time.monotonic() < deadline and launch.popen.poll() is None
            time.sleep(0.05)
        cluster.link(host, up=False)
        down = time.monotonic()
        code, out, err = _finish(launch, STEP_TIMEOUT + 30)
        while _job_processes(cluster) and time.monotonic() - down < STEP_TIMEOUT + 30:
            time.sleep(0.5)  # the dropped host's own processes end when its sshd gives up on the client
        left = _job_processes(cluster)
    finally:
        cluster.link(host, up=True)
        launch.cleanup()
    assert time.monotonic() - down < STEP_TIMEOUT + 30 and left == [], left
    assert code == 1, err
    assert cluster.address[host] in " ".join(err.split()) and "scheduler's host" not in err, err
    (run,) = (folder / "drop").iterdir()
    again = Launch(folder, "-n", "2", "--servers", "2", "--hosts", "hosts", "--ssh", cluster.ssh(), "--", "finetune",
                   "--resume", str(run), "-q", prefix=("ip", "netns", "exec", cluster.hosts[2]))
    code, out, err = _finish(again, 240)
    assert code == 0, out[-3000:] + err[-3000:]
    _same_run(ref.run(), run)


def test_the_scheduler_host_dropping_off_ends_every_process_everywhere(cluster, job):
    """The launcher and the scheduler share the third host: its link down, ssh's ServerAlive ends
    the launcher's sessions, each worker host's sshd drops the silent client and the session's
    watcher ends what it ran."""
    folder, _ = job
    launch = _start(cluster, folder, "--set", "train.epochs=200", runs="schedulerdown")
    try:
        launch.wait_for(r"^\[worker \d\] epoch 1/", timeout=180)
        cluster.link(cluster.hosts[2], up=False)
        down = time.monotonic()
        code, out, err = _finish(launch, STEP_TIMEOUT + 30)
        while _job_processes(cluster) and time.monotonic() - down < STEP_TIMEOUT + 30:
            time.sleep(0.5)
        left = _job_processes(cluster)
    finally:
        cluster.link(cluster.hosts[2], up=True)
        launch.cleanup()
    assert code == 1 and left == [], (err, left)
    msg, where = " ".join(err.split()), re.escape(cluster.address[cluster.hosts[2]])
    assert re.match(rf"error: the scheduler's host {where} \(scheduler, and this launcher\) lost the network: none "
                    r"of the hosts 10\.\d+\.\d+\.11, 10\.\d+\.\d+\.12 answered", msg), msg
    assert re.search(r"\(\w+ \d \((?:rank \d, )?host 10\.\d+\.\d+\.1[12], pid \d+\) exited with code 255", msg), msg


def test_unreachable_or_keyless_hosts_are_refused_before_anything_starts(cluster, tmp_path, capsys):
    (tmp_path / "hosts").write_text(f"{cluster.address[cluster.hosts[0]]}\n{cluster.gateway[:-1]}99\n")
    code, out, err = helpers.run_cli(capsys, "launch", "-n", "2", "--hosts", str(tmp_path / "hosts"), "--ssh",
                                     cluster.ssh(), "--", "finetune", "-r", "r.yaml")
    assert_one_paragraph(code, out, err, [f"host '{cluster.gateway[:-1]}99' does not answer", "No process"])
    netns.sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other"))
    (tmp_path / "hosts").write_text(f"{cluster.address[cluster.hosts[0]]}\n")
    code, out, err = helpers.run_cli(capsys, "launch", "-n", "1", "--hosts", str(tmp_path / "hosts"), "--ssh",
                                     cluster.ssh().replace(str(cluster.key), str(tmp_path / "other")), "--",
                                     "finetune", "-r", "r.yaml")
    assert_one_paragraph(code, out, err, ["Permission denied", "key access", "BatchMode"])
