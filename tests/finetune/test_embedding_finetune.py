"""Embedding fine-tuning through the protocol: each kept seed is a Sentence-Transformers folder that loads offline and
embeds as the stage's own encoder does; the run records the zero-shot and BM25 figures beside the trained one; the
STS and SimCSE configs train too."""

from __future__ import annotations

import json

import pytest
from helpers import make_documents
from model_folders import save_export

from pipeline.commands.finetune import main as finetune
from pipeline.hub.embedding_evaluation import cosine_rows
from pipeline.models.embedding_encoder import load_encoder


def pairs_files(folder, documents):
    """(train, dev): each document's first third searches for the rest of it."""
    files = []
    for name, part in (("train", documents[:60]), ("dev", documents[60:80])):
        rows = []
        for text in part:
            words = text.split()
            rows.append({"query": " ".join(words[:len(words) // 3]), "positive": " ".join(words[len(words) // 3:])})
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files.append(path)
    return files


@pytest.fixture(scope="module")
def export(tmp_path_factory, bpe_tokenizer_dir):
    return save_export(bpe_tokenizer_dir, tmp_path_factory.mktemp("export") / "roberta", "roberta")


def common_sets(out, train, dev):
    return ["--set", f"data.train_file={train}", "--set", f"data.validation_file={dev}", "--set",
            f"train.output_dir={out}", "--set", "tracking.enabled=false", "--set", "train.epochs=1", "--set",
            "train.batch_size=8", "--set", "data.max_seq_len=48"]


def test_a_kept_seed_is_a_sentence_transformers_folder_that_embeds_as_the_stage_does(tmp_path, export):
    from sentence_transformers import SentenceTransformer

    train, dev = pairs_files(tmp_path, make_documents(80, seed=5, min_words=9, max_words=30))
    out, uri = tmp_path / "run", f"sqlite:///{tmp_path / 'mlflow.db'}"
    finetune(["--config", "embed-pairs", "--model", str(export), "--seeds", "1", "--sweep",
              "train.learning_rate=1e-4", *common_sets(out, train, dev), "--set", "tracking.enabled=true",
              "--set", f"tracking.uri={uri}"])
    report = json.loads((out / "metrics.json").read_text())
    assert report["metric"] == "ndcg_at_10" and 0 <= report["ndcg_at_10"] <= 1
    assert {"zero_shot_ndcg_at_10", "bm25_ndcg_at_10", "mrr_at_10", "recall_at_100", "selection_score"} <= report.keys()
    best = out / json.loads((out / "best_model.json").read_text())["path"]
    info = json.loads((best / "pipeline_finetune.json").read_text())
    assert info["pooling"] == "mean" and info["equivalence"]["min_cosine"] >= 0.9999
    assert "SentenceTransformer(" in (best / "README.md").read_text()
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    seed_run = next(r for r in runs if r.info.run_name == "embed-pairs-pretrained-seed1")
    assert {"eval/ndcg_at_10", "select/ndcg_at_10", "best/zero_shot_ndcg_at_10"} <= seed_run.data.metrics.keys()

    texts = [json.loads(line)["positive"] for line in dev.read_text().splitlines()]
    loaded = SentenceTransformer(str(best), local_files_only=True, device="cpu")
    theirs = loaded.encode(texts, convert_to_numpy=True)
    ours, _ = load_encoder(str(out))  # the fine-tuning output: its best seed's folder, its pooling and length
    assert cosine_rows(ours.encode(texts), theirs).min() >= 0.9999
    # The stage's evaluator reads the same folder to the same dev figure the run reported for that seed.
    from pipeline.data.tasks.embedding_records import read_pairs
    from pipeline.hub.embedding_evaluation import score_retrieval

    seed = json.loads((best.parent / "metrics.json").read_text())
    assert -1 <= seed["zero_shot_mean_cosine"] <= 1 and seed["zero_shot_effective_rank"] >= 1  # geometry beside it
    assert score_retrieval(ours.encode, read_pairs(dev))["ndcg_at_10"] == pytest.approx(seed["ndcg_at_10"], abs=1e-6)
    # ... and the same model fused with BM25, the weight cross-fitted on dev's queries, as the evaluator fuses it.
    from pipeline.hub.retrieval.figures import hybrid_figures

    fused = hybrid_figures(read_pairs(dev), ours.encode)
    assert fused["hybrid_ndcg_at_10"] == pytest.approx(seed["hybrid_ndcg_at_10"], abs=1e-6)
    assert 0 <= seed["hybrid_weight"] <= 1


@pytest.mark.parametrize("task", ["embed-sts", "embed-simcse"])
def test_the_sts_and_simcse_configs_train_and_report_their_own_figure(tmp_path, export, task):
    documents = make_documents(60, seed=7, min_words=8, max_words=20)
    for name, part in (("train", documents[:45]), ("dev", documents[45:])):
        rows = ([{"sentence1": t, "sentence2": " ".join(t.split()[::-1]), "score": float(i % 6)}
                 for i, t in enumerate(part)] if task == "embed-sts" else [{"text": t} for t in part])
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / task
    finetune(["--config", task, "--model", str(export), "--seeds", "1",
              *common_sets(out, tmp_path / "train.jsonl", tmp_path / "dev.jsonl")])
    report = json.loads((out / "metrics.json").read_text())
    assert report["metric"] == ("spearman" if task == "embed-sts" else "ndcg_at_10")
    assert f"zero_shot_{report['metric']}" in report
    assert (out / "seed_1" / "model" / "modules.json").is_file()
    pooling = json.loads((out / "seed_1" / "model" / "1_Pooling" / "config.json").read_text())["pooling_mode"]
    assert pooling == ("cls" if task == "embed-simcse" else "mean")  # as each shipped config says


def test_hard_negatives_and_the_cached_in_batch_loss_train_together(tmp_path, export):
    """Pairs with and without a hard negative are batched apart; `embedding.cache_mini_batch` selects GradCache."""
    documents = make_documents(50, seed=9, min_words=9, max_words=24)
    rows = [{"query": " ".join(d.split()[:3]), "positive": " ".join(d.split()[3:]),
             **({"negative": documents[i - 1]} if i % 2 else {})} for i, d in enumerate(documents)]
    train, dev = (write_rows(tmp_path / f"{name}.jsonl", part) for name, part in (("train", rows[:40]),
                                                                                  ("dev", rows[40:])))
    out = tmp_path / "cached"
    finetune(["--config", "embed-pairs", "--model", str(export), "--seeds", "1", *common_sets(out, train, dev),
              "--set", "embedding.cache_mini_batch=4"])
    info = json.loads((out / "seed_1" / "model" / "pipeline_finetune.json").read_text())
    assert info["loss"] == "CachedMultipleNegativesRankingLoss"
    assert 0 <= json.loads((out / "metrics.json").read_text())["ndcg_at_10"] <= 1


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
