"""Sparse retrieval is the dense evaluator's search with dot products for scores: the same trec_eval figures, from
sparse vectors that never become a dense texts × vocabulary array, with the active dimensions per text beside
them. Bag-of-words counts stand in for SPLADE vectors here (any CSR encoder will do)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_documents
from scipy import sparse

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.splits import Split
from pipeline.hub.embedding_evaluation import Probes, RetrievalTask, score_retrieval
from pipeline.hub.retrieval.sparse_scoring import (
    active_dims,
    is_sparse_folder,
    score_sparse_probes,
    score_sparse_retrieval,
)


@pytest.fixture(scope="module")
def search():
    """Pairs whose query is the start of its document, and a bag-of-words encoder fitted on every text."""
    from sklearn.feature_extraction.text import CountVectorizer

    documents = make_documents(30, seed=3, min_words=8, max_words=20)
    pairs = Split("pairs", [(" ".join(d.split()[:3]), " ".join(d.split()[3:])) for d in documents])
    words = CountVectorizer().fit([t for texts in pairs.texts for t in texts])
    return pairs, lambda texts: words.transform(texts).astype(np.float32).tocsr()


def test_the_figures_are_the_dense_scorers_on_dot_products_with_active_dimensions_beside(search):
    pairs, encode = search
    figures = score_sparse_retrieval(encode, pairs)
    task = RetrievalTask.of(pairs)
    queries, documents = encode(task.queries), encode(task.corpus)
    expected = task.metrics((queries @ documents.T).toarray())
    assert {k: figures[k] for k in expected} == pytest.approx(expected)
    assert expected == pytest.approx(score_retrieval(lambda t: encode(t).toarray(), pairs,
                                                     similarity=lambda q, d: q @ d.T))
    assert figures["query_active_dims"] == pytest.approx(np.mean([len(set(q.lower().split())) for q in task.queries]),
                                                         rel=0.2)
    assert figures["document_active_dims"] == active_dims(documents) > figures["query_active_dims"]
    assert active_dims(sparse.csr_matrix((3, 10))) == 0.0


def test_a_sparse_model_is_scored_on_search_alone(search):
    pairs, encode = search
    figures = score_sparse_probes(encode, Probes(retrieval={"docs": pairs}))
    assert {"retrieval/docs/ndcg_at_10", "retrieval/docs/query_active_dims"} <= figures.keys()
    with pytest.raises(PipelineError, match="--retrieval files alone.*--sts similar"):
        score_sparse_probes(encode, Probes(retrieval={"docs": pairs}, sts={"similar": pairs}))


def test_a_folder_is_sparse_when_its_modules_pool_with_splade(tmp_path):
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.base.modules.transformer.Transformer"}]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert not is_sparse_folder(tmp_path) and not is_sparse_folder(tmp_path / "missing")
    modules.append({"idx": 1, "name": "1", "path": "1_SpladePooling",
                    "type": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"})
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    assert is_sparse_folder(tmp_path)

