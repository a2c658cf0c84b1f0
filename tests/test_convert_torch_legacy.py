"""The legacy torch.save reader on files written here byte by byte (no torch installed):
exact reads, and refusal of everything else without running it."""
from __future__ import annotations

import builtins
import collections
import io
import os
import pickle
import re
import sys
import types

import numpy as np
import pytest

from gluontl.convert.torch_legacy import MAGIC_NUMBER, PROTOCOL_VERSION, read_state_dict
from gluontl.errors import ModelSourceError


@pytest.fixture
def torch_names(monkeypatch):
    """Importable ``torch.FloatStorage``/``torch.LongStorage``/``torch._utils._rebuild_tensor_v2``
    stand-ins, so ``pickle`` writes the same globals torch's own legacy writer does."""
    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")
    for name in ("FloatStorage", "LongStorage"):
        setattr(torch, name, type(name, (), {"__module__": "torch"}))

    def _rebuild_tensor_v2(*args):
        raise AssertionError("only pickled here, never called")

    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    torch._utils = utils
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)
    return torch


class Storage:
    def __init__(self, key, data):
        self.key, self.data = key, np.ascontiguousarray(data)


class Tensor:
    """Pickles as ``_rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks)``."""

    def __init__(self, storage, offset, size, stride):
        self.args = (storage, offset, tuple(size), tuple(stride), False, collections.OrderedDict())

    def __reduce__(self):
        return sys.modules["torch._utils"]._rebuild_tensor_v2, self.args


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Storage):
            kind = sys.modules["torch"].LongStorage if obj.data.dtype == np.int64 else \
                sys.modules["torch"].FloatStorage
            return ("storage", kind, obj.key, "cpu", obj.data.size, None)
        return None


def legacy_file(state, storages, *, keys=None, counts=None, magic=MAGIC_NUMBER, tail=b"") -> bytes:
    """The bytes ``torch.save(state)`` writes in the legacy format (``_legacy_save``)."""
    out = io.BytesIO()
    for header in (magic, PROTOCOL_VERSION, {"protocol_version": PROTOCOL_VERSION, "little_endian": True,
                                             "type_sizes": {"short": 2, "int": 4, "long": 4}}):
        pickle.dump(header, out, protocol=2)
    _Pickler(out, protocol=2).dump(state)
    keys = [s.key for s in storages] if keys is None else keys
    pickle.dump(keys, out, protocol=2)
    for i, s in enumerate(storages):
        count = s.data.size if counts is None else counts[i]
        out.write(count.to_bytes(8, "little", signed=True))
        out.write(s.data.astype(s.data.dtype.newbyteorder("<")).tobytes())
    return out.getvalue() + tail


def _sample(torch_names):
    """Two tensors sharing one float storage (one at an offset, one transposed) and an int64 scalar."""
    floats = Storage("0", np.arange(20, dtype=np.float32) * np.float32(0.25) - 1)
    longs = Storage("1", np.array([7], np.int64))
    state = collections.OrderedDict([
        ("conv.weight", Tensor(floats, 2, (2, 3), (3, 1))),
        ("fc.weight_t", Tensor(floats, 0, (4, 5), (1, 4))),
        ("bn.num_batches_tracked", Tensor(longs, 0, (), ())),
    ])
    return state, [floats, longs]


def test_reads_a_hand_written_legacy_file_exactly(torch_names):
    state, storages = _sample(torch_names)
    sd = read_state_dict(legacy_file(state, storages), "sample.pth")
    floats = np.arange(20, dtype=np.float32) * np.float32(0.25) - 1
    assert list(sd) == ["conv.weight", "fc.weight_t", "bn.num_batches_tracked"]
    np.testing.assert_array_equal(sd["conv.weight"], floats[2:8].reshape(2, 3))
    np.testing.assert_array_equal(sd["fc.weight_t"], floats.reshape(5, 4).T)
    assert sd["conv.weight"].dtype == np.float32 and sd["fc.weight_t"].flags.writeable
    assert sd["bn.num_batches_tracked"].dtype == np.int64 and sd["bn.num_batches_tracked"][()] == 7


class _Call:
    """Pickles as a call of ``fn(*args)``: what a malicious file does."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


@pytest.mark.parametrize("where", ["object", "first"])
@pytest.mark.parametrize("call", ["os.system", "builtins.eval"])
def test_a_pickle_calling_any_other_global_is_refused_before_it_runs(torch_names, tmp_path, where, call):
    marker = tmp_path / "pwned"
    command = f"touch {marker}"
    payload = _Call(os.system, command) if call == "os.system" else \
        _Call(builtins.eval, f"__import__('os').system({command!r})")
    if where == "first":
        data = pickle.dumps(payload, protocol=2)
    else:
        state, storages = _sample(torch_names)
        state["evil"] = payload
        data = legacy_file(state, storages)
    with pytest.raises(ModelSourceError) as e:
        read_state_dict(data, "evil.pth")
    assert not marker.exists()
    # protocol 2 writes Python 2 module names: posix.system, __builtin__.eval
    assert re.search(rf"the global \w+\.{call.split('.')[1]},", str(e.value))
    assert "Nothing in it was executed" in str(e.value)


def _refusal(data) -> str:
    with pytest.raises(ModelSourceError) as e:
        read_state_dict(data, "bad.pth")
    assert "'bad.pth'" in str(e.value)
    return str(e.value)


def test_wrong_magic_number(torch_names):
    state, storages = _sample(torch_names)
    assert "no legacy torch.save magic number" in _refusal(legacy_file(state, storages, magic=MAGIC_NUMBER + 1))


def test_zip_format_is_refused_by_name():
    assert "zip format of torch >= 1.6" in _refusal(b"PK\x03\x04" + bytes(60))


def test_truncated_storage(torch_names):
    state, storages = _sample(torch_names)
    data = legacy_file(state, storages)
    assert "storage 1 cut short" in _refusal(data[:-4])


def test_storage_count_differing_from_the_pickle(torch_names):
    state, storages = _sample(torch_names)
    assert "storage 0 with 19 elements where its tensors declare 20" in _refusal(
        legacy_file(state, storages, counts=[19, 1]))


def test_trailing_bytes(torch_names):
    state, storages = _sample(torch_names)
    assert "3 bytes after the last storage" in _refusal(legacy_file(state, storages, tail=b"xyz"))


def test_key_list_not_matching_the_storages(torch_names):
    state, storages = _sample(torch_names)
    assert "storage key list" in _refusal(legacy_file(state, storages, keys=["0"]))


def test_tensor_reaching_beyond_its_storage(torch_names):
    state, storages = _sample(torch_names)
    state["conv.weight"] = Tensor(storages[0], 15, (2, 3), (3, 1))  # last element 15 + 3 + 2 = 20
    assert "tensor conv.weight reaching element 20 of a storage of 20" in _refusal(legacy_file(state, storages))


def test_negative_stride(torch_names):
    state, storages = _sample(torch_names)
    state["conv.weight"] = Tensor(storages[0], 10, (2, 3), (-3, 1))
    assert "tensor conv.weight with a negative offset, size or stride" in _refusal(legacy_file(state, storages))


def test_an_object_that_is_not_a_state_dict(torch_names):
    _, storages = _sample(torch_names)
    assert "not a state dict" in _refusal(legacy_file([Tensor(storages[0], 0, (2,), (1,))], storages[:1]))
