"""The shard stage's options: one typed dataclass, from which `data_prep/shard.py`'s flags are generated."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pipeline.common.config import size_limits as lim
from pipeline.data.corpus_types import DEFAULT_MAX_DOC_BYTES, CorpusOptions
from pipeline.data.packers import PACKERS, PackMode
from pipeline.data.shards.format import FORMAT_VERSION

if TYPE_CHECKING:
    from pipeline.data.tokenizer import TokenizerInfo

DEFAULT_VAL_FRACTION = 0.05
"""HF run_mlm's `validation_split_percentage` default: 5% of documents held out."""

# Options that change how the stage runs, not what it writes (left out of the output's identity).
RUN_ONLY = ("workers", "rank", "quiet", "overwrite", "out")


@dataclass(frozen=True)
class ShardOptions:
    """Options of the shard stage (the flags of `data_prep/shard.py`)."""

    inputs: tuple[str, ...] = field(metadata={"flag": "--input"})
    """Files (.txt/.jsonl/.parquet, optionally .zst/.gz), folders, globs, or hf:NAME for a datasets dataset
    read in streaming mode."""
    tokenizer: str
    """Tokenizer folder, or a hub name such as roberta-base."""
    seq_len: int
    """Tokens per sequence, framing included."""
    out: str
    """Output folder."""
    pack: PackMode = "full"
    """full: RoBERTa FULL-SENTENCES; doc: DOC-SENTENCES (padded); doc-packed: whole documents packed into rows,
    attention kept inside each; pairs: BERT segment pairs + NSP."""
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Tokenizer processes, by default one per core; does not change the output."""
    val_fraction: float = DEFAULT_VAL_FRACTION
    """Fraction of documents (0 to 1) held out whole for validation, chosen by a hash of each document's text;
    pretraining needs a validation split."""
    shard_size: int = 8192
    """Sequences per shard file."""
    text_field: str = "text"
    """Text field of jsonl/parquet/hf records."""
    one_doc_per_line: bool = False
    """.txt: each line is a document (default: documents are separated by blank lines)."""
    max_doc_bytes: int = DEFAULT_MAX_DOC_BYTES
    """Skip (and count) documents larger than this many bytes."""
    hf_config: str | None = None
    """Configuration name for hf: inputs."""
    hf_split: str = "train"
    """Split for hf: inputs."""
    rank: int = 0
    """This process's part of the input, from 0 to world size - 1."""
    world_size: int = 1
    """Number of independent processes (parts)."""
    dedup: Literal["none", "exact"] = "none"
    """exact: drop documents whose normalised text (NFKC, case-folded, whitespace collapsed) came earlier, across
    all inputs and ranks."""
    overwrite: bool = False
    """Replace shards made with other arguments."""
    strict: bool = False
    """Stop at the first bad record instead of counting it."""
    seed: int = 0
    """Seed of the random choices in pairs mode."""
    compression_level: int = 3
    """zstd level (1 to 22)."""
    quiet: bool = False
    """No progress bar or summary."""

    def problems(self) -> list[str]:
        """Every invalid option, so they can be reported together."""
        found = []
        if self.dedup not in ("none", "exact"):
            found.append(f"--dedup {self.dedup!r}: expected none or exact")
        if self.pack not in PACKERS:
            found.append(f"--pack {self.pack!r}: expected one of {', '.join(PACKERS)}")
        if self.seq_len < 8:
            found.append(f"--seq-len {self.seq_len}: must be at least 8")
        if not 0.0 <= self.val_fraction < 1.0:
            found.append(f"--val-fraction {self.val_fraction}: must be in [0, 1)")
        if self.shard_size < 1:
            found.append(f"--shard-size {self.shard_size}: must be at least 1 sequence")
        if self.workers < 1:
            found.append(f"--workers {self.workers}: must be at least 1")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            found.append(f"--rank {self.rank} --world-size {self.world_size}: need 0 <= rank < world size")
        if self.max_doc_bytes < 1:
            found.append(f"--max-doc-bytes {self.max_doc_bytes}: must be positive")
        found += lim.bound_problems([("--seq-len", self.seq_len, lim.MAX_SEQ_LEN),
                                     ("--shard-size", self.shard_size, lim.MAX_GLOBAL_BATCH)], minimum=-(1 << 62))
        if not 1 <= self.compression_level <= 22:
            found.append(f"--compression-level {self.compression_level}: zstd levels are 1 to 22")
        return found

    def reading_key(self) -> dict:
        """What fixes the records each rank reads (for files kept across runs, such as dedup hashes)."""
        return {"inputs": list(self.inputs), "world_size": self.world_size,
                **dataclasses.asdict(self.corpus_options())}

    def corpus_options(self) -> CorpusOptions:
        return CorpusOptions(self.text_field, self.one_doc_per_line, self.max_doc_bytes,
                             self.hf_config, self.hf_split)

    def identity(self, tokenizer: TokenizerInfo) -> dict:
        """What determines the output: every option but those in RUN_ONLY."""
        values = {k: v for k, v in dataclasses.asdict(self).items() if k not in RUN_ONLY}
        if self.dedup == "none":  # not a key of folders made before the option existed, which stay resumable
            del values["dedup"]
        values["inputs"] = list(self.inputs)
        values["tokenizer_fingerprint"] = tokenizer.fingerprint
        values["format_version"] = FORMAT_VERSION
        return values


def changed_keys(previous: dict, identity: dict) -> list[str]:
    """The keys in which two output identities differ; paths are compared as the files they name, not as typed
    (`runs/tok` and `/work/runs/tok` from the same folder are one tokenizer)."""
    a, b = _paths_resolved(previous), _paths_resolved(identity)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _paths_resolved(identity: dict) -> dict:
    values = dict(identity)
    if isinstance(values.get("tokenizer"), str):
        values["tokenizer"] = str(Path(values["tokenizer"]).resolve())
    if isinstance(values.get("inputs"), list):
        values["inputs"] = [p if p.startswith("hf:") else str(Path(p).resolve()) for p in values["inputs"]]
    return values
