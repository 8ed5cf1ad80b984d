"""Which vocabulary entries begin a word: one boolean per token id, built once from the vocabulary.

Whole-word and span masking need word boundaries, and the shards hold token ids only. As in
fairseq's `mask_whole_words`, the boundary is read off each vocabulary entry's text rather than
found by tokenizing the corpus again:
- byte-level BPE (RoBERTa, GPT-2): an entry starting with the space marker `Ġ` begins a word;
- WordPiece (BERT): every entry not starting with the continuation prefix `##` begins a word;
- Metaspace / SentencePiece-style BPE: an entry starting with `▁` begins a word.
The masker adds the positional rule: a token right after a special token (`<s>`, `</s>`,
`[SEP]`…) also begins a word, since byte-level BPE gives a document's first word no `Ġ`.
HF's `DataCollatorForWholeWordMask` knows the `##` rule only, so with a byte-level BPE vocabulary
it treats every token as a word of its own.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import numpy as np

from pipeline.common.errors import PipelineError

WordRule = Literal["space-marker", "continuation-prefix"]

BYTE_LEVEL_SPACE = "Ġ"
METASPACE = "▁"


def _components(node: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A pre-tokenizer or decoder and, for a `Sequence`, its members."""
    if not node:
        return []
    return [node, *(member for child in node.get("pretokenizers", node.get("decoders", [])) or []
                    for member in _components(child))]


def word_rule(tokenizer) -> tuple[WordRule, str]:
    """(rule, marker) for a transformers fast tokenizer, or a PipelineError naming what is unsupported."""
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    model = backend.get("model", {})
    prefix = model.get("continuing_subword_prefix")
    if prefix:
        return "continuation-prefix", prefix
    kinds = {c.get("type") for c in _components(backend.get("pre_tokenizer")) + _components(backend.get("decoder"))}
    if "ByteLevel" in kinds:
        return "space-marker", BYTE_LEVEL_SPACE
    if "Metaspace" in kinds:
        return "space-marker", METASPACE
    raise PipelineError(
        f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} ({model.get('type')} model, pre-tokenizers "
        f"{sorted(k for k in kinds if k)}): whole-word and span masking need word boundaries in the vocabulary, "
        "either byte-level BPE's 'Ġ', SentencePiece's '▁' or WordPiece's '##'; use masking.unit=token")


def word_start_table(tokenizer, vocab_size: int) -> np.ndarray:
    """`table[id]` is True when vocabulary entry `id` begins a word (special tokens included; the masker skips them)."""
    rule, marker = word_rule(tokenizer)
    table = np.zeros(max(vocab_size, len(tokenizer)), dtype=bool)
    for text, token_id in tokenizer.get_vocab().items():
        starts = text.startswith(marker) if rule == "space-marker" else not text.startswith(marker)
        table[token_id] = starts
    return table
