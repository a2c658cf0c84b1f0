"""What a sweep leaves in its folder: the trial table (trials.csv, trials.json), best.yaml (a
complete recipe `gluontl finetune --recipe` runs), Optuna's matplotlib plots and summary.json."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import yaml

from ..atomic import atomic_write, write_text
from ..console import show
from ..errors import SweepError
from ..runfolder import RunFolder

PLOTS = {"history": "plot_optimization_history", "importances": "plot_param_importances",
         "parallel": "plot_parallel_coordinate", "intermediate": "plot_intermediate_values"}


def table(study) -> list[dict[str, Any]]:
    """One row per trial: number, state, value, seconds, epochs, run folder, then its parameters."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        rows.append({"trial": t.number, "state": t.state.name, "value": t.value,
                     "seconds": t.user_attrs.get("seconds"), "epochs": t.user_attrs.get("epochs"),
                     "run_dir": t.user_attrs.get("run_dir"), **{k: v for k, v in sorted(t.params.items())}})
    return rows


def format_table(rows: list[dict[str, Any]], select: str) -> str:
    if not rows:
        return "no trials yet"
    keys = list(dict.fromkeys(k for r in rows for k in r if k != "run_dir"))
    cell = lambda v: "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    text = [[k if k != "value" else select for k in keys]] + [[cell(r.get(k)) for k in keys] for r in rows]
    widths = [min(max(len(line[i]) for line in text), 40) for i in range(len(keys))]
    return "\n".join("  ".join(c[:40].ljust(w) for c, w in zip(line, widths)).rstrip() for line in text)


def _csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    writer = csv.DictWriter(out, keys, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def plots(folder: Path, study) -> list[Path]:
    """Optuna's matplotlib figures as PNG; a plot its data cannot make (importances of one trial) is left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as vis

    made = []
    (folder / "plots").mkdir(exist_ok=True)
    for name, fn in PLOTS.items():
        try:
            ax = getattr(vis, fn)(study)
        except Exception:  # Optuna raises for too few trials or parameters; the rest still plot
            continue
        fig = (ax.flat[0] if hasattr(ax, "flat") else ax).get_figure()
        path = folder / "plots" / f"{name}.png"
        atomic_write(path, lambda tmp, f=fig: f.savefig(tmp, format="png", dpi=90, bbox_inches="tight"), SweepError)
        plt.close(fig)
        made.append(path)
    return made


def write(folder: Path, study, rows: list[dict[str, Any]], best_recipe, passes: int, quiet: bool) -> None:
    write_text(folder / "trials.json", json.dumps(rows, indent=1), SweepError)
    write_text(folder / "trials.csv", _csv(rows), SweepError)
    if best_recipe is not None:
        write_text(folder / "best.yaml", yaml.safe_dump(best_recipe.as_written(), sort_keys=False), SweepError)
    made = plots(folder, study)
    states = {s: sum(r["state"] == s for r in rows) for s in ("COMPLETE", "PRUNED", "FAIL")}
    best = next((r for r in rows if study.best_trials and r["trial"] == study.best_trial.number), None) \
        if any(r["state"] == "COMPLETE" for r in rows) else None
    summary = {"trials": len(rows), **{k.lower(): v for k, v in states.items()}, "prefix_passes": passes,
               "best": best, "plots": [p.name for p in made]}
    write_text(folder / RunFolder.SUMMARY, json.dumps(summary, indent=1), SweepError)
    show(f"sweep done: {states['COMPLETE']} complete, {states['PRUNED']} pruned, {states['FAIL']} failed; "
         f"prefix passes {passes} images; " + (f"best {best['value']:.4g} (trial {best['trial']}), "
                                               f"recipe {folder / 'best.yaml'}" if best else "no best trial"), quiet)
