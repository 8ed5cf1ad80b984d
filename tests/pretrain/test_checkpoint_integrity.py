"""A damaged checkpoint (checksums recorded at save time) and a full disk while saving or exporting one.

Resume falls back from a checkpoint with a truncated or bit-flipped file to the previous complete
one, with one warning naming the file; export refuses it with the same message; a checkpoint saved
before checksums still loads, with one warning that it cannot be verified.
"""

from __future__ import annotations

import errno
import json
import os
import warnings

import disk_full
import pytest
import test_export_layout
import torch
from disk_full import NO_SPACE, FakeEngine, files_under, fill_during_safetensors
from helpers import record_at

from pipeline.common.errors import PipelineError
from pipeline.pretrain.checkpoints import storage as checkpoints
from pipeline.pretrain.checkpoints.record import RECORD_FILE, read_record

run_folder = test_export_layout.run_folder  # a fixture: a run folder with one ZeRO-0 checkpoint
world_of_one = disk_full.world_of_one  # a fixture: a gloo process group of one, in this process
NOT_SIZE = NO_SPACE.replace("(\\d+(\\.\\d)? \\w+ needed, )?", "")


def flip_a_bit(path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def truncate(path) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) - 7)


@pytest.fixture
def two_checkpoints(tmp_path, world_of_one):
    root = tmp_path / "checkpoints"
    for step in (4, 8):
        checkpoints.save_checkpoint(FakeEngine(weights=100 + step), root, record_at(step), keep_last=3)
    return root


def test_the_record_lists_every_files_size_and_sha256(two_checkpoints):
    record = read_record(two_checkpoints / "step_00000008")
    assert sorted(record.files) == ["mp_rank_00_model_states.pt", "zero_pp_rank_0_optim_states.pt"]
    assert all(len(f["sha256"]) == 64 and f["bytes"] > 0 for f in record.files.values())


@pytest.mark.parametrize("damage", [flip_a_bit, truncate], ids=["bit_flip", "truncated"])
def test_resume_falls_back_past_a_damaged_checkpoint_with_one_warning_naming_the_file(two_checkpoints, damage):
    newest = two_checkpoints / "step_00000008"
    damage(newest / "mp_rank_00_model_states.pt")
    warned: list[str] = []
    assert checkpoints.newest_intact(two_checkpoints, warned.append) == two_checkpoints / "step_00000004"
    assert len(warned) == 1
    assert f"checkpoint {newest}: file mp_rank_00_model_states.pt is damaged" in warned[0]
    assert "falling back to the previous complete checkpoint step_00000004" in warned[0]
    # Moved aside: kept for a look, never resumed from again, and out of the way of the next save.
    assert not newest.exists() and (two_checkpoints / "damaged-step_00000008").is_dir()
    assert checkpoints.newest_intact(two_checkpoints, pytest.fail) == two_checkpoints / "step_00000004"


def test_every_checkpoint_damaged_means_a_fresh_start(two_checkpoints):
    for step in (4, 8):
        flip_a_bit(two_checkpoints / checkpoints.tag_for(step) / "zero_pp_rank_0_optim_states.pt", 60)
    warned: list[str] = []
    assert checkpoints.newest_intact(two_checkpoints, warned.append) is None
    assert len(warned) == 2 and "a fresh start" in warned[1]


def test_a_checkpoint_saved_before_checksums_loads_with_one_warning(two_checkpoints):
    marker_path = two_checkpoints / "step_00000008" / RECORD_FILE
    marker = json.loads(marker_path.read_text())
    del marker["files"]
    marker_path.write_text(json.dumps(marker))
    warned: list[str] = []
    assert checkpoints.newest_intact(two_checkpoints, warned.append) == two_checkpoints / "step_00000008"
    assert warned == [f"checkpoint {two_checkpoints / 'step_00000008'} was saved without checksums and cannot be "
                      "verified; resuming from it"]


def add_checksums(checkpoint) -> None:
    marker = json.loads((checkpoint / RECORD_FILE).read_text())
    marker["files"] = checkpoints.file_checksums(checkpoint)
    (checkpoint / RECORD_FILE).write_text(json.dumps(marker))


def test_export_refuses_a_damaged_checkpoint_with_the_message_resume_warns_with(run_folder, tmp_path):
    from pipeline.pretrain.export.folder import export_checkpoint

    checkpoint = run_folder["checkpoint"]
    add_checksums(checkpoint)
    flip_a_bit(checkpoint / "mp_rank_00_model_states.pt", 2000)
    expected = checkpoints.damage(checkpoint)
    assert expected and "mp_rank_00_model_states.pt is damaged" in expected
    with pytest.raises(PipelineError) as err:
        export_checkpoint(run_folder["layout"].root, tmp_path / "export")  # the run folder: its newest checkpoint
    assert str(err.value) == expected
    assert not (tmp_path / "export").exists()
    warned: list[str] = []
    checkpoints.newest_intact(checkpoint.parent, warned.append)
    assert warned[0].startswith(expected + ";")


def test_export_of_a_checkpoint_without_checksums_warns_that_it_cannot_be_verified(run_folder, tmp_path):
    from pipeline.pretrain.export.folder import export_checkpoint

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export_checkpoint(run_folder["checkpoint"], tmp_path / "export")
    unverified = [w for w in caught if "cannot be verified" in str(w.message)]
    assert len(unverified) == 1 and str(run_folder["checkpoint"]) in str(unverified[0].message)


def test_export_a_full_disk_keeps_the_previous_export(run_folder, tmp_path, monkeypatch):
    from pipeline.pretrain.export.folder import export_checkpoint

    out = tmp_path / "export"
    export_checkpoint(run_folder["checkpoint"], out)
    before = files_under(out)
    with monkeypatch.context() as patch:
        fill_during_safetensors(patch)
        with pytest.raises(PipelineError, match=NOT_SIZE) as err:
            export_checkpoint(run_folder["checkpoint"], out, overwrite=True)
    assert str(out) in str(err.value)
    assert files_under(out) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".export")]  # no temporary folder left
    export_checkpoint(run_folder["checkpoint"], out, overwrite=True)


@pytest.mark.usefixtures("world_of_one")
def test_checkpoint_a_full_disk_keeps_the_previous_checkpoint_and_a_rerun_saves(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    engine = FakeEngine()
    checkpoints.save_checkpoint(engine, root, record_at(4), keep_last=2)
    before = files_under(root / "step_00000004")
    real_save = torch.save

    def full_partway(obj, path, *args, **kwargs):
        real_save(obj, path, *args, **kwargs)
        with open(path, "r+b") as fh:
            fh.truncate(os.path.getsize(path) // 2)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(torch, "save", full_partway)
        with pytest.raises(PipelineError, match=NOT_SIZE) as err:
            checkpoints.save_checkpoint(engine, root, record_at(8), keep_last=2)
    assert str(root / "step_00000008") in str(err.value)
    assert checkpoints.newest_intact(root, pytest.fail) == root / "step_00000004"  # verifies, no warning
    assert files_under(root / "step_00000004") == before
    # After space is freed the rerun saves the same step again, over the half-written folder.
    checkpoints.save_checkpoint(engine, root, record_at(8), keep_last=2)
    assert checkpoints.newest_intact(root, pytest.fail) == root / "step_00000008"


@pytest.mark.slow
def test_a_real_run_falls_back_past_a_flipped_bit_and_resumes_after_a_full_disk(tmp_path, roberta_shards,
                                                                                bpe_tokenizer_dir):
    """One process, three runs (tests/dist/damaged_and_full_checkpoints.py): the DeepSpeed checkpoints themselves."""
    from helpers import tiny_pretrain_config
    from test_pretrain_distributed import launch, write_config

    config = write_config(tmp_path / "config.json", tiny_pretrain_config(
        roberta_shards, bpe_tokenizer_dir, tmp_path / "unused", data={"num_workers": 0, "cache_dir": str(tmp_path)},
        train={"export": False}, checkpoint={"every": 4, "keep_last": 3},
        schedule={"end_lr_ratio": 1.0}))  # a flat LR after warmup: runs of 8 and 12 steps take the same steps
    launch([], "tests/dist/damaged_and_full_checkpoints.py", config, tmp_path, timeout=300)
    report = json.loads((tmp_path / "report.json").read_text())
    run = tmp_path / "run" / "checkpoints"
    assert report["first"]["last_step"] == 8 and not report["first"]["warnings"]
    second = report["second"]
    assert len(second["warnings"]) == 1, second
    assert second["warnings"][0].startswith(f"warning: checkpoint {run / 'step_00000008'}: file "
                                            "mp_rank_00_model_states.pt is damaged")
    assert "falling back to the previous complete checkpoint step_00000004" in second["warnings"][0]
    assert second["error"].startswith(f"{run / 'step_00000012'}: no space left on device while writing it")
    after = report["after_second"]
    assert after["complete"] == after["intact"] == ["step_00000004", "step_00000008"]
    assert "damaged-step_00000008" in after["folders"]
    assert report["third"] == {**report["third"], "last_step": 12, "warnings": []}
    # Nothing lost: steps 5-8 retrained from step 4 give the first run's losses, and every step is logged once.
    first = {r["step"]: r["train/loss"] for r in map(json.loads, (tmp_path / "first-metrics.jsonl").open())
             if "train/loss" in r}
    final = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    losses = [(r["step"], r["train/loss"]) for r in final if "train/loss" in r]
    assert [s for s, _ in losses] == list(range(1, 13))
    assert all(dict(losses)[s] == first[s] for s in range(1, 9))
    print(json.dumps({"recovery": {k: report[k]["seconds"] for k in ("first", "second", "third")},
                      "resume_load_seconds": report["resume_load_seconds"],
                      "checkpoint_verify_seconds": report["checkpoint_verify_seconds"]}))
