"""Where a sweep's study lives, and how a trial whose process died is found.

By default a SQLite file in the sweep folder, in WAL mode with a long busy timeout so the K local
processes of ``--jobs K`` share it; any Optuna RDB URL (``postgresql://``, ``mysql+pymysql://``)
puts the study on a server where processes on many machines work on one study.

A trial left RUNNING by a killed process would otherwise stay RUNNING for ever (and never be run
again). Every trial records its owner (machine, PID namespace, PID and the process's start time):
a trial whose owner on this machine is gone is stale at once; one from another machine is stale
when its Optuna heartbeat is older than the grace period. Stale trials are marked FAIL by
``fail_stale`` and by ``study.optimize`` before each trial.
"""
from __future__ import annotations

import os
import re
import socket
import warnings
from pathlib import Path
from typing import Any

from ..errors import SweepError, short_reason

HEARTBEAT_SECONDS = 10  # a running trial writes its heartbeat this often
GRACE_SECONDS = 60  # ... and is another machine's dead trial when it is older than this
CONNECT_SECONDS = 5  # a server that does not answer fails the sweep before any trial, after this
SQLITE_BUSY_SECONDS = 60  # how long a SQLite writer waits for another process's write
OWNER = "gluontl:owner"  # the trial system attribute naming the process that runs it
DRIVERS = {"postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql"}  # scheme without a driver
INSTALL = {"psycopg": "pip install 'psycopg[binary]' (or pip install 'gluontl[sweep]')",
           "psycopg2": "pip install psycopg2-binary", "pymysql": "pip install pymysql",
           "mysqldb": "pip install mysqlclient"}


def open_storage(url: str | None, folder: Path, heartbeat: bool = True):
    """The study's storage (an ``optuna.storages.RDBStorage``): ``url``, or ``sqlite:///FOLDER/study.db``.

    An unreachable or malformed URL raises ``SweepError`` within ``CONNECT_SECONDS``, before any trial.
    """
    import optuna  # noqa: F401  (before the driver's ImportError is caught below)
    import sqlalchemy

    advice = ("Check that the server runs and this machine reaches it (host, port, user, password, database; "
              "the database must exist), or leave --storage out for a SQLite file in the sweep folder."
              if url else f"Check that {folder} is writable and its study.db, if any, is Optuna's.")
    url = url or f"sqlite:///{Path(folder).resolve() / 'study.db'}"
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except Exception:
        raise SweepError(f"--storage '{mask(url)}' is not a database URL. Pass an Optuna RDB URL such as "
                         f"postgresql://USER:PASSWORD@HOST:5432/DB or sqlite:///PATH/study.db, or leave "
                         f"--storage out for a SQLite file in the sweep folder.") from None
    parsed = parsed.set(drivername=DRIVERS.get(parsed.drivername, parsed.drivername))
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and parsed.database not in (None, "", ":memory:") and not Path(parsed.database).parent.is_dir():
        raise SweepError(f"--storage '{mask(url)}': the folder {Path(parsed.database).parent} does not exist. "
                         f"Create it, or leave --storage out for a SQLite file in the sweep folder.")
    connect = {"timeout": SQLITE_BUSY_SECONDS} if sqlite else {"connect_timeout": CONNECT_SECONDS}
    connect = {k: v for k, v in connect.items() if k not in parsed.query}
    try:
        storage = _make(parsed, {"connect_args": connect}, heartbeat)
        if sqlite and parsed.database not in (None, "", ":memory:"):
            with storage.engine.connect() as c:  # WAL: readers do not wait for the writer; kept in the file
                c.exec_driver_sql("PRAGMA journal_mode=WAL")
    except ImportError as e:  # Optuna re-raises the driver's ImportError with a note of its own
        module = (getattr(e.__cause__, "name", None) or getattr(e, "name", None) or "?").split(".")[0]
        how = INSTALL.get(module.lower(), f"install the Python package {module}")
        raise SweepError(f"--storage '{mask(url)}' needs the database driver {module}, which is not installed: "
                         f"{how}.") from None
    except sqlalchemy.exc.NoSuchModuleError:
        raise SweepError(f"--storage '{mask(url)}': SQLAlchemy knows no database '{parsed.drivername}'. Pass an "
                         f"Optuna RDB URL (postgresql://, mysql+pymysql://, sqlite:///), or leave --storage out "
                         f"for a SQLite file in the sweep folder.") from None
    except Exception as e:  # SQLAlchemy and the drivers raise many types for a database they cannot open
        raise SweepError(f"Cannot open the sweep storage '{mask(url)}': {_reason(e)}. {advice}") from None
    return storage


def _reason(err: BaseException) -> str:
    """The driver's own words, without SQLAlchemy's exception class and link."""
    text = re.sub(r"\(Background on this error at: [^)]*\)|^\([\w.]+\) ", "", " ".join(str(err).split()))
    return short_reason(Exception(mask(text.strip())), 300)


def mask(url: str) -> str:
    """``url`` with its password as ``***`` (for messages and logs)."""
    return re.sub(r"(?i)(password=)[^&]*", r"\1***", re.sub(r"(://[^:/@]*:).*@", r"\1***@", url))


def fail_stale(study) -> list[int]:
    """Mark FAIL the trials whose process died while they ran; their numbers.

    Another process's running trial is left alone; a trial that ends meanwhile is not touched.
    """
    import optuna
    from optuna.trial import TrialState

    storage = study._storage  # Optuna's cache around the storage open_storage made
    if not isinstance(getattr(storage, "_backend", storage), _owned_storage_class()):
        return []
    failed = []
    for trial_id in storage._get_stale_trial_ids(study._study_id):
        try:
            if storage.set_trial_state_values(trial_id, TrialState.FAIL):
                failed.append(storage.get_trial(trial_id).number)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another process marked or finished it first
    return sorted(failed)


def _me() -> dict[str, Any]:
    """This process as a trial's owner (what ``_is_dead`` compares with)."""
    return {"host": socket.gethostname(), "machine": _machine(), "pid": os.getpid(), "start": _started(os.getpid())}


def _machine() -> str | None:
    """This boot of this machine and its PID namespace: PIDs compare only within one (None: unknown)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return None


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot): a reused PID has another; None if none runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the name in parentheses may hold spaces
    return None if fields[0] in ("Z", "X") else int(fields[19])  # a zombie has exited


def _is_dead(owner: Any, machine: str | None) -> bool:
    """True only when ``owner`` ran on this machine and is provably gone; other machines' trials are
    the heartbeat's."""
    if not isinstance(owner, dict) or machine is None or owner.get("machine") != machine:
        return False
    pid, start = owner.get("pid"), owner.get("start")
    return isinstance(pid, int) and _started(pid) != start


_CLASS: list[type] = []


def _owned_storage_class() -> type:
    """``RDBStorage`` whose trials record their owner, and whose stale trials include dead owners'."""
    if _CLASS:
        return _CLASS[0]
    import optuna
    from optuna.trial import TrialState

    class OwnedStorage(optuna.storages.RDBStorage):
        def _create_new_trial(self, study_id: int, template_trial=None):
            frozen = super()._create_new_trial(study_id, template_trial)
            if frozen.state == TrialState.RUNNING:
                frozen.system_attrs[OWNER] = _me()
                self.set_trial_system_attr(frozen._trial_id, OWNER, frozen.system_attrs[OWNER])
            return frozen

        def set_trial_state_values(self, trial_id: int, state, values=None) -> bool:
            changed = super().set_trial_state_values(trial_id, state, values)
            if changed and state == TrialState.RUNNING:  # a WAITING (enqueued) trial this process took
                self.set_trial_system_attr(trial_id, OWNER, _me())
            return changed

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            stale = set(super()._get_stale_trial_ids(study_id)) if self.heartbeat_interval else set()
            machine = _machine()
            stale.update(t._trial_id for t in self.get_all_trials(study_id, deepcopy=False,
                                                                  states=(TrialState.RUNNING,))
                         if _is_dead(t.system_attrs.get(OWNER), machine))
            return sorted(stale)

    _CLASS.append(OwnedStorage)
    return OwnedStorage


def _make(url, engine_kwargs: dict[str, Any], heartbeat: bool):
    import optuna

    with warnings.catch_warnings():  # heartbeat_interval is "experimental" in Optuna 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return _owned_storage_class()(url.render_as_string(hide_password=False), engine_kwargs=engine_kwargs,
                                      heartbeat_interval=HEARTBEAT_SECONDS if heartbeat else None,
                                      grace_period=GRACE_SECONDS if heartbeat else None)
