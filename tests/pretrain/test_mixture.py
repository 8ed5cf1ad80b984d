"""Weighted corpus mixing as the trainer sees it: config, batches, eval sets, progress and a resumed run (the
stream's arithmetic is test_stream.py's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import make_documents, tiny_pretrain_config, write_jsonl

from pipeline.common.config.tree import ConfigError
from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.data.shards.index import load_index
from pipeline.pretrain.batches.masked_slots import dense_labels
from pipeline.pretrain.batches.stretch_data import PretrainData
from pipeline.pretrain.plan.masking import IGNORE_INDEX, Masker
from pipeline.pretrain.preflight import load_pretrain_config, prepare_run


def shard(tmp_path_factory, tokenizer: Path, name: str, seed: int, **args) -> Path:
    from pipeline.data.shards.options import ShardOptions
    from pipeline.data.shards.stage import run_shard_stage

    root = tmp_path_factory.mktemp(name)
    corpus = write_jsonl(root / "corpus.jsonl", make_documents(200, seed=seed))
    out = root / name
    run_shard_stage(ShardOptions(inputs=(str(corpus),), tokenizer=str(tokenizer), out=str(out), workers=1,
                              shard_size=100, val_fraction=0.1, quiet=True, **{"seq_len": 64, **args}))
    return out


@pytest.fixture(scope="module")
def books(tmp_path_factory, bpe_tokenizer_dir) -> Path:
    """A second corpus for the test tokenizer: other documents, the same seq_len and packing as `roberta_shards`."""
    return shard(tmp_path_factory, bpe_tokenizer_dir, "books", seed=1)


def data_config(tmp_path: Path, shards, tokenizer: Path, **train) -> Path:
    config = tiny_pretrain_config(Path("x"), tokenizer, tmp_path / "out", train=train)
    config["data"]["shards"] = shards if isinstance(shards, list) else str(shards)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_a_mix_config_loads_and_problems_name_the_item_and_the_folders(tmp_path, tmp_path_factory, roberta_shards,
                                                                      books, pairs_shards, bpe_tokenizer_dir):
    mix = [{"path": str(roberta_shards), "weight": 0.3}, {"path": str(books), "weight": 0.7, "name": "books"}]
    config = load_pretrain_config(data_config(tmp_path, mix, bpe_tokenizer_dir), world_size=1)
    assert [(c.name, c.weight) for c in config.data.corpora()] == [("roberta", 0.3), ("books", 0.7)]

    short = shard(tmp_path_factory, bpe_tokenizer_dir, "short", seed=2, seq_len=32)
    bad = [{"path": str(roberta_shards), "weight": 0.5}, {"path": str(short), "weight": 0.5},
           {"path": str(pairs_shards), "weight": 0.5}]
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(data_config(tmp_path, bad, bpe_tokenizer_dir), world_size=1)
    message = str(err.value)
    assert (f"mixed corpora must share one sequence length: {roberta_shards} has seq_len 64, {short} has "
            "seq_len 32") in message
    assert f"{pairs_shards} has pack 'pairs'" in message and "mixed corpora must share one packing" in message
    # Every folder is held to data.tokenizer, so the one made with another tokenizer is named for that.
    assert f"data.tokenizer {bpe_tokenizer_dir} is not the tokenizer data.shards {pairs_shards} was made" in message

    wrong = [{"path": str(roberta_shards), "weight": -1}, {"path": "", "weight": 1, "name": "bad/name"},
             {"path": str(books), "weight": "lots"}, {"path": str(books), "weight": 1, "name": "roberta"}]
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(data_config(tmp_path, wrong, bpe_tokenizer_dir), world_size=1)
    problems = err.value.problems
    assert 'data.shards[2].weight: expected a number, got "lots"' in problems
    assert any(p.startswith("data.shards[0].weight: must be a positive number, got -1") for p in problems)
    assert any(p.startswith("data.shards[1].path: required") for p in problems)
    assert any(p.startswith("data.shards[1].name: 'bad/name'") for p in problems)
    assert any(p.startswith("data.shards: 2 corpora are named 'roberta'") for p in problems)

    tiny_share = [{"path": str(roberta_shards), "weight": 1}, {"path": str(books), "weight": 0.01}]
    with pytest.raises(ConfigError, match=r"data.shards: books has a share of 0.0099, less than one of the 16 "):
        load_pretrain_config(data_config(tmp_path, tiny_share, bpe_tokenizer_dir), world_size=1)


def pretrain_data(config: Path, tmp_path: Path) -> PretrainData:
    stretch = prepare_run(config).stretches[0]
    return PretrainData(stretch, BatchPlan.derive(16, 4, 1), Masker(400, 4, (0, 1, 2, 3, 4), seed=0), seed=0,
                        cache_dir=tmp_path / "cache", tokenizer_fingerprint=None, with_segments=False)


def test_a_single_folder_is_a_stream_of_one_corpus_with_one_epoch_count(tmp_path, roberta_shards, bpe_tokenizer_dir):
    data = pretrain_data(data_config(tmp_path, roberta_shards, bpe_tokenizer_dir), tmp_path)
    assert not data.mixed and len(data.stream.corpora) == 1
    assert data.progress(10) == {"train/epoch": pytest.approx(160 / len(data.train_batches))}
    assert set(data.eval_metrics(np.array([[20.0, 10.0]]))) == {"eval/mlm_loss", "eval/perplexity"}


def test_mixed_batches_eval_sets_and_progress_come_from_each_corpus(tmp_path, tmp_path_factory, bpe_tokenizer_dir):
    # Doc-packed corpora: padded, so the real tokens per sequence vary and "tokens seen" must count them.
    news, wiki = (shard(tmp_path_factory, bpe_tokenizer_dir, name, seed=seed, pack="doc")
                  for name, seed in (("news", 3), ("wiki", 4)))
    mix = [{"path": str(news), "weight": 1}, {"path": str(wiki), "weight": 3}]
    data = pretrain_data(data_config(tmp_path, mix, bpe_tokenizer_dir), tmp_path)
    from pipeline.data.token_cache import TokenCache

    caches = [TokenCache(p, "train", tmp_path / "cache") for p in (news, wiki)]
    offsets = data.stream.offsets
    key = data.stream.micro_batch(2, 1)
    batch = data.train_batches[key]
    for row, index in enumerate(key.indices):
        corpus = int(index >= offsets[1])
        source = caches[corpus].fields["input_ids"][index - offsets[corpus]]
        labels = dense_labels(batch)[row].numpy()
        assert np.array_equal(labels[labels != IGNORE_INDEX], source[labels != IGNORE_INDEX])
        assert batch["attention_mask"][row].sum() == caches[corpus].fields["length"][index - offsets[corpus]]

    # Tokens seen: exactly the real tokens of every sequence drawn so far.
    steps = 40
    corpus_of, rows = (np.concatenate(part) for part in zip(*(data.stream.step_sequences(s)[:2]
                                                                for s in range(steps)), strict=True))
    progress = data.progress(steps)
    for corpus, name in enumerate(("news", "wiki")):
        mine = rows[corpus_of == corpus]
        assert progress[f"data/{name}/tokens"] == int(caches[corpus].fields["length"][mine].astype(np.int64).sum())
        assert progress[f"data/{name}/epoch"] == pytest.approx(len(mine) / len(caches[corpus]))
    assert len(rows) == 640 and progress["data/wiki/epoch"] == pytest.approx(480 / len(caches[1]))

    sets = data.eval_sets(eval_sequences=8, micro_batch_size=4, rank=0, world_size=1)
    val_sizes = [len(TokenCache(p, "val", tmp_path / "cache")) for p in (news, wiki)]
    assert [np.concatenate([k.indices for k in s]).tolist() for s in sets] == [
        list(range(8)), list(range(val_sizes[0], val_sizes[0] + 8))]
    metrics = data.eval_metrics(np.array([[40.0, 10.0], [30.0, 10.0]]))  # losses 4 and 3, shares 0.25 and 0.75
    assert metrics["eval/news/mlm_loss"] == 4 and metrics["eval/wiki/mlm_loss"] == 3
    assert metrics["eval/mlm_loss"] == pytest.approx(3.25)


@pytest.mark.slow
def test_a_mixed_run_logs_each_corpus_and_resumes_to_the_same_losses(tmp_path, roberta_shards, books,
                                                                      bpe_tokenizer_dir):
    """One process, 8 steps of a 1:3 mix with MLflow; then the run again from its step-4 checkpoint."""
    import shutil
    import subprocess

    from helpers import PYTHON, ROOT
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mix = [{"path": str(roberta_shards), "weight": 1}, {"path": str(books), "weight": 3}]
    config = tiny_pretrain_config(Path("x"), bpe_tokenizer_dir, tmp_path / "full", train={"eval_every": 4,
                                  "export": False}, tracking={"enabled": True, "uri": uri})
    config["data"].update(shards=mix, num_workers=1, cache_dir=str(tmp_path / "cache"))
    (tmp_path / "full.json").write_text(json.dumps(config))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}

    def run(name: str) -> dict[int, dict]:
        proc = subprocess.run([PYTHON, "launchers/pretrain.py", "--config", str(tmp_path / f"{name}.json")],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        records: dict[int, dict] = {}
        for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            records.setdefault(record["step"], {}).update(record)
        return records

    full = run("full")
    assert full[8]["data/roberta/tokens"] == 8 * 4 * 64 and full[8]["data/books/tokens"] == 8 * 12 * 64
    books_train = load_index(books)["splits"]["train"]["sequences"]
    assert full[8]["data/books/epoch"] == pytest.approx(96 / books_train)
    for step in (4, 8):
        per_corpus = full[step]["eval/roberta/mlm_loss"], full[step]["eval/books/mlm_loss"]
        assert full[step]["eval/mlm_loss"] == pytest.approx(0.25 * per_corpus[0] + 0.75 * per_corpus[1])
    assert full[8]["eval/mlm_loss"] < full[4]["eval/mlm_loss"]
    # The plateau's level beside every loss: each corpus's validation unigram entropy, the mix's by share.
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.pretrain.report.plateau import validation_unigram_entropy

    specials = load_tokenizer(bpe_tokenizer_dir).all_special_ids
    levels = validation_unigram_entropy(roberta_shards, specials), validation_unigram_entropy(books, specials)
    for step in (4, 8):
        assert full[step]["eval/roberta/unigram_entropy"] == pytest.approx(levels[0])
        assert full[step]["eval/books/unigram_entropy"] == pytest.approx(levels[1])
        assert full[step]["eval/unigram_entropy"] == pytest.approx(0.25 * levels[0] + 0.75 * levels[1])
        assert full[step]["eval/margin_below_unigram"] == pytest.approx(
            full[step]["eval/unigram_entropy"] - full[step]["eval/mlm_loss"])

    client = MlflowClient(uri)
    run_id = json.loads((tmp_path / "full" / "tracking.json").read_text())["run_id"]
    for key in ("data/books/tokens", "data/roberta/epoch", "eval/roberta/mlm_loss", "eval/mlm_loss",
                "eval/unigram_entropy", "eval/margin_below_unigram"):
        assert client.get_metric_history(run_id, key), key

    shutil.copytree(tmp_path / "full", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "step_00000008")
    config["train"]["output_dir"] = str(tmp_path / "resumed")
    config["tracking"]["enabled"] = False
    (tmp_path / "resumed.json").write_text(json.dumps(config))
    resumed = run("resumed")
    assert "resumed_from" in resumed[4]
    # The same batches, masks and dropout after the resume: the same losses, bit for bit.
    assert [resumed[s]["train/loss"] for s in range(1, 9)] == [full[s]["train/loss"] for s in range(1, 9)]
    assert resumed[8]["eval/books/mlm_loss"] == full[8]["eval/books/mlm_loss"]


def mix_plan(tmp_path: Path, weights: list[float], start=None):
    """The plan of a run of 12 steps at a global batch of 16 over `weights`' corpora (one shard of 300 each, no
    files read), from the checkpoint record `start` (None: step 0)."""
    from helpers import tiny_pretrain_config

    from pipeline.common.config.tree import build_config
    from pipeline.data.epoch_order import CorpusLayout
    from pipeline.pretrain.checkpoints.record import StartPoint
    from pipeline.pretrain.config import PretrainConfig
    from pipeline.pretrain.plan.run_plan import build_plan

    names = ["news", "wiki", "code"][: len(weights)]
    config = tiny_pretrain_config(Path("x"), Path("tok"), tmp_path / "run", train={"max_steps": 12})
    config["data"]["shards"] = [{"path": name, "weight": w} for name, w in zip(names, weights, strict=True)]
    typed, problems = build_config(PretrainConfig, config)
    assert not problems, problems
    layouts = {name: CorpusLayout(name, name, key, (300,), 1, 64) for key, name in enumerate(names)}
    point = None if start is None else StartPoint(tmp_path / f"step_{start.step:08d}", start, universal=False)
    return build_plan(typed, 1, layouts, point)


def batches(plan, steps: range) -> list[list[tuple[int, int, int]]]:
    """Each step's sequences as (corpus key, row, epoch), as the loader draws them."""
    out = []
    for step in steps:
        stretch = plan.stretch_at(step)
        corpus, rows, epochs = stretch.stream(plan.config.train.seed).step_sequences(step)
        out.append([(stretch.corpora[c].key, int(r), int(e)) for c, r, e in zip(corpus, rows, epochs, strict=True)])
    return out


@pytest.mark.parametrize(("before", "after"), [([1, 1], [1, 2]), ([1, 2, 3], [1, 1, 1])],
                         ids=["two-corpora-1:2", "three-corpora"])
def test_a_plain_resume_after_a_mix_change_sees_the_uninterrupted_batches(tmp_path, before, after):
    """The shares do not divide the batch of 16 evenly: a resume that started a new stretch would round each
    corpus's count afresh and draw other batches than the run that went on."""
    from pipeline.pretrain.checkpoints.record import read_record, write_record

    def saved(plan, step: int):  # what a checkpoint at `step` records, through its file
        folder = tmp_path / f"record-{step}-{len(plan.stretches)}"
        folder.mkdir()
        write_record(folder, plan.record(step, hf_config={}))
        return read_record(folder)

    first = mix_plan(tmp_path, before)  # steps 0-5 under the first mix
    changed = mix_plan(tmp_path, after, saved(first, 6))  # a resume at 6 into the edited mix, run to the end
    resumed = mix_plan(tmp_path, after, saved(changed, 8))  # the same run stopped at 8 and resumed, mix unchanged
    assert batches(resumed, range(8, 12)) == batches(changed, range(8, 12))
    assert [(s.start, s.end) for s in resumed.stretches] == [(0, 6), (6, 12)]  # the resume's stretch goes on
