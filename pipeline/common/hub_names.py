"""The one rule for telling a local path from a Hugging Face hub name (`roberta-base`, `FacebookAI/roberta-base`),
and whether the hub may be reached at all (offline mode)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pipeline.common.errors import PipelineError

# The hub's own rule: NAME or ORG/NAME, letters, digits, '-', '_', '.', no leading '.' or '-'.
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def is_hub_name(text: str | os.PathLike) -> bool:
    """True for a string that names a hub repository and no existing local path."""
    text = str(text)
    return not Path(text).exists() and bool(_HUB_NAME.match(text)) and not text.endswith((".json", ".txt"))


def local_or_hub(text: str | os.PathLike, what: str) -> str:
    """`text` itself when it is an existing folder or a hub name; otherwise a clear error naming `what`."""
    text = str(text)
    path = Path(text).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise PipelineError(f"{what} {text}: is a file, expected a folder or a hub name (NAME or ORG/NAME)")
    if is_hub_name(text):
        return text
    raise PipelineError(f"{what} {text}: no such folder, and not a hub name (NAME or ORG/NAME, e.g. roberta-base)")


def hub_offline() -> bool:
    """`HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) as set now.

    huggingface_hub reads the variable once, when it is first imported; a command (or test) that sets it
    later would still wait on the network, retrying, before failing. Loaders pass `local_files_only` instead.
    """
    import huggingface_hub.constants

    now = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return huggingface_hub.constants.HF_HUB_OFFLINE or now.strip().upper() in ("1", "ON", "YES", "TRUE")
