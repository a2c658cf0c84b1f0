"""What a worker of a data-parallel run does beyond one process, per engine.

The loop talks to a :class:`Backend`: its rank, the Trainer it must use, one collective sum
(loss, image and hit counts, and the stop flag travel together once per batch, so every worker
decides to skip a non-finite step or to stop at the same step, and metrics are global), and a
broadcast from rank 0 (the run folder's name, BatchNorm statistics). Engines:

- ``kvstore``: MXNet's parameter server (``dist_sync``). The servers sum what workers push,
  so ``step()`` takes the global batch. ``update_on_kvstore=False`` keeps the optimizer on the
  workers: with updates on the servers MXNet drops ``lr_mult``/``wd_mult``, ignores
  ``set_learning_rate`` and cannot save trainer states. MXNet 1.9.1 broadcasts the initial
  weights inside the first ``step()``, unordered against the first gradient push: the
  broadcast is done (and waited for) before training (:meth:`KVStoreBackend.prepare`).
- ``horovod``: ``horovod.mxnet``'s allreduce averages, so ``step()`` takes the local batch.

Every collective runs under a :class:`Watchdog`: when a peer dies, ps-lite waits forever; the
watchdog ends this worker after ``train.distributed.step_timeout`` instead.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Callable

import mxnet as mx
import numpy as np
from mxnet import gluon

from ..errors import TrainError
from ..mxinternals import init_trainer, trainer_params
from ..recipe import DistributedSpec

WATCHDOG_EXIT = 3  # a collective outlived train.distributed.step_timeout
_TEXT_BYTES = 4096  # longest run-folder path a broadcast carries
# kvstore keys of our own collectives: above the Trainer's parameter indices, yet below 2**31 / 9973,
# because MXNet 1.9.1 picks a key's server as int32 (key * 9973) % servers, which overflows (to server
# -1: "Check failed: ps_key < krs[server].end()") for larger keys when there are 2 or more servers.
_SUM_KEY = 200_000


class Watchdog:
    """Ends the process when an armed section outlives ``timeout``: a worker stuck in a
    collective whose peer died (ps-lite never gives up) must not hang the job. ``os._exit``
    because the main thread is blocked inside MXNet and cannot be interrupted."""

    def __init__(self, timeout: float, rank: int, say: Callable[[str], None]) -> None:
        self.timeout, self.rank, self.say = timeout, rank, say
        self._deadline: float | None = None
        self._what = ""
        self._wake = threading.Event()
        threading.Thread(target=self._watch, name="gluontl-watchdog", daemon=True).start()

    def __call__(self, what: str) -> "Watchdog":
        self._what = what
        return self

    def __enter__(self) -> "Watchdog":
        self._deadline = time.monotonic() + self.timeout
        self._wake.set()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._deadline = None

    def _watch(self) -> None:
        while True:
            deadline = self._deadline
            if deadline is None:
                self._wake.wait()
                self._wake.clear()
                continue
            left = deadline - time.monotonic()
            if left > 0:
                self._wake.wait(min(left, 1.0))
                self._wake.clear()
                continue
            self.say(f"error: rank {self.rank}: {self._what or 'a step'} did not finish within "
                     f"train.distributed.step_timeout={self.timeout:g}s. Another worker, a server or the network "
                     f"has probably died (this worker cannot tell which; their logs can). Exiting with code "
                     f"{WATCHDOG_EXIT} so the job does not hang; raise step_timeout if steps are really that slow.")
            sys.stderr.flush()
            os._exit(WATCHDOG_EXIT)


class Backend:
    """One process (``backend: none``): the identity of every collective."""

    rank, size = 0, 1
    name = "none"

    def __init__(self, spec: DistributedSpec | None = None) -> None:
        self.spec = spec or DistributedSpec()
        self.guard = _NoGuard()

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def trainer(self, params: list, optimizer: str, options: dict[str, Any]) -> gluon.Trainer:
        return gluon.Trainer(params, optimizer, options)

    def step_batch(self, images: int) -> float:
        """What ``Trainer.step`` takes for a step over ``images`` on all workers together: the
        parameter server sums the workers' gradients, so all of them."""
        return images

    def prepare(self, trainer: gluon.Trainer) -> None:
        """Before the first forward: the initial weights of every worker are rank 0's."""

    def sum(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, np.float32)

    def broadcast(self, values: np.ndarray) -> np.ndarray:
        """Rank 0's ``values`` on every worker."""
        return np.asarray(values, np.float32)

    def broadcast_text(self, text: str) -> str:
        data = text.encode()
        if len(data) > _TEXT_BYTES:
            raise TrainError(f"The run folder path is {len(data)} bytes long; a distributed run shares at most "
                             f"{_TEXT_BYTES}. Use a shorter --runs path.")
        padded = np.zeros(_TEXT_BYTES, np.float32)
        padded[:len(data)] = np.frombuffer(data, np.uint8)
        got = self.broadcast(padded).astype(np.uint8)  # bytes are exact in float32
        return bytes(got[:int(np.count_nonzero(got))]).decode()

    def broadcast_arrays(self, arrays: list[mx.nd.NDArray]) -> None:
        """Overwrite ``arrays`` (every context's copy) with rank 0's values, in one message."""
        if self.size == 1 or not arrays:
            return
        flat = np.concatenate([a.asnumpy().ravel() for a in arrays])
        got, at = self.broadcast(flat), 0
        for a in arrays:
            a[:] = got[at:at + a.size].reshape(a.shape)
            at += a.size


class _NoGuard:
    def __call__(self, what: str) -> "_NoGuard":
        return self

    def __enter__(self) -> "_NoGuard":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def _default_layout(trainer: gluon.Trainer) -> None:
    """Fresh, plain-layout weight arrays: an inference forward (guards, validation) leaves conv
    weights in oneDNN's blocked layout, which a push to the servers cannot send ("We can't generate
    TBlob for MKLDNN data"), and the failure surfaces only as a server dying of an uninitialized key."""
    for p in trainer_params(trainer):
        p.reset_ctx(p.list_ctx())


class KVStoreBackend(Backend):
    """MXNet's parameter server; the process was started with the ``DMLC_*`` environment."""

    name = "kvstore"

    def __init__(self, spec: DistributedSpec, say: Callable[[str], None]) -> None:
        super().__init__(spec)
        if os.environ.get("DMLC_ROLE") != "worker" or "DMLC_PS_ROOT_URI" not in os.environ:
            raise TrainError("train.distributed.backend: kvstore needs the DMLC_* environment of a parameter-server "
                             "job (DMLC_ROLE=worker, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_WORKER, "
                             "DMLC_NUM_SERVER). Start it with `gluontl launch -n N -- finetune --recipe R`, or set "
                             "backend: none to train in one process.")
        self.kv = mx.kv.create(spec.kvstore)
        self.rank, self.size = self.kv.rank, self.kv.num_workers
        self.guard = Watchdog(spec.step_timeout, self.rank, say)
        self._keys: dict[tuple[str, int], int] = {}

    def trainer(self, params: list, optimizer: str, options: dict[str, Any]) -> gluon.Trainer:
        if len(params) >= _SUM_KEY:
            raise TrainError(f"{len(params)} trainable parameter arrays exceed the {_SUM_KEY} kvstore keys gluontl "
                             f"leaves the Trainer; freeze some (rules) or use backend: horovod.")
        return gluon.Trainer(params, optimizer, options, kvstore=self.kv, update_on_kvstore=False)

    def prepare(self, trainer: gluon.Trainer) -> None:
        # Private API of MXNet 1.9.1 (pinned; tests/dist pin it too): the broadcast that step()
        # would do lazily, racing the first gradient push on the same keys.
        _default_layout(trainer)
        with self.guard("the initial broadcast of the weights"):
            waiting = init_trainer(trainer)
            mx.nd.waitall()
        if waiting:
            names = ", ".join(p.name for p in waiting[:3])
            raise TrainError(f"Parameters {names} have no shape yet (deferred initialization), so they cannot be "
                             f"broadcast before training; give the model an input_shape.")

    def _key(self, kind: str, n: int) -> int:
        """One server key per (collective, length), created collectively on first use."""
        if (kind, n) not in self._keys:
            key = _SUM_KEY + len(self._keys)
            self.kv.init(key, mx.nd.zeros(n))
            self._keys[(kind, n)] = key
        return self._keys[(kind, n)]

    def sum(self, values: np.ndarray) -> np.ndarray:
        arr = mx.nd.array(np.asarray(values, np.float32).ravel())
        self.kv.pushpull(self._key("sum", arr.size), arr, out=arr)
        return arr.asnumpy()

    def broadcast(self, values: np.ndarray) -> np.ndarray:
        values = np.asarray(values, np.float32)
        return self.sum(values if self.is_root else np.zeros_like(values))


class HorovodBackend(Backend):
    """Horovod's allreduce (Gloo or MPI), started by ``horovodrun``."""

    name = "horovod"

    def __init__(self, spec: DistributedSpec, say: Callable[[str], None]) -> None:
        super().__init__(spec)
        if not any(v in os.environ for v in ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")):
            raise TrainError("train.distributed.backend: horovod needs a process started by horovodrun (or mpirun), "
                             "which tells it its rank; alone it would be rank 0 of 1. Run `horovodrun -np N -H "
                             "localhost:N --gloo gluontl finetune --recipe R` (gluontl launch starts parameter-server "
                             "jobs: backend kvstore).")
        try:
            import horovod.mxnet as hvd
        except ImportError as e:
            raise TrainError(f"train.distributed.backend: horovod needs horovod.mxnet, which does not import "
                             f"({e}). Build it with `bash scripts/build_horovod.sh` (about 5 minutes), or use "
                             f"backend: kvstore.") from None
        hvd.init()
        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.guard = Watchdog(spec.step_timeout, self.rank, say)

    def trainer(self, params: list, optimizer: str, options: dict[str, Any]) -> gluon.Trainer:
        # a dict: Horovod sorts a list, and Parameters do not compare
        return self.hvd.DistributedTrainer({p.name: p for p in params}, optimizer, options)

    def step_batch(self, images: int) -> float:
        return images / self.size  # Horovod averages the workers' gradients (a kept last batch may not split evenly)

    def prepare(self, trainer: gluon.Trainer) -> None:
        _default_layout(trainer)
        with self.guard("the initial broadcast of the weights"):
            self.hvd.broadcast_parameters({p.name: p for p in trainer_params(trainer)}, root_rank=0)
            mx.nd.waitall()

    # Stable names (one per collective and length): Horovod caches the negotiation by name.
    def sum(self, values: np.ndarray) -> np.ndarray:
        arr = mx.nd.array(np.asarray(values, np.float32).ravel())
        return self.hvd.allreduce(arr, average=False, name=f"gluontl.sum.{arr.size}").asnumpy()

    def broadcast(self, values: np.ndarray) -> np.ndarray:
        arr = mx.nd.array(np.asarray(values, np.float32).ravel())
        return self.hvd.broadcast(arr, root_rank=0, name=f"gluontl.broadcast.{arr.size}").asnumpy()


def connect(spec: DistributedSpec, say: Callable[[str], None]) -> Backend:
    """The backend the recipe asks for, joined (blocks until every worker has)."""
    if spec.backend == "kvstore":
        return KVStoreBackend(spec, say)
    if spec.backend == "horovod":
        return HorovodBackend(spec, say)
    return Backend(spec)


__all__ = ["Backend", "KVStoreBackend", "HorovodBackend", "Watchdog", "WATCHDOG_EXIT", "connect"]
