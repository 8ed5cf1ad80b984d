"""The Sentence-Transformers model of the embedding family: built from any HF folder the stage takes, and saved as
a Sentence-Transformers folder that proves it computes what the model in memory computed.

The folder is sentence-transformers' own layout (`modules.json`, the transformer at the root, `1_Pooling/` with
the pooling mode), so `SentenceTransformer(folder)` loads it offline; `pipeline_finetune.json` beside it holds the
pipeline's provenance, as every fine-tuned folder does. The proof: texts from the dev split are embedded by the
model in memory and by the folder loaded back with `SentenceTransformer(folder, local_files_only=True)`; every
pair's cosine must be at least `MIN_COSINE`, or nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import staged_folder, write_json_atomic
from pipeline.common.errors import PipelineError
from pipeline.common.run_layout import FINETUNE_PROVENANCE_FILE
from pipeline.models.architectures.config import Pooling

MIN_COSINE = 0.9999
"""The least cosine between a text's embedding from the model in memory and from its saved folder (fp32 kernels
and summation order move it by about 1e-7; a lost weight or another pooling moves it far more)."""

DROPOUT_KEYS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "embedding_dropout", "mlp_dropout",
                "attention_dropout")
"""The dropout rates of RoBERTa's, BERT's and ModernBERT's configs."""


def model_dropout(config) -> float:
    """The largest dropout rate of a transformers config (0 when it has none)."""
    return max([float(getattr(config, key, 0) or 0) for key in DROPOUT_KEYS])


def build_sentence_model(source: str, *, pooling: Pooling, max_seq_len: int, from_scratch: bool = False,
                         dropout: float | None = None, prompts: dict[str, str] | None = None):
    """A `SentenceTransformer` of `source`'s encoder (no head) and `pooling`; random weights of the same
    architecture `from_scratch`; `dropout` (None: the model's own) set on every dropout of the config; `prompts`
    by name (`query`, `document`), saved with the folder. A checkpoint lacking a weight of the encoder is refused,
    naming it (`encoder_weights.load_encoder_weights`), before sentence-transformers loads it.

    A Sentence-Transformers folder (an earlier embedding stage's output) gives its transformer, and its pooling
    must be `pooling`: a stage that pooled otherwise than its source was trained to is refused before it loads."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    from pipeline.models.embedding_encoder import sentence_folder
    from pipeline.models.encoder_weights import load_encoder_weights

    if (folder := sentence_folder(source)) is not None:
        if folder.pooling != pooling:
            raise PipelineError(f"{source}: a Sentence-Transformers folder that pools {folder.pooling!r}, but "
                                f"embedding.pooling is {pooling!r}; set embedding.pooling to {folder.pooling!r} to "
                                "go on from it (or start from the model it was trained from)")
        source = str(folder.transformer)
    if not from_scratch:
        load_encoder_weights(source)  # strict: raises naming the keys; sentence-transformers loads its own copy
    present = AutoConfig.from_pretrained(source).to_dict()
    config_kwargs = {key: dropout for key in DROPOUT_KEYS if key in present} if dropout is not None else {}
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the load report was judged above
    try:
        transformer = models.Transformer(source, max_seq_length=max_seq_len, config_kwargs=config_kwargs or None)
    finally:
        hf_logging.set_verbosity(verbosity)
    if from_scratch:
        transformer.model = AutoModel.from_config(transformer.model.config)
    pool = models.Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)
    return SentenceTransformer(modules=[transformer, pool], device="cpu", prompts=prompts or None)


@dataclass(frozen=True)
class FolderAgreement:
    """Texts embedded by the model in memory and by the saved folder: the least cosine between the two."""

    min_cosine: float
    texts: int
    threshold: float = MIN_COSINE
    loader: str = "SentenceTransformer"
    """The class that loaded the folder back (`SparseEncoder` for a sparse folder)."""

    @property
    def within_tolerance(self) -> bool:
        return self.min_cosine >= self.threshold

    def record(self) -> dict:
        return {**asdict(self), "within_tolerance": self.within_tolerance,
                "summary": f"{self.texts} dev texts were embedded by the model as it was trained and by this folder "
                           f"loaded with `{self.loader}(folder)`: the least cosine between the two is "
                           f"{self.min_cosine:.7f} (at least {self.threshold} required; a folder below it is "
                           "refused, never written)."}


def folder_agreement(model, folder: Path, texts: list[str]) -> FolderAgreement:
    """The model in memory against `folder` loaded offline by sentence-transformers, on `texts`."""
    from sentence_transformers import SentenceTransformer

    from pipeline.hub.embedding_evaluation import cosine_rows

    ours = model.encode(texts, convert_to_numpy=True, show_progress_bar=False)
    loaded = SentenceTransformer(str(folder), local_files_only=True, device="cpu")
    theirs = loaded.encode(texts, convert_to_numpy=True, show_progress_bar=False)
    cosine = cosine_rows(ours.astype(np.float64), theirs.astype(np.float64))
    return FolderAgreement(float(cosine.min()) if np.isfinite(cosine).all() else float("nan"), len(texts))


def save_sentence_model(folder: Path, model, provenance: dict, check_texts: list[str],
                        agree: Callable[[object, Path, list[str]], FolderAgreement] = folder_agreement
                        ) -> FolderAgreement:
    """`model` as a Sentence-Transformers folder with `pipeline_finetune.json`, swapped into place whole once
    `agree` (`folder_agreement`; a sparse model's own) holds; below `MIN_COSINE` nothing is written."""
    with staged_folder(folder) as tmp:
        model.save(str(tmp))
        agreement = agree(model, tmp, check_texts)
        if not agreement.within_tolerance:
            raise PipelineError(f"saving the embedding model {folder} refused: loaded back with "
                                f"{agreement.loader}(folder), {agreement.texts} dev texts' embeddings reach a least "
                                f"cosine of {agreement.min_cosine:.6f} with the model's own (at least {MIN_COSINE} "
                                "required): the folder does not compute what the model computed")
        write_json_atomic(tmp / FINETUNE_PROVENANCE_FILE, {**provenance, "equivalence": agreement.record()})
    return agreement
