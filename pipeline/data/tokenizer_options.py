"""Tokenizer training's options: one typed dataclass; `data_prep/train_tokenizer.py`'s flags are generated from it."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.common.config import size_limits as lim
from pipeline.data.corpus_types import CorpusOptions
from pipeline.data.tokenizer import DEFAULT_VOCAB_SIZE, TokenizerKind


@dataclass(frozen=True)
class TokenizerOptions:
    """Options of tokenizer training (the flags of `data_prep/train_tokenizer.py`)."""

    inputs: tuple[str, ...] = field(metadata={"flag": "--input"})
    """Files, folders, globs or hf:NAME, read as data_prep/shard.py reads them."""
    out: str
    """Output folder."""
    type: TokenizerKind = "bpe"
    """bpe: byte-level BPE with RoBERTa's special tokens; wordpiece: BERT's."""
    vocab_size: int | None = None
    """Vocabulary size in tokens, special tokens included (default: 50265 for bpe, 30522 for wordpiece)."""
    min_frequency: int = 2
    """Minimum count of a merge or word piece."""
    lowercase: bool | None = None
    """Lowercase text (default: no for bpe, yes for wordpiece)."""
    text_field: str = "text"
    """Text field of jsonl/parquet/hf records."""
    one_doc_per_line: bool = False
    """.txt: one document per line."""
    max_documents: int | None = None
    """Train on at most this many documents (default: all)."""
    model_max_length: int = 512
    """Longest input in tokens that the saved tokenizer accepts."""

    @property
    def effective_vocab_size(self) -> int:
        return self.vocab_size or DEFAULT_VOCAB_SIZE[self.type]

    def corpus_options(self) -> CorpusOptions:
        return CorpusOptions(text_field=self.text_field, one_doc_per_line=self.one_doc_per_line)

    def problems(self) -> list[str]:
        """Every invalid option, so they can be reported together (vocabulary size is checked by training)."""
        found = []
        if self.min_frequency < 1:
            found.append(f"--min-frequency {self.min_frequency}: must be at least 1")
        if self.max_documents is not None and self.max_documents < 1:
            found.append(f"--max-documents {self.max_documents}: must be at least 1")
        if self.model_max_length < 1:
            found.append(f"--model-max-length {self.model_max_length}: must be at least 1 token")
        found += lim.bound_problems([("--vocab-size", self.vocab_size, lim.MAX_VOCAB),
                                     ("--model-max-length", self.model_max_length, lim.MAX_SEQ_LEN)])
        return found
