"""Read a PyTorch state dict in the legacy (pre-1.6, non-zip) ``torch.save`` format, without torch.

The format (``torch.serialization._legacy_save``): five pickles back to back — a magic
number, the protocol version 1001, system info (byte order, C type sizes), the saved object,
the storage keys — then every storage's raw little-endian bytes in key order, each behind its
element count as an int64. Tensors in the object pickle reach their storage through a
persistent id and are rebuilt by ``torch._utils._rebuild_tensor_v2``.

Unpickling calls whatever importable function the file names, so an untrusted ``.pth`` could
run anything. The unpickler here resolves only the names a float state dict uses, each to a
numpy stand-in: ``collections.OrderedDict``, ``torch._utils._rebuild_tensor_v2`` and the
``torch.FloatStorage``/``torch.LongStorage`` types. Any other global fails before it is
called. Tensors are bounds-checked against their storage before numpy views them. The zip
format of torch >= 1.6 and the older tar format are refused by name: no file we convert uses
them.
"""
from __future__ import annotations

import collections
import dataclasses
import io
import math
import pickle
import tarfile
from pathlib import Path

import numpy as np

from ..errors import ModelSourceError, short_reason

MAGIC_NUMBER = 0x1950A86A20F9469CFC6C
PROTOCOL_VERSION = 1001


@dataclasses.dataclass(frozen=True)
class _StorageType:
    name: str
    dtype: np.dtype


@dataclasses.dataclass
class _Storage:
    type: _StorageType
    size: int
    data: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class _TensorRef:
    """A tensor as the pickle describes it; its storage's bytes come after the pickle."""

    storage: _Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


class _Refused(Exception):
    """Raised inside the unpickler; read_state_dict turns it into the user's message."""


def _ints(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, tuple) or not all(type(v) is int for v in value):
        raise _Refused(f"a tensor {what} that is not a tuple of integers ({value!r:.60})")
    return value


def _rebuild_tensor_v2(storage: object, storage_offset: object, size: object, stride: object,
                       requires_grad: object = False, backward_hooks: object = None,
                       metadata: object = None) -> _TensorRef:
    """Stand-in for ``torch._utils._rebuild_tensor_v2``: records where the tensor lives."""
    if not isinstance(storage, _Storage) or type(storage_offset) is not int:
        raise _Refused("a tensor whose storage or offset is not a storage reference and an integer")
    shape, strides = _ints(size, "size"), _ints(stride, "stride")
    if len(shape) != len(strides):
        raise _Refused(f"a tensor with size {shape} but stride {strides}")
    return _TensorRef(storage, storage_offset, shape, strides)


_STORAGE_TYPES = {name: _StorageType(name, np.dtype(dtype))
                  for name, dtype in (("FloatStorage", "<f4"), ("LongStorage", "<i8"))}
_GLOBALS: dict[tuple[str, str], object] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    **{("torch", name): st for name, st in _STORAGE_TYPES.items()},
}


class _Unpickler(pickle.Unpickler):
    """Resolves only the globals of ``_GLOBALS``; with ``storages``, collects the storages
    that persistent ids name (only the object pickle may have them)."""

    def __init__(self, file: io.BytesIO, storages: dict[str, _Storage] | None = None) -> None:
        super().__init__(file)
        self._storages = storages

    def find_class(self, module: str, name: str) -> object:
        try:
            value = _GLOBALS[(module, name)]
        except KeyError:
            raise _Refused(f"the global {module}.{name}, which a state dict of float tensors never "
                           f"needs (allowed: {', '.join(f'{m}.{n}' for m, n in _GLOBALS)})") from None
        # BUILD sets attributes on whatever object a pickle names, frozen dataclasses and
        # functions included: hand out fresh ones, so a file changes nothing beyond its own read.
        if isinstance(value, _StorageType):
            return dataclasses.replace(value)
        if value is _rebuild_tensor_v2:
            return lambda *args: _rebuild_tensor_v2(*args)
        return value  # OrderedDict: a built-in type, BUILD cannot set its attributes

    def persistent_load(self, pid: object) -> _Storage:
        if self._storages is None:
            raise _Refused("a persistent id outside the object pickle")
        if not (isinstance(pid, tuple) and len(pid) == 6 and pid[0] == "storage"):
            raise _Refused(f"a persistent id that is not a legacy storage reference ({pid!r:.80})")
        _, kind, key, location, size, view = pid
        if not isinstance(kind, _StorageType) or not isinstance(key, str) or not isinstance(location, str) \
                or type(size) is not int or size < 0:
            raise _Refused(f"a malformed storage reference ({pid!r:.80})")
        if view is not None:
            raise _Refused(f"a storage view ({view!r:.60}), which this reader does not support")
        kind = _STORAGE_TYPES.get(kind.name) if isinstance(kind.name, str) else None  # as BUILD left it
        if kind is None:
            raise _Refused(f"a storage type altered by the pickle ({pid!r:.80})")
        storage = self._storages.setdefault(key, _Storage(kind, size))
        if (storage.type, storage.size) != (kind, size):
            raise _Refused(f"storage {key} declared twice with different types or sizes")
        return storage


def read_state_dict(data: bytes, name: str | Path) -> dict[str, np.ndarray]:
    """The state dict in ``data`` (the bytes of a legacy ``.pth`` file called ``name``) as
    numpy arrays, in file order. Everything not a legacy state dict of float/int64 tensors
    is a ModelSourceError naming the file and the reason."""
    if data[:4] == b"PK\x03\x04":
        raise _error(name, "it is in the zip format of torch >= 1.6, which this reader does not support")
    if tarfile.is_tarfile(io.BytesIO(data)):
        raise _error(name, "it is in the tar format of torch < 0.4, which this reader does not support")
    f = io.BytesIO(data)
    try:
        return _read(f, data)
    except _Refused as e:
        raise _error(name, f"it contains {e}") from None
    except Exception as e:  # a malformed pickle raises many types; all mean "not a valid file"
        raise _error(name, f"it is truncated or malformed at byte {f.tell()} ({short_reason(e)})") from None


def _read(f: io.BytesIO, data: bytes) -> dict[str, np.ndarray]:
    if _Unpickler(f).load() != MAGIC_NUMBER:
        raise _Refused("no legacy torch.save magic number at its start")
    if (protocol := _Unpickler(f).load()) != PROTOCOL_VERSION:
        raise _Refused(f"protocol version {protocol!r:.40} (only {PROTOCOL_VERSION} is supported)")
    info = _Unpickler(f).load()
    if not isinstance(info, dict) or info.get("little_endian") is not True:
        raise _Refused("system info that is not little-endian")
    storages: dict[str, _Storage] = {}
    obj = _Unpickler(f, storages).load()
    keys = _Unpickler(f).load()
    if not isinstance(keys, list) or sorted(keys) != sorted(storages):
        raise _Refused("a storage key list that does not match the storages its tensors use")
    for key in keys:
        storage = storages[key]
        count = int.from_bytes(f.read(8), "little", signed=True)
        if count != storage.size:
            raise _Refused(f"storage {key} with {count} elements where its tensors declare {storage.size}")
        nbytes = count * storage.type.dtype.itemsize
        if f.tell() + nbytes > len(data):
            raise _Refused(f"storage {key} cut short by the end of the file")
        storage.data = np.frombuffer(data, storage.type.dtype, count, offset=f.tell())
        f.seek(nbytes, io.SEEK_CUR)
    if f.tell() != len(data):
        raise _Refused(f"{len(data) - f.tell()} bytes after the last storage")
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, _TensorRef)
                                            for k, v in obj.items()):
        raise _Refused("an object that is not a state dict (a dict of names to tensors)")
    return {k: _materialize(k, t) for k, t in obj.items()}


def _materialize(name: str, t: _TensorRef) -> np.ndarray:
    """A copy of the tensor's elements, after checking that they lie inside the storage."""
    assert t.storage.data is not None  # _read filled every storage the keys list names
    if min((t.offset, *t.shape, *t.stride)) < 0:
        raise _Refused(f"tensor {name} with a negative offset, size or stride")
    dtype = t.storage.type.dtype
    if math.prod(t.shape) == 0:
        return np.zeros(t.shape, dtype)
    last = t.offset + sum((n - 1) * s for n, s in zip(t.shape, t.stride))
    if last >= t.storage.size:
        raise _Refused(f"tensor {name} reaching element {last} of a storage of {t.storage.size}")
    view = np.lib.stride_tricks.as_strided(t.storage.data[t.offset:], t.shape,
                                           [s * dtype.itemsize for s in t.stride], writeable=False)
    return view.astype(dtype.newbyteorder("="), copy=True)


def _error(name: str | Path, why: str) -> ModelSourceError:
    return ModelSourceError(f"Cannot read '{name}' as a legacy PyTorch state dict: {why}. Nothing in it "
                            f"was executed. Use the original file (reinstall the package that ships it).")
