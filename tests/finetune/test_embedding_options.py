"""The embedding section's training options, each trained for a few steps and shown to take effect: mined hard
negatives (never the positive nor a copy of it), Matryoshka widths (the loss, and the figure at each width), query and
document prompts (in training, scoring, the saved folder and the evaluator); and a checkpoint that lacks an encoder
weight is refused by name, while the pipeline's own exports load quietly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_documents, write_records
from model_folders import save_export

from pipeline.commands.finetune import main as finetune
from pipeline.common.errors import PipelineError
from pipeline.data.tasks.embedding_records import read_pairs
from pipeline.data.tasks.splits import Split
from pipeline.finetune.families.embedding.hard_negatives import bm25_ranked, mine_negatives, same_text
from pipeline.finetune.families.embedding.options import HardNegatives, Prompts
from pipeline.hub.embedding_evaluation import score_retrieval


@pytest.fixture(scope="module")
def export(tmp_path_factory, bpe_tokenizer_dir):
    return save_export(bpe_tokenizer_dir, tmp_path_factory.mktemp("export") / "roberta", "roberta")



@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """(train, dev): each document's first words search for the rest of it."""
    folder = tmp_path_factory.mktemp("pairs")
    documents = make_documents(60, seed=5, min_words=9, max_words=24)
    rows = [{"query": " ".join(d.split()[1:4]), "positive": " ".join(d.split()[4:])} for d in documents]
    return write_records(folder / "train.jsonl", rows[:44]), write_records(folder / "dev.jsonl", rows[44:])


def run(out, export, train, dev, *sets):
    finetune(["--config", "embed-pairs", "--model", str(export), "--seeds", "1", "--set", f"data.train_file={train}",
              "--set", f"data.validation_file={dev}", "--set", f"train.output_dir={out}", "--set",
              "tracking.enabled=false", "--set", "train.epochs=1", "--set", "train.batch_size=8", "--set",
              "data.max_seq_len=48", *[x for s in sets for x in ("--set", s)]])
    return out / "seed_1" / "model"


def tricky_split() -> Split:
    """Pairs whose best lexical matches are a copy of the positive (other case and spacing), a second positive of the
    same query, and the query itself; one pair brings its own negative."""
    return Split("train.jsonl", [
        ("red apple pie", "a pie of red apples, baked slowly"),
        ("baked apple pie", "A  pie of RED apples, baked slowly"),           # a copy of the first positive
        ("red apple pie", "the red apple pie recipe of our grandmother"),    # the first query's second positive
        ("river boats", "boats on the river at dawn", "trains in the station"),
        ("apple orchards", "orchards full of apple trees in autumn"),
        ("pie crust", "a crust for any pie, red or green"),
        ("river fish", "fish swimming up the cold river"),
    ], None, [str(i) for i in range(7)])


@pytest.mark.parametrize("miner", ["bm25", "model"])
def test_mined_negatives_come_from_the_training_pairs_and_are_never_a_positive_or_a_copy_of_one(export, miner):
    from pipeline.finetune.families.embedding.sentence_folder import build_sentence_model

    split = tricky_split()
    if miner == "bm25":  # the copy of the first positive is the first query's best lexical match
        corpus = list(dict.fromkeys(t for texts in split.texts for t in texts[1:]))
        ranked = bm25_ranked(["red apple pie"], corpus, {"red apple pie": {split.texts[0][1], split.texts[2][1]}}, 5,
                             None)
        assert ranked["red apple pie"][0] == split.texts[1][1]
    model = build_sentence_model(str(export), pooling="mean", max_seq_len=32) if miner == "model" else None
    mined = mine_negatives(split, HardNegatives(miner=miner, count=2), model=model)
    positives = {}
    for texts in split.texts:
        positives.setdefault(texts[0], set()).add(same_text(texts[1]))
    assert mined.split.texts[3] == split.texts[3] and mined.own == 1  # its own negative is kept, not mined
    candidates = {t for texts in split.texts for t in texts[1:]}
    for before, after in zip(split.texts, mined.split.texts, strict=True):
        if len(before) == 2 and len(after) > 2:
            query, _, *negatives = after
            assert len(negatives) == 2 and set(negatives) <= candidates  # the training split's own texts
            assert not {same_text(n) for n in negatives} & (positives[query] | {same_text(query)})
    assert mined.mined + mined.short == 6 and mined.mined >= 4


@pytest.mark.parametrize("miner", ["bm25", "model"])
def test_embed_pairs_trains_on_mined_negatives_and_records_them(tmp_path, export, pairs, miner):
    folder = run(tmp_path / miner, export, *pairs, f"embedding.hard_negatives.miner={miner}")
    record = json.loads((folder / "pipeline_finetune.json").read_text())["hard_negatives"]
    assert record["miner"] == miner and record["mined"] >= 40 and record["own_negative"] == 0
    assert 0 <= json.loads((tmp_path / miner / "metrics.json").read_text())["ndcg_at_10"] <= 1


def test_matryoshka_widths_wrap_the_loss_and_each_width_gets_its_figure(tmp_path, export, pairs):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss

    from pipeline.finetune.families.embedding.config import EmbeddingConfig
    from pipeline.finetune.families.embedding.family import EmbeddingFamily, load_embedding_task
    from pipeline.finetune.families.embedding.sentence_folder import build_sentence_model

    folder = run(tmp_path / "run", export, *pairs, "embedding.matryoshka_dims=[32,16]")
    report = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert {"ndcg_at_10@32", "ndcg_at_10@16"} <= report.keys()
    assert json.loads((folder / "pipeline_finetune.json").read_text())["loss"] == \
        "MatryoshkaLoss(MultipleNegativesRankingLoss)"
    # The figure at 16 is the saved model's search with each embedding cut to its first 16 components.
    model = SentenceTransformer(str(folder), local_files_only=True, device="cpu")
    cut = score_retrieval(lambda texts: model.encode(list(texts))[:, :16], read_pairs(pairs[1]))["ndcg_at_10"]
    assert cut == pytest.approx(report["ndcg_at_10@16"], abs=1e-5)
    # The loss trains at the full width and at each configured one.
    from pipeline.finetune.config import FinetuneConfig, FinetuneDataConfig

    config = FinetuneConfig(task="embed-pairs", data=FinetuneDataConfig(train_file=str(pairs[0]),
                                                                        validation_file=str(pairs[1])),
                            embedding=EmbeddingConfig(matryoshka_dims=[32, 16]))
    loss = EmbeddingFamily(load_embedding_task(config)).loss(
        build_sentence_model(str(export), pooling="mean", max_seq_len=32), config.embedding)
    assert isinstance(loss, MatryoshkaLoss) and list(loss.matryoshka_dims) == [64, 32, 16]


def test_a_matryoshka_width_beyond_the_model_is_refused_before_training(tmp_path, export, pairs, capsys):
    with pytest.raises(SystemExit):
        run(tmp_path / "wide", export, *pairs, "embedding.matryoshka_dims=[128,16]")
    assert "embedding.matryoshka_dims: [128] exceed the width" in capsys.readouterr().err
    assert not (tmp_path / "wide" / "seed_1" / "metrics.json").exists()


def test_prompts_are_trained_with_saved_in_the_folder_and_applied_by_the_evaluator(tmp_path, export, pairs,
                                                                                     monkeypatch, capsys):
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    from pipeline.commands.embed_eval import main as embed_eval

    seen = {}
    trainer = sentence_transformers.SentenceTransformerTrainer

    class Spy(trainer):
        def __init__(self, *args, **kwargs):
            seen["prompts"] = kwargs["args"].prompts
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(sentence_transformers, "SentenceTransformerTrainer", Spy)
    folder = run(tmp_path / "run", export, *pairs, 'embedding.prompts={"query": "query: ", "document": "passage: "}',
                 "embedding.hard_negatives.miner=bm25")
    assert seen["prompts"] == {"anchor": "query: ", "positive": "passage: ", "negative": "passage: "}
    saved = json.loads((folder / "config_sentence_transformers.json").read_text())
    assert saved["prompts"] == {"query": "query: ", "document": "passage: "}

    model = SentenceTransformer(str(folder), local_files_only=True, device="cpu")
    dev = read_pairs(pairs[1])
    query = dev.texts[0][0]
    assert not np.allclose(model.encode([query], prompt_name="query"), model.encode([query]))
    with_prompts = score_retrieval(lambda t: model.encode_query(list(t)), dev,
                                   lambda t: model.encode_document(list(t)))["ndcg_at_10"]
    seed = json.loads((folder.parent / "metrics.json").read_text())
    assert seed["ndcg_at_10"] == pytest.approx(with_prompts, abs=1e-5)  # the run scored dev with its prompts

    out = tmp_path / "eval.json"
    capsys.readouterr()
    embed_eval(["--model", str(folder), "--retrieval", str(pairs[1]), "--json", str(out)])
    assert "prompts applied" in capsys.readouterr().out
    record = json.loads(out.read_text())
    assert (record["prompts"]["query"], record["prompts"]["document"]) == ("query: ", "passage: ")
    figure = next(r for r in record["results"] if r["scorer"] == "model")
    assert figure["scores"]["test"][0]["ndcg_at_10"] == pytest.approx(with_prompts, abs=1e-5)


def test_options_a_task_cannot_take_are_config_errors(tmp_path, export, pairs, capsys):
    with pytest.raises(SystemExit):
        finetune(["--config", "embed-sts", "--model", str(export), "--set", f"data.train_file={pairs[0]}",
                  "--set", f"data.validation_file={pairs[1]}", "--set", "embedding.prompts.query=q: ", "--set",
                  "embedding.hard_negatives.miner=bm25", "--set", "embedding.hard_negatives.count=0"])
    err = capsys.readouterr().err
    assert "embedding.hard_negatives: mines negatives for embed-pairs only" in err
    assert "embedding.prompts: STS pairs are symmetric" in err
    assert "embedding.hard_negatives.count: must be in [1, 64], got 0" in err
    assert Prompts(query="q: ").columns(["anchor", "positive", "negative_1"]) == {"anchor": "q: "}


def drop_weight(folder, key_part: str) -> str:
    """Delete the first checkpoint weight whose name holds `key_part`; its name."""
    from safetensors.torch import load_file, save_file

    path = folder / "model.safetensors"
    state = load_file(path)
    key = next(k for k in state if key_part in k)
    del state[key]
    save_file(state, path, metadata={"format": "pt"})
    return key


def test_a_checkpoint_missing_an_encoder_weight_is_refused_naming_it(tmp_path, bpe_tokenizer_dir):
    from pipeline.finetune.families.embedding.sentence_folder import build_sentence_model
    from pipeline.models.embedding_encoder import load_encoder

    folder = save_export(bpe_tokenizer_dir, tmp_path / "broken", "roberta")
    key = drop_weight(folder, "layer.0.attention.self.query.weight")
    bare = key.removeprefix("roberta.")
    with pytest.raises(PipelineError, match=rf"missing from the checkpoint.*{bare}"):
        build_sentence_model(str(folder), pooling="mean", max_seq_len=32)
    with pytest.raises(PipelineError, match=rf"missing from the checkpoint.*{bare}"):
        load_encoder(str(folder))


@pytest.mark.parametrize("architecture", ["roberta", "bert", "modernbert"])
def test_the_pipelines_exports_load_quietly(tmp_path, architecture, bpe_tokenizer_dir, wordpiece_tokenizer_dir,
                                            capfd):
    from pipeline.finetune.families.embedding.sentence_folder import build_sentence_model
    from pipeline.models.embedding_encoder import load_encoder

    tokenizer = wordpiece_tokenizer_dir if architecture == "bert" else bpe_tokenizer_dir
    folder = save_export(tokenizer, tmp_path / architecture, architecture)
    capfd.readouterr()
    build_sentence_model(str(folder), pooling="mean", max_seq_len=32)
    load_encoder(str(folder))
    printed = capfd.readouterr()
    assert "LOAD REPORT" not in printed.out + printed.err and "MISSING" not in printed.out + printed.err
