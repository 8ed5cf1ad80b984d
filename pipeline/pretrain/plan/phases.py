"""Training phases: which steps run on which data, at which batch, LR peak, warmup and masking rate.

BERT (Devlin et al. 2019) and NVIDIA's recipe train 90% of the steps at 128 tokens and the last
10% at 512, since attention's cost grows with the square of the length; mmBERT's three phases lower
the masking rate (30% → 15% → 5%) and flatten the language mix (sampling temperature 0.7 → 0.5 →
0.3). A config lists them in `phases`; without it the run is one phase made of `data`, `train`,
`optimizer`, `masking` and `schedule`.

Phase k covers the optimizer steps [start, end), where end = ⌊F_k · train.max_steps⌋ and F_k is
the sum of the first k + 1 `steps_fraction`s, read as the decimals the user wrote (0.9 + 0.1 is
exactly 1), so the last phase ends at `train.max_steps`. The step counter runs on across phases;
each phase warms up to its own peak and decays over its own steps (NVIDIA's `--phase2`, bing_bert's
`--rewarmup`; schedules.py, which counts optimizer steps whatever the batch). Under WSD
`phases[i].decay_steps: 0` holds a phase at its peak, so ModernBERT's stable, context-extension and
decay phases are three phases. A ModernBERT phase may raise the rotary bases with its longer shards; a
phase that names none keeps the previous phase's (model.py's `set_rope_theta` applies them). How the
phases' data streams follow each other is the plan's (plan.py, stream.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.pretrain.config import DataConfig, PhaseConfig, PretrainConfig


@dataclass(frozen=True, kw_only=True)
class Phase:
    """One configured phase (or the whole run, when the config lists none) with every default filled in."""

    index: int
    name: str
    start: int
    """First optimizer step (0-based) of the phase."""
    end: int
    """One past the phase's last step."""
    data: DataConfig
    """`data` with this phase's shard folder or mix (and its sampling temperature)."""
    global_batch_size: int
    """The phase's global batch (a batch warmup ramps up to it, `Stretch`)."""
    micro_batch_size: int
    lr: float
    warmup_steps: int
    masking_probability: float
    """The phase's masking rate (the validation rate stays `masking.eval_probability`, so losses compare)."""
    seq_len: int | None = None
    """The sequence length the config says the phase's shards hold (None: not stated)."""
    decay_steps: int | None = None
    """schedule.kind wsd: the phase's own decay length (None: the schedule's, schedules.py)."""
    global_rope_theta: float | None = None
    """modernbert: the global layers' rotary base in this phase (None: other architectures)."""
    local_rope_theta: float | None = None
    """modernbert: the local layers' rotary base in this phase."""

    @property
    def steps(self) -> int:
        return self.end - self.start

    def plan(self, world_size: int, global_batch_size: int | None = None) -> BatchPlan:
        """The phase's batch plan; `global_batch_size` replaces the phase's own (a batch warmup's stretch)."""
        key = f"phases[{self.index}]"
        return BatchPlan.derive(global_batch_size or self.global_batch_size, self.micro_batch_size, world_size,
                                keys=(f"{key}.global_batch_size", f"{key}.micro_batch_size"))


def phase_ends(fractions: list[float], max_steps: int) -> list[int]:
    """Each phase's end step: ⌊cumulative fraction × max_steps⌋, the fractions read as written decimals."""
    ends, total = [], Fraction(0)
    for fraction in fractions:
        total += Fraction(repr(float(fraction)))
        ends.append(math.floor(total * max_steps))
    return ends


def resolve_phases(config: PretrainConfig) -> list[Phase]:
    """The run's phases; without `phases`, one phase of the whole run made of `data` and the other sections."""
    t, o, s, m = config.train, config.optimizer, config.schedule, config.model
    written = config.phases or [PhaseConfig(steps_fraction=1.0, shards=config.data.shards,
                                            mix_temperature=config.data.mix_temperature)]
    theta = (m.global_rope_theta, m.local_rope_theta) if m.architecture == "modernbert" else (None, None)
    phases, start = [], 0
    for i, (p, end) in enumerate(zip(written, phase_ends([p.steps_fraction for p in written], t.max_steps),
                                     strict=True)):
        if theta[0] is not None:  # a phase that names no base keeps the previous phase's
            theta = (theta[0] if p.global_rope_theta is None else p.global_rope_theta,
                     theta[1] if p.local_rope_theta is None else p.local_rope_theta)
        phases.append(Phase(
            index=i, name=p.name, start=start, end=end,
            data=replace(config.data, shards=p.shards, mix_temperature=p.mix_temperature),
            global_batch_size=t.global_batch_size if p.global_batch_size is None else p.global_batch_size,
            micro_batch_size=t.micro_batch_size if p.micro_batch_size is None else p.micro_batch_size,
            lr=o.lr if p.lr is None else p.lr,
            warmup_steps=s.warmup_steps if p.warmup_steps is None else p.warmup_steps, seq_len=p.seq_len,
            masking_probability=p.masking_probability or config.masking.probability,
            decay_steps=p.decay_steps, global_rope_theta=theta[0], local_rope_theta=theta[1]))
        start = end
    return phases
