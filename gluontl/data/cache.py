"""Frozen-prefix feature cache: compute what the frozen part of the network makes of each
image once, and train the trainable suffix from that.

A frozen prefix (see ``prefix.split_frozen_prefix``) under deterministic train transforms
maps each image to the same features every epoch, so epochs 2..N need only the suffix.
With random augmentation the cache holds ``train.cache_views`` = K augmented views per
image, view v drawn exactly as epoch v would draw it (``sample_rng(seed, v, index)``);
epoch e trains on view e % K, so with K >= epochs training is the uncached run. Batches
come in the sampler's order, so the loss curve equals the uncached one within float
tolerance. Features live in memory, or in a memory-mapped file in the run folder past
``train.cache_max_bytes``.

A run that stops before its end (a signal, ``--stop-after-steps``, an error) leaves its features
in ``RUN/feature_cache``, each ``.npy`` beside a JSON record of what it is the output of: the
cut, the frozen prefix's parameter values (SHA-256), the recipe's model, surgery and data
sections, the seed, dtype and shape. A resume whose record matches reads the file instead of
running the prefix again (so a short slot trains at once, on the very features the
uninterrupted run uses); any difference recomputes. Memory-mapped features get their record as
soon as they are complete, so they survive kill -9 too. A finished run removes the folder.

Inside ``shared_features(FOLDER)`` (what ``gluontl sweep`` runs its trials in) every run's features
go to FOLDER instead, named by a digest of their record, so runs with the same prefix identity
(cut, prefix weights, images, model/surgery/data sections, seed, dtype, engine) read one file: the
first run to need a view computes it under an exclusive ``fcntl`` lock into a temp file renamed into
place, the others wait for the lock and memory-map the result read-only. Each computation appends
its image count to ``FOLDER/passes.jsonl`` (the sweep's prefix passes). Nothing there is removed
by a run.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import HybridBlock

from ..atomic import atomic_write, write_text
from ..errors import TrainError
from ..mxinternals import clear_cached_op, loader_dataset
from ..naming import named_params
from ..readers import name_bytes, read_json, read_json_lines
from ..recipe import Recipe, TrainSpec, TransformSpec
from ..rules import Plan
from ..runfolder import RunFolder
from .datasets import ImageDataset, Loaders, load_split
from .prefix import (Engine, Int8Engine, MxEngine, Split, check_images, choose_engine, nested,
                     split_frozen_prefix)
from .sampler import EpochSampler

_RANDOM_STEPS = ("random_resized_crop", "flip", "color_jitter", "randaugment", "trivial_augment", "random_erasing")
PER_STEP_MARGIN = 1.5
# The int8 prefix's activation ranges come from this many training images (a fixed draw, each
# in one of the views the cache holds), in batches of CALIBRATION_BATCH.
CALIBRATION_IMAGES = 128
CALIBRATION_BATCH = 16


def random_steps(spec: TransformSpec) -> list[str]:
    """The random steps of a train transform (what rules out a one-view cache)."""
    return [s for s in _RANDOM_STEPS if getattr(spec, s)]


@dataclass
class Decision:
    """Whether train features are cached (and how many views), and the sentence saying why."""

    train: bool
    views: int
    reason: str


def decide(t: TrainSpec, split: Split, train_transform: TransformSpec) -> Decision:
    """Cache train features when there is a frozen prefix and each image has a fixed set of
    views; ``cache_features: on`` makes any reason against it an error."""
    if t.cache_features == "off":
        return Decision(False, 0, "train.cache_features: off")
    why_not = None
    steps = random_steps(train_transform)
    if split.prefix is None:
        why_not = split.reason
    elif steps and t.cache_views == 0:
        why_not = (f"{', '.join(steps)} in train_transform (random per epoch; set train.cache_views: K "
                   f"to cache K augmented views)")
    if why_not is not None:
        if t.cache_features == "on":
            raise TrainError(f"train.cache_features: on, but the features cannot be cached: {why_not}. "
                             f"Use cache_features: auto to train without the cache in that case.")
        return Decision(False, 0, why_not)
    views = t.cache_views if steps else 1
    more = f", {views} augmented views (epoch e uses view e % {views})" if steps else ""
    if t.mixup is not None:
        more += "; train.mixup mixes these cached features (after the prefix, docs/classification.md)"
    return Decision(True, views, f"{split.reason}{more}")


def check_mixing(t: TrainSpec, decision: Decision, features: tuple[int, ...]) -> None:
    """CutMix cuts boxes from a feature map: on a cached prefix's flat (N, D) features it is refused
    before any work (``features`` is the prefix's output shape for a batch)."""
    if decision.train and t.mixup is not None and t.mixup.cutmix_alpha > 0 and len(features) != 4:
        raise TrainError(f"train.mixup.cutmix_alpha is {t.mixup.cutmix_alpha:g}, but with the feature cache "
                         f"CutMix cuts boxes from the frozen prefix's features, and these are flat "
                         f"({list(features)}, no H x W). Set cutmix_alpha: 0 (mixup mixes flat features "
                         f"fine), cut the model earlier, or set train.cache_features: off to mix images.")


def cache_key(recipe: Recipe, split: Split, row_shape: tuple[int, ...], train: ImageDataset, val: ImageDataset,
              engine: Engine | None = None) -> dict[str, Any]:
    """What cached features are the output of (see the module docstring). The images are named by
    their items and labels: a data folder renamed or relabelled between a stop and its resume
    (same recipe, same count) must not pair old features with new labels. The float engines
    agree within 1e-4 and share a key; an int8 prefix's features are others, and which ones
    depends on ``reduce_range`` (the CPU's), so the engine that ran keys them (``engine.key``)."""
    items = hashlib.sha256()
    for ds in (train, val):
        items.update(name_bytes("\n".join(ds.name(i) for i in range(len(ds)))) + b"\0" + ds.labels.tobytes() + b"\0")
    return {"format": 1, "boundary": split.boundary, "prefix_sha256": params_digest(split.prefix),
            "items_sha256": items.hexdigest(),
            "recipe": recipe.digest("model", "surgery", "data"), "seed": recipe.train.seed,
            "dtype": recipe.train.cache_dtype, "row_shape": list(row_shape), **(engine.key if engine else {})}


def params_digest(block: HybridBlock) -> str:
    """SHA-256 of a block's parameter names and values (a frozen prefix's identity)."""
    h = hashlib.sha256()
    for name, e in sorted(named_params(block).items()):
        h.update(name.encode())
        h.update(e.param.list_data()[0].asnumpy().tobytes())
    return h.hexdigest()


class Calibration:
    """Training images as the cache feeds them to the prefix, in batches decoded on demand: a
    fixed draw of ``n``, image k of the draw in view k % ``views`` (``prefix.Int8Engine``)."""

    def __init__(self, ds: ImageDataset, views: int, n: int = CALIBRATION_IMAGES,
                 batch: int = CALIBRATION_BATCH) -> None:
        picked = sorted(np.random.default_rng(0).permutation(len(ds))[:n].tolist())
        self.ds, self.images = ds, len(picked)
        self.keys = [[(i, k % views) for k, i in enumerate(picked)][s:s + batch] for s in range(0, len(picked), batch)]

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, b: int) -> np.ndarray:
        return np.stack([self.ds[key][0] for key in self.keys[b]])


def _files(folder: Path, what: str) -> tuple[Path, Path]:
    name = what.replace(" ", "_")
    return folder / f"{name}.npy", folder / f"{name}.json"


_SHARED: list[Path] = []  # the folder of shared_features, innermost last


@contextlib.contextmanager
def shared_features(folder: str | Path) -> Iterator[Path]:
    """Runs started inside share frozen-prefix features through ``folder`` (see the module
    docstring): one computation per prefix identity and view, whatever the number of runs."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _SHARED.append(folder)
    try:
        yield folder
    finally:
        _SHARED.remove(folder)


def prefix_passes(folder: str | Path) -> int:
    """Images the whole frozen prefix ran on for the features in a ``shared_features`` folder
    (features a deeper cut made from a shallower cut's are not counted: no image went through)."""
    rows, _ = read_json_lines(Path(folder) / "passes.jsonl", TrainError, "the shared cache's pass log")
    return sum(r["rows"] for r in rows if "from" not in r and isinstance(r.get("rows"), int))


_SAME_SOURCE = ("format", "items_sha256", "recipe", "seed", "dtype")


def _shallower_source(net: HybridBlock, split: Split, cache: "FeatureCache", probe: np.ndarray, ctx: mx.Context,
                      hybridize: bool) -> Callable[[str, int], tuple[np.ndarray, Callable, str] | None]:
    """For a shared cache: find features a shallower cut of the same model, images and settings
    stored, whose prefix has this one's weights (``params_digest``) and whose middle blocks make
    this cut's features on the probe (``prefix.nested``); the middle then runs on them alone."""

    def find(what: str, rows: int) -> tuple[np.ndarray, Callable, str] | None:
        if "engine" in cache.key:  # int8 features are their engine's own
            return None
        for record_path in sorted(cache.folder.glob(f"*-{what.replace(' ', '_')}.json")):
            try:
                record = read_json(record_path, TrainError, "the feature-cache record")
            except TrainError:
                continue
            if (record.get("what") != what or record.get("rows") != rows or "engine" in record
                    or record.get("boundary") == cache.key["boundary"]
                    or any(record.get(k) != cache.key[k] for k in _SAME_SOURCE)):
                continue
            parts = nested(net, split, record["boundary"])
            if parts is None or params_digest(parts[0]) != record["prefix_sha256"]:
                continue
            head, middle = parts
            key = {k: v for k, v in record.items() if k not in ("what", "rows")}
            stored = stored_features(cache.folder, what, record, cache.dtype, f"{_key_digest(key)}-{what}")
            if stored is None:
                continue
            if hybridize:
                middle.hybridize(static_alloc=True, static_shape=True)
            with autograd.predict_mode():
                x = mx.nd.array(probe, ctx=ctx)
                want, got = split.prefix(x).asnumpy(), middle(head(x)).asnumpy()
            if want.shape != got.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5):
                continue

            def run(f: np.ndarray, middle=middle) -> np.ndarray:
                with autograd.predict_mode():
                    return middle(mx.nd.array(f, ctx=ctx)).asnumpy()

            return stored, run, record["boundary"]
        return None

    return find


def _key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]


def stored_features(folder: Path, what: str, record: dict[str, Any], dtype: np.dtype,
                    name: str | None = None) -> np.ndarray | None:
    """The features in ``folder`` for ``what`` (files ``name``, default ``what``; memory-mapped), if
    their record is ``record`` and the file holds what it says; None otherwise (missing, another
    key, damaged)."""
    data, path = _files(folder, name or what)
    try:
        if read_json(path, TrainError, "the feature-cache record") != record:
            return None
        out = np.load(data, mmap_mode="r", allow_pickle=False)
    except Exception:  # numpy's header parser raises many types (ValueError, SyntaxError, TokenError...)
        return None  # a damaged cache is computed again, never trusted
    return out if out.dtype == dtype and out.shape == (record["rows"], *record["row_shape"]) else None


class FeatureCache:
    """Prefix outputs of the train views and of val, filled on first use (or read from the
    run folder, where a stopped run left them under the same ``key``)."""

    def __init__(self, engine: Engine | None, loaders: Loaders, views: int, t: TrainSpec, folder: Path,
                 batch_size: int, workers: int, quiet: bool, key: dict[str, Any]) -> None:
        self.engine, self.loaders, self.views = engine, loaders, views
        self.dtype = np.dtype(t.cache_dtype)
        self.max_bytes, self.folder = t.cache_max_bytes, folder
        self.batch_size, self.workers, self.quiet = batch_size, workers, quiet
        self.key = key
        self.train: dict[int, np.ndarray] = {}
        self.val: np.ndarray | None = None
        self.bytes = 0
        self.fill_seconds = 0.0  # the frozen prefix's share of the run's wall time
        self.reused: list[str] = []  # what was read from the run folder instead of computed
        self.on_disk: set[str] = set()  # what is in the run folder under this cache's record
        self.shared = False  # the folder is a shared_features one: named by key, locked, never removed
        # in a shared folder: (what, rows) -> a shallower cut's stored features and the block that
        # makes this cut's from them (prefix.nested), or None
        self.from_shallower: Callable[[str, int], tuple[np.ndarray, Callable, str] | None] | None = None

    def _name(self, what: str) -> str:
        return f"{_key_digest(self.key)}-{what}" if self.shared else what

    def _files(self, what: str) -> tuple[Path, Path]:
        return _files(self.folder, self._name(what))

    def _record(self, what: str, rows: int) -> dict[str, Any]:
        return {**self.key, "what": what, "rows": rows}

    def _on_file(self, what: str, rows: int) -> np.ndarray | None:
        return stored_features(self.folder, what, self._record(what, rows), self.dtype, self._name(what))

    def complete(self) -> bool:
        """Whether every view and val are in the run folder under this cache's record."""
        train, val = len(loader_dataset(self.loaders.train)), len(loader_dataset(self.loaders.val))
        return all(self._on_file(f"train view {v}", train) is not None for v in range(self.views)) \
            and self._on_file("val", val) is not None

    def _stored(self, what: str, rows: int) -> np.ndarray | None:
        out = self._on_file(what, rows)
        if out is None:
            return None
        self.bytes += out.nbytes
        self.reused.append(what)
        self.on_disk.add(what)
        return out

    def _fill(self, ds: ImageDataset, keys: list, what: str) -> np.ndarray:
        from tqdm import tqdm

        stored = self._stored(what, len(keys))
        if stored is not None:
            return stored
        if self.shared:
            return self._fill_shared(ds, keys, what)
        batches = [keys[i:i + self.batch_size] for i in range(0, len(keys), self.batch_size)]
        loader = gluon.data.DataLoader(ds, batch_sampler=batches, num_workers=self.workers, thread_pool=False)
        out = None
        row = 0
        start = time.perf_counter()
        for x, _ in tqdm(loader, total=len(batches), desc=f"caching {what} features", unit="batch",
                         leave=False, disable=self.quiet):
            f = self.engine(x.asnumpy())
            if out is None:
                out = self._allocate((len(keys), *f.shape[1:]), what)
            out[row:row + len(f)] = f
            row += len(f)
        self.fill_seconds += time.perf_counter() - start
        if isinstance(out, np.memmap):  # complete on disk: valid for a resume from now on
            out.flush()
            write_text(self._files(what)[1], json.dumps(self._record(what, len(keys))), TrainError)
            self.on_disk.add(what)
        return out

    def _fill_shared(self, ds: ImageDataset, keys: list, what: str) -> np.ndarray:
        """Compute ``what`` into the shared folder under its lock, unless another run did while
        this one waited for the lock; then read it memory-mapped."""
        data, record = self._files(what)
        with open(data.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when the process dies
            stored = self._stored(what, len(keys))
            if stored is not None:
                return stored
            tmp = data.with_name(f".{data.name}.{os.getpid()}.tmp")
            source = self.from_shallower(what, len(keys)) if self.from_shallower is not None else None
            if source is None:
                batches = [keys[i:i + self.batch_size] for i in range(0, len(keys), self.batch_size)]
                loader = gluon.data.DataLoader(ds, batch_sampler=batches, num_workers=self.workers,
                                               thread_pool=False)
                steps, engine = ((x.asnumpy(), None) for x, _ in loader), self.engine
            else:  # the shallower cut's features through the middle blocks: no image decoded, no early layer run
                stored, engine, _ = source
                steps = ((np.asarray(stored[i:i + self.batch_size], np.float32), None)
                         for i in range(0, len(keys), self.batch_size))
            out, row, start = None, 0, time.perf_counter()
            try:
                for x, _ in steps:
                    f = engine(x)
                    if out is None:
                        out = np.lib.format.open_memmap(tmp, "w+", self.dtype, (len(keys), *f.shape[1:]))
                    out[row:row + len(f)] = f
                    row += len(f)
                out.flush()
                del out
                os.replace(tmp, data)
            finally:
                tmp.unlink(missing_ok=True)
            self.fill_seconds += time.perf_counter() - start
            write_text(record, json.dumps(self._record(what, len(keys))), TrainError)
            with open(self.folder / "passes.jsonl", "a", encoding="utf-8") as log:
                log.write(json.dumps({"what": what, "rows": len(keys), "boundary": self.key["boundary"],
                                      **({"from": source[2]} if source is not None else {})}) + "\n")
        stored = self._on_file(what, len(keys))
        if stored is None:
            raise TrainError(f"The shared feature file {data} was written but does not read back; remove it "
                             f"and run again.")
        self.bytes += stored.nbytes
        self.on_disk.add(what)
        return stored

    def _allocate(self, shape: tuple[int, ...], what: str) -> np.ndarray:
        size = int(np.prod(shape)) * self.dtype.itemsize
        self.bytes += size
        if self.bytes <= self.max_bytes:
            return np.empty(shape, self.dtype)
        self.folder.mkdir(parents=True, exist_ok=True)
        data, record = self._files(what)
        record.unlink(missing_ok=True)  # an old record must not vouch for the half-written file
        return np.lib.format.open_memmap(data, "w+", self.dtype, shape)

    def prepare(self, epoch: int) -> None:
        """Compute the view epoch ``epoch`` trains on, if not yet done (before its progress bar)."""
        v = epoch % self.views
        if v not in self.train:
            ds = loader_dataset(self.loaders.train)
            self.train[v] = self._fill(ds, [(i, v) for i in range(len(ds))], f"train view {v}")

    def train_batches(self, epoch: int, skip: int) -> Iterator[tuple[mx.nd.NDArray, mx.nd.NDArray]]:
        """The batches of ``epoch`` in the loader's order, as (features, labels)."""
        self.prepare(epoch)
        feats, labels = self.train[epoch % self.views], loader_dataset(self.loaders.train).labels
        sampler: EpochSampler = self.loaders.train_sampler
        sampler.set_epoch(epoch)
        sampler.skip(skip)
        for keys in sampler:
            idx = np.fromiter((k[0] for k in keys), np.int64, len(keys))
            yield mx.nd.array(feats[idx], dtype=np.float32), mx.nd.array(labels[idx], dtype=np.float32)

    def val_batches(self) -> Iterator[tuple[mx.nd.NDArray, mx.nd.NDArray]]:
        ds = loader_dataset(self.loaders.val)
        if self.val is None:
            self.val = self._fill(ds, list(range(len(ds))), "val")
        return feature_batches(self.val, ds.labels, self.batch_size)

    def close(self, keep: bool = False, keep_val: bool = False) -> None:
        """Drop the features. ``keep`` (the run stopped before its end) leaves them in the run
        folder with their records, for its resume; ``keep_val`` (a finished run) leaves only val's,
        when a float prefix made them, for ``gluontl evaluate`` (``stored_val``). Keeping is a
        convenience: a write that fails (a full disk) only means the resume or evaluate computes
        them again."""
        filled = [(f"train view {v}", a) for v, a in sorted(self.train.items())]
        filled += [("val", self.val)] if self.val is not None else []
        self.train.clear()
        self.val = None
        if self.shared:  # the shared folder's files serve other runs
            return
        if not keep:
            filled = [(w, a) for w, a in filled if keep_val and w == "val" and "engine" not in self.key]
            kept = {p.name for p in self._files("val")} if filled else set()
            if self.folder.is_dir():
                for path in self.folder.iterdir():
                    if path.name not in kept:
                        path.unlink(missing_ok=True)
                if not kept:
                    shutil.rmtree(self.folder, ignore_errors=True)
        for what, features in filled:
            if what in self.on_disk:  # memory-mapped, or read from there
                continue
            data, record = self._files(what)
            with contextlib.suppress(TrainError, OSError):
                self.folder.mkdir(parents=True, exist_ok=True)
                record.unlink(missing_ok=True)  # a stale record must never vouch for the new file
                atomic_write(data, lambda tmp, a=features: _save_npy(tmp, a), TrainError)
                write_text(record, json.dumps(self._record(what, len(features))), TrainError)

    def describe(self) -> str:
        where = "memory" if self.bytes <= self.max_bytes and not self.shared else \
            f"memory-mapped files in {self.folder}"
        reused = f", {', '.join(self.reused)} read from {self.folder}" if self.reused else ""
        return f"{self.bytes / 2**20:.1f} MiB of {self.dtype.name} features in {where}{reused}"


def feature_batches(features: np.ndarray, labels: np.ndarray, batch_size: int
                    ) -> Iterator[tuple[mx.nd.NDArray, mx.nd.NDArray]]:
    """Cached features and their labels in batches of ``batch_size``, in order, as float32 (the
    validation of ``finetune`` and of ``evaluate`` from the cache: the same batches, the same numbers)."""
    for i in range(0, len(features), batch_size):
        yield (mx.nd.array(features[i:i + batch_size], dtype=np.float32),
               mx.nd.array(labels[i:i + batch_size], dtype=np.float32))


def _save_npy(path: Path, features: np.ndarray) -> None:
    with open(path, "wb") as fh:  # a file object: np.save would append .npy to a path
        np.save(fh, features, allow_pickle=False)


class Feed:
    """What the loop trains — the whole network, or the suffix after a frozen prefix — and the
    batches it feeds it: images, cached features, or features the prefix engine computes per
    step (augmentation rules out a cache, but onnxruntime runs the prefix faster)."""

    def __init__(self, net: HybridBlock, loaders: Loaders, split: Split | None = None,
                 cache: FeatureCache | None = None, engine: Engine | None = None, log: str = "",
                 val_cache: FeatureCache | None = None, input_shape: tuple[int, ...] | None = None) -> None:
        self.net, self.loaders, self.split, self.cache, self.engine = net, loaders, split, cache, engine
        self.log = log
        self.val_cache = val_cache or cache
        self.input_shape = input_shape  # images fed to ``net`` itself are checked against it

    @property
    def boundary(self) -> str | None:
        return self.split.boundary if self.split is not None else None

    def prepare(self, epoch: int) -> None:
        if self.cache is not None:
            self.cache.prepare(epoch)

    def train_batches(self, epoch: int, skip: int) -> Iterable[tuple[mx.nd.NDArray, mx.nd.NDArray]]:
        if self.cache is not None:
            return self.cache.train_batches(epoch, skip)
        loader = self.loaders.train_epoch(epoch, skip_batches=skip)
        return self._checked(loader) if self.engine is None else self._through_engine(loader)

    def val_batches(self) -> Iterable[tuple[mx.nd.NDArray, mx.nd.NDArray]]:
        return self._checked(self.loaders.val) if self.val_cache is None else self.val_cache.val_batches()

    def _checked(self, batches: Iterable[tuple[mx.nd.NDArray, mx.nd.NDArray]]
                 ) -> Iterator[tuple[mx.nd.NDArray, mx.nd.NDArray]]:
        for x, y in batches:
            if self.input_shape is not None:
                check_images(x.shape, self.input_shape, "the network")
            yield x, y

    def _through_engine(self, loader) -> Iterator[tuple[mx.nd.NDArray, mx.nd.NDArray]]:
        for x, y in loader:
            yield mx.nd.array(self.engine(x.asnumpy()), ctx=x.context), y

    def close(self, keep: bool = False, keep_val: bool = False) -> None:
        if self.val_cache is not None:
            self.val_cache.close(keep, keep_val)

    def summary(self) -> dict[str, Any]:
        return {"cache": self.cache is not None, "prefix_engine": self.engine.name if self.engine else None,
                "boundary": self.boundary, "log": self.log,
                "cache_size": self.cache.describe() if self.cache is not None else None,
                "cache_fill_seconds": round(self.cache.fill_seconds, 3) if self.cache is not None else None,
                "cache_reused": self.val_cache.reused if self.val_cache is not None else None}


def build_feed(net: HybridBlock, plan: Plan, recipe: Recipe, loaders: Loaders, ctx: mx.Context, folder: Path,
               quiet: bool, previous: Feed | None = None) -> Feed:
    """The feed for ``plan``; the previous one (and its cache) is kept while the cut stays put."""
    t = recipe.train
    split = split_frozen_prefix(net, plan, recipe.model.input_shape, ctx)
    if previous is not None and previous.boundary == split.boundary:
        clear_cached_op(previous.net)  # traced with the old grad_req
        return previous
    train_ds = loader_dataset(loaders.train)
    decision = decide(t, split, recipe.data.train_transform)
    probe = np.stack([train_ds[(i, 0)][0] for i in range(min(recipe.data.batch_size, len(train_ds)))])
    if split.prefix is not None:
        with autograd.predict_mode():
            one = split.prefix(mx.nd.array(probe[:1], ctx=ctx))
    if split.prefix is not None:
        check_mixing(t, decision, tuple(one.shape))
    if decision.train:
        decision = _check_room(decision, t, one.size, len(train_ds) * decision.views + len(loader_dataset(loaders.val)),
                               folder)
    per_step = t.prefix_engine.startswith(("onnxruntime", "openvino")) or (t.prefix_engine == "auto"
                                                                          and t.cache_features != "off")
    use_engine = split.prefix is not None and (decision.train or per_step)
    if not use_engine:
        return Feed(net, loaders, split, log=f"feature cache: off ({decision.reason})",
                    input_shape=recipe.model.input_shape)
    if t.hybridize:
        split.suffix.hybridize(static_alloc=True, static_shape=True)
    # per step, onnxruntime must clearly beat MXNet's own step, which skips backward through the prefix
    # val transforms are deterministic, so val features are cached whenever the suffix trains
    float_key = cache_key(recipe, split, one.shape[1:], train_ds, loader_dataset(loaders.val))
    cache = FeatureCache(None, loaders, max(decision.views, 1), t, _SHARED[-1] if _SHARED else folder,
                         recipe.data.batch_size, recipe.data.workers, quiet, float_key)
    cache.shared = bool(_SHARED)
    if cache.shared:
        cache.from_shallower = _shallower_source(net, split, cache, probe, ctx, t.hybridize)
    made_by = _complete_under(cache, [float_key] + [{**float_key, **Int8Engine.key_for(reduce)} for reduce in
                                                    (False, True) if t.prefix_engine == "onnxruntime-int8"]
                              + [{**float_key, "engine": "openvino-int8"}] * (t.prefix_engine == "openvino-int8"))
    if decision.train and made_by is not None:  # a resume with every feature at hand: skip the engines' probe
        engine, engine_log = MxEngine(split.prefix, recipe.model.input_shape, ctx, t.hybridize), \
            f"prefix engine: none run (every feature is in {folder}{made_by})"
    else:
        engine, engine_log = choose_engine(t.prefix_engine, split.prefix, recipe.model.input_shape, ctx, probe,
                                           t.hybridize, margin=1.0 if decision.train else PER_STEP_MARGIN,
                                           calibration=Calibration(train_ds, max(decision.views, 1)))
        cache.key = {**float_key, **engine.key}  # the engine that runs, not the one asked for
    cache.engine = engine
    if decision.train:
        return Feed(split.suffix, loaders, split, cache=cache, engine=engine,
                    log=f"feature cache: on ({decision.reason}); {engine_log}")
    if engine.name == "mxnet":  # MXNet already skips backward through the frozen prefix
        return Feed(net, loaders, split, log=f"feature cache: off ({decision.reason}); {engine_log}",
                    input_shape=recipe.model.input_shape)
    return Feed(split.suffix, loaders, split, engine=engine, val_cache=cache,
                log=f"feature cache: off ({decision.reason}); {engine_log}, run every step (val features cached)")


def stored_val(run: Path, recipe: Recipe, net: HybridBlock, plan: Plan, val: ImageDataset, ctx: mx.Context
               ) -> tuple[HybridBlock, np.ndarray] | None:
    """The trained suffix of ``net`` and the val features ``finetune`` left in ``RUN/feature_cache``
    when their record is the key this model, recipe and data give now under a float prefix engine:
    evaluate then runs only the suffix, on the very features and batches of finetune's own
    validation (the same numbers, without decoding val or running the prefix again). None — run
    the whole network — when the folder is gone, the record differs in anything (weights, cut,
    images, labels, seed, dtype), or the prefix was int8 (evaluate reports the float network)."""
    folder = RunFolder(run).feature_cache_dir()
    if recipe.data is None or not _files(folder, "val")[1].is_file():
        return None
    split = split_frozen_prefix(net, plan, recipe.model.input_shape, ctx)
    if split.prefix is None:
        return None
    train = load_split(recipe.data, recipe.data.train, check=False)  # listed: its names and labels are keyed
    with autograd.predict_mode():
        row_shape = split.prefix(mx.nd.zeros((1, *recipe.model.input_shape), ctx=ctx)).shape[1:]
    key = cache_key(recipe, split, row_shape, train, val)
    features = stored_features(folder, "val", {**key, "what": "val", "rows": len(val)},
                               np.dtype(recipe.train.cache_dtype))
    if features is None:
        return None
    if recipe.train.hybridize:  # as finetune validated it
        split.suffix.hybridize(static_alloc=True, static_shape=True)
    return split.suffix, features


def _complete_under(cache: FeatureCache, keys: list[dict[str, Any]]) -> str | None:
    """Whether a complete set of features is in the run folder under one of ``keys`` (a complete
    set is never a mix of engines): None if not, else what to tell of the engine that made them;
    ``cache`` is left under that key."""
    for key in keys:
        cache.key = key
        if cache.complete():
            return (f", made by {key['engine']}" + (f" with reduce_range {key['reduce_range']}" if "reduce_range" in key
                                                      else "")) if "engine" in key else ""
    cache.key = keys[0]
    return None


def _check_room(decision: Decision, t: TrainSpec, per_row: int, rows: int, folder: Path) -> Decision:
    """Past ``cache_max_bytes`` features go to disk; refuse a cache the disk cannot hold."""
    need = rows * per_row * np.dtype(t.cache_dtype).itemsize
    if need <= t.cache_max_bytes:
        return decision
    free = shutil.disk_usage(folder.parent).free
    if need <= 0.9 * free:
        return decision
    why = (f"the features need {need / 2**30:.1f} GiB, more than cache_max_bytes in memory and more than "
           f"the {free / 2**30:.1f} GiB free beside the run folder (try cache_dtype: float16)")
    if t.cache_features == "on":
        raise TrainError(f"train.cache_features: on, but {why}. Free disk space or use cache_features: auto.")
    return Decision(False, 0, why)


def preview(recipe: Recipe, net: HybridBlock, plan: Plan, ctx: mx.Context | None = None) -> str:
    """What ``finetune`` will decide about the cache for this plan, without data or engines
    (for ``gluontl plan``)."""
    split = split_frozen_prefix(net, plan, recipe.model.input_shape, ctx or mx.cpu())
    spec = recipe.data.train_transform if recipe.data is not None else TransformSpec()
    try:
        d = decide(recipe.train, split, spec)
        if d.train and recipe.train.mixup is not None:
            with autograd.predict_mode():
                one = split.prefix(mx.nd.zeros((1, *recipe.model.input_shape), ctx=ctx or mx.cpu()))
            check_mixing(recipe.train, d, tuple(one.shape))
    except TrainError as e:
        return f"feature cache: error ({e})"
    return f"feature cache: {'on' if d.train else 'off'} ({d.reason})"
