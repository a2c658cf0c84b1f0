"""Atomic writes: a failed write (disk full, read-only, crash) leaves the previous file intact."""
import errno
import os

import pytest

from gluontl.atomic import atomic_write, write_text
from gluontl.errors import TrainError


def test_disk_full_keeps_previous_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "last.params"
    write_text(target, "good checkpoint")

    def fill_disk(tmp):
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(TrainError, match="No space left on device.*previous file .* untouched"):
        atomic_write(target, fill_disk, TrainError)
    assert target.read_text() == "good checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.params"]


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(TrainError, match="Cannot write .*nowhere"):
        write_text(tmp_path / "nowhere" / "x.json", "{}", TrainError)


def test_written_file_has_normal_permissions(tmp_path):
    p = write_text(tmp_path / "a.txt", "x")
    umask = os.umask(0)
    os.umask(umask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs: a real full file system (needs root and mount; skipped elsewhere)."""
    import subprocess
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_full_disk_under_mxnets_own_writer_is_named(tiny_disk):
    """MXNet's nd.save fails on a full disk with its own MXNetError; the checkpoint writer says
    the disk is full, keeps the previous file and leaves no temp file (was: an internal error)."""
    import mxnet as mx
    from gluontl.data.checkpoint import save_params
    target = tiny_disk / "last.params"
    write_text(target, "good checkpoint")
    net = mx.gluon.nn.Dense(500, in_units=1000)  # 2 MB of weights for a 1 MiB disk
    net.initialize()
    with pytest.raises(TrainError, match=r"Cannot write .*last\.params': the file system is full\. Check "
                                         r"free space.*previous file .* untouched"):
        save_params(net, target)
    assert target.read_text() == "good checkpoint"
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["last.params"]


def test_a_failed_write_with_room_to_spare_is_not_called_a_full_disk(tmp_path):
    def broken(tmp):
        raise ValueError("a bug in the writer")

    with pytest.raises(ValueError, match="a bug in the writer"):
        atomic_write(tmp_path / "x.bin", broken, TrainError)
    assert list(tmp_path.iterdir()) == []
