"""Sparse (SPLADE) retrieval: a `SparseEncoder` turns each text into a vocabulary-wide vector of mostly zeros, and a
query's score for a document is the dot product of their vectors (the similarity SPLADE trains for).

The search and its figures are the dense evaluator's own (`embedding_evaluation.score_retrieval`, trec_eval's
nDCG@10, MRR@10, Recall@10 and @100) with the dot product as its scoring function; beside them, the active
dimensions per text (the mean number of nonzeros of the query vectors, and of the document vectors), which is
what an inverted index pays for each text. Vectors are kept as scipy CSR matrices, so a corpus never becomes a dense
texts × vocabulary array.

A folder is sparse when its `modules.json` holds sentence-transformers' `SpladePooling`; `load_sparse_encoder`
reads it with `SparseEncoder(folder, local_files_only=True)`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import sparse

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.splits import Split
from pipeline.hub.embedding_evaluation import Probes, score_retrieval

SPARSE_POOLING = "SpladePooling"
"""The module of a `modules.json` that makes a folder sparse."""
ACTIVE_DIMS = ("query_active_dims", "document_active_dims")
"""The figures reported beside the retrieval metrics: mean nonzeros per query vector, per document vector."""

SparseEncode = Callable[[Sequence[str]], sparse.csr_matrix]
"""Texts → (n, vocabulary) sparse vectors."""


def active_dims(vectors: sparse.csr_matrix) -> float:
    """The mean number of nonzero dimensions per row."""
    return float(vectors.getnnz(axis=1).mean()) if vectors.shape[0] else 0.0


def dot_scores(queries: sparse.csr_matrix, documents: sparse.csr_matrix) -> np.ndarray:
    """(queries × documents) dot products, dense: what the retrieval metrics rank by."""
    return np.asarray((queries @ documents.T).todense(), dtype=np.float64)


def score_sparse_retrieval(encode: SparseEncode, pairs: Split) -> dict[str, float]:
    """The dense evaluator's retrieval figures with dot-product scores, and the active dimensions per text."""
    dims: dict[str, float] = {}

    def scores(queries: sparse.csr_matrix, documents: sparse.csr_matrix) -> np.ndarray:
        dims.update(zip(ACTIVE_DIMS, (active_dims(queries), active_dims(documents)), strict=True))
        return dot_scores(queries, documents)

    return {**score_retrieval(encode, pairs, similarity=scores), **dims}


def score_sparse_probes(encode: SparseEncode, probes: Probes) -> dict[str, float]:
    """Every retrieval file's figures, flat (`retrieval/<name>/<metric>`, the active dimensions among them); a
    sparse model is scored on search alone, so other files are refused by name."""
    others = [f"--{kind.replace('_', '-')} {name}" for kind, name, _ in probes.items() if kind != "retrieval"]
    if others:
        raise PipelineError(f"a sparse (SPLADE) model is scored on --retrieval files alone, by dot-product search; "
                            f"not on {', '.join(others)}")
    return {f"retrieval/{name}/{metric}": value for name, split in probes.retrieval.items()
            for metric, value in score_sparse_retrieval(encode, split).items()}


def to_csr(vectors) -> sparse.csr_matrix:
    """A torch tensor of vectors (sparse COO, as `SparseEncoder.encode` gives them, or dense) as scipy CSR."""
    vectors = vectors.detach().cpu().float()
    if not vectors.is_sparse:
        return sparse.csr_matrix(vectors.numpy())
    vectors = vectors.coalesce()
    rows, columns = vectors.indices().numpy()
    return sparse.csr_matrix((vectors.values().numpy(), (rows, columns)), shape=tuple(vectors.shape))


def sparse_encode(model, texts: Sequence[str], batch_size: int = 32) -> sparse.csr_matrix:
    """`model.encode(texts)` (a `SparseEncoder`) as CSR; the model is left in the mode it was in."""
    was_training = model.training
    try:
        if not texts:
            return sparse.csr_matrix((0, model.get_embedding_dimension() or 0), dtype=np.float32)
        return to_csr(model.encode(list(texts), batch_size=batch_size, convert_to_sparse_tensor=True,
                                   show_progress_bar=False))
    finally:
        model.train(was_training)


def sparse_folder_of(model: str | Path) -> Path | None:
    """The `SparseEncoder` folder `model` names (itself, or a fine-tuning output's best seed), or None when it is
    no sparse folder."""
    from pipeline.common.run_layout import FinetuneLayout
    from pipeline.models.model_source import resolve_model_source

    path = Path(model)
    if path.is_dir() and FinetuneLayout(path).best_model.is_file():
        path = Path(resolve_model_source(path, what="--model").path)
    return path if is_sparse_folder(path) else None


def is_sparse_folder(folder: str | Path) -> bool:
    """Whether `folder` is a Sentence-Transformers folder whose modules include `SpladePooling`."""
    modules = Path(folder) / "modules.json"
    if not modules.is_file():
        return False
    try:
        kinds = [entry["type"].rsplit(".", 1)[-1] for entry in json.loads(modules.read_text())]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise PipelineError(f"{modules}: not a Sentence-Transformers module list ({err})") from None
    return SPARSE_POOLING in kinds


@dataclass
class SparseFolderEncoder:
    """A `SparseEncoder` folder loaded offline: `encode(texts)` → CSR vectors."""

    model: object
    batch_size: int = 32

    @classmethod
    def load(cls, folder: str | Path, *, batch_size: int = 32, max_seq_len: int | None = None) -> SparseFolderEncoder:
        from sentence_transformers import SparseEncoder

        model = SparseEncoder(str(folder), local_files_only=True, device="cpu")
        if max_seq_len:
            model.max_seq_length = max_seq_len
        return cls(model, batch_size)

    @property
    def tokenizer(self):
        return self.model.tokenizer

    @property
    def max_seq_len(self) -> int:
        return int(self.model.max_seq_length)

    def encode(self, texts: Sequence[str]) -> sparse.csr_matrix:
        return sparse_encode(self.model, texts, self.batch_size)
