"""`Encoder.from_pretrained` finds the model in a pretraining checkpoint, an output folder, or fails clearly."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline.common.errors import PipelineError
from pipeline.hub import Encoder, resolve_source


@pytest.fixture(scope="module")
def pretrain_output(tmp_path_factory, bpe_tokenizer_dir):
    """A pretraining output folder with one ZeRO-0 checkpoint, in the layout DeepSpeed and the trainer write."""
    import shutil

    from helpers import tiny_pretrain_config
    from transformers import AutoTokenizer

    from pipeline.common.config_tree import build_config
    from pipeline.data.tokenizer import describe_tokenizer
    from pipeline.pretrain.config import ModelConfig
    from pipeline.pretrain.model import SparseRobertaForMaskedLM, hf_config

    out = tmp_path_factory.mktemp("pretrain") / "run"
    config = tiny_pretrain_config(out / "shards", bpe_tokenizer_dir, out)
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
    enc = Encoder.from_pretrained(pretrain_output["dir"], cache_dir=tmp_path)
    exported = resolve_source(pretrain_output["dir"], tmp_path).path
    assert exported.startswith(str(tmp_path)) and enc.source.path == exported
    tokens = enc.encode("the river model", "a corpus")
    with torch.no_grad():
        expected = pretrain_output["model"].roberta(tokens[None]).last_hidden_state
        assert torch.allclose(enc.extract_features(tokens), expected, atol=1e-6)
    stamp = (tmp_path / "exports").stat().st_mtime_ns, sorted(p.name for p in (tmp_path / "exports").iterdir())
    checkpoint = Encoder.from_pretrained(pretrain_output["dir"] / "checkpoints" / "step_00000004", cache_dir=tmp_path)
    assert checkpoint.source.path == exported  # the checkpoint itself resolves to the same cached export
    assert ((tmp_path / "exports").stat().st_mtime_ns, sorted(p.name for p in (tmp_path / "exports").iterdir())) \
        == stamp
    assert enc.fill_mask("the <mask> model", topk=2)[0][1] > 0


def test_an_incomplete_checkpoint_is_refused(tmp_path):
    (tmp_path / "checkpoints" / "step_00000002").mkdir(parents=True)
    with pytest.raises(PipelineError, match="no complete checkpoint"):
        Encoder.from_pretrained(tmp_path, cache_dir=tmp_path / "cache")


def test_a_hub_name_that_cannot_be_fetched_is_a_clear_error(monkeypatch, tmp_path):
    import huggingface_hub.constants

    # Offline and an empty cache: the name reaches transformers, which cannot fetch it (no network in tests).
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert resolve_source("FacebookAI/roberta-base").path == "FacebookAI/roberta-base"
    with pytest.raises(PipelineError, match="roberta-base"):
        Encoder.from_pretrained("FacebookAI/roberta-base")
