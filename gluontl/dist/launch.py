"""``gluontl launch``: start a ps-lite job (scheduler, servers, workers) and never leave it hanging.

MXNet's own ``tools/launch.py`` crashes on Python >= 3.9 and exits 0 after failures, and when a
ps-lite worker dies the other workers, the servers and the scheduler wait for it forever. So the
launcher watches every process it starts and, on the first failure, stops all the others (as
torchrun does: SIGTERM to each process group, SIGKILL after a grace) and names the process that
failed. Every child runs in its own session, so a stop reaches its subprocesses (DataLoader
workers) and a Ctrl-C on the terminal reaches only the launcher, which forwards it.

On several machines (``--hosts``) the scheduler runs here and servers and workers go round-robin
over the hosts through ``ssh -o BatchMode=yes HOST 'cd CWD && ... PYTHON -m gluontl ARGS'``: like
MXNet's dmlc tracker this assumes the same paths (working folder, Python, data) on every machine
and key-based ssh; ``localhost`` and ``127.0.0.1`` run here without ssh. A remote command first
prints its PID, which the launcher uses to stop it with ``ssh HOST kill``: closing an ssh
connection does not stop the command it started. So the remote command is also bound to its
session: a watcher there reads the session's stdin, which the launcher holds open, and kills the
command's process group at EOF (the local ssh was killed, or sshd dropped a dead client), so no
remote process outlives its launcher. ssh's ServerAlive probes end a session whose host stopped
answering within 15 s, and before the job starts every host must answer ``ssh HOST true``.

``--max-restarts N`` is torchrun's: after a failure (not a refused input, not a signal) every
process is stopped, and the job starts again, up to N times, from the run's last checkpoint
(``finetune --resume RUN``; the run folder is the one rank 0 reports) — exact, because a resume
is. Each restart is a row of the run folder's restarts record. The hosts file is read again before
each restart, so a dead host taken out of it is left out with its workers: elastic, as torchrun's
``--nnodes MIN:MAX``, no host gets more workers than the busiest host of the first start, and the
global batch stays (the resume rebatches; a count that does not divide it is refused).
"""
from __future__ import annotations

import datetime
import json
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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Mapping, Optional, Sequence

from ..errors import LaunchError
from ..runfolder import RunFolder
from ..threads import physical_cores, user_threads

if TYPE_CHECKING:
    import click

STOP_GRACE = 5.0  # s between SIGTERM and SIGKILL when stopping after a failure
FINISH_GRACE = 10.0  # s the scheduler and servers get to exit by themselves once every worker is done
INTERRUPT_GRACE = 60.0  # s workers get to checkpoint after a forwarded SIGTERM (a step must end first)
LOCAL_HOSTS = ("localhost", "127.0.0.1")  # hosts file entries run on this machine without ssh
SSH = ("ssh", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3")
SSH_CHECK_TIMEOUT = 20.0  # s for `ssh HOST true` before the job starts
RANK_LINE = re.compile(r"gluontl worker: rank (\d+) of (\d+)")
PID_LINE = re.compile(r"^gluontl launch: pid (\d+)$")
RUN_LINE = re.compile(r"gluontl worker: run folder (.+)$")
HOST_LINE = re.compile(r"(\S+)(?:\s+cpus=([1-9]\d{0,5}))?")  # up to 999,999 cores: a number Python can read


@dataclass(frozen=True)
class Host:
    """One machine of a hosts file: ``name`` as ssh reaches it (``user@`` allowed); ``cpus`` its
    cores when they differ from this machine's (``HOST cpus=N``), to split threads over its workers."""

    name: str
    cpus: int | None = None

    @property
    def local(self) -> bool:
        return self.name in LOCAL_HOSTS

    @property
    def address(self) -> str:
        return self.name.rpartition("@")[2]


@dataclass(frozen=True)
class Process:
    """One process of the job as planned: ``env`` holds the variables it gets on top of the
    launcher's environment (which loses ``PORT``); a remote one has them inside its ssh command."""

    role: str  # scheduler, server or worker
    index: int
    host: Host | None  # None: this machine, no ssh
    argv: tuple[str, ...]
    env: dict[str, str]

    @property
    def name(self) -> str:
        return self.role if self.role == "scheduler" else f"{self.role} {self.index}"

    def environ(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment to start ``argv`` in: ``base`` without ``PORT``, which ps-lite would
        bind in every process (collisions, "bind failed")."""
        out = {k: v for k, v in base.items() if k != "PORT"}
        return out if self.host is not None else {**out, **self.env}


def read_hosts(path: Path) -> list[Host]:
    """Hosts file: one host per line, ``HOST`` or ``HOST cpus=N``; ``#`` starts a comment."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise LaunchError(f"--hosts {path}: cannot read the file ({reason}). Pass a text file with one host "
                          f"per line (HOST or HOST cpus=N).") from None
    hosts = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        match = HOST_LINE.fullmatch(entry)
        if match is None:
            raise LaunchError(f"--hosts {path}, line {number}: '{entry}' is not HOST or HOST cpus=N "
                              f"(N a positive number of cores). Fix that line.")
        hosts.append(Host(match[1], int(match[2]) if match[2] else None))
    if not hosts:
        raise LaunchError(f"--hosts {path}: the file lists no host. Write one host per line (HOST or "
                          f"HOST cpus=N; # starts a comment).")
    return hosts


def plan(args: Sequence[str], workers: int, servers: int = 1, hosts: Sequence[Host] = (),
         root_uri: str = "127.0.0.1", port: int = 9091, cpus: int = 1, python: str = sys.executable,
         cwd: str = ".", ssh: Sequence[str] = SSH, threads: str | None = None) -> list[Process]:
    """The scheduler (here), then servers and workers round-robin over ``hosts`` (here when none).

    Workers split their host's cores (``cpus`` here, a host's own ``cpus=`` elsewhere) unless the
    user set ``threads`` (their OMP_NUM_THREADS, which wins as everywhere in gluontl): MXNet sizes
    its thread pool from OMP_NUM_THREADS at import, so it must be in the environment before Python
    starts. Servers and the scheduler only move gradients and get one thread.
    """
    places: list[Host | None] = [None if h.local else h for h in hosts] or [None]
    common = {"DMLC_PS_ROOT_URI": root_uri, "DMLC_PS_ROOT_PORT": str(port),
              "DMLC_NUM_WORKER": str(workers), "DMLC_NUM_SERVER": str(servers)}
    machine = [None if place is None else place.address for place in places]
    on_host = [sum(1 for i in range(workers) if machine[i % len(places)] == m) for m in machine]

    def process(role: str, index: int, slot: int | None, command: list[str], omp: str) -> Process:
        host = places[slot] if slot is not None else None
        env = {**common, "DMLC_ROLE": role, "DMLC_NODE_HOST": host.address if host else root_uri,
               **({"GLUONTL_LAUNCH_INDEX": str(index)} if role == "worker" else {}),
               "OMP_NUM_THREADS": omp}
        if host is None:
            return Process(role, index, None, (python, *command), env)
        # the watcher: EOF on the session's stdin (the launcher or its ssh died) kills the process group
        # (on fd 3: a background list's stdin is /dev/null)
        remote = (f"cd {shlex.quote(cwd)} && echo \"gluontl launch: pid $$\" && exec 3<&0 || exit 1; "
                  f"{{ cat <&3 > /dev/null; kill -KILL -$$; }} > /dev/null 2>&1 & exec env -u PORT "
                  + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " "
                  + shlex.join([python, *command]) + " < /dev/null 3<&-")
        return Process(role, index, host, (*ssh, host.name, remote), env)

    # with DMLC_ROLE set, importing mxnet runs that role until the job ends (numpy's aliases first)
    server = ["-c", "import gluontl.npcompat, mxnet"]
    out = [process("scheduler", 0, None, server, "1")]
    out += [process("server", i, i % len(places), server, "1") for i in range(servers)]
    for i in range(workers):
        slot = i % len(places)
        place = places[slot]
        host_cpus = place.cpus if place is not None and place.cpus else cpus
        split = str(max(1, host_cpus // on_host[slot]))
        out.append(process("worker", i, slot, ["-m", "gluontl", *args], threads or split))
    return out


def free_port(address: str) -> int:
    """A TCP port nothing listens on at ``address`` now (ps-lite binds the scheduler's on every interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((address, 0))
        except OSError as e:
            raise LaunchError(f"--root-uri {address}: not an address of this machine ({e.strerror}); the scheduler "
                              f"runs here. Pass one of this machine's addresses that the hosts can reach.") from None
        return s.getsockname()[1]


def address_towards(hosts: Sequence[Host]) -> str:
    """This machine's address on the route to the first remote host (no packet is sent): the
    address the hosts reach the scheduler at. Loopback when every host is this machine."""
    remote = [h for h in hosts if not h.local]
    if not remote:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((remote[0].address, 9))
            return s.getsockname()[0]
    except OSError as e:
        raise LaunchError(f"Cannot find this machine's address towards host '{remote[0].name}' ({e.strerror or e}). "
                          f"Check the name in --hosts, or pass --root-uri ADDRESS (an address of this machine "
                          f"the hosts can reach).") from None


class _Child:
    """A started process: its output is copied line by line with a prefix, and a worker's rank
    (assigned by the scheduler, printed by the worker) and a remote command's PID are noted."""

    def __init__(self, spec: Process, events: queue.SimpleQueue, out: IO[str], lock: threading.Lock) -> None:
        self.spec, self.events = spec, events
        self.rank: int | None = None
        self.remote_pid: int | None = None
        self.run_dir: Path | None = None
        self.answered: bool | None = None  # did its host answer the last ``ssh HOST kill`` (remote only)
        try:
            self.popen = subprocess.Popen(spec.argv, env=spec.environ(os.environ),  # a remote one's stdin: its session
                                          stdin=subprocess.PIPE if spec.host else subprocess.DEVNULL,
                                          stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, start_new_session=True, text=True,
                                          errors="replace", bufsize=1)
        except OSError as e:
            raise LaunchError(f"Cannot start {spec.name}: {spec.argv[0]}: {e.strerror}. "
                              + ("Check --ssh (or that ssh is installed)." if spec.host else
                                 "Check the Python installation.")) from None
        self._reader = threading.Thread(target=self._copy, args=(out, lock), daemon=True)
        self._reader.start()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        self.popen.wait()
        self.events.put(self)

    def _copy(self, out: IO[str], lock: threading.Lock) -> None:
        assert self.popen.stdout is not None
        prefix = f"[{self.spec.name}] "
        for line in self.popen.stdout:
            line = line.rstrip("\n")
            pid = PID_LINE.match(line) if self.spec.host is not None and self.remote_pid is None else None
            if pid:
                self.remote_pid = int(pid.group(1))
                continue
            rank = RANK_LINE.search(line)
            if rank:
                self.rank = int(rank.group(1))
            run = RUN_LINE.search(line) if self.run_dir is None else None
            if run:
                self.run_dir = Path(run.group(1))
            with lock:
                out.write(prefix + line + "\n")
                out.flush()

    @property
    def running(self) -> bool:
        return self.popen.returncode is None

    def signal(self, sig: signal.Signals, group: bool = True) -> None:
        """``sig`` to the process, or to its process group: here by PID, on a remote host by
        ``ssh HOST kill`` (the remote command's session is not the local ssh's)."""
        if self.spec.host is None:
            try:
                if group:
                    os.killpg(self.popen.pid, sig)  # also after the leader is gone: its subprocesses may live on
                elif self.running:
                    os.kill(self.popen.pid, sig)
            except (ProcessLookupError, PermissionError):  # gone, or its PID is now another user's
                pass
            return
        lost = self.popen.returncode is not None and (self.popen.returncode < 0 or self.popen.returncode == 255)
        if (self.running or lost) and self.remote_pid is not None:  # a lost session's command may still run
            target = f"-{self.remote_pid}" if group else str(self.remote_pid)
            try:  # POSIX sh's kill: dash has no `--`
                done = subprocess.run([*self.spec.argv[:-1], f"kill -{sig.name[3:]} {target}"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      timeout=STOP_GRACE)
                self.answered = done.returncode != 255  # ssh's own failure, not kill's
            except subprocess.TimeoutExpired:
                self.answered = False  # the host does not answer: its processes are beyond reach from here
        if sig == signal.SIGKILL or (group and self.remote_pid is None):  # the local ssh itself
            try:
                os.killpg(self.popen.pid, sig)
            except (ProcessLookupError, PermissionError):  # gone, or its PID is now another user's
                pass

    def describe(self) -> str:
        parts = [f"rank {self.rank}"] if self.rank is not None else []
        parts += [f"host {self.spec.host.name}"] if self.spec.host is not None else []
        parts.append(f"pid {self.remote_pid or self.popen.pid}")
        code = self.popen.returncode
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
        if code == 255 and self.spec.host is not None:
            how += " (ssh's code when it cannot connect or the command died by a signal there)"
        return f"{self.spec.name} ({', '.join(parts)}) {how}"

    def drain(self, timeout: float) -> None:
        self._reader.join(timeout)


def launch(args: Sequence[str], workers: int, servers: int = 1, hosts_file: Optional[Path] = None,
           port: Optional[int] = None, root_uri: Optional[str] = None, ssh: Optional[str] = None, *,
           commands: Mapping[str, "click.Command"], max_restarts: int = 0, restart_delay: float = 5.0) -> int:
    """Run the job; 0 when every worker exited 0. A failure or a stop raises ``LaunchError``
    (after ``max_restarts`` restarts from the last checkpoint, for a failure).
    ``commands`` are the CLI's (name -> click command), given by the CLI's ``launch`` so the
    engine reads the workers' command line without importing the front door."""
    _check(args, workers, servers, commands, max_restarts, restart_delay)
    ssh_argv = tuple(shlex.split(ssh)) if ssh else SSH
    current, run_dir, failure, count, per_host = list(args), None, "", workers, workers
    for attempt in range(max_restarts + 1):
        # read again at each restart: a host taken out of the file is left out with its workers
        hosts = read_hosts(hosts_file) if hosts_file is not None else []
        if hosts and attempt == 0:
            per_host = -(-workers // len(hosts))  # the busiest host's share of the first start
        elif hosts:
            count = min(workers, len(hosts) * per_host)
        uri = root_uri or address_towards(hosts)
        check_hosts(hosts, hosts_file, ssh_argv)
        if attempt == 0:
            make_weights(args, commands)
        else:
            current = restart(args, run_dir, commands, attempt, max_restarts, failure,
                              Elastic(workers, count, hosts_file, [h.name for h in hosts] if hosts else None))
        procs = plan(current, count, servers, hosts, uri, port or free_port(uri), physical_cores(),
                     cwd=os.getcwd(), ssh=ssh_argv, threads=user_threads())
        job = _Job(procs, sys.stdout)
        try:
            return job.run()
        except LaunchError as e:
            if e.exit_code != 1 or attempt == max_restarts:  # a refused input or a signal: again would not help
                raise
            run_dir, failure = job.run_dir() or run_dir, job.failure
            announce(run_dir, attempt + 1, max_restarts, failure, restart_delay)
        time.sleep(restart_delay)
    raise AssertionError("unreachable")  # the last attempt returns or raises


def check_hosts(hosts: Sequence[Host], hosts_file: Optional[Path], ssh: Sequence[str]) -> None:
    """Every remote host answers ``ssh HOST true`` (in parallel) before any process starts: an
    unreachable host or a refused key is bad input, said by name, not a job failing later."""
    remote = sorted({h.name for h in hosts if not h.local})
    probes = {name: subprocess.Popen([*ssh, "-o", "ConnectTimeout=10", name, "true"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
              for name in remote}
    for name, probe in probes.items():
        try:
            _, err = probe.communicate(timeout=SSH_CHECK_TIMEOUT)
        except subprocess.TimeoutExpired:
            probe.kill()
            err = f"no answer within {SSH_CHECK_TIMEOUT:g} s"
        if probe.returncode == 0:
            continue
        for other in probes.values():
            other.kill()
            other.wait()
        reason = " ".join(err.split()) or f"ssh exited with code {probe.returncode}"
        if "Permission denied" in reason or "Host key verification failed" in reason:
            fix = (f"ssh needs key access without a prompt (it runs with BatchMode=yes): add this machine's public "
                   f"key to {name}'s ~/.ssh/authorized_keys (ssh-copy-id {name}) and accept its host key once")
        else:
            fix = f"check that {name} is up and reachable from here, or remove it from the file"
        raise LaunchError(f"--hosts {hosts_file}: host '{name}' does not answer `{shlex.join(ssh)} {name} true` "
                          f"({reason}); {fix}. No process was started.")


@dataclass(frozen=True)
class Elastic:
    """The worker count of a restart: ``first`` at the first start, ``now`` over the hosts the
    file lists at the restart (``hosts``, None without a file)."""

    first: int
    now: int
    hosts_file: Optional[Path]
    hosts: Optional[list[str]]


def _last(run_dir: Path | None) -> tuple[RunFolder | None, dict | None]:
    """The run folder and its last checkpoint's record (None when there is none yet)."""
    from ..runfolder import read_checkpoint

    rf = RunFolder(run_dir) if run_dir is not None else None
    return rf, read_checkpoint(rf.checkpoints_dir, "last") if rf is not None and rf.has_checkpoint("last") else None


def announce(run_dir: Path | None, number: int, limit: int, reason: str, delay: float) -> None:
    """The failure and the restart to come, on stderr, before the delay."""
    _, meta = _last(run_dir)
    where = (f"from step {meta['global_step']} (epoch {meta['epoch']}, batch {meta['batch_in_epoch']}) of {run_dir}"
             if meta is not None else "from the start (no checkpoint yet)")
    print(f"gluontl launch: {reason}; stopped the job. Restart {number} of {limit} in {delay:g} s, {where}.",
          file=sys.stderr, flush=True)


def restart(args: Sequence[str], run_dir: Path | None, commands: Mapping[str, "click.Command"], number: int,
            limit: int, reason: str, workers: Elastic) -> list[str]:
    """The command of restart ``number``: ``finetune --resume RUN`` (with the first command's
    --runs, -q and --stop-after-steps) when the run has a last checkpoint, else the first command
    again (a new run). On another worker count the global batch stays (a resume keeps it; a new run
    gets its per-worker batch with --set), refused here when the count does not divide it. Appends
    the restart to the run's restarts record."""
    from ..atomic import write_text

    rf, meta = _last(run_dir)
    again = list(args)
    if args[0] == "finetune":
        with commands["finetune"].make_context("finetune", list(args[1:]), resilient_parsing=True) as ctx:
            opts = ctx.params
        if meta is not None:
            again = ["finetune", "--resume", str(run_dir), "--runs", str(opts["runs"]),
                     *(["-q"] if opts["quiet"] else []),
                     *(["--stop-after-steps", str(opts["stop_after_steps"])] if opts["stop_after_steps"] else [])]
        if workers.now != workers.first:
            again += _rebatched(opts, run_dir if meta is not None else None, meta, workers)
    if workers.now != workers.first:
        print(f"gluontl launch: --hosts {workers.hosts_file} lists {len(workers.hosts or [])} host(s) now: restart "
              f"{number} runs {workers.now} worker(s) instead of {workers.first}.", file=sys.stderr, flush=True)
    if rf is not None and rf.logs_dir.is_dir():
        row = {"restart": number, "of": limit, "time": datetime.datetime.now(datetime.timezone.utc).isoformat(),
               "reason": reason, "from_step": meta["global_step"] if meta else None,
               "from_epoch": meta["epoch"] if meta else None, "workers": workers.now,
               **({"hosts": workers.hosts} if workers.hosts is not None else {}), "command": again}
        old = rf.restarts_path.read_text(encoding="utf-8") if rf.restarts_path.is_file() else ""
        write_text(rf.restarts_path, old + json.dumps(row) + "\n", LaunchError)
    return again


def _rebatched(opts: dict, run_dir: Path | None, meta: dict | None, workers: Elastic) -> list[str]:
    """What keeps the global batch on ``workers.now``: nothing for a resume (the workers rebatch
    it), ``--set data.batch_size=…`` for a new run. Refused (exit 2) when the count does not divide it."""
    from ..errors import GluontlError
    from ..train.elastic import global_batch, rebatch
    from ..train.runs import finetune_recipe

    why = (f"--hosts {workers.hosts_file} lists {len(workers.hosts or [])} host(s) at the restart, so the job would "
           f"continue on {workers.now} worker(s) instead of {workers.first}")
    try:
        if run_dir is not None and meta is not None:
            rebatch(run_dir, finetune_recipe(None, None, run_dir, None), meta, workers.now)
            return []
        recipe = finetune_recipe(opts["recipe"], opts["set_"], None, opts["init_from"])
        total = global_batch(recipe, {"workers": workers.first})
        if total % workers.now:
            raise GluontlError(f"its global batch of {total} images ({workers.first} × data.batch_size "
                               f"{recipe.data.batch_size}) cannot be shared equally by {workers.now}.")
        return ["--set", f"data.batch_size={total // workers.now}"]
    except GluontlError as e:
        raise LaunchError(f"{why}: {e} Put hosts back in the file for a worker count that divides the global "
                          f"batch, or continue by hand with gluontl launch -n M ... -- finetune --resume "
                          f"RUN.") from None


def _check(args: Sequence[str], workers: int, servers: int, commands: Mapping[str, "click.Command"],
           max_restarts: int = 0, restart_delay: float = 0.0) -> None:
    if max_restarts < 0 or not restart_delay >= 0:
        raise LaunchError(f"--max-restarts {max_restarts} --restart-delay {restart_delay:g}: the restarts after a "
                          f"failure must be 0 or more (0, the default, stops at the first failure) and the delay "
                          f"before each a number of seconds, 0 or more. Example: gluontl launch --max-restarts 3 "
                          f"-n 2 -- finetune --recipe R.")
    if workers < 1 or servers < 1:
        raise LaunchError(f"launch needs at least one worker and one server (got -n {workers}, --servers "
                          f"{servers}). Example: gluontl launch -n 2 -- finetune --recipe R.")
    if not args:
        raise LaunchError("launch needs the gluontl command each worker runs after `--`, e.g. "
                          "gluontl launch -n 2 -- finetune --recipe R.")
    names = sorted(set(commands) - {"launch"})
    if args[0] not in names:
        raise LaunchError(f"launch runs a gluontl command on every worker, and '{args[0]}' is not one "
                          f"({', '.join(names)}). Write it without `gluontl`, e.g. -- finetune --recipe R.")


def make_weights(args: Sequence[str], commands: Mapping[str, "click.Command"]) -> None:
    """A ``finetune`` job's ``model.weights_from`` pretrain and the ImageNet ONNX its model may
    name, made here, once, before any worker starts: every worker would otherwise make them at
    once and race to write the file. Remote workers find the pretrain in the same working folder
    (a shared file system, as for ``runs/``); the ONNX lies under this machine's $GLUONTL_HOME, so
    a host that does not share it still makes its own. A command line or recipe that does not
    load is left to the workers, which name what is wrong."""
    if args[0] != "finetune":
        return
    import click

    from ..errors import GluontlError
    from ..train.runs import finetune_recipe

    try:
        with commands["finetune"].make_context("finetune", list(args[1:]), resilient_parsing=True) as ctx:
            opts = ctx.params
            recipe = finetune_recipe(opts["recipe"], opts["set_"], opts["resume"], opts["init_from"])
    except (click.ClickException, GluontlError):
        return
    if recipe.train.distributed.backend in (None, "kvstore"):  # what the workers of this job train with
        from ..sources import make_model_file
        from ..train.loop import finetune
        from ..train.weights import ensure_weights

        ensure_weights(recipe, finetune, quiet=opts["quiet"])
        make_model_file(recipe.model.source)


class _Job:
    """Starts the processes and watches them until the workers are done, one fails, or a signal comes."""

    def __init__(self, procs: Sequence[Process], out: IO[str]) -> None:
        self.procs, self.out = procs, out
        self.events: queue.SimpleQueue = queue.SimpleQueue()  # an exited _Child, or a signal number
        self.children: list[_Child] = []
        self.lock = threading.Lock()
        self.stopped = False
        self.failure = ""  # the failed process, described
        self.scheduler_host = next((p.env["DMLC_NODE_HOST"] for p in procs if p.role == "scheduler"), "")

    def run_dir(self) -> Path | None:
        """The run folder the workers reported (absolute), None before rank 0 made it."""
        return next((c.run_dir for c in self.children if c.run_dir is not None), None)

    def run(self) -> int:
        """SimpleQueue.put is safe in a signal handler, so the handler only posts the signal."""
        old = {s: signal.signal(s, lambda signum, _: self.events.put(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for p in self.procs:
                self.children.append(_Child(p, self.events, self.out, self.lock))
            self._watch()
            return 0
        finally:
            self._stop_all()  # also when a start or the watch failed, so none is left running
            for s, handler in old.items():
                signal.signal(s, handler)

    def _watch(self) -> None:
        """Returns when every worker exited 0 and the scheduler and servers exited or had their grace.

        The scheduler and servers exit 0 when the workers close the kvstore, which may be before the
        workers end (rank 0 still exports): only their failure while workers run stops the job."""
        workers = {c for c in self.children if c.spec.role == "worker"}
        pending, deadline = set(self.children), None
        while pending:
            try:
                event = self.events.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if isinstance(event, int):
                self._interrupted(event, workers)
            pending.discard(event)
            if event.popen.returncode != 0 and workers:
                self._fail(event)
            workers.discard(event)
            if not workers and deadline is None:
                deadline = time.monotonic() + FINISH_GRACE

    def _fail(self, child: _Child) -> None:
        others = self._stop_all()
        code = child.popen.returncode
        cut_off = self._cut_off(child)
        self.failure = cut_off or child.describe()
        if cut_off:
            advice = ("Check this machine's network, then launch again (-- finetune --resume runs/NAME continues "
                      "from the last checkpoint).")
        elif code == 2:
            advice = "It refused its input (its message is above); fix that and launch again."
        else:
            log = f" and in {RunFolder('.').worker_log(child.rank)} of the run folder" if child.rank is not None else ""
            advice = (f"Its output is above (lines starting [{child.spec.name}]){log}; fix the cause and launch "
                      f"again (-- finetune --resume runs/NAME continues from the last checkpoint).")
        raise LaunchError(f"{self.failure}; stopped the {others} other process{'es' if others != 1 else ''} "
                          f"of the job. {advice}", exit_code=2 if code == 2 else 1)

    def _cut_off(self, child: _Child) -> str | None:
        """When a lost ssh session's host is not to blame: no remote host (two or more) answered
        the stop's ``ssh HOST kill``, so the machine cut off is this one, the scheduler's host."""
        if child.spec.host is None or child.popen.returncode != 255:
            return None
        asked = [c for c in self.children if c.spec.host is not None and c.answered is not None]
        silent = sorted({c.spec.host.name for c in asked})
        if len(silent) < 2 or any(c.answered for c in asked):
            return None
        return (f"the scheduler's host {self.scheduler_host} (scheduler, and this launcher) lost the network: none "
                f"of the hosts {', '.join(silent)} answered, and its sessions to them ended ({child.describe()})")

    def _interrupted(self, signum: int, workers: set[_Child]) -> None:
        for c in workers:
            c.signal(signal.SIGTERM, group=False)  # finetune checkpoints at its next step and exits
        self._wait_for(workers, INTERRUPT_GRACE, until_signal=True)  # a second Ctrl-C stops at once
        self._stop_all()
        raise LaunchError(f"stopped by {signal.Signals(signum).name}: the workers were asked to checkpoint and "
                          f"stop (their lines are above); continue with gluontl launch ... -- finetune --resume "
                          f"runs/NAME.", exit_code=128 + signum)

    def _wait_for(self, children: Sequence[_Child] | set[_Child], seconds: float, until_signal: bool) -> None:
        deadline = time.monotonic() + seconds
        while any(c.running for c in children):
            try:
                event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            if until_signal and isinstance(event, int):
                return

    def _signal_all(self, sig: signal.Signals) -> None:
        """``sig`` to every child at once: a remote one's ``ssh HOST kill`` may wait its timeout
        for a host that stopped answering."""
        threads = [threading.Thread(target=c.signal, args=(sig,), daemon=True) for c in self.children]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _stop_all(self) -> int:
        """SIGTERM to every process group, SIGKILL after the grace, all reaped and their output
        printed. Returns how many were still running."""
        if self.stopped:
            return 0
        self.stopped = True
        running = [c for c in self.children if c.running]
        self._signal_all(signal.SIGTERM)  # finished ones too: their subprocesses may be left
        self._wait_for(running, STOP_GRACE, until_signal=False)
        self._signal_all(signal.SIGKILL)
        for c in self.children:
            c.popen.wait()
            if c.popen.stdin is not None:  # a remote command's session: its watcher ends what is left
                c.popen.stdin.close()
        for c in self.children:
            c.drain(STOP_GRACE)  # their last lines come before the launcher's own message
        return len(running)
