"""A study's arms as validated pretraining runs at one token budget: steps, warmup and overrides per arm.

The budget is rounded down to a multiple of every arm's tokens per step (their least common
multiple), so all arms train on exactly the same number of tokens:
`steps = tokens ÷ (global batch × sequence length)`. Tokens count sequence slots, padding
included (a `doc` or `pairs` row may end in padding; `full` and `doc-packed` rows have none).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from pipeline.ablation.studies import ArmSpec, Study
from pipeline.common.config.tree import ConfigError
from pipeline.common.errors import PipelineError
from pipeline.pretrain.preflight import load_pretrain_config

EVALS_PER_ARM = 5
"""Validation points per arm for the loss curves (the last is always at the final step)."""


@dataclass(frozen=True)
class ArmPlan:
    name: str
    description: str
    pack: str
    set: dict
    """The arm's own overrides, as the study gives them."""
    global_batch: int
    lr: float
    steps: int
    tokens: int
    warmup_steps: int
    eval_every: int

    def pretrain_overrides(self) -> list[str]:
        """What the runner adds to the study's `--set`s for this arm (not the paths)."""
        return [*ArmSpec(self.name, self.description, self.pack, self.set).overrides(),
                f"train.max_steps={self.steps}", f"schedule.warmup_steps={self.warmup_steps}",
                f"train.eval_every={self.eval_every}"]

    def to_dict(self) -> dict:
        return asdict(self)


def plan_study(study: Study, base_config: str, user_sets: list[str], *, seq_len: int, budget_tokens: int,
               world_size: int) -> list[ArmPlan]:
    """Every arm's steps at the budget, each arm's config checked now: all problems in one ConfigError."""
    placeholders = ["data.shards=<shards>", "data.tokenizer=<tokenizer>"]
    batches, problems = {}, []
    for arm in study.arms:  # first pass: each arm's global batch (and every type or key problem)
        try:
            config = load_pretrain_config(base_config, [*user_sets, *arm.overrides(), *placeholders],
                                          world_size=world_size, check_files=False)
            batches[arm.name] = (config.train.global_batch_size, config.optimizer.lr,
                                 config.schedule.warmup_steps)
        except ConfigError as err:
            problems += [f"arm {arm.name}: {p}" for p in err.problems]
    if problems:
        raise ConfigError(f"study {study.name} on {base_config}", problems)
    unit = math.lcm(*(batch * seq_len for batch, _, _ in batches.values()))
    tokens = budget_tokens // unit * unit
    if tokens == 0:
        raise PipelineError(f"--budget-tokens {budget_tokens:,} is less than one step of every arm at once: the arms "
                            f"of study {study.name} need a multiple of {unit:,} tokens (global batches "
                            f"{sorted({b for b, _, _ in batches.values()})} × sequence length {seq_len})")
    user_warmup = any(s.startswith("schedule.warmup_steps=") for s in user_sets)
    plans = []
    for arm in study.arms:
        batch, lr, warmup = batches[arm.name]
        steps = tokens // (batch * seq_len)
        if not (user_warmup or "schedule.warmup_steps" in arm.set):
            warmup = round(study.warmup_fraction * steps)
        plan = ArmPlan(arm.name, arm.description, arm.pack, dict(arm.set), batch, lr, steps, tokens,
                       min(warmup, steps), max(1, steps // EVALS_PER_ARM))
        try:  # second pass: the cross-field checks that depend on the steps (warmup ≤ steps, …)
            load_pretrain_config(base_config, [*user_sets, *plan.pretrain_overrides(), *placeholders],
                                 world_size=world_size, check_files=False)
        except ConfigError as err:
            problems += [f"arm {arm.name}: {p}" for p in err.problems]
        plans.append(plan)
    if problems:
        raise ConfigError(f"study {study.name} on {base_config}", problems)
    return plans
