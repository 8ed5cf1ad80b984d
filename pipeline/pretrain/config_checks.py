"""Load a pretraining config and check it as a whole: the one place that runs every check.

config.py holds the sections and the cross-field rules that need nothing but the config. The
checks that need another module import the config, never the reverse, and are collected here:

- `schedule`: the decay's kind, shape and length (schedules.py);
- `phases`: each phase's steps, batch, LR, warmup, decay and RoPE theta (phases.py);
- `train.compile`: a C++ compiler on CPU, Triton on GPU, not ZeRO-3 (compilation.py);
- `train.batch_warmup_*`: the ramp's batches (phases.py, batch_plan.py);
- `train.anneal_from`: the checkpoint it names, read only when `check_files` is on (anneal.py);
- the files the config points at: shard indexes, the tokenizer, `model.init_from` (file_checks.py),
  only when `check_files` is on, so a config can be checked where its data does not exist.

Every problem comes back in one ConfigError, naming its keys.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.common.run_kernel import load_config
from pipeline.pretrain.anneal import anneal_problems
from pipeline.pretrain.compilation import compile_problems, inductor_problem
from pipeline.pretrain.config import PretrainConfig, config_problems
from pipeline.pretrain.file_checks import data_problems
from pipeline.pretrain.phases import batch_warmup_problems, phase_problems
from pipeline.pretrain.schedules import schedule_problems


def load_pretrain_config(
    path: str | Path,
    overrides: list[str] = (),
    *,
    world_size: int = 1,
    cuda: bool = False,
    check_files: bool = True,
) -> PretrainConfig:
    """Read, override and validate a pretraining config; all problems come in one ConfigError."""
    return load_config(PretrainConfig, path, overrides, lambda config, typed: pretrain_config_problems(
        config, world_size=world_size, cuda=cuda, check_files=check_files and typed))


def pretrain_config_problems(config: PretrainConfig, *, world_size: int, cuda: bool, check_files: bool) -> list[str]:
    """Every problem of `config`: its cross-field rules, then the checks that need phases, compile or files."""
    problems = []
    if config.phases:
        problems += phase_problems(config, world_size)
    problems += config_problems(config, world_size=world_size, cuda=cuda)
    problems += schedule_problems(config.schedule, config.train.max_steps)
    if config.train.compile:
        problems += compile_problems(config, cuda=cuda)
    problems += batch_warmup_problems(config, world_size)
    problems += anneal_problems(config, check_files=check_files)
    if config.model.attn_implementation == "flex_attention":
        if cuda:  # transformers runs FlexAttention through torch.compile: Triton on GPU
            flex = inductor_problem("model.attn_implementation flex_attention", "model.attn_implementation=sdpa",
                                    cuda=cuda)
            problems += [flex] if flex else []
        else:  # torch 2.13 raises NotImplementedError at the first backward
            problems.append("model.attn_implementation flex_attention: FlexAttention has no backward on CPU, so it "
                            "cannot train there; use sdpa on CPU (packed documents work with it too)")
    if check_files and (config.data.shards or config.phases) and config.data.tokenizer:
        problems += data_problems(config)
    return problems
