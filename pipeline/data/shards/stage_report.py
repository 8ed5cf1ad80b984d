"""What the shard stage tells its user: a progress bar while it runs, then a short summary with warnings."""

from __future__ import annotations

import sys
import time

from pipeline.data.packers import Packer
from pipeline.data.shards.tokenize_worker import TokenizedBatch


def log(quiet: bool, message: str) -> None:
    if not quiet:
        print(message, file=sys.stderr)


class Progress:
    """A tqdm bar counting documents, with tokens/s alongside."""

    def __init__(self, enabled: bool, packers: dict[str, Packer]):
        self.bar = None
        self.packers = packers
        self.started = time.monotonic()
        self.tokens0 = self._tokens()
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(unit=" docs", desc="shard", dynamic_ncols=True, file=sys.stderr,
                            initial=sum(p.stats.documents for p in packers.values()))

    def _tokens(self) -> int:
        return sum(p.stats.document_tokens for p in self.packers.values())

    def update(self, result: TokenizedBatch) -> None:
        if self.bar is not None:
            rate = (self._tokens() - self.tokens0) / max(time.monotonic() - self.started, 1e-9)
            self.bar.set_postfix_str(f"{rate / 1e6:.2f}M tok/s", refresh=False)
            self.bar.update(len(result.lengths))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def format_summary(result: dict) -> str:
    """A short human summary of an index (or of one part's summary)."""
    stats = result.get("totals") or result.get("stats", {})
    seconds = sum(p["seconds"] for p in result.get("parts", [result]))
    per_split = {split: sum(s["sequences"] for s in shards) for split, shards in result["shards"].items()} \
        if "shards" in result else {split: entry["sequences"] for split, entry in result["splits"].items()}
    lines = [
        f"documents        {stats.get('documents', 0):>14,}  ({stats.get('val_documents', 0):,} in validation)",
        f"document tokens  {stats.get('document_tokens', 0):>14,}",
        f"sequences        {stats.get('sequences', 0):>14,}  ("
        + ", ".join(f"{split} {n:,}" for split, n in per_split.items()) + ")",
        f"padding          {stats.get('padding_tokens', 0):>14,}  "
        f"({stats.get('padding_fraction', 0.0) * 100 if 'padding_fraction' in stats else 0:.2f}% of slots)",
        f"dropped tokens   {stats.get('dropped_tokens', 0):>14,}  (final partial sequence / leftovers)",
        "skipped records  " + ", ".join(f"{k}={v}" for k, v in stats.get("skipped", {}).items()),
        f"time             {seconds:>14.1f} s  "
        f"({stats.get('document_tokens', 0) / max(seconds, 1e-9) / 1e6:.2f}M tokens/s)",
    ]
    if "duplicates" in stats:
        lines.insert(3, f"duplicates       {stats['duplicates']['documents']:>14,}  documents dropped "
                        f"(--dedup exact), {stats['duplicates']['tokens']:,} tokens")
    if "splits" in result and (warning := validation_warning(result)):
        lines.append(warning)
    return "\n".join(lines)


def validation_warning(index: dict) -> str | None:
    """A warning line when a finished shard folder has no validation sequence (pretraining refuses it)."""
    if index["splits"]["val"]["sequences"]:
        return None
    fraction = index["args"]["val_fraction"]
    totals = index["totals"]
    if fraction == 0:
        return "warning: no validation split (--val-fraction 0); pretraining refuses shards without one"
    return (f"warning: --val-fraction {fraction} gave no validation sequence ({totals.get('val_documents', 0):,} of "
            f"{totals.get('documents', 0):,} documents held out) because the corpus is too small; pretraining "
            "refuses these shards: rerun with a larger --val-fraction (and --overwrite), or add text")
