"""`Encoder.from_pretrained` finds the model in a pretraining checkpoint or output folder through the exporter it is
handed (pretraining's, as every command hands it), or fails clearly."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.common.errors import PipelineError
from pipeline.hub import Encoder, resolve_model_source
from pipeline.pretrain.export.folder import export_for_loading


@pytest.fixture(scope="module")
def pretrain_output(tmp_path_factory, bpe_tokenizer_dir, roberta_shards):
    """A pretraining output folder with one ZeRO-0 checkpoint, in the layout DeepSpeed and the trainer write."""
    import shutil

    from helpers import tiny_pretrain_config
    from transformers import AutoTokenizer

    from pipeline.common.config.tree import build_config
    from pipeline.data.tokenizer import describe_tokenizer
    from pipeline.models.architectures.config import ModelConfig
    from pipeline.models.architectures.hf_model import SparseRobertaForMaskedLM, hf_config

    out = tmp_path_factory.mktemp("pretrain") / "run"
    config = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, out)  # its validation split checks the export
    model_config, problems = build_config(ModelConfig, config["model"])
    assert not problems
    info = describe_tokenizer(AutoTokenizer.from_pretrained(bpe_tokenizer_dir))
    torch.manual_seed(0)
    model = SparseRobertaForMaskedLM(hf_config(model_config, info, 64)).eval()
    checkpoint = out / "checkpoints" / "step_00000004"
    checkpoint.mkdir(parents=True)
    torch.save({"module": model.state_dict()}, checkpoint / "mp_rank_00_model_states.pt")
    (checkpoint / "complete.json").write_text(json.dumps({"step": 4, "architecture": "roberta", "seq_len": 64,
                                                          "zero_stage": 0, "config": config}))
    shutil.copytree(bpe_tokenizer_dir, out / "tokenizer")
    return {"dir": out, "model": model}


def test_a_pretraining_output_folder_is_exported_once_into_the_cache(pretrain_output, tmp_path):
    enc = Encoder.from_pretrained(pretrain_output["dir"], exporter=export_for_loading, cache_dir=tmp_path)
    exported = resolve_model_source(pretrain_output["dir"], exporter=export_for_loading, cache_dir=tmp_path).path
    assert exported.startswith(str(tmp_path)) and enc.source.path == exported
    tokens = enc.encode("the river model", "a corpus")
    with torch.no_grad():
        expected = pretrain_output["model"].roberta(tokens[None]).last_hidden_state
        assert torch.allclose(enc.extract_features(tokens), expected, atol=1e-6)
    stamp = (tmp_path / "exports").stat().st_mtime_ns, sorted(p.name for p in (tmp_path / "exports").iterdir())
    checkpoint = Encoder.from_pretrained(pretrain_output["dir"] / "checkpoints" / "step_00000004",
                                         exporter=export_for_loading, cache_dir=tmp_path)
    assert checkpoint.source.path == exported  # the checkpoint itself resolves to the same cached export
    assert ((tmp_path / "exports").stat().st_mtime_ns, sorted(p.name for p in (tmp_path / "exports").iterdir())) \
        == stamp
    assert enc.fill_mask("the <mask> model", topk=2)[0][1] > 0


def test_a_run_retrained_into_the_same_folder_is_exported_anew(pretrain_output, tmp_path):
    """Same checkpoint path and step, other weights: neither the hub's cached export nor fine-tuning's
    `source_model` of the old run is reused, and the latter is not replaced while seeds fine-tuned from it remain."""
    import shutil

    from pipeline.models.model_source import resolve_model_source
    from pipeline.pretrain.checkpoints.storage import file_checksums

    run = tmp_path / "run"
    shutil.copytree(pretrain_output["dir"], run)
    before = Encoder.from_pretrained(run, exporter=export_for_loading, cache_dir=tmp_path / "cache")
    finetune_source = resolve_model_source(str(run), exporter=export_for_loading,
                                           export_to=tmp_path / "source_model")
    old_weights = (tmp_path / "source_model" / "model.safetensors").read_bytes()
    checkpoint = run / "checkpoints" / "step_00000004"
    states = torch.load(checkpoint / "mp_rank_00_model_states.pt", weights_only=True)
    torch.save({"module": {k: v + 0.5 if v.is_floating_point() else v for k, v in states["module"].items()}},
               checkpoint / "mp_rank_00_model_states.pt")  # the retrained run's step 4
    marker = json.loads((checkpoint / "complete.json").read_text())
    (checkpoint / "complete.json").write_text(json.dumps({**marker, "files": file_checksums(checkpoint)}))
    after = Encoder.from_pretrained(run, exporter=export_for_loading, cache_dir=tmp_path / "cache")
    with pytest.raises(PipelineError, match="the finished seeds beside it were fine-tuned from"):
        resolve_model_source(str(run), exporter=export_for_loading, export_to=tmp_path / "source_model",
                             keep_export=True)
    assert (tmp_path / "source_model" / "model.safetensors").read_bytes() == old_weights  # kept, not replaced
    again = resolve_model_source(str(run), exporter=export_for_loading, export_to=tmp_path / "source_model")
    assert again == finetune_source
    assert (tmp_path / "source_model" / "model.safetensors").read_bytes() != old_weights  # fine-tuning's too
    assert after.source.path != before.source.path
    tokens = before.encode("the river model")
    assert not torch.allclose(after.extract_features(tokens), before.extract_features(tokens))


def test_an_incomplete_checkpoint_is_refused(tmp_path):
    (tmp_path / "checkpoints" / "step_00000002").mkdir(parents=True)
    with pytest.raises(PipelineError, match="no complete checkpoint"):
        Encoder.from_pretrained(tmp_path, exporter=export_for_loading, cache_dir=tmp_path / "cache")


def test_a_hub_name_that_cannot_be_fetched_is_a_clear_error(monkeypatch, tmp_path):
    import huggingface_hub.constants

    # Offline and an empty cache: the name reaches transformers, which cannot fetch it (no network in tests).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert resolve_model_source("FacebookAI/roberta-base").path == "FacebookAI/roberta-base"
    with pytest.raises(PipelineError, match="roberta-base"):
        Encoder.from_pretrained("FacebookAI/roberta-base")


def test_without_an_exporter_a_pretraining_run_is_refused_naming_the_export_command(pretrain_output, tmp_path):
    """The hub sits below pretraining: a library call that hands it no exporter is told how to export first."""
    with pytest.raises(PipelineError, match="roberta-export") as refused:
        Encoder.from_pretrained(pretrain_output["dir"], cache_dir=tmp_path)
    assert str(pretrain_output["dir"]) in str(refused.value)
    assert not (tmp_path / "exports").exists()  # nothing exported, nothing half-written
