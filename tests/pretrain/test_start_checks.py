"""What a run starts from is checked against its config before the first step: a resume's own checkpoint,
an anneal's source, `model.init_from`. Each mismatch names both sides and the key to change.

The checkpoints here are completion markers written as the trainer writes them (its `config`,
`architecture` and `hf_config`); the checks read nothing else. tests/dist/anneal_from_checkpoint.py
does the same against a real run's checkpoint.
"""

from __future__ import annotations

import json

import pytest
from helpers import tiny_pretrain_config

from pipeline.common.config.tree import ConfigError, to_dict
from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
from pipeline.pretrain.preflight import load_pretrain_config


def write_config(tmp_path, roberta_shards, bpe_tokenizer_dir, name="config.json", **sections):
    path = tmp_path / name
    path.write_text(json.dumps(tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "run", **sections)))
    return path


def fake_checkpoint(folder, config, vocab_size, **hf):
    """A complete checkpoint's marker for `config`, as the trainer writes it (no weights: nothing here reads them)."""
    folder.mkdir(parents=True)
    m = config.model
    hf_config = {"model_type": m.architecture, "vocab_size": vocab_size, "num_hidden_layers": m.num_hidden_layers,
                 "hidden_size": m.hidden_size, "num_attention_heads": m.num_attention_heads,
                 "intermediate_size": m.intermediate_size, **hf}
    (folder / "complete.json").write_text(json.dumps({
        "step": 6, "batch_plan": {"global_batch_size": config.train.global_batch_size, "world_size": 1},
        "architecture": m.architecture, "config": to_dict(config), "hf_config": hf_config}))
    return folder


@pytest.fixture
def vocab_size(bpe_tokenizer_dir):
    return describe_tokenizer(load_tokenizer(bpe_tokenizer_dir)).vocab_size


def stable_checkpoint(tmp_path, roberta_shards, bpe_tokenizer_dir, vocab_size, *overrides, **hf):
    """A stable run's checkpoint (its config as loaded with `overrides`) in tmp_path/stable."""
    stable = load_pretrain_config(write_config(tmp_path, roberta_shards, bpe_tokenizer_dir, "stable.json"),
                                  [f"train.output_dir={tmp_path / 'stable'}", *overrides])
    return fake_checkpoint(tmp_path / "stable" / "checkpoints" / "step_00000006", stable, vocab_size, **hf)


def anneal_config(tmp_path, roberta_shards, bpe_tokenizer_dir, checkpoint):
    return write_config(tmp_path, roberta_shards, bpe_tokenizer_dir,
                        train={"anneal_from": str(checkpoint), "anneal_steps": 4})


def test_an_anneal_from_a_stableadamw_checkpoint_under_adamw_is_refused_naming_both(tmp_path, roberta_shards,
                                                                                     bpe_tokenizer_dir, vocab_size):
    """Without the check, DeepSpeed died at the first step with `KeyError: 'step'`."""
    checkpoint = stable_checkpoint(tmp_path, roberta_shards, bpe_tokenizer_dir, vocab_size,
                                   "optimizer.name=stableadamw")
    config = anneal_config(tmp_path, roberta_shards, bpe_tokenizer_dir, checkpoint)
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(config)
    (problem,) = err.value.problems
    assert problem.startswith(f"train.anneal_from: checkpoint {checkpoint} was trained with optimizer stableadamw; "
                              "this config says adamw (optimizer.name)")
    assert load_pretrain_config(config, ["optimizer.name=stableadamw"]).optimizer.name == "stableadamw"


def test_an_anneal_refuses_another_architecture_vocabulary_and_shape(tmp_path, roberta_shards, bpe_tokenizer_dir,
                                                                     vocab_size):
    checkpoint = stable_checkpoint(tmp_path, roberta_shards, bpe_tokenizer_dir, vocab_size + 7)
    config = anneal_config(tmp_path, roberta_shards, bpe_tokenizer_dir, checkpoint)
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(config, ["model.hidden_size=128", "model.architecture=roberta-prelayernorm"])
    problems = err.value.problems
    assert any(f"has a vocabulary of {vocab_size + 7} tokens; data.tokenizer {bpe_tokenizer_dir} has {vocab_size}"
               in p for p in problems)
    assert any("holds a roberta model; this config says roberta-prelayernorm (model.architecture)" in p
               for p in problems)
    with pytest.raises(ConfigError, match=r"has hidden_size 64; this config says 128 \(model\.hidden_size\)"):
        load_pretrain_config(config, ["model.hidden_size=128"])


def test_a_resume_checks_the_runs_own_newest_checkpoint_and_points_at_another_output_dir(
        tmp_path, roberta_shards, bpe_tokenizer_dir, vocab_size):
    config = write_config(tmp_path, roberta_shards, bpe_tokenizer_dir)
    ran = load_pretrain_config(config, ["optimizer.name=lamb"])
    older = fake_checkpoint(ran.layout.checkpoints / "step_00000002", ran, vocab_size)
    newest = fake_checkpoint(ran.layout.checkpoints / "step_00000004", ran, vocab_size)
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(config)  # optimizer.name adamw now
    (problem,) = err.value.problems
    assert problem.startswith(f"checkpoint.resume auto: this run's checkpoint {newest} was trained with optimizer "
                              "lamb; this config says adamw (optimizer.name)")
    assert "another train.output_dir" in problem
    # A marker that does not read is set aside by the checkpointer, so the resume starts from the one before it.
    (newest / "complete.json").write_text("{")
    with pytest.raises(ConfigError, match=f"this run's checkpoint {older} was trained with optimizer lamb"):
        load_pretrain_config(config)
    assert load_pretrain_config(config, ["checkpoint.resume=never"]).optimizer.name == "adamw"
    assert load_pretrain_config(config, ["optimizer.name=lamb"]).optimizer.name == "lamb"


def test_a_checkpoint_from_before_the_marker_recorded_the_config_is_not_refused(tmp_path, roberta_shards,
                                                                                bpe_tokenizer_dir):
    config = write_config(tmp_path, roberta_shards, bpe_tokenizer_dir)
    folder = tmp_path / "run" / "checkpoints" / "step_00000004"
    folder.mkdir(parents=True)
    (folder / "complete.json").write_text(json.dumps({"step": 4}))
    assert load_pretrain_config(config).checkpoint.resume == "auto"


def test_the_command_refuses_the_anneal_before_any_process_group_with_no_traceback(tmp_path, roberta_shards,
                                                                                  bpe_tokenizer_dir, vocab_size):
    from helpers import run_script

    checkpoint = stable_checkpoint(tmp_path, roberta_shards, bpe_tokenizer_dir, vocab_size,
                                   "optimizer.name=stableadamw")
    config = write_config(tmp_path, roberta_shards, bpe_tokenizer_dir)
    proc = run_script("launchers/pretrain.py", "--config", config, "--anneal-from", checkpoint, "--anneal-steps", "4")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "was trained with optimizer stableadamw; this config says adamw (optimizer.name)" in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing started: no run folder
