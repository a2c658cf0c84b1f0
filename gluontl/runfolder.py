"""A run folder, ``runs/NAME``: its one owner. Every file and folder name in it, what makes a folder
a run, which checkpoint ``RUN``, ``RUN/best`` or ``RUN/last`` names, and the checkpoint files as read
back (``checkpoints/TAG.json`` naming and hashing its ``TAG.<generation>.params``, ``.states`` and
``.ema``). Everything else asks :class:`RunFolder` for a path, so the layout is written down once
and ``tests/test_runfolder_names.py`` fails when a name is spelled anywhere else. At the bottom of
the house so that restore (``weights: runs/NAME``) and detection's class reuse read a run without
importing the loop that writes it (``data/checkpoint.py``)."""
from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

from .errors import TrainError
from .readers import read_json

TAGS = ("best", "last")  # the checkpoints a run keeps: the best by train.select, and the latest


class RunFolder:
    """The paths of one run folder; nothing is read or written by asking for one.

    ``str(rf)`` and ``os.fspath(rf)`` are the folder, so messages name it as before."""

    RECIPE = "recipe.yaml"  # the recipe as trained (a resume may have extended its schedule)
    PLAN_TEXT, PLAN_JSON = "plan.txt", "plan.json"  # the Plan, as printed and as data
    METRICS = "metrics.jsonl"  # the record of steps and epochs; TensorBoard events beside it mirror it
    EVENTS = "events.out.tfevents."  # how TensorBoard's files in the folder begin
    CARD = "preprocess.json"  # evaluation preprocessing and class names (data/card.py)
    SUMMARY = "summary.json"  # written when a run ends: best, last, why it stopped
    SPLIT = "split.json"  # the train/val split a run drew from one folder of images
    WARNINGS = "warnings.json"  # what the guards found
    ADAPTERS = "adapters.params"  # the best checkpoint's adapters alone, for load_adapters
    CURVES = "curves.png"  # gluontl plot
    PR_CURVES = "pr_curves"  # detection's evaluate: pr_curves-SPLIT.png
    LR_FIND = "lr_find.json"  # the range test that chose train.lr: auto
    CHECKPOINTS = "checkpoints"
    CHECKPOINT_RECORD = ".json"  # checkpoints/TAG.json: the commit record naming and hashing the files
    CHECKPOINT_KINDS = ("params", "states", "ema")  # TAG.<generation>.KIND, and TAG.KIND linked to it
    LOGS = "logs"  # logs/worker-RANK.log and .sha256 of a distributed run
    RESTARTS = "restarts.jsonl"  # logs/restarts.jsonl: gluontl launch --max-restarts' record, a row per restart
    EXPORT = "export"  # gluontl export's default place
    PREDICTIONS = "predictions"  # predict's default place for drawn images
    FEATURE_CACHE = "feature_cache"  # frozen-prefix features (feature_cache-RANK per worker)
    BENCH = "bench.json"  # gluontl bench's report, in export/

    # the names the owner alone spells (tests/test_runfolder_names.py, scripts/house_counts.py)
    FILE_NAMES = (RECIPE, PLAN_TEXT, PLAN_JSON, METRICS, CARD, SUMMARY, SPLIT, WARNINGS, ADAPTERS, CURVES,
                  LR_FIND, BENCH, RESTARTS)
    DIR_NAMES = (CHECKPOINTS, LOGS, EXPORT, PREDICTIONS, FEATURE_CACHE, PR_CURVES)

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def __fspath__(self) -> str:
        return os.fspath(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunFolder) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    # ------------------------------------------------------------------ files of the run
    @property
    def recipe_path(self) -> Path:
        return self.path / self.RECIPE

    @property
    def plan_text_path(self) -> Path:
        return self.path / self.PLAN_TEXT

    @property
    def plan_json_path(self) -> Path:
        return self.path / self.PLAN_JSON

    @property
    def metrics_path(self) -> Path:
        return self.path / self.METRICS

    @property
    def events_dir(self) -> Path:
        """Where TensorBoard's SummaryWriter writes: the run folder itself."""
        return self.path

    @property
    def card_path(self) -> Path:
        return self.path / self.CARD

    @property
    def summary_path(self) -> Path:
        return self.path / self.SUMMARY

    @property
    def split_path(self) -> Path:
        return self.path / self.SPLIT

    @property
    def warnings_path(self) -> Path:
        return self.path / self.WARNINGS

    @property
    def adapters_path(self) -> Path:
        return self.path / self.ADAPTERS

    @property
    def curves_path(self) -> Path:
        return self.path / self.CURVES

    @property
    def lr_find_path(self) -> Path:
        return self.path / self.LR_FIND

    def pr_curves_path(self, split: str) -> Path:
        return self.path / f"{self.PR_CURVES}-{split}.png"

    def user_file(self, name: str) -> Path:
        """A file the recipe names (e.g. the csv callback's ``file``), in the run folder."""
        return self.path / name

    @property
    def artifacts(self) -> tuple[Path, ...]:
        """The records a tracker (MLflow) keeps of a finished run, where they exist."""
        return tuple(self.path / n for n in (self.PLAN_TEXT, self.PLAN_JSON, self.CARD, self.SUMMARY, self.CURVES))

    # ------------------------------------------------------------------ folders of the run
    @property
    def checkpoints_dir(self) -> Path:
        return self.path / self.CHECKPOINTS

    @property
    def logs_dir(self) -> Path:
        return self.path / self.LOGS

    def worker_log(self, rank: int) -> Path:
        return self.logs_dir / f"worker-{rank}.log"

    @property
    def restarts_path(self) -> Path:
        """Every automatic restart of the run's job: when, why, from which step."""
        return self.logs_dir / self.RESTARTS

    def worker_digest(self, rank: int) -> Path:
        """The SHA-256 of a worker's final parameters (workers of one job must agree)."""
        return self.logs_dir / f"worker-{rank}.sha256"

    @property
    def export_dir(self) -> Path:
        return self.path / self.EXPORT

    @property
    def bench_path(self) -> Path:
        return self.export_dir / self.BENCH

    @property
    def predictions_dir(self) -> Path:
        return self.path / self.PREDICTIONS

    def feature_cache_dir(self, rank: int = 0, workers: int = 1) -> Path:
        """One folder per worker of a distributed run (each caches its own shard)."""
        return self.path / (self.FEATURE_CACHE if workers == 1 else f"{self.FEATURE_CACHE}-{rank}")

    # ------------------------------------------------------------------ checkpoints
    def checkpoint(self, tag: str) -> Path:
        """``checkpoints/TAG.json``: the record of checkpoint ``tag`` (its presence is the checkpoint's)."""
        return self.checkpoint_record(self.checkpoints_dir, tag)

    def checkpoint_params(self, tag: str) -> Path:
        """``checkpoints/TAG.params``: the link to the committed generation's parameters."""
        return self.checkpoint_file(self.checkpoints_dir, tag, "params")

    def has_checkpoint(self, tag: str) -> bool:
        return self.checkpoint(tag).is_file()

    @classmethod
    def checkpoint_record(cls, folder: Path, tag: str) -> Path:
        return folder / f"{tag}{cls.CHECKPOINT_RECORD}"

    @staticmethod
    def checkpoint_file(folder: Path, tag: str, kind: str, generation: str | None = None) -> Path:
        """``TAG.KIND`` (the link readers of the folder use) or ``TAG.GENERATION.KIND`` (a save's own file)."""
        return folder / (f"{tag}.{kind}" if generation is None else f"{tag}.{generation}.{kind}")

    @staticmethod
    def generations(folder: Path, tag: str, kind: str) -> list[Path]:
        return sorted(folder.glob(f"{tag}.*.{kind}"))

    # ------------------------------------------------------------------ what a run is
    def is_run(self) -> bool:
        """A run folder is a folder with the recipe it trained (written before anything else)."""
        return self.recipe_path.is_file()

    @classmethod
    def of_recipe(cls, recipe: Path) -> RunFolder | None:
        """The run whose ``recipe.yaml`` this is (a file named so beside a checkpoints folder), else None."""
        p = Path(recipe)
        return cls(p.parent) if p.name == cls.RECIPE and (p.parent / cls.CHECKPOINTS).is_dir() else None

    @classmethod
    def resolve(cls, ref: str | os.PathLike) -> tuple[RunFolder, str] | None:
        """The run and checkpoint tag ``ref`` names: ``RUN`` (its best), ``RUN/best`` or ``RUN/last``;
        None when it names no run folder."""
        path, tag = Path(ref), "best"
        if path.name in TAGS and not path.is_dir() and cls(path.parent).is_run():
            path, tag = path.parent, path.name
        run = cls(path)
        return (run, tag) if run.is_run() else None

    @classmethod
    def create(cls, root: Path, name: str) -> RunFolder:
        """A new folder ``root/NAME`` (``NAME-2``, ... when taken) with its checkpoints folder."""
        try:
            root.mkdir(parents=True, exist_ok=True)
            path, n = root / name, 1
            while path.exists():
                n += 1
                path = root / f"{name}-{n}"
            path.mkdir()
            run = cls(path)
            run.checkpoints_dir.mkdir()
        except OSError as e:
            raise TrainError(f"Cannot create a run folder under '{root}': {e.strerror}. Pick a writable place "
                             f"with --runs DIR (and check free space).") from None
        return run


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_files(folder: Path, tag: str, meta: dict[str, Any]) -> dict[str, Path]:
    """The params/states files the checkpoint names (TAG.params/.states before generations);
    only plain names inside the checkpoint folder count."""
    out = {}
    for kind in ("params", "states", *(("ema",) if "ema_file" in meta else ())):  # ema: train.ema's average
        name = str(meta.get(f"{kind}_file", RunFolder.checkpoint_file(folder, tag, kind).name))
        if Path(name).name != name or name in ("", ".."):  # "." has no name: caught by the first test
            raise TrainError(f"Checkpoint '{RunFolder.checkpoint_record(folder, tag)}' names '{name}' as its {kind} "
                             f"file, which is not a file of {folder}; refusing to read it. The JSON was edited by "
                             f"hand or is damaged.")
        out[kind] = folder / name
    return out


def read_checkpoint(folder: Path, tag: str) -> dict[str, Any]:
    """The checkpoint's counters, after checking its files are the ones it recorded."""
    meta_path = RunFolder.checkpoint_record(folder, tag)
    if not meta_path.is_file():
        raise TrainError(f"No checkpoint '{tag}' in {folder}: '{meta_path.name}' is missing. "
                         f"Resume needs a run folder written by gluontl finetune.")
    meta = read_json(meta_path, TrainError, "the checkpoint record")
    if not isinstance(meta, dict):
        raise TrainError(f"Checkpoint file '{meta_path}' is not a checkpoint record (a JSON object); refusing it.")
    for kind, path in checkpoint_files(folder, tag, meta).items():
        if not path.is_file() or file_sha256(path) != meta.get(f"{kind}_sha256"):
            raise TrainError(f"Checkpoint '{path}' does not match the hash recorded in '{meta_path.name}' "
                             f"(missing, modified or from another run); refusing to load it.")
    return meta


def run_weights(ref: str | Path) -> Path | None:
    """The params file of a run checkpoint named as ``RUN`` (its best), ``RUN/best`` or
    ``RUN/last``, hash-checked; None when ``ref`` names no run folder."""
    found = RunFolder.resolve(ref)
    if found is None:
        return None
    run, tag = found
    folder = run.checkpoints_dir
    if not run.has_checkpoint(tag):
        last = tag == "best" and run.has_checkpoint("last")
        raise TrainError(f"Run '{run}' has no '{tag}' checkpoint ({run.checkpoint(tag)} is missing) to start from: "
                         f"it stopped before finishing an epoch. Finish it with `gluontl finetune --resume {run}`"
                         f"{', or name RUN/last' if last else ''}.")
    return checkpoint_files(folder, tag, read_checkpoint(folder, tag))["params"]


def discard_unstarted(run_dir: Path) -> bool:
    """Remove a new run's folder when the run ended before its first checkpoint: nothing in it can
    be resumed, and each failed attempt would leave one more (``NAME``, ``NAME-2``, ...)."""
    if RunFolder(run_dir).checkpoint("last").exists():
        return False
    shutil.rmtree(run_dir, ignore_errors=True)
    return True
