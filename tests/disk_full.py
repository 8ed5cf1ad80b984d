"""A disk that fills up, for tests: simulated at the file-object layer, or real (a small tmpfs, as root).

`FullDisk(root, budget)` lets writes under `root` through until `budget` bytes have been written in
all, then writes what still fits and raises `OSError(ENOSPC)`, as a full file system does. It wraps
the file objects that Python code writes through (`open`, `os.fdopen`), so every writer of ours is
covered by one patch; libraries that write from C or Rust (torch.save, safetensors) are simulated at
their own entry points by the tests that use them.
"""

from __future__ import annotations

import builtins
import errno
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from pipeline.common.atomic_files import sha256_file

NO_SPACE = r"no space left on device while writing it \((\d+(\.\d)? \w+ needed, )?\d+(\.\d)? \w+ left\)"


def files_under(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def fill_during_safetensors(monkeypatch):
    """safetensors (Rust) writes half the file, then fails as it does on a full disk."""
    import transformers.modeling_utils as modeling_utils
    from safetensors import SafetensorError

    real = modeling_utils.safe_save_file

    def half_then_full(tensors, filename, *args, **kwargs):
        real(tensors, filename, *args, **kwargs)
        with open(filename, "r+b") as fh:
            fh.truncate(os.path.getsize(filename) // 2)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(modeling_utils, "safe_save_file", half_then_full)


class _FillingFile:
    def __init__(self, fh, disk: FullDisk):
        self._fh, self._disk = fh, disk

    def write(self, data):
        room = self._disk.room()
        size = len(data.encode() if isinstance(data, str) else data)
        if size > room:
            if room:
                self._fh.write(data[:room])
                self._disk.used += room
            self._fh.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._disk.used += size
        return self._fh.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._fh.close()

    def __iter__(self):
        return iter(self._fh)

    def __getattr__(self, name):
        return getattr(self._fh, name)


class FullDisk:
    """Writes under `root` fail with ENOSPC once `budget` bytes have been written (patched by `monkeypatch`)."""

    def __init__(self, monkeypatch, root: Path, budget: int):
        self.root, self.budget, self.used, self.failures = Path(root).resolve(), budget, 0, 0
        real_open, real_fdopen = builtins.open, os.fdopen

        def under_root(target) -> bool:
            if isinstance(target, int):
                try:
                    target = os.readlink(f"/proc/self/fd/{target}")
                except OSError:
                    return False
            try:
                return Path(os.fspath(target)).resolve().is_relative_to(self.root)
            except (TypeError, ValueError):
                return False

        def writing(mode: str) -> bool:
            return any(c in mode for c in "wax+")

        def fake_open(file, mode="r", *args, **kwargs):
            fh = real_open(file, mode, *args, **kwargs)
            return _FillingFile(fh, self) if writing(mode) and under_root(file) else fh

        def fake_fdopen(fd, mode="r", *args, **kwargs):
            fh = real_fdopen(fd, mode, *args, **kwargs)
            return _FillingFile(fh, self) if writing(mode) and under_root(fd) else fh

        monkeypatch.setattr(builtins, "open", fake_open)
        monkeypatch.setattr(os, "fdopen", fake_fdopen)

    def room(self) -> int:
        return max(0, self.budget - self.used)

    def free(self) -> None:
        """Space is freed: writes succeed again."""
        self.budget = 1 << 62


@contextmanager
def small_filesystem(path: Path, size: str):
    """Mount a tmpfs of `size` (e.g. "2m") at `path`; yields False where mounting is impossible here."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        yield False
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


class FakeEngine:
    """What `save_checkpoint` needs of a DeepSpeed engine: torch.save of each state file into root/tag."""

    def __init__(self, weights: int = 1000):
        self.state = {"module": {"w": torch.arange(weights, dtype=torch.float32)}}

    def save_checkpoint(self, root, tag, client_state=None, save_latest=True):
        folder = Path(root) / tag
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.state, folder / "mp_rank_00_model_states.pt")
        torch.save({"optimizer": {"m": torch.ones(10)}, **(client_state or {})},
                   folder / "zero_pp_rank_0_optim_states.pt")


@pytest.fixture
def world_of_one(monkeypatch):
    import torch.distributed as dist

    from pipeline.common.processes.topology import free_port

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
