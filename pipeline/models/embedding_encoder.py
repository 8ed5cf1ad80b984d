"""Texts → one vector each: a transformers encoder, its tokenizer and a pooling, in length-sorted batches.

The stage's own encoder, used by the evaluator, the fine-tuning family's scoring and the in-loop probes (a live
model, no folder). Pooling is sentence-transformers' formula (mean of the real tokens' vectors, or the first
token's), so a Sentence-Transformers folder gives the same embeddings here as through `SentenceTransformer.encode`.

`load_encoder` reads any model the stage takes: an export, a pretraining run or checkpoint (exported once), a
fine-tuning output or saved model, a released HF folder, or a Sentence-Transformers folder (its `modules.json`
says where the transformer is and how it pools, and `config_sentence_transformers.json` its prompts, which
`encode_query` and `encode_document` apply).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from pipeline.common.errors import PipelineError
from pipeline.models.architectures.config import Pooling

if TYPE_CHECKING:
    from pipeline.models.model_source import Exporter

ST_MODULES = "modules.json"
ST_SETTINGS = "sentence_bert_config.json"
ST_CONFIG = "config_sentence_transformers.json"
DOCUMENT_PROMPT_NAMES = ("document", "passage", "corpus")
"""The names `SentenceTransformer.encode_document` looks its prompt up by, in its order."""
KNOWN_MODULES = ("Transformer", "Pooling", "Normalize", "Dense")
"""The Sentence-Transformers modules this encoder reproduces (a Dense only without activation: a linear map, such as
the evaluator's centring or whitening); a folder with others is refused by name."""
VectorMap = Callable[[np.ndarray], np.ndarray]


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """(batch, tokens, width) → (batch, width): sentence-transformers' `Pooling` for `mean` and `cls`."""
    if pooling == "cls":
        return hidden[:, 0]
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)


@dataclass(frozen=True)
class RolePrompts:
    """The prompts of a Sentence-Transformers folder by role, as its `encode_query` (`query`), `encode_document`
    (`document`, `passage` or `corpus`) and plain `encode` (the `default_prompt_name`'s) apply them."""

    query: str = ""
    document: str = ""
    default: str = ""
    source: str = ""
    """Where they were read (a folder's `config_sentence_transformers.json`, or the config's `embedding.prompts`)."""

    @classmethod
    def of(cls, named: dict[str, str], default_name: str | None = None, source: str = "") -> RolePrompts:
        document = next((named[k] for k in DOCUMENT_PROMPT_NAMES if named.get(k)), "")
        default = named.get(default_name) if default_name else None
        return cls(named.get("query") or "", document, default or "", source)

    @classmethod
    def read(cls, folder: str | Path) -> RolePrompts:
        """`folder`'s prompts (none when it has no `config_sentence_transformers.json`)."""
        path = Path(folder) / ST_CONFIG
        if not path.is_file():
            return cls()
        try:
            config = json.loads(path.read_text())
            named = {str(k): v for k, v in (config.get("prompts") or {}).items() if isinstance(v, str)}
        except (OSError, ValueError, AttributeError) as err:
            raise PipelineError(f"{path}: not a Sentence-Transformers config ({err})") from None
        return cls.of(named, config.get("default_prompt_name"), str(path))

    def __bool__(self) -> bool:
        return bool(self.query or self.document or self.default)

    def describe(self) -> str:
        roles = [f"{role} {text!r}" for role, text in (("queries", self.query), ("documents", self.document),
                                                       ("other texts", self.default)) if text]
        return f"prompts applied ({self.source}): " + ", ".join(roles)

    def record(self) -> dict[str, str]:
        return {"query": self.query, "document": self.document, "default": self.default, "source": self.source}


def prompted(encode: Callable[[Sequence[str]], np.ndarray], prompt: str) -> Callable[[Sequence[str]], np.ndarray]:
    """`encode` with `prompt` put before each text, as sentence-transformers does (`prompt + text`)."""
    return encode if not prompt else lambda texts: encode([prompt + t for t in texts])


@dataclass
class PooledEncoder:
    """`encode(texts)` → float32 (n, width): a live model (in eval mode while encoding) and its tokenizer."""

    model: torch.nn.Module
    tokenizer: object
    pooling: Pooling = "mean"
    max_seq_len: int = 128
    batch_size: int = 32
    prompts: RolePrompts = field(default_factory=RolePrompts)
    """Applied by `encode_query` and `encode_document` (and `encode_other`); `encode` applies none."""
    after_pooling: VectorMap | None = None
    """The folder's modules after its pooling (`vector_map`), applied to the pooled vectors; None: none."""

    def encode_query(self, texts: Sequence[str]) -> np.ndarray:
        return prompted(self.encode, self.prompts.query)(texts)

    def encode_document(self, texts: Sequence[str]) -> np.ndarray:
        return prompted(self.encode, self.prompts.document)(texts)

    def encode_other(self, texts: Sequence[str]) -> np.ndarray:
        """A text that is neither query nor document (STS, clustering): the default prompt, as `encode` does."""
        return prompted(self.encode, self.prompts.default)(texts)

    @torch.no_grad()
    def encode(self, texts: Sequence[str]) -> np.ndarray:
        was_training = self.model.training
        self.model.eval()
        # Shortest first, so each batch pads to about its own length (as sentence-transformers' encode does).
        order = np.argsort([len(t) for t in texts], kind="stable")
        device = next(self.model.parameters()).device
        parts = []
        try:
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer([texts[i] for i in order[start:start + self.batch_size]], padding=True,
                                       truncation=True, max_length=self.max_seq_len, return_tensors="pt")
                batch = {k: v.to(device) for k, v in batch.items()
                         if k in ("input_ids", "attention_mask", "token_type_ids")}
                hidden = self.model(**batch).last_hidden_state
                parts.append(pool(hidden, batch["attention_mask"], self.pooling).float().cpu().numpy())
        finally:
            self.model.train(was_training)
        out = np.zeros((len(texts), parts[0].shape[1] if parts else 0), dtype=np.float32)
        if parts:
            out[order] = np.concatenate(parts)
        return self.after_pooling(out) if self.after_pooling is not None and parts else out


@dataclass(frozen=True)
class SentenceFolder:
    """What a Sentence-Transformers folder says: where its transformer is, how it pools, its length."""

    transformer: Path
    pooling: Pooling
    max_seq_len: int | None
    prompts: RolePrompts = RolePrompts()
    after_pooling: tuple[tuple[str, Path], ...] = ()
    """(kind, folder) of each module after the pooling, in order: Normalize, or a Dense without activation."""


def sentence_folder(folder: str | Path) -> SentenceFolder | None:
    """`folder`'s modules, when it is a Sentence-Transformers folder (None otherwise); modules this encoder does not
    reproduce are refused by name."""
    folder = Path(folder)
    if not (folder / ST_MODULES).is_file():
        return None
    try:
        modules = json.loads((folder / ST_MODULES).read_text())
        chain = [(m["type"].rsplit(".", 1)[-1], folder / m["path"]) for m in modules]
        kinds = dict(chain)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise PipelineError(f"{folder / ST_MODULES}: not a Sentence-Transformers module list ({err})") from None
    unknown = [kind for kind in kinds if kind not in KNOWN_MODULES]
    if unknown or "Transformer" not in kinds or "Pooling" not in kinds:
        raise PipelineError(f"{folder}: a Sentence-Transformers folder with modules {', '.join(kinds)}; this encoder "
                            f"reproduces {', '.join(KNOWN_MODULES)} (a transformer and a pooling) only")
    pooling_config = json.loads((kinds["Pooling"] / "config.json").read_text())
    mode = pooling_config.get("pooling_mode")  # sentence-transformers 6; earlier versions: one flag per mode
    modes = ([mode] if isinstance(mode, str) else list(mode)) if mode is not None else [
        k.removeprefix("pooling_mode_").removesuffix("_tokens").removesuffix("_token")
        for k, v in pooling_config.items() if k.startswith("pooling_mode_") and v is True]
    if modes not in (["mean"], ["cls"]):
        raise PipelineError(f"{kinds['Pooling'] / 'config.json'}: pooling {modes}; this encoder reproduces mean or "
                            "CLS pooling alone")
    settings = kinds["Transformer"] / ST_SETTINGS
    length = json.loads(settings.read_text()).get("max_seq_length") if settings.is_file() else None
    after = tuple(chain[[kind for kind, _ in chain].index("Pooling") + 1:])
    for kind, path in after:
        config = json.loads((path / "config.json").read_text()) if kind == "Dense" else {}
        if kind == "Dense" and (not config.get("activation_function", "").endswith(".Identity")
                                or config.get("use_residual")):
            raise PipelineError(f"{path / 'config.json'}: a Dense with activation "
                                f"{config.get('activation_function')!r}; this encoder reproduces a Dense without "
                                "activation (a linear map) alone")
    return SentenceFolder(kinds["Transformer"], modes[0], length, RolePrompts.read(folder), after)


def vector_map(found: SentenceFolder) -> VectorMap | None:
    """The modules after a folder's pooling as one function of the pooled vectors (None when there are none):
    Normalize as unit length, a Dense as `x W^T + b` (its `model.safetensors`), in the folder's order."""
    if not found.after_pooling:
        return None
    from safetensors.numpy import load_file

    steps = []
    for kind, path in found.after_pooling:
        if kind == "Normalize":
            steps.append(lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12))
        elif kind == "Dense":
            if not (path / "model.safetensors").is_file():
                raise PipelineError(f"{path}: a Dense module without model.safetensors (this encoder reads no other "
                                    "weight format)")
            weights = load_file(str(path / "model.safetensors"))
            weight, bias = weights["linear.weight"].astype(np.float64), weights.get("linear.bias")
            steps.append(lambda x, w=weight, b=bias: x @ w.T + (0 if b is None else b.astype(np.float64)))

    def apply(vectors: np.ndarray) -> np.ndarray:
        out = vectors.astype(np.float64)
        for step in steps:
            out = step(out)
        return out.astype(np.float32)

    return apply


def default_length(config, tokenizer, cap: int = 512) -> int:
    """The longest input the model takes (its positions), at most the tokenizer's own limit and `cap`."""
    from pipeline.models.model_source import position_limit

    limit = min(position_limit(config), cap)
    told = getattr(tokenizer, "model_max_length", None)
    return min(limit, told) if isinstance(told, int) and told > 0 else limit


def load_transformer(folder: str | Path, *, from_scratch: bool = False) -> torch.nn.Module:
    """The bare encoder (no head) of an HF folder; a weight of the encoder missing from the checkpoint is an error
    naming it, while a head left behind is expected (`encoder_weights.load_encoder_weights`)."""
    from transformers import AutoConfig, AutoModel

    from pipeline.models.encoder_weights import load_encoder_weights

    if from_scratch:
        return AutoModel.from_config(AutoConfig.from_pretrained(folder))
    return load_encoder_weights(folder)


def load_encoder(model: str | Path, *, pooling: Pooling | None = None, max_seq_len: int | None = None,
                 batch_size: int = 32, exporter: Exporter | None = None) -> tuple[PooledEncoder, str]:
    """(the encoder, the HF folder it reads) for any model the stage takes (a pretraining run or checkpoint through
    `exporter`); a folder that is not a model is a `PipelineError` naming it. A Sentence-Transformers folder's own
    pooling and length apply unless given."""
    from transformers import AutoConfig, AutoTokenizer

    from pipeline.models.model_source import position_limit, resolve_model_source

    source = resolve_model_source(model, exporter=exporter, what="--model")
    found = sentence_folder(source.path)
    folder = str(found.transformer) if found else source.path
    if not Path(folder, "config.json").is_file() and Path(folder).exists():
        raise PipelineError(f"--model {model}: {folder} holds no config.json; not a model folder")
    tokenizer, config = AutoTokenizer.from_pretrained(folder), AutoConfig.from_pretrained(folder)
    # A Sentence-Transformers folder's length is its own (sentence-transformers 6 keeps it as the tokenizer's
    # `model_max_length`, earlier versions in sentence_bert_config.json); elsewhere the positions, at most 512.
    told = getattr(tokenizer, "model_max_length", None)
    own = (found.max_seq_len or (told if isinstance(told, int) and 0 < told < 1 << 20 else None)) if found else None
    length = max_seq_len or own or default_length(config, tokenizer)
    encoder = PooledEncoder(load_transformer(folder), tokenizer, pooling or (found.pooling if found else "mean"),
                            min(length, position_limit(config)), batch_size,
                            found.prompts if found else RolePrompts(), vector_map(found) if found else None)
    return encoder, folder
