"""Atomic file writes for checkpoints and run files: a reader (or a resume after kill -9)
sees the old file or the new one, never half of one."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from .errors import GluontlError

_FULL_BELOW = 1 << 20  # bytes free under which a failed write is a full disk
_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write(path: str | Path, write: Callable[[Path], None],
                 error: type[GluontlError] = GluontlError) -> Path:
    """``write(tmp)`` into a temp file beside ``path``, fsync it, rename it over ``path``."""
    path = Path(path)
    try:
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise error(f"Cannot write '{path}': {e.strerror}. Check that {path.parent} exists, is writable "
                    f"and has free space; the previous file (if any) is untouched.") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file normal permissions
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except Exception as e:
        # a library writing through its own C stream (MXNet's nd.save) reports a full disk as its
        # own error ("FileStream.Write incomplete"): name it as what it is, but only then
        if not isinstance(e, OSError) and shutil.disk_usage(path.parent).free >= _FULL_BELOW:
            raise
        reason = e.strerror if isinstance(e, OSError) else "the file system is full"
        raise error(f"Cannot write '{path}': {reason}. Check free space and permissions of "
                    f"{path.parent}; the previous file (if any) is untouched.") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def link_or_copy(src: str | Path, dst: str | Path) -> None:
    """Hard-link ``dst`` to ``src`` (no bytes copied); a copy across file systems or where the
    file system has no hard links."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def write_text(path: str | Path, text: str, error: type[GluontlError] = GluontlError) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"), error)
