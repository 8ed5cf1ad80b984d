"""`embed-sparse`: SPLADE through sentence-transformers' SparseEncoder, from the export's own masked-LM head. A kept
seed is a folder `SparseEncoder(folder)` loads offline and that reproduces the run's figures; the evaluator scores
it by dot-product search with the active dimensions per text beside the figures; `--from-scratch` starts from
random weights, head included; a folder without its masked-LM head is refused."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import make_documents
from model_folders import save_export, tiny_config

from pipeline.commands.embed_eval import main as embed_eval
from pipeline.commands.finetune import main as finetune
from pipeline.common.errors import PipelineError
from pipeline.data.tasks.embedding_records import read_pairs
from pipeline.finetune.families.embedding.sparse_folder import build_sparse_model
from pipeline.hub.retrieval.sparse_scoring import SparseFolderEncoder, score_sparse_retrieval


def write_pairs(folder, documents) -> tuple:
    """(train, dev): each document's first third searches for the rest of it."""
    files = []
    for name, part in (("train", documents[:24]), ("dev", documents[24:36])):
        rows = [{"query": " ".join(t.split()[:len(t.split()) // 3]),
                 "positive": " ".join(t.split()[len(t.split()) // 3:])} for t in part]
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        files.append(path)
    return tuple(files)


def sparse_run(out, model, train, dev, *extra):
    finetune(["--config", "embed-sparse", "--model", str(model), "--seeds", "1", "--set", f"data.train_file={train}",
              "--set", f"data.validation_file={dev}", "--set", f"train.output_dir={out}", "--set",
              "tracking.enabled=false", "--set", "train.epochs=1", "--set", "train.batch_size=8", "--set",
              "data.max_seq_len=48", *extra])
    return json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def exports(tmp_path_factory, bpe_tokenizer_dir):
    root = tmp_path_factory.mktemp("exports")
    return {arch: save_export(bpe_tokenizer_dir, root / arch, arch) for arch in ("modernbert", "roberta")}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return write_pairs(tmp_path_factory.mktemp("pairs"), make_documents(36, seed=5, min_words=9, max_words=24))


def head_weights(model) -> dict[str, torch.Tensor]:
    """The masked-LM head's own tensors (its decoder is tied to the word embeddings)."""
    head = model.get_output_embeddings()
    return {"decoder": head.weight, "bias": head.bias,
            **{f"transform.{k}": v for k, v in model.get_submodule(
                "lm_head" if hasattr(model, "lm_head") else "head").state_dict().items()}}


@pytest.mark.parametrize("arch", ["modernbert", "roberta"])
def test_splade_starts_from_the_exports_own_masked_lm_head_or_random_weights_from_scratch(exports, arch):
    from transformers import AutoModelForMaskedLM

    export = AutoModelForMaskedLM.from_pretrained(exports[arch])
    trained = build_sparse_model(str(exports[arch]), max_seq_len=48)[0].model
    scratch = build_sparse_model(str(exports[arch]), max_seq_len=48, from_scratch=True)[0].model
    assert type(trained) is type(scratch) is type(export)
    for name, weight in head_weights(export).items():
        assert torch.equal(head_weights(trained)[name], weight), name  # loaded, not created
        assert head_weights(scratch)[name].shape == weight.shape
    dense = "transform.dense.weight"
    assert not torch.equal(head_weights(scratch)[dense], head_weights(export)[dense])


def test_a_folder_without_its_masked_lm_head_is_refused(tmp_path, bpe_tokenizer_dir):
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    AutoModel.from_config(tiny_config(tokenizer, "roberta")).save_pretrained(tmp_path / "headless")
    tokenizer.save_pretrained(tmp_path / "headless")
    with pytest.raises(PipelineError, match=r"masked-LM model lacks \d+ weights \(lm_head\..*--from-scratch"):
        build_sparse_model(str(tmp_path / "headless"), max_seq_len=48)
    build_sparse_model(str(tmp_path / "headless"), max_seq_len=48, from_scratch=True)  # its architecture, random


def test_a_kept_seed_is_a_sparse_encoder_folder_that_reproduces_its_figures(tmp_path, exports, pairs, capsys):
    from sentence_transformers import SparseEncoder

    train, dev = pairs
    report = sparse_run(tmp_path / "run", exports["modernbert"], train, dev)
    assert report["metric"] == "ndcg_at_10" and 0 <= report["ndcg_at_10"] <= 1
    assert {"zero_shot_ndcg_at_10", "bm25_ndcg_at_10", "query_active_dims", "document_active_dims"} <= report.keys()
    assert 0 < report["query_active_dims"] <= len(SparseEncoder(str(exports["modernbert"])).tokenizer)

    best = tmp_path / "run" / "seed_1" / "model"
    info = json.loads((best / "pipeline_finetune.json").read_text())
    assert info["kind"] == "sparse" and info["loss"] == "SpladeLoss(SparseMultipleNegativesRankingLoss)"
    assert info["equivalence"]["loader"] == "SparseEncoder" and info["equivalence"]["min_cosine"] >= 0.9999
    assert "SparseEncoder(" in (best / "README.md").read_text()
    modules = [m["type"].rsplit(".", 1)[-1] for m in json.loads((best / "modules.json").read_text())]
    assert modules == ["Transformer", "SpladePooling"]
    loaded = SparseFolderEncoder.load(best)  # SparseEncoder(folder, local_files_only=True)
    assert loaded.model.similarity_fn_name == "dot"
    figures = score_sparse_retrieval(loaded.encode, read_pairs(dev))
    seed = json.loads((best.parent / "metrics.json").read_text())
    for key in ("ndcg_at_10", "query_active_dims", "document_active_dims"):
        assert figures[key] == pytest.approx(seed[key], abs=1e-6), key

    # The evaluator finds the sparse folder behind the run's best_model.json and reports the same figures.
    capsys.readouterr()
    embed_eval(["--model", str(tmp_path / "run"), "--retrieval", str(dev), "--json", str(tmp_path / "eval.json")])
    assert "query_active_dims" in capsys.readouterr().out
    scores = json.loads((tmp_path / "eval.json").read_text())["results"][0]["scores"]["test"][0]
    assert scores["main_score"] == pytest.approx(seed["ndcg_at_10"], abs=1e-6)
    assert scores["document_active_dims"] == pytest.approx(seed["document_active_dims"])
    with pytest.raises(SystemExit):  # a sparse folder has no ONNX twin to run
        embed_eval(["--model", str(best), "--retrieval", str(dev), "--backend", "onnx"])
    assert "sparse (SPLADE) folder runs on the torch backend" in capsys.readouterr().err


def test_from_scratch_trains_and_saves_a_sparse_folder(tmp_path, exports, pairs):
    train, dev = pairs
    report = sparse_run(tmp_path / "scratch", exports["roberta"], train, dev, "--from-scratch")
    assert report["from_scratch"] is True and report["document_active_dims"] > 0
    info = json.loads((tmp_path / "scratch" / "seed_1" / "model" / "pipeline_finetune.json").read_text())
    assert info["from_scratch"] is True and info["equivalence"]["within_tolerance"]


def test_the_regulariser_weights_are_checked_where_they_are_declared():
    from pipeline.common.config.tree import SectionProblems
    from pipeline.finetune.families.embedding.config import EmbeddingConfig

    with pytest.raises(SectionProblems, match="embedding.query_regularizer_weight: must be ≥ 0, got -1"):
        EmbeddingConfig(query_regularizer_weight=-1, document_regularizer_weight=0)
