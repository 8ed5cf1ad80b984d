"""Search beside the cosine figures, on hand-made embeddings: the corpus's geometry, the model's scores fused with
BM25's (a weight chosen on held-out queries, and reciprocal rank fusion) beating both where each gets different
queries right, and the `SearchIndex` API over the same fusion."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.embedding_records import read_pairs
from pipeline.hub.embedding_evaluation import read_probes
from pipeline.hub.retrieval.figures import RememberingEncode, RetrievalExtras
from pipeline.hub.retrieval.fusion import choose_weight, rrf_fusion, weighted_fusion, z_normalised
from pipeline.hub.retrieval.geometry import effective_rank, embedding_geometry, hubness, mean_cosine
from pipeline.hub.retrieval.search_index import SearchIndex


def test_parallel_vectors_have_mean_cosine_one_and_effective_rank_one():
    direction = np.array([0.3, -1.0, 2.0, 0.5])
    vectors = np.outer([1.0, 2.0, 3.5, 0.5, 7.0], direction)
    assert mean_cosine(vectors) == pytest.approx(1.0)
    assert effective_rank(vectors) == pytest.approx(1.0, abs=1e-6)


def test_vectors_spread_evenly_over_n_axes_have_effective_rank_n_and_identical_ones_zero():
    axes = np.eye(5)
    assert effective_rank(np.vstack([axes, -axes])) == pytest.approx(5.0)
    assert mean_cosine(axes) == pytest.approx(0.0)
    assert effective_rank(axes) == pytest.approx(4.0)  # centring takes one direction of n orthogonal vectors
    assert effective_rank(np.ones((4, 3))) == 0.0


def test_hubness_is_the_largest_share_of_queries_with_one_top_document():
    assert hubness(np.eye(4)) == 0.25  # each query finds its own document
    assert hubness(np.tile([0.1, 0.9, 0.2], (4, 1))) == 1.0  # one hub answers every query
    assert set(embedding_geometry(np.eye(3))) == {"mean_cosine", "effective_rank"}


def test_z_normalised_rows_and_a_constant_row_gives_zeros():
    z = z_normalised(np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]))
    assert z[0] == pytest.approx([-1.2247449, 0.0, 1.2247449]) and not z[1].any()
    assert weighted_fusion(np.array([[1.0, 0.0]]), np.array([[0.0, 5.0]]), 1.0)[0].argmax() == 0
    with pytest.raises(ValueError, match="weight 1.5"):
        weighted_fusion(np.zeros((1, 2)), np.zeros((1, 2)), 1.5)


def test_rrf_adds_reciprocal_ranks_and_bm25_ranks_only_what_it_matches():
    fused = rrf_fusion(np.array([[0.9, 0.5, 0.1]]), np.array([[0.0, 3.0, 0.0]]))
    assert fused[0] == pytest.approx([1 / 61, 1 / 62 + 1 / 61, 1 / 63])


def test_a_tie_between_weights_goes_to_the_nearest_even_mix():
    assert choose_weight(lambda w: 1.0 if 0.2 <= w <= 0.9 else 0.5) == 0.5
    assert choose_weight(lambda w: w) == 1.0


WORDS = ["zebra", "violin", "quartz", "meadow"]
"""The lexical queries' words: each in its own document alone."""


@pytest.fixture
def toy(tmp_path):
    """8 documents (one-hot vectors). Queries 0-3 share a rare word with their document, but the model ranks it
    second (behind the next document); queries 4-7 share no word with any document, and the model ranks theirs
    first. So BM25 gets the first four right, the model the last four, and either fusion all eight."""
    docs = [f"{WORDS[i]} notes number {i}" if i < 4 else f"plain record {i}" for i in range(8)]
    queries = [f"{WORDS[i]} please" for i in range(4)] + [f"unseen wording {i}" for i in range(4, 8)]
    vectors = {d: np.eye(8)[i] for i, d in enumerate(docs)}
    for i, q in enumerate(queries):
        vectors[q] = np.eye(8)[i] + (1.1 * np.eye(8)[(i + 1) % 4] if i < 4 else 0)
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps({"query": q, "positive": d}) + "\n" for q, d in zip(queries, docs, strict=True)))
    return path, docs, lambda texts: np.stack([vectors[t] for t in texts]) if texts else np.zeros((0, 8))


def test_the_fusion_beats_both_the_model_and_bm25_with_a_weight_chosen_on_held_out_queries(toy):
    path, _, encode = toy
    probes = read_probes([path])
    extras = RetrievalExtras(probes, hybrid=True)
    figures = extras.figures(RememberingEncode(encode))
    task = extras.searched["toy"].task
    model = task.metrics(np.stack([encode([q])[0] @ encode(task.corpus).T for q in task.queries]))
    bm25 = task.metrics(extras.searched["toy"].bm25)
    assert model["ndcg_at_10"] < 1 and bm25["ndcg_at_10"] < 1
    assert figures["retrieval/toy/hybrid/ndcg_at_10"] == 1.0 and figures["retrieval/toy/hybrid/mrr_at_10"] == 1.0
    assert figures["retrieval/toy/hybrid_rrf/ndcg_at_10"] == 1.0
    assert figures["retrieval/toy/hybrid/weight"] == 0.5  # every weight from 0.1 to 0.9 is perfect: the even mix
    assert "each chosen on the other half" in extras.notes[0]
    assert figures["retrieval/toy/geometry/mean_cosine"] == pytest.approx(0.0)
    assert figures["retrieval/toy/geometry/effective_rank"] == pytest.approx(7.0)
    assert figures["retrieval/toy/geometry/hubness"] == 0.125  # every query finds a different document first


def test_a_separate_selection_file_chooses_the_weight_and_may_share_no_query(toy, tmp_path):
    path, docs, encode = toy
    probes = read_probes([path])
    with pytest.raises(PipelineError, match="8 of its queries are also in"):
        RetrievalExtras(probes, hybrid=True, select=read_pairs(path))
    other = tmp_path / "select.jsonl"  # the same kinds of query, in other words
    queries = [f"{w} thanks" for w in WORDS] + [f"fresh phrasing {i}" for i in range(4, 8)]
    other.write_text("".join(json.dumps({"query": q, "positive": d}) + "\n"
                             for q, d in zip(queries, docs, strict=True)))
    vectors = {q: encode([q.replace("thanks", "please").replace("fresh phrasing", "unseen wording")])[0]
               for q in queries}
    extras = RetrievalExtras(probes, hybrid=True, select=read_pairs(other))
    figures = extras.figures(RememberingEncode(lambda texts: np.stack([vectors[t] if t in vectors
                                                                        else encode([t])[0] for t in texts])))
    assert figures["retrieval/toy/hybrid/weight"] == 0.5 and figures["retrieval/toy/hybrid/ndcg_at_10"] == 1.0
    assert extras.notes == [f"hybrid: weight 0.5 (the model's share) chosen on {other} (8 queries)"]


def test_hybrid_needs_a_retrieval_file_and_selection_needs_hybrid(toy):
    path, _, _ = toy
    with pytest.raises(PipelineError, match="give --retrieval"):
        RetrievalExtras(read_probes(sts=[]), hybrid=True)
    with pytest.raises(PipelineError, match="give --hybrid too"):
        RetrievalExtras(read_probes([path]), select=read_pairs(path))


def test_a_search_index_returns_documents_and_scores_best_first_by_each_fusion(toy):
    _, docs, encode = toy
    dense = SearchIndex(docs, encode)
    assert [d for d, _ in dense.search("zebra please", k=2)] == [1, 0]  # the model's mistake
    assert SearchIndex(docs, fusion="bm25").search("zebra please", k=1)[0][0] == 0
    for fusion in ("hybrid", "rrf"):
        index = SearchIndex(docs, encode, fusion=fusion, weight=0.5)
        assert [hits[0][0] for hits in index.search_many(["zebra please", "unseen wording 5"], k=3)] == [0, 5]
    with pytest.raises(ValueError, match="fusion 'sparse'.*weight 2"):
        SearchIndex(docs, encode, fusion="sparse", weight=2)


def test_the_kit_and_the_hub_encoder_give_the_same_search_index(roberta_export):
    from pipeline.hub import Encoder
    from pipeline.kit import SearchIndex as KitIndex

    docs = ["the cat sat on the mat", "stocks fell sharply today", "a recipe for bread"]
    index = Encoder.from_pretrained(roberta_export).search_index(docs, fusion="hybrid", weight=0.3)
    assert isinstance(index, KitIndex) and index.vectors.shape[0] == 3
    hits = index.search("bread recipe", k=3)
    assert hits[0][0] == 2 and sorted(d for d, _ in hits) == [0, 1, 2]
