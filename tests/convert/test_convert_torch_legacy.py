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
import tarfile
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


class Pid:
    """Pickles as the persistent id ``pid`` as given: malformed storage references."""

    def __init__(self, pid):
        self.pid = pid


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, Pid):
            return obj.pid
        if isinstance(obj, Storage):
            kind = sys.modules["torch"].LongStorage if obj.data.dtype == np.int64 else \
                sys.modules["torch"].FloatStorage
            return ("storage", kind, obj.key, "cpu", obj.data.size, None)
        return None


INFO = {"protocol_version": PROTOCOL_VERSION, "little_endian": True,
        "type_sizes": {"short": 2, "int": 4, "long": 4}}


def legacy_file(state, storages, *, keys=None, counts=None, magic=MAGIC_NUMBER, protocol=PROTOCOL_VERSION,
                info=INFO, tail=b"") -> bytes:
    """The bytes ``torch.save(state)`` writes in the legacy format (``_legacy_save``)."""
    out = io.BytesIO()
    for header in (magic, protocol, info):
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


def _refusal(data, *phrases) -> str:
    """The refusal of ``data`` named ``bad.pth``; each phrase must appear as whole words, so a
    message that lost or garbled what it refused fails."""
    with pytest.raises(ModelSourceError) as e:
        read_state_dict(data, "bad.pth")
    message = str(e.value)
    assert message.startswith("Cannot read 'bad.pth' as a legacy PyTorch state dict: ")
    assert "Nothing in it was executed" in message
    for phrase in phrases:
        assert re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", message), (phrase, message)
    return message


def _rebuild(*args):
    """A tensor pickled with exactly these ``_rebuild_tensor_v2`` arguments, malformed ones included."""
    return _Call(sys.modules["torch._utils"]._rebuild_tensor_v2, *args)


def test_wrong_magic_number(torch_names):
    state, storages = _sample(torch_names)
    _refusal(legacy_file(state, storages, magic=MAGIC_NUMBER + 1),
             "no legacy torch.save magic number")


def test_wrong_protocol_version(torch_names):
    state, storages = _sample(torch_names)
    _refusal(legacy_file(state, storages, protocol=1000), "protocol version 1000", "only 1001 is supported")


@pytest.mark.parametrize("info", [dict(INFO, little_endian=False), {"protocol_version": PROTOCOL_VERSION},
                                  dict(INFO, little_endian=1), [("little_endian", True)]],
                         ids=["big-endian", "no-byte-order", "not-True", "not-a-dict"])
def test_system_info_that_is_not_little_endian(torch_names, info):
    state, storages = _sample(torch_names)
    _refusal(legacy_file(state, storages, info=info), "system info that is not little-endian")


def test_zip_format_is_refused_by_name():
    _refusal(b"PK\x03\x04" + bytes(60), "it is in the zip format of torch >= 1.6", "does not support")


def test_tar_format_is_refused_by_name():
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        payload = pickle.dumps(MAGIC_NUMBER, protocol=2)
        member = tarfile.TarInfo("sys_info")
        member.size = len(payload)
        tar.addfile(member, io.BytesIO(payload))
    _refusal(out.getvalue(), "it is in the tar format of torch < 0.4", "does not support")


def test_a_malformed_pickle_is_refused_with_where_and_why(torch_names):
    state, storages = _sample(torch_names)
    data = legacy_file(state, storages)
    headers = sum(len(pickle.dumps(h, protocol=2)) for h in (MAGIC_NUMBER, PROTOCOL_VERSION, INFO))
    message = _refusal(data[:headers + 40], "it is truncated or malformed at byte")
    # the unpickler's own reason, not a placeholder
    assert re.search(r"at byte \d+ \((pickle data was truncated|Ran out of input)\)", message), message


def test_truncated_storage(torch_names):
    state, storages = _sample(torch_names)
    data = legacy_file(state, storages)
    _refusal(data[:-4], "storage 1 cut short")


@pytest.mark.parametrize("counts, said", [([19, 1], "19"), ([-1, 1], "-1")])
def test_storage_count_differing_from_the_pickle(torch_names, counts, said):
    """The count is a signed int64: -1 is read as -1, not as 2**64 - 1."""
    state, storages = _sample(torch_names)
    _refusal(legacy_file(state, storages, counts=counts),
             f"storage 0 with {said} elements", "declare 20")


def test_trailing_bytes(torch_names):
    state, storages = _sample(torch_names)
    _refusal(legacy_file(state, storages, tail=b"xyz"), "3 bytes after the last storage")


@pytest.mark.parametrize("keys", [["0"], ["0", "1", "2"], ("0", "1")], ids=["missing", "extra", "not-a-list"])
def test_key_list_not_matching_the_storages(torch_names, keys):
    state, storages = _sample(torch_names)
    _refusal(legacy_file(state, storages, keys=keys), "a storage key list", "does not match")


def test_tensor_reaching_beyond_its_storage(torch_names):
    state, storages = _sample(torch_names)
    state["conv.weight"] = Tensor(storages[0], 15, (2, 3), (3, 1))  # last element 15 + 3 + 2 = 20
    _refusal(legacy_file(state, storages), "tensor conv.weight reaching element 20 of a storage of 20")


@pytest.mark.parametrize("offset, size, stride", [(10, (2, 3), (-3, 1)), (-1, (2,), (1,)), (0, (-2, 3), (3, 1))],
                         ids=["stride", "offset", "size"])
def test_negative_offset_size_or_stride(torch_names, offset, size, stride):
    state, storages = _sample(torch_names)
    state["conv.weight"] = Tensor(storages[0], offset, size, stride)
    _refusal(legacy_file(state, storages), "tensor conv.weight with a negative offset, size or stride")


@pytest.mark.parametrize("what, size, stride", [
    ("size", [2, 3], (3, 1)), ("size", (2, 3.0), (3, 1)), ("size", (2, True), (3, 1)),
    ("stride", (2, 3), [3, 1]), ("stride", (2, 3), (3, "1")),
], ids=["size-list", "size-float", "size-bool", "stride-list", "stride-str"])
def test_size_and_stride_must_be_tuples_of_integers(torch_names, what, size, stride):
    state, storages = _sample(torch_names)
    state["conv.weight"] = _rebuild(storages[0], 0, size, stride, False, collections.OrderedDict())
    _refusal(legacy_file(state, storages), f"a tensor {what} that is not a tuple of integers")


def test_size_and_stride_of_different_lengths(torch_names):
    state, storages = _sample(torch_names)
    state["conv.weight"] = Tensor(storages[0], 0, (2, 3), (1,))
    _refusal(legacy_file(state, storages), "a tensor with size (2, 3) but stride (1,)")


@pytest.mark.parametrize("storage, offset", [("0", 0), (None, 0), ("storage", 0.0), ("storage", "2")],
                         ids=["str-storage", "no-storage", "float-offset", "str-offset"])
def test_tensor_storage_must_be_a_reference_and_its_offset_an_integer(torch_names, storage, offset):
    state, storages = _sample(torch_names)
    state["conv.weight"] = _rebuild(storages[0] if storage == "storage" else storage, offset, (2, 3), (3, 1))
    _refusal(legacy_file(state, storages), "a tensor whose storage or offset is not")


@pytest.mark.parametrize("state", [
    {"w": "tensor", "a": 1.5}, {0: "tensor"}, collections.OrderedDict([(0, "tensor")])], ids=["value", "int-key", "ordered"])
def test_an_object_that_is_not_a_state_dict(torch_names, state):
    _, storages = _sample(torch_names)
    tensor = Tensor(storages[0], 0, (2,), (1,))
    state = {k: tensor if v == "tensor" else v for k, v in state.items()}
    _refusal(legacy_file(state, storages[:1]), "an object that is not a state dict")


def test_a_list_is_not_a_state_dict(torch_names):
    _, storages = _sample(torch_names)
    _refusal(legacy_file([Tensor(storages[0], 0, (2,), (1,))], storages[:1]), "an object that is not a state dict")


def test_zero_element_tensors_keep_shape_and_dtype(torch_names):
    """Empty storages (size 0 is a valid storage) and empty tensors with any offset."""
    floats, longs = Storage("0", np.zeros(0, np.float32)), Storage("1", np.zeros(0, np.int64))
    state = collections.OrderedDict([("w", Tensor(floats, 0, (0, 3), (3, 1))),
                                     ("idx", Tensor(longs, 0, (2, 0), (1, 1)))])
    sd = read_state_dict(legacy_file(state, [floats, longs]), "empty.pth")
    assert (sd["w"].shape, sd["w"].dtype) == ((0, 3), np.float32)
    assert (sd["idx"].shape, sd["idx"].dtype) == ((2, 0), np.int64)


def test_returned_arrays_own_their_elements(torch_names):
    """Two tensors share one storage: writing into one array changes neither the other nor a
    second read of the same bytes."""
    state, storages = _sample(torch_names)
    data = legacy_file(state, storages)
    sd = read_state_dict(data, "sample.pth")
    shared_before = sd["fc.weight_t"].copy()
    for array in sd.values():
        assert array.flags.owndata and array.flags.writeable
    sd["conv.weight"][...] = 100.0  # storage elements 2..7, which fc.weight_t also reads
    np.testing.assert_array_equal(sd["fc.weight_t"], shared_before)
    np.testing.assert_array_equal(read_state_dict(data, "sample.pth")["fc.weight_t"], shared_before)


def test_a_global_is_refused_with_the_list_of_allowed_ones(torch_names):
    message = _refusal(pickle.dumps(_Call(os.getcwd), protocol=2), "the global posix.getcwd")
    assert ("(allowed: collections.OrderedDict, torch._utils._rebuild_tensor_v2, torch.FloatStorage, "
            "torch.LongStorage)") in message


def test_a_persistent_id_outside_the_object_pickle(torch_names):
    _, storages = _sample(torch_names)
    out = io.BytesIO()
    _Pickler(out, protocol=2).dump(storages[0])
    _refusal(out.getvalue(), "it contains a persistent id outside the object pickle")


_F = object()  # stands for torch.FloatStorage, which exists only inside the torch_names fixture
_NOT_LEGACY = "a persistent id that is not a legacy storage reference"


@pytest.mark.parametrize("pid, said", [
    pytest.param(("module", _F, "0", "cpu", 20, None), _NOT_LEGACY, id="not-storage"),
    pytest.param(("storage", _F, "0", "cpu", 20), _NOT_LEGACY, id="five-fields"),
    pytest.param("storage", f"{_NOT_LEGACY} ('storage')", id="not-a-tuple"),
    pytest.param(("storage", "FloatStorage", "0", "cpu", 20, None), "a malformed storage reference", id="kind"),
    pytest.param(("storage", _F, 0, "cpu", 20, None), "a malformed storage reference", id="key"),
    pytest.param(("storage", _F, "0", 0, 20, None), "a malformed storage reference", id="location"),
    pytest.param(("storage", _F, "0", "cpu", 20.0, None), "a malformed storage reference", id="float-size"),
    pytest.param(("storage", _F, "0", "cpu", -1, None), "a malformed storage reference", id="negative-size"),
    pytest.param(("storage", _F, "0", "cpu", 20, ("v", 0, 4)), "a storage view (('v', 0, 4))", id="view"),
    pytest.param(("storage", _F, "0", "cpu", 12, None), "storage 0 declared twice", id="twice"),
])
def test_a_malformed_storage_reference(torch_names, pid, said):
    """Everything but the reference is valid: the storage's 20 floats are there, under key 0."""
    if isinstance(pid, tuple):
        pid = tuple(torch_names.FloatStorage if p is _F else p for p in pid)
    state, storages = _sample(torch_names)
    state["conv.weight"] = Tensor(Pid(pid), 0, (2, 3), (3, 1))
    message = _refusal(legacy_file(state, storages), said)
    if said.startswith("a storage view"):
        assert "which this reader does not support" in message


def _build(global_line: bytes, state) -> bytes:
    """Opcodes that name a global and BUILD (set attributes on) it: GLOBAL, the state, BUILD."""
    return b"c" + global_line + b"\n" + pickle.dumps(state, protocol=2)[2:-1] + b"b"


def test_a_pickle_cannot_change_the_readers_globals_by_building_on_them(torch_names):
    from gluontl.convert import torch_legacy as T

    before = dict(T._STORAGE_TYPES), T._rebuild_tensor_v2.__defaults__
    payload = (b"\x80\x02" + _build(b"torch\nFloatStorage", {"dtype": "<f8", "name": "LongStorage"})
               + _build(b"torch._utils\n_rebuild_tensor_v2", (None, {"__defaults__": (True, 1, 2)}))
               + b"\x86.")  # TUPLE2, STOP
    built_storage, built_fn = T._Unpickler(io.BytesIO(payload), {}).load()
    assert built_storage.dtype == "<f8"  # the pickle changed the object it was handed ...
    assert (dict(T._STORAGE_TYPES), T._rebuild_tensor_v2.__defaults__) == before  # ... not the reader's
    assert T._STORAGE_TYPES["FloatStorage"] == T._StorageType("FloatStorage", np.dtype("<f4"))
    test_reads_a_hand_written_legacy_file_exactly(torch_names)  # and later reads are exact


def test_a_storage_type_renamed_by_the_pickle_is_refused(torch_names):
    from gluontl.convert import torch_legacy as T

    renamed = _build(b"torch\nFloatStorage", {"name": "os.system"})
    pid = b"(X\x07\x00\x00\x00storage" + renamed + b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x01Nt"  # 6-tuple
    payload = b"\x80\x02" + pid + b"Q."  # BINPERSID, STOP
    with pytest.raises(T._Refused, match="storage type altered"):
        T._Unpickler(io.BytesIO(payload), {}).load()
