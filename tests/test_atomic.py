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
