"""The one owner of atomic writes: files and folders appear whole under their final name, or not at all.

A file is written under a temporary name in the same folder, fsynced, then renamed over the target
(`os.replace` is atomic on POSIX within one file system). A folder is built under a temporary name
beside the target and swapped into place by `publish_folder`. A crash leaves either the old
content or the new, never a half-written file under the real name.

A full disk (ENOSPC, or EDQUOT for a quota) is the same: the temporary file or folder is removed,
whatever was there before is left as it was, and the error becomes a `PipelineError` naming the
path, the bytes it needed (when known) and the bytes left, so a rerun after freeing space resumes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.common.errors import PipelineError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""The errors of a full disk, an exhausted quota or a file past the file system's size limit: reported as
`PipelineError`, never a traceback."""


def is_disk_full(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in DISK_FULL


def _human(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"  # unreachable


def space_left(path: str | os.PathLike) -> int | None:
    """Bytes free to us on the file system holding `path` (its nearest existing ancestor)."""
    here = Path(path).absolute()
    while not here.exists() and here != here.parent:
        here = here.parent
    try:
        return shutil.disk_usage(here).free
    except OSError:
        return None


def disk_full_error(err: OSError, path: str | os.PathLike, needed: int | None = None) -> PipelineError:
    """The message for a write to `path` that ran out of space: the path, the bytes needed and left, the fix."""
    what = {errno.EDQUOT: "disk quota exceeded", errno.EFBIG: "file too large for the file system"}.get(
        err.errno, "no space left on device")
    left = space_left(path)
    sizes = [f"{_human(needed)} needed" if needed is not None else None,
             f"{_human(left)} left" if left is not None else None]
    sizes = ", ".join(s for s in sizes if s)
    return PipelineError(f"{path}: {what} while writing it{f' ({sizes})' if sizes else ''}. Nothing written "
                         "before was changed; free some space (or choose another folder) and rerun: "
                         "the stage resumes from what it completed")


LOW_SPACE = 16 << 20
"""Below this many free bytes, a library's failed write is taken for a full disk (see `reporting_disk_full`)."""

_FULL_TEXTS = ("No space left on device", "os error 28", "Disk quota exceeded", "os error 122")


def _disk_full_code(err: BaseException, path: str | os.PathLike) -> int | None:
    if isinstance(err, PipelineError):
        return None
    if isinstance(err, OSError) and err.errno is not None:
        return err.errno if err.errno in DISK_FULL else None
    text = str(err)
    if any(t in text for t in _FULL_TEXTS):
        return errno.EDQUOT if "quota" in text or "122" in text else errno.ENOSPC
    # torch.save reports a short write as "PytorchStreamWriter failed writing file" or "unexpected
    # pos 576 vs 534", without the OS error: a nearly empty file system says what happened. Python's
    # own errors (a ValueError, a KeyError) are bugs or bad input, whatever the free space.
    if not isinstance(err, RuntimeError) and type(err).__module__ == "builtins":
        return None
    left = space_left(path)
    return errno.ENOSPC if left is not None and left < LOW_SPACE else None


@contextmanager
def reporting_disk_full(path: str | os.PathLike, needed: int | None = None) -> Iterator[None]:
    """Turn a full disk inside the block (ENOSPC/EDQUOT from us, or a library's failed write while the
    file system is out of space) into a `PipelineError` naming `path`, the bytes needed and left."""
    try:
        yield
    except Exception as err:
        code = _disk_full_code(err, path)
        if code is None:
            raise
        if not isinstance(err, OSError) or err.errno != code:
            err = OSError(code, f"{os.strerror(code)} ({type(err).__name__}: {str(err)[:200]})")
        raise disk_full_error(err, path, needed) from None


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync it, then rename it over `path`."""
    path = Path(path)
    with reporting_disk_full(path, len(data)):
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
    is left as it was; a full disk while the block writes (through any library) is a `PipelineError`
    naming `out`.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        with reporting_disk_full(out):
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
