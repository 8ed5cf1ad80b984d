"""A model folder's card: `README.md` in Hugging Face's format, YAML metadata then markdown.

The metadata is written by huggingface_hub's own `ModelCardData`, so `ModelCard.load` reads it back and the
hub shows it. The card describes the folder; it is not part of what the folder holds, so model fingerprints
leave it out (`pipeline/models/fingerprints.py`) and a card rewritten with later figures changes no reuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.common.atomic_files import write_text_atomic

CARD_FILE = "README.md"


def write_card(folder: Path, metadata: dict[str, Any], title: str, sections: Sequence[tuple[str, str]]) -> Path:
    """Write `folder/README.md`: `metadata` (keys of `huggingface_hub.ModelCardData`; None values left out), a
    title, and `(heading, markdown)` sections."""
    from huggingface_hub import ModelCardData

    data = ModelCardData(**{k: v for k, v in metadata.items() if v not in (None, [], {})})
    body = "\n\n".join(f"## {heading}\n\n{text.strip()}" for heading, text in sections if text)
    path = Path(folder) / CARD_FILE
    write_text_atomic(path, f"---\n{data.to_yaml()}\n---\n\n# {title}\n\n{body}\n")
    return path


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; `|` inside a cell is escaped."""
    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in rows)])


def figure(value: float | None, digits: int = 3) -> str:
    """A figure for a card: fixed digits, or "—" where it was not measured."""
    return "—" if value is None else f"{value:.{digits}f}"


def equivalence_text(record: dict[str, Any], saved_as: str) -> str:
    """The equivalence check of a saved folder in words (`output_agreement.Agreement.record()`)."""
    return (f"One batch went through the model as it was trained ({record['reference']}, {record['precision']}) "
            f"and through this folder loaded with `{saved_as}` in fp32: over {record['compared']} positions the "
            f"largest logit difference is {record['max_logit_difference']:.3g} (tolerance {record['tolerance']:.3g} "
            f"for {record['precision']}) and the top-1 prediction agrees at {record['top1_agreement']:.1%} (in bf16 "
            f"or fp16, rounding flips near-ties between the top tokens). A folder beyond the tolerance is refused, "
            f"never written.")
