"""Repack mxnet 1.9.1's wheel as ``1.9.1+np2``: the same files, with ``numpy (>1.16.0)`` for ``numpy (<2.0.0,>1.16.0)``.

mxnet 1.9.1 declares ``numpy<2``, and numpy < 2 has no wheels for Python 3.13 and later, so pip cannot
install it there. Its Python code runs on numpy 2 once ``gluontl.npcompat`` puts back what numpy 2
removed (libmxnet.so is reached through ctypes and links neither libpython nor numpy; the wheel is
``py3-none``). Rewriting the one metadata line in a wheel of our own beats the alternatives: pip's
``--no-deps`` would leave ``pip check`` reporting a broken requirement and let any later ``pip
install`` downgrade numpy, and no user has to edit site-packages. The local version label makes
the repack visible (``pip list`` shows ``1.9.1+np2``) and still satisfies ``mxnet==1.9.1``.

Usage: ``python scripts/mxnet_np2_wheel.py MXNET_WHEEL OUT_DIR`` (scripts/env.sh runs it for numpy 2);
then ``pip install --find-links OUT_DIR ...``.
"""
from __future__ import annotations

import base64
import hashlib
import os
import sys
import zipfile

OLD_DIST, NEW_DIST = "mxnet-1.9.1.dist-info/", "mxnet-1.9.1+np2.dist-info/"
OLD_REQ, NEW_REQ = "Requires-Dist: numpy (<2.0.0,>1.16.0)", "Requires-Dist: numpy (>1.16.0)"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(wheel: str, out_dir: str) -> str:
    """Write the repacked wheel into ``out_dir`` (atomically) and return its path."""
    name = os.path.basename(wheel)
    if not name.startswith("mxnet-1.9.1-"):
        raise SystemExit(f"error: {wheel} is not an mxnet 1.9.1 wheel; download it with "
                         "`pip download --no-deps mxnet==1.9.1`.")
    target = os.path.join(out_dir, name.replace("mxnet-1.9.1-", "mxnet-1.9.1+np2-", 1))
    with zipfile.ZipFile(wheel) as src:
        metadata = src.read(OLD_DIST + "METADATA").decode()
        if metadata.count(OLD_REQ) != 1 or "\nVersion: 1.9.1\n" not in metadata:
            raise SystemExit(f"error: {wheel}'s METADATA does not have mxnet 1.9.1's numpy requirement "
                             f"({OLD_REQ!r}); it is not the wheel this script knows.")
        metadata = metadata.replace(OLD_REQ, NEW_REQ).replace("\nVersion: 1.9.1\n", "\nVersion: 1.9.1+np2\n")
        os.makedirs(out_dir, exist_ok=True)
        tmp = target + ".part"
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as dst:
            record = []
            for info in src.infolist():
                if info.filename == OLD_DIST + "RECORD":
                    continue
                data = metadata.encode() if info.filename == OLD_DIST + "METADATA" else src.read(info)
                path = info.filename.replace(OLD_DIST, NEW_DIST, 1)
                entry = zipfile.ZipInfo(path, info.date_time)
                entry.external_attr = info.external_attr  # keeps the files' modes
                dst.writestr(entry, data, zipfile.ZIP_DEFLATED)
                record.append(f"{path},{_record_hash(data)},{len(data)}")
            record.append(NEW_DIST + "RECORD,,")
            dst.writestr(NEW_DIST + "RECORD", "\n".join(record) + "\n")
    os.replace(tmp, target)
    return target


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.split("\n\n")[-1])
    print(repack(sys.argv[1], sys.argv[2]))
