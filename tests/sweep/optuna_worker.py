"""A sweep worker for the storage tests: Optuna on ``gluontl.sweep.storage`` with a tiny objective
(x², x in [-1, 1]) until the study holds N complete trials. It logs every trial it starts (one line,
``NAME NUMBER``, to LOG) and talks to the test through its pipes, never by time:
``--block-at K``: its K-th trial prints ``blocked NUMBER`` and waits on stdin (to be killed there);
``--gate``: each trial prints ``trial NUMBER`` and waits for a line on stdin before it ends.

    python -m tests.sweep.optuna_worker URL FOLDER STUDY N NAME LOG [--block-at K] [--gate]
"""
from __future__ import annotations

import argparse
import sys
import zlib
from pathlib import Path


def main() -> None:
    import optuna
    from optuna.study import MaxTrialsCallback
    from optuna.trial import TrialState

    from gluontl.sweep.storage import open_storage

    p = argparse.ArgumentParser()
    for name in ("url", "folder", "study", "n", "name", "log"):
        p.add_argument(name)
    p.add_argument("--block-at", type=int, default=0)
    p.add_argument("--gate", action="store_true")
    a = p.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(storage=open_storage(a.url if a.url != "-" else None, Path(a.folder)),
                                study_name=a.study, load_if_exists=True,
                                sampler=optuna.samplers.RandomSampler(seed=zlib.crc32(a.name.encode())))
    started = 0

    def objective(trial) -> float:
        nonlocal started
        x = trial.suggest_float("x", -1.0, 1.0)
        with open(a.log, "a") as log:
            log.write(f"{a.name} {trial.number}\n")
        started += 1
        if started == a.block_at:
            print(f"blocked {trial.number}", flush=True)
            sys.stdin.readline()
            raise SystemExit("unblocked: the test should have killed this worker")
        if a.gate:
            print(f"trial {trial.number}", flush=True)
            sys.stdin.readline()
        return x * x

    study.optimize(objective, callbacks=[MaxTrialsCallback(int(a.n), states=(TrialState.COMPLETE,))])
    print("done", flush=True)


if __name__ == "__main__":
    main()
