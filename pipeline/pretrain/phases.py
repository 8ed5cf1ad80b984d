"""Training phases: which steps run on which shard folder, at which batch, LR peak and warmup.

BERT (Devlin et al. 2019) and NVIDIA's recipe train 90% of the steps at 128 tokens and the last
10% at 512, since attention's cost grows with the square of the length. A config lists them in
`phases`; without it the run is one phase made of `data`, `train`, `optimizer` and `schedule`,
and every answer here is the one the pipeline gave before phases existed.

Phase k covers the optimizer steps [start, end), where end = ⌊F_k · train.max_steps⌋ and F_k is
the sum of the first k + 1 `steps_fraction`s, read as the decimals the user wrote (0.9 + 0.1 is
exactly 1), so the last phase ends at `train.max_steps`. The step counter runs on across phases;
each phase warms up from its own start to its own peak and decays to `schedule.end_lr_ratio` at
its own end (NVIDIA's `--phase2`, bing_bert's `--rewarmup`). With `schedule.kind: wsd` each phase
holds its peak and decays over its own last `decay_steps`; `phases[i].decay_steps: 0` keeps a phase
at its peak, so ModernBERT's stable, context-extension and decay phases are three phases.

A ModernBERT phase may change the rotary bases (`global_rope_theta`, `local_rope_theta`) with its
longer shards; a phase that names none keeps the previous phase's (rope.py applies them).

A phase that reads the same folder as an earlier one continues that folder's data stream: it
starts at the epoch and position the earlier phase stopped at, rounded up to a whole batch of
its own (`stream_start`), rather than at sample 0. Masks are keyed by (epoch, sequence), so they
stay the ones the uninterrupted stream would use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path

from pipeline.pretrain.batch_plan import BatchPlan, batch_ramp
from pipeline.pretrain.config import DataConfig, PretrainConfig

# `phases` and `train.batch_warmup_*` as written are checked by the config (config.py), their steps and
# batches on a world size by the preflight (preflight.py).


@dataclass(frozen=True)
class Phase:
    """One phase with every default filled in and its steps resolved."""

    index: int
    name: str
    start: int
    """First optimizer step (0-based) of the phase."""
    end: int
    """One past the phase's last step."""
    data: DataConfig
    """`data` with this phase's shard folder."""
    global_batch_size: int
    micro_batch_size: int
    lr: float
    warmup_steps: int
    seq_len: int | None
    """The sequence length the config says the phase's shards hold (None: not stated)."""
    decay_steps: int | None = None
    """schedule.kind wsd: the phase's decay in steps (None for the other kinds)."""
    global_rope_theta: float | None = None
    """modernbert: the global layers' rotary base in this phase (None: other architectures)."""
    local_rope_theta: float | None = None
    """modernbert: the local layers' rotary base in this phase."""
    schedule_span: tuple[int, int] | None = None
    """The steps its LR schedule spans when that differs from [start, end): a batch-warmup segment's run."""

    @property
    def steps(self) -> int:
        return self.end - self.start

    @property
    def schedule_start(self) -> int:
        return self.schedule_span[0] if self.schedule_span else self.start

    @property
    def schedule_steps(self) -> int:
        """Steps of the LR schedule this phase is part of (warmup, then decay to its end)."""
        start, end = self.schedule_span or (self.start, self.end)
        return end - start

    def plan(self, world_size: int) -> BatchPlan:
        key = f"phases[{self.index}]"
        return BatchPlan.derive(self.global_batch_size, self.micro_batch_size, world_size,
                                keys=(f"{key}.global_batch_size", f"{key}.micro_batch_size"))


def phase_ends(fractions: list[float], max_steps: int) -> list[int]:
    """Each phase's end step: ⌊cumulative fraction × max_steps⌋, the fractions read as written decimals."""
    ends, total = [], Fraction(0)
    for fraction in fractions:
        total += Fraction(repr(float(fraction)))
        ends.append(math.floor(total * max_steps))
    return ends


def resolve_phases(config: PretrainConfig) -> list[Phase]:
    """The run's phases; one phase of the whole run when the config lists none."""
    from pipeline.pretrain.schedules import wsd_decay_steps

    t, o, s, m = config.train, config.optimizer, config.schedule, config.model
    wsd = s.kind == "wsd"
    theta = (m.global_rope_theta, m.local_rope_theta) if m.architecture == "modernbert" else (None, None)
    if not config.phases and t.batch_warmup_tokens:
        return batch_warmup_phases(config)
    if not config.phases:
        return [Phase(0, "", 0, t.max_steps, config.data, t.global_batch_size, t.micro_batch_size, o.lr,
                      s.warmup_steps, None, wsd_decay_steps(s, t.max_steps) if wsd else None, *theta)]
    phases, start = [], 0
    for i, (p, end) in enumerate(zip(config.phases, phase_ends([p.steps_fraction for p in config.phases],
                                                               t.max_steps), strict=True)):
        decay = (wsd_decay_steps(s, end - start) if p.decay_steps is None else p.decay_steps) if wsd else None
        if theta[0] is not None:  # a phase that names no base keeps the previous phase's
            theta = (theta[0] if p.global_rope_theta is None else p.global_rope_theta,
                     theta[1] if p.local_rope_theta is None else p.local_rope_theta)
        phases.append(Phase(
            i, p.name, start, end, replace(config.data, shards=p.shards),
            t.global_batch_size if p.global_batch_size is None else p.global_batch_size,
            t.micro_batch_size if p.micro_batch_size is None else p.micro_batch_size,
            o.lr if p.lr is None else p.lr,
            s.warmup_steps if p.warmup_steps is None else p.warmup_steps, p.seq_len, decay, *theta))
        start = end
    return phases


def batch_warmup_phases(config: PretrainConfig) -> list[Phase]:
    """A batch warmup as phases of one LR schedule: one per global batch of `batch_plan.batch_ramp`.

    Each segment continues the shard folder's stream where the previous one stopped (`stream_start`),
    checkpoints record its batch, and a resume picks the segment of its step, as for phases. The LR
    schedule counts optimizer steps over the whole run (`schedule_span`), whatever the batch.
    """
    from pipeline.data.shard_index import load_index

    t, o, s = config.train, config.optimizer, config.schedule
    seq_len = load_index(config.data.shards)["seq_len"]
    ramp = batch_ramp(t.global_batch_size, t.batch_warmup_start or t.micro_batch_size, t.batch_warmup_tokens,
                      seq_len, t.max_steps)
    from pipeline.pretrain.schedules import wsd_decay_steps

    m = config.model
    decay = wsd_decay_steps(s, t.max_steps) if s.kind == "wsd" else None  # one schedule over the whole run
    theta = (m.global_rope_theta, m.local_rope_theta) if m.architecture == "modernbert" else (None, None)
    return [Phase(i, "", r.start, r.end, config.data, r.global_batch_size, t.micro_batch_size, o.lr, s.warmup_steps,
                  None, decay, *theta, schedule_span=(0, t.max_steps)) for i, r in enumerate(ramp)]


def phase_at(phases: list[Phase], step: int) -> Phase:
    """The phase that trains optimizer step `step` (0-based); past the end, the last phase."""
    return next((p for p in phases if p.start <= step < p.end), phases[-1])


def samples_consumed(phases: list[Phase], step: int) -> int:
    """Training sequences drawn by the first `step` optimizer steps, each phase at its own global batch."""
    return sum(p.global_batch_size * (min(step, p.end) - p.start) for p in phases if p.start < step)


def longest_seq_len(phases: list[Phase]) -> int:
    """The longest sequence any phase trains on, from the shard indexes: what position embeddings are sized for."""
    from pipeline.data.shard_index import load_index

    return max(load_index(s.path)["seq_len"] for p in phases for s in p.data.corpora())


def same_folder(a: Phase, b: Phase) -> bool:
    if isinstance(a.data.shards, list) or isinstance(b.data.shards, list):
        return False
    return Path(a.data.shards).resolve() == Path(b.data.shards).resolve()


def stream_start(phases: list[Phase], k: int, num_sequences: int) -> int:
    """The step of phase k's own shuffle order (`batches.GlobalShuffle` at its global batch) it starts at.

    0 for a phase whose folder no earlier phase read. Otherwise the position where the last such
    phase stopped: the same epoch (so the same permutation), at the first whole batch of phase
    k's size not before the samples already drawn. Nothing is repeated, and at most one batch
    minus one sample is skipped per hand-over.
    """
    epoch, position = 0, 0  # where the folder's stream stands: epoch, samples into its permutation
    for phase in [p for p in phases[:k] if same_folder(p, phases[k])] + [phases[k]]:
        per_epoch = num_sequences // phase.global_batch_size
        first = epoch * per_epoch + math.ceil(position / phase.global_batch_size)
        if phase is phases[k]:
            return first
        epoch, within = divmod(first + phase.steps, per_epoch)
        position = within * phase.global_batch_size
    raise AssertionError("unreachable: the loop returns at phase k")
