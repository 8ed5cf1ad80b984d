"""Every shipped config is valid: types, keys and cross-field rules, without needing its data to exist.

Validity and the presence of data are separate questions: `check_files=False` asks only the
first, so the GLUE configs (whose data lives elsewhere) are validated here too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT

from pipeline.common.config.tree import ConfigError, read_json_config
from pipeline.common.errors import PipelineError

CONFIGS = ROOT / "configs"


def load_pretrain(path: Path) -> None:
    from pipeline.pretrain.preflight import load_pretrain_config

    load_pretrain_config(path, cuda=True, check_files=False)  # the big presets are GPU configs


def load_finetune(path: Path) -> None:
    from pipeline.finetune.preflight import load_finetune_config

    load_finetune_config(path, check_files=False)


def load_shard(path: Path) -> None:
    from pipeline.common.config.cli_options import options_from_config
    from pipeline.data.shards.options import ShardOptions

    options = options_from_config(ShardOptions, read_json_config(path), str(path), exclude=("rank", "world_size"))
    assert options.problems() == []


LOADERS = {".": load_pretrain, "recipes": load_pretrain, "glue": load_finetune, "tasks": load_finetune,
           "shard": load_shard}
SHIPPED = sorted(CONFIGS.rglob("*.json"))


def test_every_config_folder_is_validated_here():
    folders = {str(path.parent.relative_to(CONFIGS)) for path in SHIPPED}
    assert folders <= set(LOADERS), f"add a loader for {folders - set(LOADERS)} to LOADERS"
    assert len(SHIPPED) >= 15


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_shipped_config_is_valid(path):
    LOADERS[str(path.parent.relative_to(CONFIGS))](path)


def test_validity_and_data_presence_are_separate_checks(tmp_path):
    from pipeline.finetune.preflight import load_finetune_config

    config = json.loads((CONFIGS / "glue" / "sst2.json").read_text())
    config["data"]["glue_dir"] = str(tmp_path / "missing")
    path = tmp_path / "sst2.json"
    path.write_text(json.dumps(config))
    load_finetune_config(path, check_files=False)
    with pytest.raises(ConfigError, match="data.glue_dir: .*missing is not a folder"):
        load_finetune_config(path)
    config["train"]["epochs"] = "ten"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"train.epochs: expected an integer, got \"ten\""):
        load_finetune_config(path, check_files=False)


def test_a_shard_config_is_checked_as_its_command_line_will_be(tmp_path):
    bad = tmp_path / "shard.json"
    bad.write_text(json.dumps({"input": ["c.jsonl"], "tokenizer": "tok", "seq_len": "long", "out": "s",
                               "pack": "sentences"}))
    with pytest.raises(PipelineError, match="argument --seq-len: invalid int value: 'long'"):
        load_shard(bad)
    bad.write_text(json.dumps({"input": ["c.jsonl"], "out": "s", "rank": 1, "overwrite": "yes"}))
    with pytest.raises(PipelineError) as err:
        load_shard(bad)
    for problem in ("rank: not an option here", "tokenizer: required", "seq_len: required",
                    'overwrite: expected true or false, got "yes"'):
        assert problem in str(err.value)


def test_the_budget_recipe_keeps_crammings_choices_at_tiny_size():
    """configs/budget-tiny.json: tiny's model size (compared like for like), pre-LN, no dropout, a triangle."""
    from pipeline.pretrain.plan.phases import resolve_phases
    from pipeline.pretrain.plan.schedules import lr_schedule
    from pipeline.pretrain.preflight import load_pretrain_config

    budget = load_pretrain_config(CONFIGS / "budget-tiny.json", check_files=False)
    tiny = load_pretrain_config(CONFIGS / "tiny.json", check_files=False)
    size = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
    assert [getattr(budget.model, k) for k in size] == [getattr(tiny.model, k) for k in size]
    assert budget.model.architecture == "roberta-prelayernorm"
    assert budget.model.hidden_dropout_prob == budget.model.attention_probs_dropout_prob == 0.0
    steps = budget.train.max_steps
    lr = lr_schedule(budget, resolve_phases(budget)).multiplier
    peak = max(range(steps), key=lr)
    assert 0.2 * steps <= peak <= 0.5 * steps  # one cycle: up for a fifth to a half of the run, then down
    assert lr(steps - 1) < 0.01
