"""The pretraining config: presets, overrides, every problem at once (shipped files: test_shipped_configs.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, run_script, tiny_pretrain_config

from pipeline.common.config.tree import ConfigError, apply_overrides, parse_override
from pipeline.common.errors import PipelineError
from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.models.parameter_groups import parameter_groups
from pipeline.pretrain.config import ScheduleConfig
from pipeline.pretrain.plan.schedules import Schedule, segments
from pipeline.pretrain.preflight import load_pretrain_config
from pipeline.pretrain.step.engine import deepspeed_config
from pipeline.pretrain.step.optimizers import Lamb, client_optimizer


def write(tmp_path: Path, data: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def test_shipped_presets_have_the_published_recipes():
    base = load_pretrain_config(ROOT / "configs/base.json", world_size=8, cuda=True, check_files=False)
    assert (base.model.num_hidden_layers, base.model.hidden_size, base.train.global_batch_size) == (12, 768, 8192)
    assert (base.optimizer.lr, base.schedule.warmup_steps, base.train.max_steps) == (6e-4, 24_000, 500_000)
    assert (base.optimizer.betas, base.optimizer.eps, base.optimizer.weight_decay) == ((0.9, 0.98), 1e-6, 0.01)
    assert base.train.precision == "bf16" and base.model.hidden_dropout_prob == 0.1
    large = load_pretrain_config(ROOT / "configs/large.json", world_size=8, cuda=True, check_files=False)
    assert (large.model.num_hidden_layers, large.model.hidden_size, large.train.global_batch_size) == (24, 1024, 8192)
    assert (large.optimizer.lr, large.schedule.warmup_steps, large.train.max_steps) == (4e-4, 30_000, 500_000)
    assert large.train.precision == "bf16"
    # fast on a GPU: ZeRO 0 (no DeepSpeed wrapper; fp32 masters and moments of 355M parameters are 5.7 GB a GPU),
    # compiled, a micro batch sized to an 80 GB card, the losses brought to the host every 100 steps
    t = large.train
    assert (t.zero_stage, t.compile, t.micro_batch_size, t.log_every) == (0, "auto", 64, 100)
    bert = load_pretrain_config(ROOT / "configs/bert-base.json", world_size=8, cuda=True, check_files=False)
    assert bert.model.architecture == "bert"
    # NVIDIA's BERT-large phase 1: 64k sequences of 128 per step, LAMB at 6e-3, 7,038 steps, 28.43% warmup,
    # polynomial decay of power 0.5; 8 GPUs × 64 × accumulation 128 as in their script.
    lamb = load_pretrain_config(ROOT / "configs/bert-large-lamb.json", world_size=8, cuda=True, check_files=False)
    assert (lamb.optimizer.name, lamb.optimizer.lr, lamb.optimizer.betas) == ("lamb", 6e-3, (0.9, 0.999))
    assert (lamb.train.global_batch_size, lamb.train.max_steps, lamb.schedule.warmup_steps) == (65_536, 7038, 2000)
    assert BatchPlan.derive(65_536, lamb.train.micro_batch_size, 8).accumulation == 128
    assert (lamb.model.num_hidden_layers, lamb.model.hidden_size, lamb.schedule.power) == (24, 1024, 0.5)
    assert lamb.train.zero_stage == 0  # keeps LAMB's trust ratio per layer (see the README's optimizer section)


def test_set_overrides_parse_json_values_else_strings():
    assert parse_override("train.max_steps=100") == (["train", "max_steps"], 100, False)
    assert parse_override("optimizer.betas=[0.9,0.95]") == (["optimizer", "betas"], [0.9, 0.95], False)
    assert parse_override("data.shards=/data/shards") == (["data", "shards"], "/data/shards", False)
    data = apply_overrides({"train": {}}, ["train.zero_stage=3", "deepspeed.bf16.immediate_grad_update=true"])
    assert data == {"train": {"zero_stage": 3}, "deepspeed": {"bf16": {"immediate_grad_update": True}}}
    with pytest.raises(PipelineError, match="section.key=value"):
        parse_override("no-equals-sign")


def test_a_plus_equals_override_adds_its_items_to_the_list_the_config_holds():
    """What `--skip-steps` passes: the config's own ranges stay, the new ones follow."""
    data = {"train": {"skip_steps": ["3:4"]}}
    assert apply_overrides(data, ['train.skip_steps+=["9:9", "12:13"]']) == {"train": {"skip_steps": ["3:4", "9:9",
                                                                                                    "12:13"]}}
    assert apply_overrides({}, ['train.skip_steps+=["9:9"]']) == {"train": {"skip_steps": ["9:9"]}}
    with pytest.raises(PipelineError, match="adds a JSON list"):
        apply_overrides(data, ["train.skip_steps+=9:9"])
    with pytest.raises(PipelineError, match="train.max_steps is 100, not a list"):
        apply_overrides({"train": {"max_steps": 100}}, ['train.max_steps+=["9:9"]'])


def test_unknown_keys_wrong_types_and_cross_field_problems_come_in_one_error(tmp_path):
    data = tiny_pretrain_config(tmp_path / "missing-shards", tmp_path / "tok", tmp_path / "out")
    data["model"]["hidden_sise"] = 64                       # unknown key
    data["train"]["max_steps"] = "many"                     # wrong type
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(path, world_size=1)
    message = str(err.value)
    assert "model.hidden_sise: unknown key" in message and "train.max_steps: expected an integer" in message

    data = tiny_pretrain_config(tmp_path / "missing-shards", tmp_path / "tok", tmp_path / "out")
    data["model"]["num_attention_heads"] = 5                # 64 is not divisible by 5
    data["train"]["global_batch_size"] = 18                 # not divisible by 4 × 2 ranks
    data["deepspeed"] = {"train_batch_size": 18}            # owned by the pipeline
    data["train"]["precision"] = "fp16"                     # no GPU
    data["masking"] = {"probability": 1.5}
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(write(tmp_path, data), world_size=2, cuda=False)
    problems = err.value.problems
    assert any("hidden_size 64 is not divisible by model.num_attention_heads 5" in p for p in problems)
    assert any("global_batch_size 18 is not divisible by train.micro_batch_size 4 × world size 2 = 8" in p
               for p in problems)
    assert any("deepspeed.train_batch_size: derived by the pipeline" in p for p in problems)
    assert any("fp16 needs a GPU" in p for p in problems)
    assert any("masking.probability" in p for p in problems)
    assert any("data.shards" in p for p in problems)
    assert len(problems) >= 6


def test_fp16_at_zero_0_takes_the_grad_scalers_keys_and_autocast_is_the_pipelines(tmp_path):
    data = tiny_pretrain_config(tmp_path / "missing-shards", tmp_path / "tok", tmp_path / "out",
                                train={"precision": "fp16"},
                                deepspeed={"fp16": {"initial_scale_power": 8, "loss_scale_window": 500,
                                                    "hysteresis": 4},
                                           "torch_autocast": {"enabled": True}})
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(write(tmp_path, data), check_files=False, cuda=True)
    problems = err.value.problems
    assert [p for p in problems if p.startswith("deepspeed.fp16.")] == [
        "deepspeed.fp16.hysteresis: not applied at ZeRO 0, where fp16 scales the loss with torch's GradScaler, which "
        "takes initial_scale_power and loss_scale_window; leave it out, or use train.zero_stage ≥ 1 for DeepSpeed's "
        "own loss scaling"]
    assert any(p.startswith("deepspeed.torch_autocast: derived by the pipeline; set train.precision") for p in problems)
    data["train"]["zero_stage"] = 1  # DeepSpeed's own fp16 takes every key of its section
    del data["deepspeed"]["torch_autocast"]
    load_pretrain_config(write(tmp_path, data), check_files=False, cuda=True)


def test_precision_and_zero_stage_are_typed_keys_and_old_spellings_say_the_new_ones(tmp_path):
    data = tiny_pretrain_config(tmp_path / "missing-shards", tmp_path / "tok", tmp_path / "out",
                                deepspeed={"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(write(tmp_path, data), check_files=False)
    message = str(err.value)
    assert 'deepspeed.bf16.enabled: precision is a typed key now; write train.precision: "bf16"' in message
    assert "deepspeed.zero_optimization.stage: the ZeRO stage is a typed key now; write train.zero_stage: 2" in message
    data = tiny_pretrain_config(tmp_path / "missing-shards", tmp_path / "tok", tmp_path / "out",
                                train={"precision": "bf16 ", "zero_stage": 4})
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(write(tmp_path, data), check_files=False)
    assert 'train.precision: expected one of "fp32", "bf16", "fp16"' in str(err.value)
    assert "train.zero_stage: expected one of 0, 1, 2, 3" in str(err.value)


def test_the_deepspeed_section_is_checked_against_deepspeeds_own_config_models(tmp_path):
    data = tiny_pretrain_config(tmp_path / "missing-shards", tmp_path / "tok", tmp_path / "out",
                                deepspeed={"zero_optimisation": {"overlap_comm": True},  # a typo DeepSpeed ignores
                                           "zero_optimization": {"offload_optimiser": {"device": "cpu"}},
                                           "activation_checkpointing": {"partition_activations": False}})
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(write(tmp_path, data), check_files=False)
    problems = err.value.problems
    assert any(p.startswith("deepspeed.zero_optimisation: not a DeepSpeed config key (did you mean zero_optimization?)")
               for p in problems)
    assert any(p.startswith("deepspeed.zero_optimization.offload_optimiser: Extra inputs are not permitted")
               for p in problems)
    assert not any("activation_checkpointing" in p for p in problems)  # a real DeepSpeed key passes


def test_shards_made_with_another_tokenizer_are_refused(tmp_path, roberta_shards, wordpiece_tokenizer_dir):
    path = write(tmp_path, tiny_pretrain_config(roberta_shards, wordpiece_tokenizer_dir, tmp_path / "out"))
    with pytest.raises(ConfigError, match="is not the tokenizer data.shards"):
        load_pretrain_config(path)


def test_bert_with_next_sentence_prediction_needs_pairs_shards(tmp_path, roberta_shards, bpe_tokenizer_dir):
    data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "out", model={"architecture": "bert"})
    with pytest.raises(ConfigError, match="--pack pairs.*or set model.next_sentence_loss false"):
        load_pretrain_config(write(tmp_path, data))


def test_bert_without_next_sentence_prediction_accepts_full_shards(tmp_path, roberta_shards, bpe_tokenizer_dir):
    data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "out",
                                model={"architecture": "bert", "next_sentence_loss": False})
    assert load_pretrain_config(write(tmp_path, data)).model.next_sentence_loss is False


def test_next_sentence_loss_off_is_for_bert_only(tmp_path, roberta_shards, bpe_tokenizer_dir):
    data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "out",
                                model={"next_sentence_loss": False})
    with pytest.raises(ConfigError, match="model.next_sentence_loss: false applies to model.architecture bert"):
        load_pretrain_config(write(tmp_path, data))


def test_cli_reports_config_problems_before_starting_anything(tmp_path):
    path = write(tmp_path, {"model": {"layers": 2}, "train": {"global_batch_size": 10, "micro_batch_size": 4}})
    proc = run_script("launchers/pretrain.py", "--config", path, "--set", "optimizer.lr=-1")
    assert proc.returncode == 2
    assert "model.layers: unknown key" in proc.stderr and "optimizer.lr: must be > 0" in proc.stderr
    assert "global_batch_size 10 is not divisible" in proc.stderr and "Traceback" not in proc.stderr
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"train": {"max_steps": 10,}}')
    proc = run_script("launchers/pretrain.py", "--config", bad_json)
    assert proc.returncode == 2 and "line 1 column" in proc.stderr


def test_gradient_accumulation_is_derived_from_the_world_size():
    assert BatchPlan.derive(8192, 32, 8).accumulation == 32
    assert BatchPlan.derive(8192, 32, 256).accumulation == 1
    with pytest.raises(PipelineError, match="8192 is not divisible by .* 96 × world size 1"):
        BatchPlan.derive(8192, 96, 1)


def test_deepspeed_receives_the_derived_sizes_and_the_users_own_keys(tmp_path, roberta_shards, bpe_tokenizer_dir):
    data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "out",
                                train={"zero_stage": 3, "precision": "bf16"},
                                deepspeed={"zero_optimization": {"overlap_comm": True}})
    config = load_pretrain_config(write(tmp_path, data), world_size=2)
    ds = deepspeed_config(config, BatchPlan.derive(16, 4, 2))
    sizes = ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
    assert sizes == (16, 4, 2)
    assert ds["zero_optimization"] == {"overlap_comm": True, "stage": 3}
    assert ds["bf16"]["enabled"] is True and ds["fp16"] == {"enabled": False}
    assert ds["optimizer"]["params"]["betas"] == [0.9, 0.98]


def test_schedule_warms_up_linearly_then_decays_to_the_end_ratio():
    schedule = ScheduleConfig(warmup_steps=4, decay="linear", end_lr_ratio=0.1)
    lrs = [Schedule(segments(schedule, start=0, end=14, warmup=4)).multiplier(step) for step in range(15)]
    assert lrs[:4] == [0.2, 0.4, 0.6, 0.8] and lrs[4] == 1.0
    assert lrs[14] == pytest.approx(0.1) and all(a >= b for a, b in zip(lrs[4:], lrs[5:], strict=False))
    poly = ScheduleConfig(warmup_steps=0, decay="polynomial", power=2.0)
    assert Schedule(segments(poly, start=0, end=10, warmup=0)).multiplier(5) == pytest.approx(0.25)


def test_lamb_is_ours_on_every_device_handed_to_deepspeed_as_a_client_optimizer(tmp_path, roberta_shards,
                                                                                   bpe_tokenizer_dir):
    from pipeline.data.tokenizer import TokenizerInfo
    from pipeline.models.architectures.hf_model import build_model

    data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "out", optimizer={"name": "lamb"},
                                train={"zero_stage": 2})
    config = load_pretrain_config(write(tmp_path, data), world_size=2)
    plan = BatchPlan.derive(16, 4, 2)
    ds = deepspeed_config(config, plan)
    assert "optimizer" not in ds and ds["zero_allow_untested_optimizer"] is True  # ZeRO refuses untested ones

    model = build_model(config.model, TokenizerInfo("t", "sha256:0", 400, 0, 2, 1, 4, "{}"), seq_len=64)
    ours = client_optimizer(parameter_groups(model, config.optimizer.weight_decay), config)
    assert isinstance(ours, Lamb) and ours.defaults["bias_correction"] is True
    assert [g["weight_decay"] for g in ours.param_groups] == [0.01, 0.0]  # no trust ratio where it is 0

    zero0 = load_pretrain_config(write(tmp_path, {**data, "train": {**data["train"], "zero_stage": 0}}), world_size=2)
    assert "zero_allow_untested_optimizer" not in deepspeed_config(zero0, plan)
    adamw = load_pretrain_config(write(tmp_path, {**data, "optimizer": {}}), world_size=2)
    assert deepspeed_config(adamw, plan)["optimizer"]["type"] == "AdamW"


def test_span_and_lamb_settings_are_checked_up_front(tmp_path):
    data = tiny_pretrain_config(tmp_path / "missing", tmp_path / "tok", tmp_path / "out",
                                masking={"unit": "span", "probability": 0.85, "span_p": 0.2},
                                optimizer={"name": "lamb"},
                                train={"zero_stage": 2},
                                deepspeed={"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(write(tmp_path, data), cuda=True)
    message = str(err.value)
    assert "masking.probability 0.85 is more than spans of 3.80 words" in message
    assert "DeepSpeed has no CPU Lamb for offloaded optimizer states" in message
    data["masking"] = {"unit": "sentence", "span_max_words": 0}
    with pytest.raises(ConfigError, match='masking.unit: expected one of "token", "word", "span"'):
        load_pretrain_config(write(tmp_path, data), cuda=True)


def test_modernbert_keys_are_checked_and_refused_for_the_other_architectures(tmp_path):
    data = tiny_pretrain_config(tmp_path / "missing-shards", tmp_path / "tok", tmp_path / "out",
                                model={"architecture": "modernbert", "local_attention": 15,
                                       "global_attn_every_n_layers": 0, "local_rope_theta": 1.0,
                                       "type_vocab_size": 2})
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(write(tmp_path, data), check_files=False)
    message = str(err.value)
    assert "model.local_attention: the window must be an even number" in message
    assert "model.global_attn_every_n_layers: must be ≥ 1" in message
    assert "model.local_rope_theta: a rotary base must be > 1" in message
    assert "model.type_vocab_size: modernbert has no segment embeddings" in message
    data = tiny_pretrain_config(tmp_path / "missing-shards", tmp_path / "tok", tmp_path / "out",
                                model={"architecture": "roberta", "local_attention": 64, "classifier_pooling": "cls"})
    with pytest.raises(ConfigError) as err:
        load_pretrain_config(write(tmp_path, data), check_files=False)
    assert "model.local_attention: applies to model.architecture modernbert only" in str(err.value)
    assert "model.classifier_pooling: applies to model.architecture modernbert only" in str(err.value)


def test_modernbert_presets_have_the_published_shape_and_30_percent_masking():
    from pipeline.pretrain.plan.phases import resolve_phases

    base = load_pretrain_config(ROOT / "configs/modernbert-base.json", world_size=8, cuda=True, check_files=False)
    m = base.model
    assert (m.architecture, m.num_hidden_layers, m.hidden_size, m.intermediate_size) == ("modernbert", 22, 768, 1152)
    assert (m.local_attention, m.global_attn_every_n_layers) == (128, 3)
    assert (m.global_rope_theta, m.local_rope_theta) == (160_000.0, 10_000.0)
    assert (base.optimizer.lr, base.optimizer.weight_decay, base.schedule.decay) == (8e-4, 1e-5, "constant")
    # 1.7T tokens at 4,608 × 1,024 (the paper's constant-LR stage), then the 8,192-token phase.
    first, second = resolve_phases(base)
    assert first.steps * 4608 * 1024 == pytest.approx(1.7e12, rel=1e-4) and second.seq_len == 8192
    tiny = load_pretrain_config(ROOT / "configs/modernbert-tiny.json", check_files=False)
    assert base.masking.probability == tiny.masking.probability == 0.3
    assert tiny.model.architecture == "modernbert" and tiny.model.num_hidden_layers == 3  # one global, two local


def test_each_section_checks_its_own_keys_when_built_and_the_top_level_the_rules_between_them():
    """litgpt's and torchtitan's `__post_init__`: a section made in code is checked as one read from a file."""
    from pipeline.common.config.tree import SectionProblems
    from pipeline.pretrain.config import (
        DataConfig,
        ModelConfig,
        OptimizerConfig,
        PhaseConfig,
        PretrainConfig,
        TrainConfig,
    )

    with pytest.raises(SectionProblems, match=r"optimizer\.lr: must be > 0, got -1") as err:
        OptimizerConfig(lr=-1, fused=True, name="lamb")
    assert len(err.value.problems) == 2  # and fused is for adamw only
    with pytest.raises(SectionProblems, match="model.local_attention: applies to model.architecture modernbert only"):
        ModelConfig(local_attention=64)
    with pytest.raises(SectionProblems) as err:
        PretrainConfig(data=DataConfig(tokenizer="tok"), train=TrainConfig(anneal_from="ckpt", anneal_steps=4),
                       phases=[PhaseConfig(name="a", steps_fraction=1.0, shards="s")])
    assert err.value.problems == ["train.anneal_from with phases: annealing runs one decay on one data stream; give "
                                  "the config of the phase to anneal (its shards, batch and LR) without phases"]
    assert PretrainConfig(data=DataConfig(shards="shards", tokenizer="tok")).model.architecture == "roberta"


def test_skip_steps_are_ranges_of_steps_as_the_logs_number_them_and_do_not_overlap():
    from pipeline.common.config.tree import SectionProblems
    from pipeline.pretrain.config import TrainConfig

    assert TrainConfig(skip_steps=[" 11:12", "3 : 5"]).skipped() == (range(2, 5), range(10, 12))
    with pytest.raises(SectionProblems, match=r"train.skip_steps: '5:3' is not a range A:B of steps with 1 ≤ A ≤ B"):
        TrainConfig(skip_steps=["5:3"])
    with pytest.raises(SectionProblems, match=r"train.skip_steps: 3:5 and 5:8 overlap; give them as one range"):
        TrainConfig(skip_steps=["5:8", "3:5"])
