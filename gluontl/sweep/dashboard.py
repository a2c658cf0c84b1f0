"""``gluontl sweep --dashboard``: optuna-dashboard's live view of a sweep's study, on 127.0.0.1 only.

Served from a thread of the sweep's process (a WSGI server on a port the system picks), so it
needs no second command, sees the same storage, and ends with the sweep; as a context manager it
stops and frees its port on exit.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from ..errors import SweepError


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:  # one line per request would bury the trial lines
        pass


class Dashboard:
    """optuna-dashboard for ``storage`` at ``self.url`` while entered (or between start and stop)."""

    def __init__(self, storage: Any, port: int = 0) -> None:
        try:
            from optuna_dashboard import wsgi
        except ImportError:
            raise SweepError("--dashboard needs optuna-dashboard: pip install optuna-dashboard (or pip install "
                             "'gluontl[sweep]').") from None
        self.storage, self._app, self.port = storage, wsgi(storage), port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/dashboard/"

    def start(self) -> "Dashboard":
        try:
            self._server = make_server("127.0.0.1", self.port, self._app, handler_class=_Quiet)
        except OSError as e:
            raise SweepError(f"--dashboard cannot listen on 127.0.0.1:{self.port} ({e.strerror}); pick another "
                             f"port or stop what uses it.") from None
        self.port = self._server.server_port
        self._thread = threading.Thread(target=self._server.serve_forever, name="sweep-dashboard", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join()
            self._server = self._thread = None

    def __enter__(self) -> "Dashboard":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve(url: str | None, folder: Path, show: Callable[[str], None]) -> Dashboard:
    """A started dashboard for the sweep in ``folder`` (storage ``url``, None: its SQLite file)."""
    from .storage import open_storage

    board = Dashboard(open_storage(url, folder, heartbeat=False)).start()
    show(f"dashboard: {board.url} (127.0.0.1 only; it stops with the sweep)")
    return board
