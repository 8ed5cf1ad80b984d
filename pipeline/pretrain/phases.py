"""Training phases: which steps run on which shard folder, at which batch, LR peak and warmup.

BERT (Devlin et al. 2019) and NVIDIA's recipe train 90% of the steps at 128 tokens and the last
10% at 512, since attention's cost grows with the square of the length. A config lists them in
`phases`; without it the run is one phase made of `data`, `train`, `optimizer` and `schedule`.

Phase k covers the optimizer steps [start, end), where end = ⌊F_k · train.max_steps⌋ and F_k is
the sum of the first k + 1 `steps_fraction`s, read as the decimals the user wrote (0.9 + 0.1 is
exactly 1), so the last phase ends at `train.max_steps`. The step counter runs on across phases;
each phase warms up to its own peak and decays over its own steps (NVIDIA's `--phase2`, bing_bert's
`--rewarmup`; schedules.py, which counts optimizer steps whatever the batch). Under WSD
`phases[i].decay_steps: 0` holds a phase at its peak, so ModernBERT's stable, context-extension and
decay phases are three phases. A ModernBERT phase may raise the rotary bases with its longer shards; a
phase that names none keeps the previous phase's (rope.py applies them).

A stretch is a phase at one global batch: a phase, or under a batch warmup (`batch_plan.batch_ramp`)
each step range of one batch of the ramp. Each has its own batch plan and data stream, and the loop
hands over from one to the next. A stretch that reads the same folder as an earlier one continues
that folder's stream: it starts at the epoch and position the earlier one stopped at, rounded up to
a whole batch of its own (`stream_start`), rather than at sample 0. Masks are keyed by (epoch,
sequence), so they stay the ones the uninterrupted stream would use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

from pipeline.pretrain.batch_plan import BatchPlan, batch_ramp
from pipeline.pretrain.config import DataConfig, PretrainConfig


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
    """`data` with this phase's shard folder."""
    global_batch_size: int
    """The phase's global batch (a batch warmup ramps up to it, `Stretch`)."""
    micro_batch_size: int
    lr: float
    warmup_steps: int
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


@dataclass(frozen=True, kw_only=True)
class Stretch:
    """Optimizer steps [start, end) of one phase at one global batch: what one data stream and batch plan serve."""

    index: int
    start: int
    end: int
    phase: Phase
    global_batch_size: int

    @property
    def steps(self) -> int:
        return self.end - self.start

    def plan(self, world_size: int) -> BatchPlan:
        return self.phase.plan(world_size, self.global_batch_size)


def phase_ends(fractions: list[float], max_steps: int) -> list[int]:
    """Each phase's end step: ⌊cumulative fraction × max_steps⌋, the fractions read as written decimals."""
    ends, total = [], Fraction(0)
    for fraction in fractions:
        total += Fraction(repr(float(fraction)))
        ends.append(math.floor(total * max_steps))
    return ends


def resolve_phases(config: PretrainConfig) -> list[Phase]:
    """The run's phases; one phase of the whole run when the config lists none."""
    t, o, s, m = config.train, config.optimizer, config.schedule, config.model
    theta = (m.global_rope_theta, m.local_rope_theta) if m.architecture == "modernbert" else (None, None)
    if not config.phases:
        return [Phase(index=0, name="", start=0, end=t.max_steps, data=config.data,
                      global_batch_size=t.global_batch_size, micro_batch_size=t.micro_batch_size, lr=o.lr,
                      warmup_steps=s.warmup_steps, global_rope_theta=theta[0], local_rope_theta=theta[1])]
    phases, start = [], 0
    for i, (p, end) in enumerate(zip(config.phases, phase_ends([p.steps_fraction for p in config.phases],
                                                               t.max_steps), strict=True)):
        if theta[0] is not None:  # a phase that names no base keeps the previous phase's
            theta = (theta[0] if p.global_rope_theta is None else p.global_rope_theta,
                     theta[1] if p.local_rope_theta is None else p.local_rope_theta)
        phases.append(Phase(
            index=i, name=p.name, start=start, end=end, data=replace(config.data, shards=p.shards),
            global_batch_size=t.global_batch_size if p.global_batch_size is None else p.global_batch_size,
            micro_batch_size=t.micro_batch_size if p.micro_batch_size is None else p.micro_batch_size,
            lr=o.lr if p.lr is None else p.lr,
            warmup_steps=s.warmup_steps if p.warmup_steps is None else p.warmup_steps, seq_len=p.seq_len,
            decay_steps=p.decay_steps, global_rope_theta=theta[0], local_rope_theta=theta[1]))
        start = end
    return phases


def resolve_stretches(config: PretrainConfig, phases: list[Phase], end: int) -> list[Stretch]:
    """The run's stretches up to step `end`: one per phase, or one per global batch of a batch warmup (one phase,
    one folder: config.py checks) over `train.max_steps`. `end` past it (an anneal) lengthens the last stretch."""
    t = config.train
    if t.batch_warmup_tokens:
        from pipeline.data.shard_index import load_index

        seq_len = load_index(config.data.shards)["seq_len"]
        ramp = batch_ramp(t.global_batch_size, t.batch_warmup_start or t.micro_batch_size, t.batch_warmup_tokens,
                          seq_len, t.max_steps)
        spans = [(r.start, r.end, phases[0], r.global_batch_size) for r in ramp]
    else:
        spans = [(p.start, p.end, p, p.global_batch_size) for p in phases]
    kept = [span for span in spans if span[0] < end]
    kept[-1] = (kept[-1][0], end, *kept[-1][2:])
    return [Stretch(index=i, start=a, end=b, phase=p, global_batch_size=g) for i, (a, b, p, g) in enumerate(kept)]


def stretch_at(stretches: list[Stretch], step: int) -> Stretch:
    """The stretch that trains optimizer step `step` (0-based); past the end, the last one."""
    return next((s for s in stretches if s.start <= step < s.end), stretches[-1])


def samples_consumed(stretches: list[Stretch], step: int) -> int:
    """Training sequences drawn by the first `step` optimizer steps, each stretch at its own global batch."""
    return sum(s.global_batch_size * (min(step, s.end) - s.start) for s in stretches if s.start < step)


def longest_seq_len(phases: list[Phase]) -> int:
    """The longest sequence any phase trains on, from the shard indexes: what position embeddings are sized for."""
    from pipeline.data.shard_index import load_index

    return max(load_index(s.path)["seq_len"] for p in phases for s in p.data.corpora())


def stream_start(stretches: list[Stretch], k: int, num_sequences: int) -> int:
    """The step of stretch k's own shuffle order (`batches.GlobalShuffle` at its global batch) it starts at.

    0 for a stretch whose folder no earlier stretch read. Otherwise the position where the last
    such stretch stopped: the same epoch (so the same permutation), at the first whole batch of
    stretch k's size not before the samples already drawn. Nothing is repeated, and at most one
    batch minus one sample is skipped per hand-over.
    """
    def folder(s: Stretch) -> Path | None:  # a mix of corpora has no one stream to continue
        return None if s.phase.data.mixed else Path(s.phase.data.shards).resolve()

    epoch, position = 0, 0  # where the folder's stream stands: epoch, samples into its permutation
    earlier = [s for s in stretches[:k] if folder(s) is not None and folder(s) == folder(stretches[k])]
    for stretch in earlier + [stretches[k]]:
        per_epoch = num_sequences // stretch.global_batch_size
        first = epoch * per_epoch + math.ceil(position / stretch.global_batch_size)
        if stretch is stretches[k]:
            return first
        epoch, within = divmod(first + stretch.steps, per_epoch)
        position = within * stretch.global_batch_size
    raise AssertionError("unreachable: the loop returns at stretch k")
