"""A full disk while writing each kind of artefact: a clear error naming the path and the space, what was
written before intact, and a rerun after space is freed that resumes.

Simulated (`FullDisk`: writes fail with ENOSPC once a byte budget is spent, partway through a file),
and once on a real small file system where this machine lets the tests mount one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from disk_full import (  # noqa: F401 (world_of_one is a fixture)
    NO_SPACE,
    FakeEngine,
    FullDisk,
    files_under,
    fill_during_safetensors,
    small_filesystem,
    world_of_one,
)
from helpers import record_at

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.errors import PipelineError


def shard_options(corpus, tokenizer, out):
    from pipeline.data.shards.options import ShardOptions

    # The same options as the `roberta_shards` fixture: a finished rerun must give its shards exactly.
    return ShardOptions(inputs=(str(corpus),), tokenizer=str(tokenizer), seq_len=64, out=str(out), workers=1,
                        shard_size=100, val_fraction=0.1, quiet=True)


def test_shards_a_full_disk_names_the_shard_keeps_the_written_ones_and_a_rerun_resumes(
        tmp_path, monkeypatch, corpus_jsonl, bpe_tokenizer_dir, roberta_shards):
    from pipeline.data.shards.index import load_index, verify_folder
    from pipeline.data.shards.stage import run_shard_stage

    out = tmp_path / "shards"
    total = sum(p.stat().st_size for p in roberta_shards.rglob("*") if p.is_file())
    disk = FullDisk(monkeypatch, out, budget=total // 2)  # fills halfway through the stage
    with pytest.raises(PipelineError, match=NO_SPACE) as err:
        run_shard_stage(shard_options(corpus_jsonl, bpe_tokenizer_dir, out))
    assert str(out) in str(err.value) and "rerun" in str(err.value)
    assert not list(out.rglob("*.tmp")), "a temporary file of the failed write was left behind"
    written = {name: digest for name, digest in files_under(out).items() if name.endswith(".zst")
               and not name.startswith("parts/")}
    assert written, "the disk filled before any shard was written: the budget is too small to test anything"
    disk.free()
    run_shard_stage(shard_options(corpus_jsonl, bpe_tokenizer_dir, out))
    assert verify_folder(out) == []
    after = files_under(out)
    assert all(after[name] == digest for name, digest in written.items())  # kept, not rewritten differently
    assert load_index(out)["splits"] == load_index(roberta_shards)["splits"]  # as if the disk had never filled


def test_metrics_json_a_full_disk_keeps_the_previous_file_whole(tmp_path, monkeypatch):
    from pipeline.tracking.metrics import JsonlSink

    metrics = tmp_path / "run" / "metrics.json"
    metrics.parent.mkdir()
    write_json_atomic(metrics, {"accuracy": 0.5})
    disk = FullDisk(monkeypatch, tmp_path / "run", budget=80)  # room for one metrics line, then full
    sink = JsonlSink(tmp_path / "run" / "metrics.jsonl")
    sink.log({"train/loss": 1.0}, step=1)
    with pytest.raises(PipelineError, match=NO_SPACE) as err:
        write_json_atomic(metrics, {"accuracy": 0.9, "per_seed": list(range(100))})
    assert str(metrics) in str(err.value)
    assert json.loads(metrics.read_text()) == {"accuracy": 0.5}
    assert sorted(p.name for p in metrics.parent.iterdir()) == ["metrics.json", "metrics.jsonl"]
    with pytest.raises(PipelineError, match=r"metrics.jsonl: no space left on device"):
        sink.log({"train/loss": 0.5, "padding": "x" * 100}, step=2)
    disk.free()
    write_json_atomic(metrics, {"accuracy": 0.9})
    assert json.loads(metrics.read_text()) == {"accuracy": 0.9}
    sink.close()
    # A resume drops the line the full disk cut short, and keeps the whole ones.
    JsonlSink(tmp_path / "run" / "metrics.jsonl", resume_step=1).close()
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["train/loss"] for line in lines] == [1.0]


def tiny_model_and_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer, RobertaConfig, RobertaForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=80)
    return RobertaForSequenceClassification(config), tokenizer


def proof(tokenizer) -> dict:
    """`save_model`'s equivalence check: a batch of two texts, the model run in fp32."""
    return {"check_batch": dict(tokenizer(["the river", "a model token"], padding=True, return_tensors="pt")),
            "precision": "fp32"}


def test_fine_tuned_model_a_full_disk_keeps_the_saved_model_and_a_rerun_saves(tmp_path, monkeypatch,
                                                                              bpe_tokenizer_dir):
    from transformers import AutoModelForSequenceClassification

    from pipeline.finetune.outputs.folders import save_model

    model, tokenizer = tiny_model_and_tokenizer(bpe_tokenizer_dir)
    folder = tmp_path / "seed_1" / "model"
    save_model(folder, model, tokenizer, {"seed": 1, "epoch": 1}, **proof(tokenizer))
    before = files_under(folder)
    with monkeypatch.context() as patch:
        fill_during_safetensors(patch)
        with pytest.raises(PipelineError, match=NO_SPACE.replace("(\\d+(\\.\\d)? \\w+ needed, )?", "")) as err:
            save_model(folder, model, tokenizer, {"seed": 1, "epoch": 2}, **proof(tokenizer))
    assert str(folder) in str(err.value)
    assert files_under(folder) == before  # the model saved before is whole, and still loads
    AutoModelForSequenceClassification.from_pretrained(folder)
    assert sorted(p.name for p in folder.parent.iterdir()) == ["model"]  # no half-written folder left beside it
    save_model(folder, model, tokenizer, {"seed": 1, "epoch": 2}, **proof(tokenizer))
    assert json.loads((folder / "pipeline_finetune.json").read_text())["epoch"] == 2


@pytest.mark.usefixtures("world_of_one")
def test_a_real_full_file_system(tmp_path, bpe_tokenizer_dir):
    """The same outcomes on a real 1 MiB tmpfs, where torch.save and safetensors meet a real ENOSPC."""
    from pipeline.finetune.outputs.folders import save_model
    from pipeline.pretrain.checkpoints import storage as checkpoints
    mount = tmp_path / "small"
    with small_filesystem(mount, "1m") as mounted:
        if not mounted:
            pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN); covered by the simulations above")
        root = mount / "checkpoints"
        checkpoints.save_checkpoint(FakeEngine(weights=1000), root, record_at(4), keep_last=2)
        with pytest.raises(PipelineError, match="no space left on device") as err:
            checkpoints.save_checkpoint(FakeEngine(weights=400_000), root, record_at(8), keep_last=2)
        assert str(root / "step_00000008") in str(err.value) and "left)" in str(err.value)
        assert checkpoints.newest_intact(root, pytest.fail) == root / "step_00000004"
        model, tokenizer = tiny_model_and_tokenizer(bpe_tokenizer_dir)
        with pytest.raises(PipelineError, match="no space left on device") as err:
            save_model(mount / "model", model, tokenizer, {"seed": 1}, **proof(tokenizer))
        assert str(mount / "model") in str(err.value)
        assert not (mount / "model").exists() and not list(mount.glob(".model.*"))
        with pytest.raises(PipelineError, match=r"needed, \d+(\.\d)? \w+ left\)"):
            write_json_atomic(mount / "metrics.json", {"x": "y" * (2 << 20)})
        assert sorted(p.name for p in mount.iterdir()) == ["checkpoints"]
