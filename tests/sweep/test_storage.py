"""A sweep's storage: a URL that cannot be opened is exit 2 before any trial; a trial whose process
was killed is marked failed, not lost, and not run again; two processes on one PostgreSQL study run
every trial once. Real processes killed with SIGKILL, synchronised through their pipes (no sleeps);
a real PostgreSQL server (tests/sweep/postgres.py)."""
from __future__ import annotations

import collections
import re
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gluontl.errors import SweepError
from gluontl.sweep import storage as st
from tests import helpers
from tests.sweep import common
from tests.sweep.postgres import postgres  # noqa: F401  (the fixture)

optuna = pytest.importorskip("optuna")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    return helpers.tiny_symbol(tmp_path_factory.mktemp("net"))


class Worker:
    """``tests/sweep/optuna_worker.py`` in a process of its own; killed at the end if still running."""

    def __init__(self, url: str, folder: Path, n: int, name: str, *flags: str) -> None:
        self.log = folder / "started.log"
        env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.sweep.optuna_worker", url, str(folder), "s",
                                      str(n), name, str(self.log), *flags], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=folder)

    def line(self) -> str:
        got = self.proc.stdout.readline().strip()
        assert got, f"the worker ended (code {self.proc.wait()}) without saying what it does"
        return got

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            f.close()


@pytest.fixture
def workers():
    made: list[Worker] = []
    yield lambda *a: made.append(Worker(*a)) or made[-1]
    for w in made:
        w.close()


def study_of(url: str | None, folder: Path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage=st.open_storage(url, folder), study_name="s", load_if_exists=True)


def states(study) -> dict[int, str]:
    return {t.number: t.state.name for t in study.get_trials(deepcopy=False)}


def started(log: Path) -> collections.Counter:
    return collections.Counter(int(line.split()[1]) for line in log.read_text().splitlines())


# --- bad URLs: exit 2, one paragraph naming the URL (password masked), nothing written ------------

def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.mark.parametrize("url, needles", [
    ("postgresql://me:hunter2@127.0.0.1:{port}/db", ["postgresql://me:***@127.0.0.1", "Connection refused",
                                                              "Check that the server runs"]),
    ("not a url", ["'not a url'", "is not a database URL", "postgresql://USER:PASSWORD@HOST"]),
    ("mysql://me:hunter2@127.0.0.1/db", ["mysql://me:***@127.0.0.1/db", "needs the database driver pymysql",
                                         "pip install pymysql"]),
    ("oracle9://me:hunter2@h/db", ["oracle9://me:***@h/db", "knows no database 'oracle9'"]),
    ("sqlite:////no/such/folder/s.db", ["sqlite:////no/such/folder/s.db", "/no/such/folder does not exist"]),
])
def test_unusable_storage_exits_2_before_any_trial(tmp_path, capsys, monkeypatch, prefix, url, needles):
    if url.startswith("mysql") and any(m in sys.modules or _importable(m) for m in ("pymysql",)):
        pytest.skip("pymysql is installed here, so a mysql URL is no missing driver")
    url = url.format(port=closed_port())  # not at collection: xdist's workers must collect the same ids
    monkeypatch.chdir(tmp_path)
    r = common.write(tmp_path, common.recipe(prefix), "r.yaml")
    s = common.write(tmp_path, common.SPACE, "s.yaml")
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = helpers.run_cli(capsys, "sweep", "--recipe", str(r), "--space", str(s), "--trials", "2",
                                     "--storage", url)
    helpers.assert_one_paragraph(code, out, err, needles)
    assert "hunter2" not in out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no sweeps/ folder


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_a_server_that_never_answers_fails_after_the_connect_timeout(tmp_path):
    """A port that accepts connections but never speaks: the error comes from the connect timeout,
    not from a hang (the socket is never read; the test would block for ever without the timeout)."""
    pytest.importorskip("psycopg")
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(8)
        url = f"postgresql://me:hunter2@127.0.0.1:{mute.getsockname()[1]}/db"
        with pytest.raises(SweepError) as e:
            st.open_storage(url, tmp_path)
    assert "timeout" in str(e.value) and "me:***@" in str(e.value) and "hunter2" not in str(e.value)


def test_mask_hides_passwords_in_the_authority_and_the_query():
    assert st.mask("postgresql://u:p@ss@h:5/d?sslmode=require&password=x&a=b") == \
        "postgresql://u:***@h:5/d?sslmode=require&password=***&a=b"
    assert st.mask("sqlite:////tmp/s.db") == "sqlite:////tmp/s.db"


# --- a killed process's trial: FAIL, not lost; a live process's trial: left alone ------------------

def test_killed_trial_is_failed_live_one_kept_and_the_sweep_goes_on(tmp_path, workers):
    """SQLite in the sweep folder (the default): a worker killed in its first trial leaves it RUNNING;
    ``fail_stale`` marks it FAIL while another live worker's running trial stays RUNNING; after that
    one is killed too, the next worker's ``study.optimize`` fails it on its own and runs the rest."""
    study = study_of(None, tmp_path)
    a = workers("-", tmp_path, 2, "a", "--block-at", "1")
    assert a.line() == "blocked 0"
    b = workers("-", tmp_path, 2, "b", "--block-at", "1")  # before a dies: its optimize() would fail 0 itself
    assert b.line() == "blocked 1"
    a.kill()
    assert states(study) == {0: "RUNNING", 1: "RUNNING"}
    assert st.fail_stale(study) == [0]
    assert states(study) == {0: "FAIL", 1: "RUNNING"}
    assert st.fail_stale(study) == []  # already failed; b still runs
    b.kill()
    c = workers("-", tmp_path, 2, "c")
    assert c.line() == "done"
    assert states(study) == {0: "FAIL", 1: "FAIL", 2: "COMPLETE", 3: "COMPLETE"}
    assert started(a.log) == {0: 1, 1: 1, 2: 1, 3: 1}  # none run twice
    owner = study.trials[2].system_attrs[st.OWNER]
    assert owner["pid"] == c.proc.pid and owner["machine"] == st._machine()


def test_another_machines_trial_is_failed_by_its_old_heartbeat_only(tmp_path):
    """A trial owned elsewhere is never judged by PID; it fails once its heartbeat is older than the
    grace period (the heartbeat row is aged in the database, instead of waiting a minute)."""
    study = study_of(None, tmp_path)
    trial = study.ask()
    storage = study._storage
    storage.set_trial_system_attr(trial._trial_id, st.OWNER, {"machine": "another-boot/pid:[1]", "pid": 1,
                                                               "start": 1})
    storage.record_heartbeat(trial._trial_id)
    assert st.fail_stale(study) == [] and states(study) == {0: "RUNNING"}
    with storage._backend.engine.begin() as c:
        c.exec_driver_sql(f"UPDATE trial_heartbeats SET heartbeat = datetime(heartbeat, "
                          f"'-{st.GRACE_SECONDS + 5} seconds')")
    assert st.fail_stale(study) == [0] and states(study) == {0: "FAIL"}


def test_default_sqlite_is_in_the_sweep_folder_in_wal_mode(tmp_path):
    study = study_of(None, tmp_path)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    assert (tmp_path / "study.db").is_file()
    with study._storage._backend.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() == st.SQLITE_BUSY_SECONDS * 1000


# --- two processes on one PostgreSQL study -----------------------------------------------------------

def test_two_workers_on_postgres_run_every_trial_once_and_the_killed_ones_trial_fails(tmp_path, postgres,
                                                                                        workers):
    """Worker a runs two trials and is killed in its third; worker b, whose first trial was running
    all that time, finishes the sweep (6 complete trials). Every trial was started by exactly one
    process, none is left RUNNING, a's last trial is FAIL, and each value is its own x²."""
    url = postgres.url()
    study = study_of(url, tmp_path)  # the tables and the study exist before the workers race for them
    a = workers(url, tmp_path, 6, "a", "--block-at", "3")
    b = workers(url, tmp_path, 6, "b", "--gate")
    first_b = int(b.line().split()[1])  # b's first trial is running, waiting for the test
    killed = int(a.line().split()[1])  # a ran two trials and is inside its third
    a.kill()
    said = f"trial {first_b}"
    while said != "done":  # b's trials, each let go in turn
        assert said.startswith("trial ")
        b.proc.stdin.write("go\n")
        b.proc.stdin.flush()
        said = b.line()
    by = collections.defaultdict(list)
    for line in a.log.read_text().splitlines():
        name, number = line.split()
        by[name].append(int(number))
    assert len(by["a"]) == 3 and by["a"][-1] == killed and first_b == by["b"][0]
    assert started(a.log) == {n: 1 for n in states(study)}  # every trial started once, by one process
    final = states(study)
    assert final[killed] == "FAIL"
    assert {s for n, s in final.items() if n != killed} == {"COMPLETE"}
    assert sum(s == "COMPLETE" for s in final.values()) >= 6
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        assert t.value == t.params["x"] * t.params["x"]
    assert study.trials[killed].system_attrs[st.OWNER]["pid"] == a.proc.pid


# --- the sweep command on PostgreSQL, and its dashboard ---------------------------------------------

def test_gluontl_sweep_with_two_jobs_on_postgres_and_its_dashboard(tmp_path, capsys, monkeypatch, postgres,
                                                                     prefix):
    """``gluontl sweep --jobs 2 --storage postgresql://... --dashboard`` on the tiny recipe: the study
    lives on the server with its 3 trials complete, each its own run; the dashboard was announced on
    127.0.0.1 and nothing listens there once the command returned."""
    monkeypatch.chdir(tmp_path)
    url = postgres.url()
    r = common.write(tmp_path, common.recipe(prefix, epochs=1), "r.yaml")
    s = common.write(tmp_path, {"train.lr": {"log_uniform": [1e-3, 0.3]}}, "s.yaml")
    code, out, err = helpers.run_cli(capsys, "sweep", "--recipe", str(r), "--space", str(s), "--trials", "3",
                                     "--jobs", "2", "--storage", url, "--sampler", "random", "--pruner", "none",
                                     "--dashboard")
    assert code == 0, err
    board = re.search(r"dashboard: http://127\.0\.0\.1:(\d+)/dashboard/", out + err)
    assert board, out + err
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", int(board[1])), timeout=5):
        pass
    study = optuna.load_study(study_name="t", storage=url)
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) >= 3 and not study.get_trials(states=(optuna.trial.TrialState.RUNNING,))
    assert len({t.user_attrs["run_dir"] for t in done}) == len(done)
    assert all((tmp_path / "sweeps" / "t" / t.user_attrs["run_dir"] / "metrics.jsonl").is_file() for t in done)
    assert not (tmp_path / "sweeps" / "t" / "study.db").exists()  # the study is on the server


def test_a_study_db_that_is_no_database_is_one_paragraph(tmp_path):
    (tmp_path / "study.db").write_bytes(b"not sqlite at all" * 64)
    with pytest.raises(SweepError) as e:
        st.open_storage(None, tmp_path)
    assert "file is not a database" in str(e.value) and f"Check that {tmp_path} is writable" in str(e.value)
    assert (tmp_path / "study.db").read_bytes() == b"not sqlite at all" * 64  # the user's file is kept
