"""`embed-corpus`: a contrastive stage on pairs mined from the user's own corpus. Its output is a
Sentence-Transformers folder that `embed-pairs` takes as `--model` (pretraining → corpus stage → supervised pairs),
its steps can be capped, `--from-scratch` gives random weights, and a corpus too small for one batch is refused
before any model loads."""

from __future__ import annotations

import json

import pytest
from helpers import make_documents
from model_folders import save_export

from pipeline.commands.finetune import main as finetune


def corpus_files(folder, n_train=24, n_dev=8):
    """(train, dev) corpora of several-sentence documents, every other one with a title."""
    pieces = make_documents(3 * (n_train + n_dev), seed=11, min_words=6, max_words=14)
    documents = [" ".join(pieces[3 * i:3 * i + 3]) for i in range(n_train + n_dev)]
    files = []
    for name, part in (("train", documents[:n_train]), ("dev", documents[n_train:])):
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"text": t, **({"title": t.split()[1]} if i % 2 else {})}) + "\n"
                                for i, t in enumerate(part)))
        files.append(path)
    return files


def stage_sets(out, train, dev, *extra):
    return ["--seeds", "1", "--set", f"data.train_file={train}", "--set", f"data.validation_file={dev}",
            "--set", f"train.output_dir={out}", "--set", "tracking.enabled=false", "--set", "data.max_seq_len=48",
            "--set", "train.batch_size=8", "--set", "embedding.cache_mini_batch=4", "--set", "embedding.max_steps=2",
            *extra]


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory, bpe_tokenizer_dir):
    return save_export(bpe_tokenizer_dir, tmp_path_factory.mktemp("export") / "modernbert", "modernbert")


def test_the_corpus_stage_feeds_the_supervised_pairs_stage(tmp_path, modernbert):
    from pipeline.data.tasks.embedding_records import read_pairs
    from pipeline.hub.embedding_evaluation import score_retrieval
    from pipeline.models.embedding_encoder import load_encoder

    train, dev = corpus_files(tmp_path)
    stage = tmp_path / "corpus-stage"
    finetune(["--config", "configs/tasks/embed-corpus.json", "--model", str(modernbert),
              *stage_sets(stage, train, dev, "--set", "train.epochs=3")])
    report = json.loads((stage / "metrics.json").read_text())
    assert report["task"] == "embed-corpus" and report["metric"] == "ndcg_at_10" and 0 <= report["ndcg_at_10"] <= 1
    history = json.loads((stage / "seed_1" / "history.json").read_text())
    assert len(history) == 1  # 2 steps of an epoch of 6: embedding.max_steps stops before train.epochs' 3
    folder = stage / "seed_1" / "model"
    info = json.loads((folder / "pipeline_finetune.json").read_text())
    assert info["loss"] == "CachedMultipleNegativesRankingLoss" and (folder / "modules.json").is_file()
    assert "3 epochs (at most 2 steps)" in (folder / "README.md").read_text()

    rows = [{"query": " ".join(d.split()[:4]), "positive": " ".join(d.split()[4:])}
            for d in make_documents(30, seed=12, min_words=9, max_words=20)]
    pairs = {}
    for name, part in (("train", rows[:20]), ("dev", rows[20:])):
        pairs[name] = tmp_path / f"pairs-{name}.jsonl"
        pairs[name].write_text("".join(json.dumps(r) + "\n" for r in part))
    supervised = tmp_path / "pairs-stage"
    finetune(["--config", "embed-pairs", "--model", str(stage),
              *stage_sets(supervised, pairs["train"], pairs["dev"])])
    after = json.loads((supervised / "seed_1" / "model" / "pipeline_finetune.json").read_text())
    assert after["source_model"] == str(folder) and after["pooling"] == "mean"
    # The pairs stage began from the corpus stage's weights: its zero-shot figure is the corpus folder's.
    corpus_encoder, _ = load_encoder(str(folder))
    zero_shot = score_retrieval(corpus_encoder.encode, read_pairs(pairs["dev"]))["ndcg_at_10"]
    assert json.loads((supervised / "metrics.json").read_text())["zero_shot_ndcg_at_10"] == pytest.approx(zero_shot,
                                                                                                        abs=1e-6)


def test_a_sentence_folder_that_pools_otherwise_is_refused_before_it_loads(tmp_path, modernbert, capsys):
    train, dev = corpus_files(tmp_path)
    stage = tmp_path / "corpus-stage"
    finetune(["--config", "embed-corpus", "--model", str(modernbert),
              *stage_sets(stage, train, dev, "--set", "embedding.max_steps=1")])
    with pytest.raises(SystemExit):
        finetune(["--config", "embed-corpus", "--model", str(stage / "seed_1" / "model"),
                  *stage_sets(tmp_path / "again", train, dev, "--set", "embedding.pooling=cls")])
    assert "pools 'mean', but embedding.pooling is 'cls'" in capsys.readouterr().err


def test_from_scratch_trains_random_weights_of_the_same_architecture(tmp_path, bpe_tokenizer_dir):
    import torch
    from safetensors.torch import load_file

    roberta = save_export(bpe_tokenizer_dir, tmp_path / "roberta", "roberta")
    train, dev = corpus_files(tmp_path)
    out = tmp_path / "scratch"
    finetune(["--config", "embed-corpus", "--model", str(roberta), "--from-scratch",
              *stage_sets(out, train, dev, "--set", "embedding.max_steps=1")])
    assert json.loads((out / "metrics.json").read_text())["from_scratch"] is True
    trained = load_file(out / "seed_1" / "model" / "model.safetensors")
    exported = load_file(roberta / "model.safetensors")
    name = "embeddings.word_embeddings.weight"
    assert trained[name].shape == exported[f"roberta.{name}"].shape
    assert not torch.allclose(trained[name], exported[f"roberta.{name}"], atol=1e-2)


def test_a_corpus_smaller_than_one_batch_is_refused_before_any_model_loads(tmp_path, capsys):
    train, dev = corpus_files(tmp_path, n_train=6)
    out = tmp_path / "small"
    with pytest.raises(SystemExit):
        finetune(["--config", "embed-corpus", "--model", str(tmp_path / "no-model-here"),
                  *stage_sets(out, train, dev)])
    err = capsys.readouterr().err
    assert f"{train}: 6 documents give pairs, fewer than one batch (train.batch_size 8)" in err
    assert "lower train.batch_size to at most 6" in err and "Traceback" not in err
