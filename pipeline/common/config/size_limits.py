"""The one owner of the size bounds that keep a typo or a hostile file from allocating absurd memory.

A config value (`seq_len` 10^9, a micro batch of 10^9, a vocabulary of 10^12) or a count in a
file (`index.json`, a shard header, a task file's line) is checked against these bounds before
anything is allocated from it, and the error states the bound. They sit far above anything a real
run uses (RoBERTa-large: seq_len 512, vocabulary 50k, micro batch 16-64), so they never refuse
real work; raising one is a one-line change here.
"""

from __future__ import annotations

MAX_SEQ_LEN = 1 << 17
"""Tokens per sequence (131,072): 256× RoBERTa's 512."""

MAX_MICRO_BATCH = 1 << 16
"""Sequences per forward pass, per process (65,536)."""

MAX_GLOBAL_BATCH = 1 << 24
"""Sequences per optimizer step (16.8 M): 2,000× RoBERTa's 8k."""

MAX_VOCAB = 1 << 22
"""Vocabulary entries (4.2 M): 80× RoBERTa's 50k."""

MAX_MODEL_WIDTH = 1 << 16
"""model.hidden_size and model.intermediate_size (65,536)."""

MAX_LAYERS = 1024
"""model.num_hidden_layers and model.num_attention_heads."""

MAX_SHARD_BYTES = 1 << 32
"""Decompressed bytes of one shard or resume snapshot (4 GiB); the shard stage writes ~100 MB ones."""

MAX_LINE_BYTES = 4 << 20
"""One line of a task file (CSV, TSV, JSONL, CoNLL): 4 MiB, thousands of times any example's max_seq_len."""

MAX_JSON_FILE_BYTES = 1 << 30
"""A whole-file JSON input (a SQuAD file, index.json, tokenizer.json): 1 GiB (SQuAD 2.0 train is 40 MB)."""


def bound_problem(key: str, value: object, limit: int, *, minimum: int | None = 1) -> str | None:
    """A problem naming `key` if `value` is not an int within [minimum, limit]; None if it is.

    `minimum` None: the lower bound is checked where more is known (a batch's, with the world size).
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{key}: expected an integer, got {value!r}"
    if minimum is not None and value < minimum:
        return f"{key}: must be ≥ {minimum}, got {value}"
    if value > limit:
        return (f"{key}: {value:,} is above the bound of {limit:,} (pipeline/common/config/size_limits.py), which "
                "keeps a typo from allocating absurd memory")
    return None


def bound_problems(checks: list[tuple[str, object, int]], *, minimum: int | None = 1) -> list[str]:
    """`bound_problem` for each (key, value, limit); None values are skipped (the key's default applies)."""
    found = (bound_problem(key, value, limit, minimum=minimum) for key, value, limit in checks if value is not None)
    return [problem for problem in found if problem]
