"""Train, load and fingerprint tokenizers: byte-level BPE (RoBERTa) and WordPiece (BERT).

Training uses HF `tokenizers`; the result is wrapped in `PreTrainedTokenizerFast` and saved, so
`transformers.AutoTokenizer.from_pretrained(dir)` loads it. (transformers 5 builds an empty
vocabulary from `RobertaTokenizerFast(vocab_file=..., merges_file=...)`, so we wrap the
`tokenizers.Tokenizer` object instead; see shared/notes/platform-facts.md.)
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.common.atomic_files import staged_folder
from pipeline.common.errors import PipelineError
from pipeline.common.hub_names import hub_offline, local_or_hub

TokenizerKind = Literal["bpe", "wordpiece"]

# Special tokens in id order. RoBERTa's order matches roberta-base (<s>=0, <pad>=1, </s>=2,
# <unk>=3); <mask> comes right after instead of at the end of the vocabulary.
ROBERTA_SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
DEFAULT_VOCAB_SIZE: dict[str, int] = {"bpe": 50_265, "wordpiece": 30_522}


@dataclass(frozen=True)
class TokenizerInfo:
    """What the data stage needs to know about a tokenizer, checked once at start-up."""

    name: str
    fingerprint: str
    vocab_size: int
    cls_id: int
    """Id that opens every sequence (`<s>` or `[CLS]`)."""
    sep_id: int
    """Id that closes a sequence and separates documents or segments (`</s>` or `[SEP]`)."""
    pad_id: int
    mask_id: int
    backend_json: str
    """The `tokenizers.Tokenizer` serialised as JSON, so worker processes can rebuild it cheaply."""


def train_tokenizer(
    texts: Iterable[str],
    kind: TokenizerKind,
    vocab_size: int,
    out_dir: Path,
    *,
    min_frequency: int = 2,
    lowercase: bool | None = None,
    model_max_length: int = 512,
):
    """Train a tokenizer on `texts` and save it to `out_dir` (written atomically).

    `lowercase` defaults to False for BPE (RoBERTa is cased) and True for WordPiece
    (bert-base-uncased).
    """
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    smallest = 256 + len(ROBERTA_SPECIAL_TOKENS) if kind == "bpe" else len(BERT_SPECIAL_TOKENS) + 1
    if vocab_size < smallest:
        # Byte-level BPE starts from all 256 bytes, plus the 5 special tokens.
        raise PipelineError(f"--vocab-size {vocab_size} is too small for {kind}: it must be at least {smallest}")
    if kind == "bpe":
        lowercase = False if lowercase is None else lowercase
        tok = Tokenizer(models.BPE(unk_token=None))
        tok.normalizer = normalizers.Lowercase() if lowercase else None
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(ROBERTA_SPECIAL_TOKENS),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=True,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        bos, pad, eos, unk, mask = ROBERTA_SPECIAL_TOKENS
        # As in roberta-base: "<mask>" absorbs the space before it, so "a <mask>" masks " word".
        mask_token = AddedToken(mask, lstrip=True, rstrip=False, normalized=False, special=True)
        tok.add_special_tokens([mask_token])
        tok.post_processor = processors.RobertaProcessing(
            (eos, tok.token_to_id(eos)), (bos, tok.token_to_id(bos)), trim_offsets=True, add_prefix_space=False
        )
        wrapped = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            bos_token=bos, eos_token=eos, cls_token=bos, sep_token=eos,
            unk_token=unk, pad_token=pad,
            mask_token=mask_token,
            model_max_length=model_max_length,
        )
    elif kind == "wordpiece":
        lowercase = True if lowercase is None else lowercase
        pad, unk, cls, sep, mask = BERT_SPECIAL_TOKENS
        tok = Tokenizer(models.WordPiece(unk_token=unk))
        tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=None, clean_text=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(BERT_SPECIAL_TOKENS),
            show_progress=True,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
        )
        wrapped = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            cls_token=cls, sep_token=sep, unk_token=unk, pad_token=pad, mask_token=mask,
            model_max_length=model_max_length,
            # BERT's segment embeddings need token_type_ids, which the generic class omits.
            model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        )
    else:
        raise PipelineError(f"--type must be 'bpe' or 'wordpiece', got {kind!r}")

    if tok.get_vocab_size() <= len(BERT_SPECIAL_TOKENS):
        raise PipelineError("the tokenizer learned no vocabulary: is the corpus empty?")
    _save_atomically(wrapped, Path(out_dir))
    return wrapped


def _save_atomically(tokenizer, out_dir: Path) -> None:
    """Save into a temporary sibling folder, then swap it into place.

    Only an empty folder or an earlier tokenizer folder is replaced: anything else in `out_dir`
    would be lost with the swap.
    """
    out_dir = out_dir.resolve()
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "tokenizer.json").is_file():
        raise PipelineError(f"--out {out_dir} holds other files and no tokenizer.json; "
                            "choose an empty or new folder")
    with staged_folder(out_dir) as tmp:
        tokenizer.save_pretrained(str(tmp))


def load_tokenizer(name_or_path: str | os.PathLike):
    """Load a fast tokenizer from a local folder or a hub name such as `roberta-base`."""
    from transformers import AutoTokenizer

    name = local_or_hub(name_or_path, "tokenizer")
    if Path(name).is_dir():
        check_tokenizer_files(Path(name))
    try:
        tok = AutoTokenizer.from_pretrained(name, local_files_only=hub_offline())
    except (OSError, ValueError) as err:
        raise PipelineError(f"cannot load tokenizer {name!r}: {err}") from None
    except Exception as err:  # noqa: BLE001 - the Rust tokenizer's own errors are plain Exceptions
        raise PipelineError(f"cannot load tokenizer {name!r}: {type(err).__name__}: {str(err)[:300]}") from None
    if not getattr(tok, "is_fast", False):
        raise PipelineError(f"tokenizer {name!r} has no fast (Rust) implementation, which the pipeline needs")
    return tok


TOKENIZER_JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def check_tokenizer_files(folder: Path) -> None:
    """The JSON files of a tokenizer folder are bounded, UTF-8, JSON objects: else an error naming the file."""
    from pipeline.common.config.size_limits import MAX_JSON_FILE_BYTES

    for name in TOKENIZER_JSON_FILES:
        path = folder / name
        if not path.is_file():
            continue
        size = path.stat().st_size
        if size > MAX_JSON_FILE_BYTES:
            raise PipelineError(f"{path}: {size:,} bytes, more than the {MAX_JSON_FILE_BYTES:,} a tokenizer file "
                                "may have")
        try:
            value = json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as err:
            raise PipelineError(f"{path}: not a tokenizer file: byte {err.start} is not UTF-8") from None
        except (ValueError, RecursionError) as err:
            raise PipelineError(f"{path}: not a tokenizer file: invalid JSON ({str(err)[:200]})") from None
        if not isinstance(value, dict):
            raise PipelineError(f"{path}: not a tokenizer file: expected a JSON object, got {type(value).__name__}")


def describe_tokenizer(tok, name: str | None = None) -> TokenizerInfo:
    """Check that `tok` has the special tokens an encoder needs and summarise it."""
    name = name or getattr(tok, "name_or_path", "tokenizer")
    ids = {
        "cls/bos": tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id,
        "sep/eos": tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id,
        "pad": tok.pad_token_id,
        "mask": tok.mask_token_id,
    }
    missing = [role for role, token_id in ids.items() if token_id is None]
    if missing:
        raise PipelineError(
            f"tokenizer {name!r} lacks the special tokens {', '.join(missing)}; an encoder needs "
            "<s> </s> <pad> <mask> (RoBERTa) or [CLS] [SEP] [PAD] [MASK] (BERT). "
            "Train one with data_prep/train_tokenizer.py"
        )
    backend_json = tok.backend_tokenizer.to_str()
    return TokenizerInfo(
        name=str(name),
        fingerprint=fingerprint(backend_json, tok),
        vocab_size=len(tok),
        cls_id=ids["cls/bos"],
        sep_id=ids["sep/eos"],
        pad_id=ids["pad"],
        mask_id=ids["mask"],
        backend_json=backend_json,
    )


def fingerprint(backend_json: str, tok) -> str:
    """sha256 of the tokenizer's content: its `tokenizer.json` and its special-token map.

    Hashing the canonical serialisation rather than the folder's bytes gives the same answer for
    a local folder and the same tokenizer loaded from the hub cache.
    """
    digest = hashlib.sha256(backend_json.encode())
    digest.update(json.dumps(tok.special_tokens_map, sort_keys=True, default=str).encode())
    return "sha256:" + digest.hexdigest()
