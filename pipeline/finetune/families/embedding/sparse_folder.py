"""The SPLADE model of `embed-sparse`: sentence-transformers' `SparseEncoder` over the export's own masked-LM head,
its loss, and the folder it saves.

SPLADE (Formal et al. 2021) reads the masked-LM head's logits: each text becomes one vocabulary-wide vector,
log(1 + ReLU(logit)) max-pooled over its tokens (`SpladePooling`), trained with in-batch negatives on dot products
(`SparseMultipleNegativesRankingLoss`) plus FLOPS regularisers that push the vectors to few active dimensions
(`SpladeLoss`). Nothing of it is written here; the model is sentence-transformers' `Transformer` with
`transformer_task="fill-mask"` (which loads `AutoModelForMaskedLM`; 6.3's `MLMTransformer` is that module kept
for old folders) followed by `SpladePooling`.

The head must be the export's trained one: a folder whose masked-LM weights transformers would have to create
(a headless `AutoModel` folder, a Sentence-Transformers folder) is refused by name, since SPLADE on a random head
would start from noise. `--from-scratch` is random weights of the same architecture, head included.

The saved folder is the dense one's contract (`sentence_folder.save_sentence_model`): written whole, with
`pipeline_finetune.json`, once dev texts' vectors from the model in memory and from the folder loaded back with
`SparseEncoder(folder, local_files_only=True)` agree to a cosine of at least `MIN_COSINE` (two all-zero vectors
agree).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pipeline.common.errors import PipelineError
from pipeline.finetune.families.embedding.sentence_folder import FolderAgreement, save_sentence_model

SPLADE_POOLING = "max"
"""SpladePooling's strategy: max over tokens (SPLADE v2 and later; sum was the first SPLADE's)."""


def head_problem(source: str) -> str | None:
    """Why `source` cannot start SPLADE (weights its masked-LM model would have to create), or None."""
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a BERT export's next-sentence head is left behind on purpose
    try:
        _, loading = AutoModelForMaskedLM.from_pretrained(source, output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = sorted(loading["missing_keys"])
    if not missing:
        return None
    return (f"{source}: its masked-LM model lacks {len(missing)} weights ({', '.join(missing[:4])}"
            f"{', …' if len(missing) > 4 else ''}); SPLADE reads the trained masked-LM head's logits, so start from "
            "an export or checkpoint that kept its head, or give --from-scratch")


def build_sparse_model(source: str, *, max_seq_len: int, from_scratch: bool = False):
    """A `SparseEncoder` of `source`'s masked-LM model (its head checked, `head_problem`) and max `SpladePooling`;
    random weights of the same architecture `from_scratch`."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.sparse_encoder.modules import SpladePooling, Transformer
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    if not from_scratch and (problem := head_problem(source)):
        raise PipelineError(problem)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        transformer = Transformer(source, transformer_task="fill-mask", max_seq_length=max_seq_len)
    finally:
        hf_logging.set_verbosity(verbosity)
    if from_scratch:
        transformer.model = AutoModelForMaskedLM.from_config(transformer.model.config)
    return SparseEncoder(modules=[transformer, SpladePooling(SPLADE_POOLING)], device="cpu",
                         similarity_fn_name="dot")


def splade_loss(model, embedding):
    """In-batch negatives on dot products (`embedding.scale`, 1 for SPLADE), wrapped with the FLOPS regularisers
    on queries and documents (`embedding.query_regularizer_weight`, `document_regularizer_weight`)."""
    from sentence_transformers.sparse_encoder import losses

    return losses.SpladeLoss(model, losses.SparseMultipleNegativesRankingLoss(model, scale=embedding.scale),
                             query_regularizer_weight=embedding.query_regularizer_weight,
                             document_regularizer_weight=embedding.document_regularizer_weight)


def sparse_cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The cosine of each row of `a` with the same row of `b`; 1 where both rows are all zeros (a text with no
    active dimension in either), 0 where only one is."""
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    both_zero = ~a.any(axis=1) & ~b.any(axis=1)
    cosine = (a * b).sum(1) / np.maximum(norms, 1e-300)
    return np.where(both_zero, 1.0, cosine)


def sparse_folder_agreement(model, folder: Path, texts: list[str]) -> FolderAgreement:
    """The sparse model in memory against `folder` loaded offline by `SparseEncoder`, on `texts`."""
    from sentence_transformers import SparseEncoder

    from pipeline.hub.retrieval.sparse_scoring import sparse_encode

    ours = sparse_encode(model, texts).toarray().astype(np.float64)
    loaded = SparseEncoder(str(folder), local_files_only=True, device="cpu")
    theirs = sparse_encode(loaded, texts).toarray().astype(np.float64)
    cosine = sparse_cosine_rows(ours, theirs) if ours.shape == theirs.shape else np.array([0.0])
    return FolderAgreement(float(cosine.min()) if np.isfinite(cosine).all() else float("nan"), len(texts),
                           loader="SparseEncoder")


def save_sparse_model(folder: Path, model, provenance: dict, check_texts: list[str]) -> FolderAgreement:
    """`model` as a `SparseEncoder` folder with `pipeline_finetune.json`, written only once
    `sparse_folder_agreement` holds."""
    return save_sentence_model(folder, model, provenance, check_texts, agree=sparse_folder_agreement)
