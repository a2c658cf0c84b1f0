"""``gluontl sweep --dashboard``: optuna-dashboard on 127.0.0.1 shows the sweep's study, read by
headless Chromium (Debian's ``chromium``; .ci/run installs it); stopping it frees its port and
leaves nothing running."""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess

import pytest

from gluontl.sweep import storage as st
from tests.sweep.postgres import missing

optuna = pytest.importorskip("optuna")
pytest.importorskip("optuna_dashboard", reason="--dashboard needs optuna-dashboard (pip install 'gluontl[sweep]')")


def page_text(url: str, profile) -> str:
    """What a browser shows at ``url`` once its scripts ran: the DOM's text (no styles, scripts or SVG)."""
    chromium = shutil.which("chromium")
    if chromium is None:
        missing("Debian's chromium is not installed (apt-get install -y chromium)")
    flags = ["--no-sandbox"] if os.geteuid() == 0 else []  # Chromium's sandbox refuses root
    out = subprocess.run([chromium, "--headless", "--disable-gpu", *flags, f"--user-data-dir={profile}",
                          "--virtual-time-budget=20000", "--dump-dom", url],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    body = re.sub(r"<(style|script|svg)\b.*?</\1>", " ", out.stdout, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", body).split())


def test_dashboard_shows_the_study_and_its_trials_then_stops(tmp_path):
    from gluontl.sweep.dashboard import Dashboard

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = st.open_storage(None, tmp_path)
    study = optuna.create_study(storage=storage, study_name="elpv-lr-sweep",
                                sampler=optuna.samplers.RandomSampler(seed=3))
    study.optimize(lambda t: t.suggest_float("lr", 1e-4, 1e-1, log=True), n_trials=3)
    best = study.best_trial
    with Dashboard(storage) as board:
        assert board.url.startswith("http://127.0.0.1:")
        listing = page_text(board.url, tmp_path / "p1")
        trials = page_text(f"{board.url}studies/{study._study_id}/trials", tmp_path / "p2")
        port = board.port
    assert "elpv-lr-sweep" in listing and "Direction: MINIMIZE" in listing
    assert f"elpv-lr-sweep (id={study._study_id})" in trials and "3 Trials" in trials
    assert re.findall(r"Trial (\d) Complete", trials) == ["0", "1", "2"]
    first = study.trials[0]
    assert f"Value {first.value!r}" in trials and f"lr {first.params['lr']!r}" in trials
    assert re.search(rf"Trial {best.number} Complete Best Trial", trials)
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # stopped: nothing listens there any more


def test_dashboard_without_the_package_is_one_paragraph(tmp_path, monkeypatch):
    import sys

    from gluontl.errors import SweepError
    from gluontl.sweep.dashboard import Dashboard

    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # as if not installed
    with pytest.raises(SweepError, match="needs optuna-dashboard: pip install optuna-dashboard"):
        Dashboard(st.open_storage(None, tmp_path))
