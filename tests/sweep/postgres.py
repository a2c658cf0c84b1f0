"""The ``postgres`` fixture (test modules import it): a real PostgreSQL server from Debian's
``postgresql`` package, started on 127.0.0.1 on a free port in a temporary folder, as the
``postgres`` user when the tests run as root (the server refuses root), stopped and removed
afterwards. ``.ci/run`` installs the package; a machine without it skips these tests, except in
CI (``CI=true``), where they fail."""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def pg_bin(name: str) -> str | None:
    """A PostgreSQL server program: on PATH, else the newest of Debian's /usr/lib/postgresql/N/bin."""
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(Path(p).parts[-3]))
    return versions[-1] if versions else None


def missing(what: str) -> None:
    """Skip on a developer's machine without it; fail in CI, where .ci/run installs it."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{what} (CI=true: .ci/run installs it)")
    pytest.skip(f"{what}; install it (apt-get install -y postgresql) to run this test")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Postgres:
    """One server: ``url(db)`` for a fresh database on it."""

    def __init__(self, port: int, user: str) -> None:
        self.port, self.user, self.count = port, user, 0

    def url(self, password: str = "") -> str:
        """A new empty database (one per test: its studies are its own)."""
        import psycopg

        self.count += 1
        name = f"sweep{self.count}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres",
                             autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        secret = f":{password}" if password else ""
        return f"postgresql://{self.user}{secret}@127.0.0.1:{self.port}/{name}"


@pytest.fixture(scope="session")
def postgres():
    initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        missing("PostgreSQL's initdb/pg_ctl are not installed")
    pytest.importorskip("psycopg", reason="the PostgreSQL driver (pip install 'gluontl[sweep]')")
    as_user: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="gluontl-pg-"))  # not tmp_path: its parents are root's, mode 0700
    if os.geteuid() == 0:  # postgres will not run as root
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            missing("running as root, and there is no 'postgres' user to run the server as")
        os.chown(root, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()

    def run(*cmd: str) -> None:
        out = subprocess.run([*as_user, *cmd], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, timeout=120)
        assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout}"

    try:
        run(initdb, "-D", str(data), "-U", "gluontl", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
        with open(data / "postgresql.conf", "a") as conf:  # TCP on 127.0.0.1 only; the socket in the folder
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{root}'\n"
                       f"fsync = off\n")
        run(pg_ctl, "-D", str(data), "-l", str(root / "log"), "-w", "-t", "60", "start")
        try:
            yield Postgres(port, "gluontl")
        finally:
            run(pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
