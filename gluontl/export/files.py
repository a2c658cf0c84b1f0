"""Atomic, no-clobber file writes: a reader never sees a half-written export."""
from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import mxnet as mx

from gluontl.errors import ExportError


def _cannot_create(path: Path, err: OSError) -> ExportError:
    return ExportError(
        f"Cannot write {path}: creating a file in {path.parent} failed ({err.strerror}). "
        "Choose a writable output folder."
    )


def check_target(path: Path, force: bool) -> None:
    """Fail before any work if ``path`` exists (without ``force``) or its folder is unusable.

    Writability is probed by creating a file: permission bits do not stop root, and
    read-only or virtual filesystems only show up when a write is attempted.
    """
    if path.exists() and not force:
        raise ExportError(f"{path} already exists; refusing to overwrite it. Pass force=True (--force) to replace it.")
    if path.is_dir():
        raise ExportError(f"{path} is a directory; give a file name to export to.")
    if not path.parent.is_dir():
        raise ExportError(
            f"Cannot write {path}: its folder {path.parent} does not exist or is not a directory. "
            "Create the folder or choose another output path."
        )
    try:
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".probe"):
            pass
    except OSError as err:
        raise _cannot_create(path, err) from err


@contextlib.contextmanager
def staged(path: Path) -> Iterator[Path]:
    """Yield a temp path next to ``path``; the caller fills it, then ``commit`` moves it in.

    The temp file is removed on any failure, so nothing partial is ever left behind.
    """
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:
        raise _cannot_create(path, err) from err
    os.close(fd)
    try:
        yield Path(tmp)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def commit(tmp: Path, path: Path) -> None:
    """fsync ``tmp`` and atomically rename it to ``path`` (then fsync the folder)."""
    try:
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as err:
        raise ExportError(f"Cannot write {path}: {err.strerror}. Check free space and permissions of {path.parent}.") from err


def fill(tmp: Path, path: Path, write: Callable[[Path], None]) -> None:
    """Run ``write(tmp)``, turning OS errors into an ExportError naming the real target."""
    try:
        write(tmp)
    except (OSError, mx.base.MXNetError) as err:
        reason = err.strerror if isinstance(err, OSError) else str(err).splitlines()[0]
        raise ExportError(f"Cannot write {path}: {reason}. Check free space and permissions of {path.parent}.") from err
