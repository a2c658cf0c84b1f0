"""Where a sweep's study lives: a SQLite file in the sweep folder by default, or an Optuna RDB URL.
(A minimal SQLite-first version; the storage work of issue 34 replaces it with the same signatures.)"""
from __future__ import annotations

from pathlib import Path

from ..errors import SweepError


def open_storage(url: str | None, folder: Path, heartbeat: bool = True):
    """The study's storage: ``url``, or ``sqlite:///FOLDER/study.db`` when None."""
    import optuna

    url = url or f"sqlite:///{Path(folder).resolve() / 'study.db'}"
    try:
        return optuna.storages.RDBStorage(url)
    except Exception as e:  # SQLAlchemy raises many types for a URL it cannot open
        raise SweepError(f"Cannot open the sweep storage '{url}': {' '.join(str(e).split())[:300]}. Pass a "
                         f"reachable Optuna RDB URL with --storage (e.g. postgresql://user@host/db), or leave it "
                         f"out for a SQLite file in the sweep folder.") from None


def fail_stale(study) -> list[int]:
    """Mark trials left RUNNING (by a killed process) as FAIL; their numbers."""
    import optuna

    stale = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))]
    for t in stale:
        study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
    return [t.number for t in stale]
