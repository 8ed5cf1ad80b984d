"""Weighted corpus mixing: the realised mix, resume and rank agreement, per-corpus epochs, masks and config."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import make_documents, tiny_pretrain_config, write_jsonl

from pipeline.common.config_tree import ConfigError
from pipeline.data.shard_index import load_index
from pipeline.pretrain.batch_plan import BatchPlan
from pipeline.pretrain.batches import GlobalShuffle
from pipeline.pretrain.masking import IGNORE_INDEX, Masker
from pipeline.pretrain.mixture import MixedShuffle, PretrainData
from pipeline.pretrain.preflight import load_pretrain_config


def shard(tmp_path_factory, tokenizer: Path, name: str, seed: int, **args) -> Path:
    from pipeline.data.shard_options import ShardOptions
    from pipeline.data.shard_stage import run_shard_stage

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


def corpus_counts(shuffle: MixedShuffle, steps: range) -> np.ndarray:
    rows = np.concatenate([shuffle.step_rows(s)[0] for s in steps])
    return np.bincount(np.searchsorted(shuffle.offsets, rows, side="right") - 1, minlength=len(shuffle.sizes))


@pytest.mark.parametrize("weights,sizes", [([0.3, 0.7], [700, 2500]), ([5, 3, 2], [90, 4000, 333])],
                         ids=["0.3-0.7", "5-3-2"])
def test_over_10000_sequences_the_realised_mix_is_within_one_point_of_the_weights(weights, sizes):
    shuffle = MixedShuffle(sizes, weights, BatchPlan.derive(40, 8, 1), seed=3)
    shares = np.array(weights) / sum(weights)
    counts = corpus_counts(shuffle, range(250))  # 250 steps × 40 = 10,000 sequences
    assert counts.sum() == 10_000
    assert np.abs(counts / 10_000 - shares).max() < 0.01
    assert counts.tolist() == [round(s * 10_000) for s in shares]  # weights are read as the decimals written
    # Stronger, and what makes it hold at any length: after every step each corpus is within one
    # sequence of its share.
    for step in (1, 7, 33, 250):
        assert np.abs(shuffle.drawn(step) - shares * step * 40).max() < 1


def test_each_step_mixes_the_corpora_across_its_micro_batches():
    shuffle = MixedShuffle([500, 500], [0.5, 0.5], BatchPlan.derive(64, 8, 2), seed=0)
    mixed = [len(set(shuffle.offsets.searchsorted(shuffle.micro_batch(3, k).indices, side="right")))
             for k in range(8)]
    assert sum(n == 2 for n in mixed) >= 6  # not one corpus per micro batch (or per rank)


def test_resume_and_every_rank_layout_give_the_same_order():
    plan = BatchPlan.derive(32, 4, 2)
    uninterrupted = MixedShuffle([300, 1000], [0.4, 0.6], plan, seed=5)
    resumed = MixedShuffle([300, 1000], [0.4, 0.6], plan, seed=5)  # a new process at step 9
    for rank in range(2):
        before = list(uninterrupted.rank_keys(rank, 0, 30))[9 * plan.accumulation:]
        after = list(resumed.rank_keys(rank, 9, 30))
        assert all(np.array_equal(a.indices, b.indices) and np.array_equal(a.epoch, b.epoch)
                   for a, b in zip(before, after, strict=True))
    one_rank = MixedShuffle([300, 1000], [0.4, 0.6], BatchPlan.derive(32, 4, 1), seed=5)
    for step in (0, 17):
        two = {tuple(k.indices) for r in range(2) for k in uninterrupted.rank_keys(r, step, step + 1)}
        assert two == {tuple(k.indices) for k in one_rank.rank_keys(0, step, step + 1)}
        assert sorted(np.concatenate([np.array(t) for t in two])) == sorted(uninterrupted.step_rows(step)[0])
    assert not np.array_equal(MixedShuffle([300, 1000], [0.4, 0.6], plan, seed=6).step_rows(0)[0],
                              uninterrupted.step_rows(0)[0])


def test_a_corpus_that_runs_out_starts_a_new_epoch_with_new_masks():
    small, large = 12, 1000
    shuffle = MixedShuffle([small, large], [0.25, 0.75], BatchPlan.derive(16, 16, 1), seed=0)
    draws = [(r, e) for s in range(12) for r, e in zip(*shuffle.step_rows(s), strict=True) if r < small]
    assert len(draws) == 48  # 4 of every 16 sequences: 4 epochs of the small corpus, 0.144 of the large one
    for epoch in range(4):
        assert sorted(r for r, e in draws if e == epoch) == list(range(small))  # each sequence once per epoch
    assert shuffle.drawn(12).tolist() == [48, 144]

    masker = Masker(400, 4, (0, 1, 2, 3, 4), seed=0)
    ids = np.full((1, 64), 10)
    first = masker(ids, np.array([0]), np.array([5]))[1]
    second = masker(ids, np.array([1]), np.array([5]))[1]
    assert not np.array_equal(first, second)  # the same sequence, its next epoch: another mask
    # Rows are global over the corpora, so corpus 0's row 5 and corpus 1's row 5 never share a mask key.
    keys = masker.keys(np.array([e for _, e in draws] + [0] * 4), np.array([r for r, _ in draws] + [small + 5] * 4))
    assert len(set(keys[:48].tolist())) == 48 and keys[48] not in set(keys[:48].tolist())
    # An epoch given per row masks each row exactly as a call with that epoch alone would.
    both = masker(np.full((2, 64), 10), np.array([0, 1]), np.array([5, 5]))[1]
    assert np.array_equal(both[0], first[0]) and np.array_equal(both[1], second[0])


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
    assert f"mixed corpora must share one tokenizer: {roberta_shards} was made with" in message
    assert f"{pairs_shards} with" in message and "mixed corpora must share one packing" in message

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
    with pytest.raises(ConfigError, match=r"books has weight 0.01, a share of 0.0099: less than one of the 16"):
        load_pretrain_config(data_config(tmp_path, tiny_share, bpe_tokenizer_dir), world_size=1)


def test_a_single_folder_keeps_the_order_masks_and_metrics_it_had_before(tmp_path, roberta_shards, bpe_tokenizer_dir):
    config = load_pretrain_config(data_config(tmp_path, roberta_shards, bpe_tokenizer_dir), world_size=1)
    plan = BatchPlan.derive(16, 4, 1)
    masker = Masker(400, 4, (0, 1, 2, 3, 4), seed=0)
    data = PretrainData(config.data, plan, masker, seed=0, cache_dir=tmp_path / "cache",
                        tokenizer_fingerprint=None, with_segments=False)
    assert isinstance(data.order, GlobalShuffle) and not config.data.mixed
    reference = GlobalShuffle(len(data.train_batches), plan, seed=0)
    for got, want in zip(data.order.rank_keys(0, 0, 30), reference.rank_keys(0, 0, 30), strict=True):
        assert got.epoch == want.epoch and np.array_equal(got.indices, want.indices)
    assert set(data.progress(10)) == {"train/epoch"} and data.epoch_state(10) == 10 // reference.steps_per_epoch
    assert set(data.eval_metrics(np.array([[20.0, 10.0]]))) == {"eval/mlm_loss", "eval/perplexity"}


def test_mixed_batches_eval_sets_and_progress_come_from_each_corpus(tmp_path, tmp_path_factory, bpe_tokenizer_dir):
    # Doc-packed corpora: padded, so the real tokens per sequence vary and "tokens seen" must count them.
    news, wiki = (shard(tmp_path_factory, bpe_tokenizer_dir, name, seed=seed, pack="doc")
                  for name, seed in (("news", 3), ("wiki", 4)))
    mix = [{"path": str(news), "weight": 1}, {"path": str(wiki), "weight": 3}]
    config = load_pretrain_config(data_config(tmp_path, mix, bpe_tokenizer_dir), world_size=1)
    plan = BatchPlan.derive(16, 4, 1)
    masker = Masker(400, 4, (0, 1, 2, 3, 4), seed=0)
    data = PretrainData(config.data, plan, masker, seed=0, cache_dir=tmp_path / "cache",
                        tokenizer_fingerprint=None, with_segments=False)
    from pipeline.data.token_cache import TokenCache

    caches = [TokenCache(p, "train", tmp_path / "cache") for p in (news, wiki)]
    offsets = data.order.offsets
    key = data.order.micro_batch(2, 1)
    batch = data.train_batches[key]
    for row, index in enumerate(key.indices):
        corpus = int(index >= offsets[1])
        source = caches[corpus].fields["input_ids"][index - offsets[corpus]]
        labels = batch["labels"][row].numpy()
        assert np.array_equal(labels[labels != IGNORE_INDEX], source[labels != IGNORE_INDEX])
        assert batch["attention_mask"][row].sum() == caches[corpus].fields["length"][index - offsets[corpus]]

    # Tokens seen: exactly the real tokens of every sequence drawn so far.
    steps = 40
    drawn = np.concatenate([data.order.step_rows(s)[0] for s in range(steps)])
    progress = data.progress(steps)
    for corpus, name in enumerate(("news", "wiki")):
        mine = drawn[data.train_batches.cache.corpus_of(drawn) == corpus] - offsets[corpus]
        assert progress[f"data/{name}/tokens"] == int(caches[corpus].fields["length"][mine].astype(np.int64).sum())
        assert progress[f"data/{name}/epoch"] == pytest.approx(len(mine) / len(caches[corpus]))
    assert len(drawn) == 640 and progress["data/wiki/epoch"] == pytest.approx(480 / len(caches[1]))
    assert data.epoch_state(steps) == {"news": 160 // len(caches[0]), "wiki": 480 // len(caches[1])}

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
    from pipeline.pretrain.plateau import validation_unigram_entropy

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
