"""The one owner of atomic writes: files and folders appear whole under their final name, or not at all.

A file is written under a temporary name in the same folder, fsynced, then renamed over the target
(`os.replace` is atomic on POSIX within one file system). A folder is built under a temporary name
beside the target and swapped into place by `publish_folder`. A crash leaves either the old
content or the new, never a half-written file under the real name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync it, then rename it over `path`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    write_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


@contextmanager
def staged_folder(out: str | os.PathLike, *, replace: bool = True) -> Iterator[Path]:
    """Yield an empty temporary folder beside `out`; on success it becomes `out` in one rename.

    With `replace`, an existing `out` is moved aside first and deleted after the swap, so a reader
    sees the old folder or the new one. On an exception the temporary folder is removed and `out`
    is left as it was.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        yield tmp
        publish_folder(tmp, out, replace=replace)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def publish_folder(tmp: Path, out: Path, *, replace: bool = True) -> bool:
    """Rename the finished folder `tmp` to `out`. False (and `tmp` deleted) if `out` exists and not `replace`."""
    if out.exists():
        if not replace:
            shutil.rmtree(tmp, ignore_errors=True)
            return False
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
    return True


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
