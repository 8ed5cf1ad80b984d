"""The faster step's options: train.compile, optimizer.fused (on by default), and losses kept on the device between
checks."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import PYTHON, ROOT, tiny_pretrain_config

from pipeline.common.config.tree import ConfigError
from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.common.run_layout import PretrainLayout
from pipeline.pretrain.preflight import load_pretrain_config
from pipeline.pretrain.step.engine import deepspeed_config

ENV = {**os.environ, "DS_ACCELERATOR": "cpu"}  # one OpenMP thread, as tests/conftest.py sets


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_compile_and_fused_are_checked_up_front(tmp_path):
    import torch._inductor.config

    data = tiny_pretrain_config(tmp_path / "missing", tmp_path / "tok", tmp_path / "out",
                                train={"compile": True, "zero_stage": 3}, optimizer={"name": "lamb", "fused": True})
    # inductor's own patch: a monkeypatched config attribute is not put back as inductor keeps it
    with torch._inductor.config.patch({"cpp.cxx": ("no-such-c++-compiler",)}), pytest.raises(ConfigError) as err:
        load_pretrain_config(write(tmp_path / "c.json", data), cuda=False)
    message = str(err.value)
    assert "train.compile with train.zero_stage 3: not supported" in message
    assert "torch.compile on CPU needs a C++ compiler" in message
    assert "optimizer.fused: only for optimizer.name adamw, got lamb" in message


def test_compile_is_on_by_default_where_a_gpu_can_compile_and_off_on_cpu(monkeypatch):
    from pipeline.pretrain.config import TrainConfig
    from pipeline.pretrain.step.compile_blocks import compiles

    monkeypatch.setattr("torch.utils._triton.has_triton", lambda: True)
    assert TrainConfig().compile == "auto"
    assert compiles(TrainConfig(), cuda=True) and not compiles(TrainConfig(), cuda=False)
    assert not compiles(TrainConfig(zero_stage=3), cuda=True)  # ZeRO-3's hooks are not traced
    assert not compiles(TrainConfig(compile=False), cuda=True) and compiles(TrainConfig(compile=True), cuda=False)
    monkeypatch.setattr("torch.utils._triton.has_triton", lambda: False)
    assert not compiles(TrainConfig(), cuda=True)  # a GPU without Triton trains eager rather than failing


def test_compile_compiles_each_block_and_identical_blocks_share_one_graph():
    import torch
    from torch._dynamo.utils import counters
    from transformers import AutoModelForMaskedLM, RobertaConfig

    from pipeline.pretrain.step.compile_blocks import compile_blocks, repeated_blocks

    torch._dynamo.reset()
    counters.clear()
    model = AutoModelForMaskedLM.from_config(RobertaConfig(
        vocab_size=100, num_hidden_layers=4, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=40))
    assert repeated_blocks(model) == list(model.roberta.encoder.layer)
    assert compile_blocks(model) == 4
    keys = set(model.state_dict())
    ids = torch.randint(5, 100, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    assert counters["stats"]["unique_graphs"] == 1  # four layers, one compiled graph
    assert set(model.state_dict()) == keys and not any("_orig_mod" in k for k in keys)


def test_adamw_is_torchs_fused_kernel_unless_turned_off_or_offloaded(tmp_path, roberta_shards, bpe_tokenizer_dir):
    data = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "out")
    config = load_pretrain_config(write(tmp_path / "c.json", data))
    params = deepspeed_config(config, BatchPlan.derive(16, 4, 1))["optimizer"]["params"]
    assert params["fused"] is True and params["torch_adam"] is True  # DeepSpeed passes `fused` to torch's AdamW
    data["optimizer"]["fused"] = False
    config = load_pretrain_config(write(tmp_path / "c.json", data))
    assert "fused" not in deepspeed_config(config, BatchPlan.derive(16, 4, 1))["optimizer"]["params"]
    # DeepSpeed's own fp16 (ZeRO 1-3) keeps the unfused kernel unless asked (engine.py says why).
    data["optimizer"].pop("fused")
    data["train"].update(precision="fp16", zero_stage=1)
    config = load_pretrain_config(write(tmp_path / "c.json", data), cuda=True)
    assert "fused" not in deepspeed_config(config, BatchPlan.derive(16, 4, 1))["optimizer"]["params"]
    data["train"]["precision"] = "fp32"
    # Offloaded optimizer states use DeepSpeed's CPU Adam, which takes no `fused`.
    data["train"]["zero_stage"] = 2
    data["deepspeed"] = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    config = load_pretrain_config(write(tmp_path / "c.json", data))
    assert "fused" not in deepspeed_config(config, BatchPlan.derive(16, 4, 1))["optimizer"]["params"]


def test_losses_stay_on_the_device_until_a_check_and_a_nan_anywhere_in_the_window_is_seen(tmp_path, monkeypatch):
    import torch.distributed as dist

    from pipeline.common.processes.topology import free_port
    from pipeline.pretrain.step.step_sync import StepSync

    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        sync = StepSync(world_size=1)
        t = torch.tensor
        sync.record(1, [t(1.0), t(3.0)], {"mlm_loss": [t(1.0), t(1.0)]}, tokens=100)
        sync.record(2, [t(float("nan"))], {"mlm_loss": [t(0.5)]}, tokens=100)
        sync.record(3, [t(4.0)], {"mlm_loss": [t(0.25)]}, tokens=50)
        assert sync.stop_requested(True) and not sync.stop_requested(False)
        checked = sync.check()
        assert (checked.loss, checked.extras, checked.first_step, checked.tokens) == (4.0, {"mlm_loss": 0.25}, 1, 250)
        assert math.isnan(checked.window_loss)  # step 2's NaN is not lost behind step 3's finite loss
        sync.record(4, [t(1.0)], {"mlm_loss": [t(1.0)]}, tokens=10)
        checked = sync.check()  # a new window
        assert (checked.window_loss, checked.first_step, checked.tokens) == (1.0, 4, 10)
    finally:
        dist.destroy_process_group()


def launch(config: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([PYTHON, "launchers/pretrain.py", "--config", str(config), *extra], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def logged_losses(output_dir: Path) -> dict[int, float]:
    records = map(json.loads, PretrainLayout(output_dir).metrics.read_text().splitlines())
    return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


@pytest.mark.slow
def test_a_compiled_fused_run_matches_the_plain_one_saves_resumes_and_exports(tmp_path, roberta_shards,
                                                                              bpe_tokenizer_dir):
    from transformers import AutoModelForMaskedLM

    # No dropout: inductor draws dropout masks from its own generator, so with dropout a compiled run
    # is a different (equally valid) sample of the trajectory, not the eager one.
    model = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
             "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    common = dict(model=model, data={"num_workers": 0, "cache_dir": str(tmp_path / "cache")})
    plain = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "plain", **common,
                                 train={"max_steps": 4, "export": False})
    launch(write(tmp_path / "plain.json", plain))
    fast = tiny_pretrain_config(roberta_shards, bpe_tokenizer_dir, tmp_path / "fast", **common,
                                train={"max_steps": 2, "compile": True, "log_every": 2},
                                optimizer={"fused": True}, checkpoint={"every": 1})
    launch(write(tmp_path / "fast.json", fast))
    layout = PretrainLayout(tmp_path / "fast")
    states = torch.load(layout.checkpoints / "step_00000002" / "mp_rank_00_model_states.pt", weights_only=False)
    assert not [k for k in states["module"] if "_orig_mod" in k]  # compiled in place: the model's own keys

    resumed = launch(write(tmp_path / "fast.json", fast), "--set", "train.max_steps=4")
    assert "resumed from" in resumed.stdout + resumed.stderr and "step_00000002 (step 2)" in resumed.stdout
    # The same trajectory as the plain run (fused kernels and compiled graphs round differently);
    # log_every 2: losses were only brought to the host at steps 2 and 4.
    fast_losses, plain_losses = logged_losses(tmp_path / "fast"), logged_losses(tmp_path / "plain")
    assert sorted(fast_losses) == [2, 4]
    for step, loss in fast_losses.items():
        assert loss == pytest.approx(plain_losses[step], rel=1e-3)
    exported = AutoModelForMaskedLM.from_pretrained(layout.export).state_dict()
    final = torch.load(layout.checkpoints / "step_00000004" / "mp_rank_00_model_states.pt", weights_only=False)
    assert all(torch.equal(exported[k], v) for k, v in final["module"].items() if k in exported)
    assert len([k for k in final["module"] if k in exported]) >= len(exported) - 1
