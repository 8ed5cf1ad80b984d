"""The one way to find a config: a path as given, or a config shipped with the package, by name.

The repository's `configs/` folder is the single copy. In a checkout, `pipeline/shipped_configs`
is a link to it; a built wheel holds its files there as package data. So `--config large` finds
`configs/large.json` from any folder, installed or not, and `--config configs/large.json` (the
documented spelling) still works outside the checkout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pipeline.common.errors import PipelineError

Kind = Literal["pretrain", "finetune", "shard"]

# Where each kind of config lives inside the shipped folder, searched in this order.
FOLDERS: dict[str, tuple[str, ...]] = {"pretrain": ("",), "finetune": ("glue", "tasks"), "shard": ("shard",)}
PREFIX = "configs/"


def shipped_root() -> Path:
    """The shipped configs folder (`configs/` of the checkout, or the wheel's copy)."""
    return Path(__file__).resolve().parents[2] / "shipped_configs"


def shipped_names(kind: Kind) -> list[str]:
    """The names `--config` accepts for `kind`, e.g. `tiny`, `large` or `sst2`, `ner`."""
    root = shipped_root()
    return sorted({p.stem for folder in FOLDERS[kind] for p in (root / folder).glob("*.json")})


def documented_path(shipped: Path) -> str:
    """How the docs spell a shipped config, e.g. `configs/glue/word-order.json`."""
    return PREFIX + shipped.relative_to(shipped_root()).as_posix()


def find_config(name_or_path: str | Path, kind: Kind) -> Path:
    """`name_or_path` as an existing file, else the shipped config of that name (or `configs/...` path).

    Raises PipelineError naming the shipped configs of `kind` when neither exists.
    """
    given = Path(name_or_path)
    if given.is_file():
        return given
    text = str(name_or_path)
    root = shipped_root()
    candidates: list[Path] = []
    if text.startswith(PREFIX):  # a documented repository path, used outside the checkout
        candidates.append(root / text.removeprefix(PREFIX))
    elif "/" not in text and "\\" not in text:
        stem = text.removesuffix(".json")
        candidates += [root / folder / f"{stem}.json" for folder in FOLDERS[kind]]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise PipelineError(f"--config {text}: no such file, and no shipped {kind} config of that name "
                        f"(shipped: {', '.join(shipped_names(kind)) or 'none'})")
