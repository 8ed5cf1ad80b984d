"""The evaluator: its figures are sentence-transformers' own on the same files, BM25 stands beside retrieval, a live
model is probed without a folder, and a pretraining run's revisions are scored by one command and drawn."""

from __future__ import annotations

import json

import pytest
from helpers import make_documents
from model_folders import save_export, save_pretraining_run

from pipeline.commands.embed_eval import main as embed_eval
from pipeline.hub.embedding_evaluation import probe_model, read_probes, score_probes


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A search file (with hard negatives), scored pairs, labelled pairs and clusters from synthetic documents."""
    folder = tmp_path_factory.mktemp("probes")
    docs = make_documents(60, seed=11, min_words=10, max_words=30)
    split = [(" ".join(d.split()[:4]), " ".join(d.split()[4:])) for d in docs]
    pairs = [{"query": q, "positive": p, **({"negative": split[i - 1][1]} if i % 3 == 0 else {})}
             for i, (q, p) in enumerate(split)]
    scored = [{"sentence1": q, "sentence2": p, "score": float(i % 5)} for i, (q, p) in enumerate(split[:30])]
    labelled = [{"sentence1": q, "sentence2": split[(i + i % 2) % 30][1], "label": 1 - i % 2}
                for i, (q, _) in enumerate(split[:30])]
    clusters = [{"text": d, "label": f"topic{i % 3}"} for i, d in enumerate(docs[:30])]
    return {"retrieval": write(folder / "search.jsonl", pairs), "sts": write(folder / "sts.jsonl", scored),
            "pair_classification": write(folder / "pc.jsonl", labelled),
            "clustering": write(folder / "clusters.jsonl", clusters)}


@pytest.fixture(scope="module")
def sentence_folder(tmp_path_factory, wordpiece_tokenizer_dir):
    from pipeline.finetune.families.embedding.sentence_folder import build_sentence_model

    root = tmp_path_factory.mktemp("st")
    export = save_export(wordpiece_tokenizer_dir, root / "bert", "bert")
    build_sentence_model(str(export), pooling="mean", max_seq_len=48).save(str(root / "st"))
    return root / "st"


def test_our_figures_equal_sentence_transformers_own_evaluators_and_the_record_is_mteb_shaped(
        tmp_path, files, sentence_folder):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import (
        BinaryClassificationEvaluator,
        EmbeddingSimilarityEvaluator,
        InformationRetrievalEvaluator,
    )

    out = tmp_path / "result.json"
    embed_eval(["--model", str(sentence_folder), "--retrieval", str(files["retrieval"]), "--sts", str(files["sts"]),
                "--pair-classification", str(files["pair_classification"]), "--json", str(out)])
    results = {r["task_name"]: r for r in json.loads(out.read_text())["results"]}
    ours = {name: r["scores"]["test"][0] for name, r in results.items()}

    probes = read_probes([files["retrieval"]], [files["sts"]], [files["pair_classification"]])
    model = SentenceTransformer(str(sentence_folder), local_files_only=True, device="cpu")
    search = probes.retrieval["search"]
    queries = {f"q{t[0]}": t[0] for t in search.texts}
    corpus = {f"d{x}": x for t in search.texts for x in t[1:]}
    relevant = {}
    for t in search.texts:
        relevant.setdefault(f"q{t[0]}", set()).add(f"d{t[1]}")
    theirs = InformationRetrievalEvaluator(queries, corpus, relevant, mrr_at_k=[10], ndcg_at_k=[10],
                                           accuracy_at_k=[1], precision_recall_at_k=[10, 100], map_at_k=[10],
                                           score_functions=None)(model)
    assert ours["search"]["ndcg_at_10"] == pytest.approx(theirs["cosine_ndcg@10"], abs=1e-4)
    assert ours["search"]["mrr_at_10"] == pytest.approx(theirs["cosine_mrr@10"], abs=1e-4)
    assert ours["search"]["recall_at_10"] == pytest.approx(theirs["cosine_recall@10"], abs=1e-4)
    assert ours["search"]["recall_at_100"] == pytest.approx(theirs["cosine_recall@100"], abs=1e-4)
    sts = probes.sts["sts"]
    spearman = EmbeddingSimilarityEvaluator([t[0] for t in sts.texts], [t[1] for t in sts.texts], sts.labels)(model)
    assert ours["sts"]["cosine_spearman"] == pytest.approx(spearman["spearman_cosine"], abs=1e-4)
    pc = probes.pair_classification["pc"]
    ap = BinaryClassificationEvaluator([t[0] for t in pc.texts], [t[1] for t in pc.texts], pc.labels)(model)
    assert ours["pc"]["cosine_ap"] == pytest.approx(ap["cosine_ap"], abs=1e-4)
    # MTEB's shape, BM25 beside the search: the file's digest as its revision, the main score named.
    assert results["search"]["scores"]["test"][0]["main_score"] == ours["search"]["ndcg_at_10"]
    assert "search (BM25)" in results and results["search"]["dataset_revision"]


def test_bm25_beside_retrieval_scores_word_overlap(tmp_path):
    """A query made of its positive's rarest words is found first by BM25; unrelated words are not."""
    from pipeline.hub.embedding_evaluation import bm25_probes

    docs = make_documents(30, seed=3, min_words=12, max_words=20)
    overlap = write(tmp_path / "overlap.jsonl", [{"query": f"doc{i} {d.split()[2]}", "positive": d}
                                                 for i, d in enumerate(docs)])
    figures = bm25_probes(read_probes([overlap]))
    assert figures["retrieval/overlap/bm25/ndcg_at_10"] == 1.0  # every document holds its own `docN` id word
    assert figures["retrieval/overlap/bm25/recall_at_100"] == 1.0


def test_pretraining_can_probe_a_live_masked_lm_without_writing_a_folder(tmp_path, files, bpe_tokenizer_dir):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from pipeline.models.embedding_encoder import load_encoder

    export = save_export(bpe_tokenizer_dir, tmp_path / "export", "modernbert")
    probes = read_probes([files["retrieval"]], [files["sts"]], clustering=[files["clustering"]])
    live = AutoModelForMaskedLM.from_pretrained(export).train()  # as the training loop holds it
    figures = probe_model(live, AutoTokenizer.from_pretrained(export), probes, max_seq_len=48)
    assert live.training  # left in the mode it was in
    encoder, _ = load_encoder(str(export), max_seq_len=48)
    assert figures == pytest.approx(score_probes(encoder.encode, probes), abs=1e-6)
    assert {"retrieval/search/ndcg_at_10", "sts/sts/spearman", "clustering/clusters/v_measure"} <= figures.keys()


def test_a_runs_kept_revisions_are_scored_by_one_command_drawn_and_logged_as_curves(
        tmp_path, files, bpe_tokenizer_dir, doc_packed_shards):
    from mlflow import MlflowClient

    run = save_pretraining_run(tmp_path / "run", doc_packed_shards, bpe_tokenizer_dir, steps=(2, 4),
                               evaluations={2: 6.0, 4: 5.5})
    out, uri = tmp_path / "probes", f"sqlite:///{tmp_path / 'mlflow.db'}"
    embed_eval(["--run", str(run), "--retrieval", str(files["retrieval"]), "--sts", str(files["sts"]),
                "--out", str(out), "--tracking-uri", uri])
    curve = json.loads((out / "revisions.json").read_text())
    assert [p["step"] for p in curve] == [2, 4] and [p["validation_loss"] for p in curve] == [6.0, 5.5]
    assert curve[0]["figures"]["retrieval/search/ndcg_at_10"] != curve[1]["figures"]["retrieval/search/ndcg_at_10"]
    assert (out / "embed-curve.png").stat().st_size > 1000
    client = MlflowClient(uri)
    run_id = client.search_runs([e.experiment_id for e in client.search_experiments()])[0].info.run_id
    history = client.get_metric_history(run_id, "embed/retrieval/search/ndcg_at_10")
    assert sorted(m.step for m in history) == [2, 4]
