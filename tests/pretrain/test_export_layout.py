"""Export finds a checkpoint's run folder (tokenizer copy, MLflow run) through the run layout."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pipeline.common.run_layout import PretrainLayout

TINY = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}


@pytest.fixture
def run_folder(tmp_path, bpe_tokenizer_dir, roberta_shards):
    """A pretraining run folder with one ZeRO-0 checkpoint, as the trainer lays it out, written before markers
    held the model's transformers config.

    The config names a tokenizer folder that no longer exists: the run's own copy is the one to use.
    """
    from transformers import AutoTokenizer

    from pipeline.common.config.tree import build_config
    from pipeline.data.tokenizer import describe_tokenizer
    from pipeline.models.architectures.config import ModelConfig
    from pipeline.models.architectures.hf_model import SparseRobertaForMaskedLM, hf_config

    layout = PretrainLayout(tmp_path / "run")
    shutil.copytree(bpe_tokenizer_dir, layout.tokenizer)
    tokenizer = AutoTokenizer.from_pretrained(layout.tokenizer)
    model_config, problems = build_config(ModelConfig, TINY)
    assert not problems
    model = SparseRobertaForMaskedLM(hf_config(model_config, describe_tokenizer(tokenizer), 64))
    checkpoint = layout.checkpoints / "step_00000004"
    checkpoint.mkdir(parents=True)
    torch.save({"module": model.state_dict()}, checkpoint / "mp_rank_00_model_states.pt")
    (checkpoint / "complete.json").write_text(json.dumps({
        "step": 4, "architecture": "roberta", "seq_len": 64, "zero_stage": 0,
        "config": {"model": TINY, "data": {"shards": str(roberta_shards), "tokenizer": str(tmp_path / "moved-away")}}}))
    layout.tracking.write_text(json.dumps({"uri": "sqlite:///mlflow.db", "run_id": "abc123"}))
    return {"layout": layout, "checkpoint": checkpoint, "weights": model.state_dict()}


def test_a_checkpoint_given_by_a_relative_path_finds_its_run_folder(run_folder, tmp_path, monkeypatch):
    from transformers import AutoModelForMaskedLM

    from pipeline.pretrain.export.folder import export_checkpoint

    monkeypatch.chdir(run_folder["layout"].checkpoints)  # `launchers/export.py step_00000004 --out …`
    out = export_checkpoint("step_00000004", tmp_path / "export")
    provenance = json.loads((out / "pipeline_export.json").read_text())
    assert provenance["pretrain_run_id"] == "abc123" and provenance["checkpoint"] == str(run_folder["checkpoint"])
    assert (out / "tokenizer.json").read_text() == (run_folder["layout"].tokenizer / "tokenizer.json").read_text()
    exported = AutoModelForMaskedLM.from_pretrained(out).state_dict()
    assert all(torch.equal(exported[k], v) for k, v in run_folder["weights"].items())


def test_a_loose_checkpoint_has_no_run_folder(run_folder, tmp_path):
    loose = tmp_path / "elsewhere" / "copied" / "step_00000004"
    shutil.copytree(run_folder["checkpoint"], loose)
    assert PretrainLayout.of_checkpoint(loose) is None
    assert PretrainLayout.of_checkpoint(run_folder["checkpoint"]) == run_folder["layout"]
