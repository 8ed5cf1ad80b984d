"""The run's plan: built once, by the preflight, from the config, the shard indexes and the checkpoint the
run starts from. `--print-config` prints it, the trainer carries it out, every checkpoint records it.

It holds the phases (phases.py); the stretches, each a run of steps that one data stream and one batch
plan serve (a phase, or one batch of a batch warmup); the LR schedule (schedules.py); where the run
starts (its own newest usable checkpoint, an anneal's source, or step 0); the step ranges it skips (the
config's, the start checkpoint's and the run ledger's: run_ledger.py); and each corpus's layout, which fixes
its order (stream.py).

A run that starts from a checkpoint keeps the stream the checkpoint records: the stretches before the
start are the record's, and the config's stretches take over from the start step, each corpus at the
draws the record reached. Where the config's stretch across the start has the batch, shares and corpora
of the recorded stretch the start ends in, that one simply goes on (whatever step it began at: an earlier
resume into an edited mix, say), so an unchanged resume sees exactly the uninterrupted batches; an edited
mix or batch starts a new stretch at the resume step, and nothing is repeated or skipped. A
corpus's recorded layout wins over today's default, so a release that changes the block size leaves a
running job's order alone. A version-1 record kept no stream: the config's own stretches stand in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.common.config.tree import build_config, to_dict
from pipeline.common.errors import PipelineError
from pipeline.common.processes.batch_plan import BatchPlan, RampSegment, batch_ramp
from pipeline.data.epoch_order import CorpusLayout
from pipeline.pretrain.checkpoints.ledger import Ledger
from pipeline.pretrain.checkpoints.record import CheckpointRecord, StartPoint, StretchRecord
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.plan.phases import Phase, resolve_phases
from pipeline.pretrain.plan.schedules import Anneal, Schedule, lr_schedule
from pipeline.pretrain.plan.stream import DataStream, drawn, shares_of


@dataclass(frozen=True, kw_only=True)
class Stretch:
    """Steps [start, end) of one phase at one global batch, drawing `shares` from `corpora`, each of which had
    drawn `first_draws` sequences before `start` (stream.py)."""

    index: int = 0
    start: int
    end: int
    phase: Phase
    global_batch_size: int
    corpora: tuple[CorpusLayout, ...]
    shares: tuple[Fraction, ...]
    first_draws: tuple[int, ...] = ()

    @property
    def seq_len(self) -> int:
        return self.corpora[0].seq_len

    @property
    def keys(self) -> tuple[int, ...]:
        """Its corpora's order keys."""
        return tuple(c.key for c in self.corpora)

    def plan(self, world_size: int) -> BatchPlan:
        return self.phase.plan(world_size, self.global_batch_size)

    def drawn(self, step: int) -> np.ndarray:
        """Each corpus's draws after the run's first `step` steps (its first draws before the stretch)."""
        inside = min(max(step, self.start), self.end) - self.start
        return np.asarray(self.first_draws) + drawn(self.shares, inside * self.global_batch_size)

    def stream(self, seed: int, batch: BatchPlan | None = None) -> DataStream:
        """The stretch's order at `batch` (None: the whole global batch as one micro batch)."""
        batch = batch or BatchPlan(self.global_batch_size, self.global_batch_size, 1, 1)
        return DataStream(self.corpora, batch, seed, shares=self.shares, first_draws=self.first_draws,
                          start=self.start)

    def record(self, step: int) -> StretchRecord:
        """The part of the stretch trained by the first `step` steps, for a checkpoint."""
        return StretchRecord(self.start, min(self.end, step), self.global_batch_size, self.keys, self.shares,
                             self.first_draws, self.phase.name)


@dataclass(frozen=True, kw_only=True)
class RunPlan:
    config: PretrainConfig
    world_size: int
    phases: tuple[Phase, ...]
    stretches: tuple[Stretch, ...]
    """Every stretch from step 0 to the end; those before the start are the recorded history."""
    schedule: Schedule
    end_step: int
    start: StartPoint | None
    anneal_from: StartPoint | None
    """`train.anneal_from`'s checkpoint, the start of an anneal's first session (later ones resume their own)."""
    anneal: Anneal | None
    skipped: tuple[range, ...]
    """0-based step indices whose batches are left out: `train.skip_steps`, those the start's record lists and
    those the run's ledger holds."""
    rolled_back: tuple[Path, ...] = ()
    """This run's checkpoints that trained on a skipped range: set aside at the start, never resumed from."""
    ledger: Ledger
    """The run's ledger as the preflight read it; its skips are among `skipped`, the others are added at the start
    (`unrecorded_skips`)."""
    layouts: dict[str, CorpusLayout]
    """Today's layout of each folder the config names, by path (a restart from another checkpoint rebuilds)."""

    @property
    def start_step(self) -> int:
        return self.start.step if self.start else 0

    @property
    def max_seq_len(self) -> int:
        """The longest sequence any stretch trains on: what position embeddings are sized for."""
        return max(c.seq_len for s in self.stretches for c in s.corpora)

    def stretch_at(self, step: int) -> Stretch:
        """The stretch that trains step `step` (0-based); past the end, the last one."""
        return next((s for s in self.stretches if s.start <= step < s.end), self.stretches[-1])

    def skip_at(self, step: int) -> range | None:
        return next((r for r in self.skipped if step in r), None)

    @property
    def unrecorded_skips(self) -> tuple[range, ...]:
        """Skipped ranges the run's ledger does not hold yet (new ones, or those of a run from before the ledger)."""
        return tuple(r for r in self.skipped if r not in self.ledger.skipped)

    def sequences_seen(self, step: int) -> int:
        """Training sequences drawn by the first `step` steps, skipped ones included."""
        return sum(s.global_batch_size * (min(step, s.end) - s.start) for s in self.stretches if s.start < step)

    def record(self, step: int, hf_config: dict[str, Any]) -> CheckpointRecord:
        """What a checkpoint after `step` steps of a model of `hf_config` records (its files' checksums are added
        when it is saved)."""
        c, last = self.config, self.stretch_at(step - 1)
        used = {c.key: c for s in self.stretches if s.start < step for c in s.corpora}
        return CheckpointRecord(
            step=step, config=to_dict(c), architecture=c.model.architecture, seq_len=last.seq_len,
            zero_stage=c.train.zero_stage, precision=c.train.precision, batch_plan=last.plan(self.world_size),
            hf_config=hf_config, phase=last.phase.name, corpora=tuple(used.values()),
            stretches=tuple(s.record(step) for s in self.stretches if s.start < step),
            skipped=tuple((r.start + 1, r.stop) for r in self.skipped if r.start < step),
            sequences_seen=self.sequences_seen(step))

    def starting_from(self, start: StartPoint | None) -> RunPlan:
        """The same run planned from another start (the checkpointer fell back past a damaged one)."""
        return build_plan(self.config, self.world_size, self.layouts, start, self.rolled_back, self.anneal_from,
                          self.ledger)

    def describe(self) -> dict[str, Any]:
        """The plan as `--print-config` prints it."""
        def stretch(s: Stretch) -> dict[str, Any]:
            trained = s.end > self.start_step
            plan = s.plan(self.world_size) if trained else None
            return {"steps": [s.start, s.end], "phase": s.phase.name, "global_batch_size": s.global_batch_size,
                    "micro_batch_size": plan.micro_batch_size if plan else None,
                    "gradient_accumulation": plan.accumulation if plan else None, "seq_len": s.seq_len,
                    "masking_probability": s.phase.masking_probability,
                    "corpora": {c.name: str(share) for c, share in zip(s.corpora, s.shares, strict=True)},
                    "first_draws": {c.name: n for c, n in zip(s.corpora, s.first_draws, strict=True)},
                    **({} if trained else {"trained_before_the_start": True})}

        return {"config": to_dict(self.config), "world_size": self.world_size, "end_step": self.end_step,
                "start": None if self.start is None else {
                    "checkpoint": str(self.start.checkpoint), "step": self.start.step,
                    "anneal": self.start.anneal, "universal": self.start.universal},
                "skip_steps": [f"{r.start + 1}:{r.stop}" for r in self.skipped],
                "rolled_back": [str(p) for p in self.rolled_back],
                "stretches": [stretch(s) for s in self.stretches],
                "corpora": [{"name": c.name, "path": c.path, "sequences": c.num_sequences,
                             "shards": len(c.shard_sizes), "shards_per_block": c.shards_per_block}
                            for c in {c.key: c for s in self.stretches for c in s.corpora}.values()]}


class PlanError(PipelineError):
    """Problems only the whole plan shows (each naming its key), reported with the preflight's."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def build_plan(config: PretrainConfig, world_size: int, layouts: dict[str, CorpusLayout], start: StartPoint | None,
               rolled_back: tuple[Path, ...] = (), anneal_from: StartPoint | None = None,
               ledger: Ledger | None = None) -> RunPlan:
    """The run's plan; `layouts` are today's of every folder the config names, `ledger` the run's (preflight.py
    reads them)."""
    ledger = ledger if ledger is not None else Ledger(config.layout.ledger)
    phases = resolve_phases(config)
    anneal = None
    if anneal_from is not None:  # its step and its run's schedule fix the decay, whichever session this is
        source, problems = build_config(PretrainConfig, anneal_from.record.config or to_dict(config))
        if problems:
            raise PlanError([f"train.anneal_from: the config recorded in {anneal_from.checkpoint} does not load: "
                             f"{'; '.join(problems)}"])
        anneal = Anneal(anneal_from.step, int(config.train.anneal_steps), source)
    end_step = anneal.start + anneal.steps if anneal else config.train.max_steps
    recorded = {c.key: c for c in start.record.corpora} if start else {}
    kept = {path: dataclasses.replace(recorded.get(c.key, c), name=c.name, path=c.path)  # the recorded block wins
            for path, c in layouts.items()}
    problems: list[str] = []
    spans = [span for span in config_spans(config, phases, kept, problems) if span.start < end_step]
    if problems:
        raise PlanError(problems)
    spans[-1] = dataclasses.replace(spans[-1], end=end_step)  # an anneal runs on past the source run's end
    stretches = _stretches(start, spans, recorded)
    recorded_skips = {range(a - 1, b) for a, b in start.record.skipped} if start and not start.anneal else set()
    skipped = tuple(sorted(set(config.train.skipped()) | recorded_skips | set(ledger.skipped), key=lambda r: r.start))
    problems = [f"train.skip_steps: {r.start + 1}:{r.stop} goes past the run's last step {end_step}"
                for r in skipped if r.stop > end_step]
    if problems:
        raise PlanError(problems)
    schedule = lr_schedule(config, phases, anneal)
    return RunPlan(config=config, world_size=world_size, phases=tuple(phases), stretches=tuple(stretches),
                   schedule=schedule, end_step=end_step, start=start, anneal_from=anneal_from, anneal=anneal,
                   skipped=skipped, rolled_back=rolled_back, ledger=ledger, layouts=layouts)


def config_spans(config: PretrainConfig, phases: list[Phase], layouts: dict[str, CorpusLayout],
                 problems: list[str]) -> list[Stretch]:
    """Each phase, or each batch of a batch warmup, with its corpora and their shares: the stretches as the config
    alone gives them. A corpus whose share is less than one sequence of a global batch is a problem (its per-step
    quota could go negative)."""
    spans = []
    for phase in phases:
        sources = phase.data.corpora()
        corpora = tuple(dataclasses.replace(layouts[s.path], name=s.name) for s in sources)
        if phase.data.mix_temperature is not None:  # p_c ∝ N_c^τ
            shares = shares_of([c.num_sequences ** phase.data.mix_temperature for c in corpora])
        else:
            shares = shares_of([s.weight for s in sources])
        key = f"phases[{phase.index}]" if config.phases else "data"
        for c, share in zip(corpora, shares, strict=True):
            if share * phase.global_batch_size < 1:
                problems.append(f"{key}.shards: {c.name} has a share of {float(share):.3g}, less than one of the "
                                f"{phase.global_batch_size} sequences of a global batch; raise its weight (or the "
                                f"temperature) or the global batch")
        t = config.train
        ramp = [RampSegment(phase.start, phase.end, phase.global_batch_size)]
        if t.batch_warmup_tokens:  # one phase (config.py): a stretch per global batch of the ramp
            ramp = batch_ramp(t.global_batch_size, t.batch_warmup_start or t.micro_batch_size,
                              t.batch_warmup_tokens, corpora[0].seq_len, t.max_steps)
        spans += [Stretch(start=r.start, end=r.end, phase=phase, global_batch_size=r.global_batch_size,
                          corpora=corpora, shares=shares) for r in ramp]
    return spans


def _stretches(start: StartPoint | None, spans: list[Stretch], recorded: dict[int, CorpusLayout]) -> list[Stretch]:
    """Every stretch of the run: before the start, the record's; from it, the config's `spans`. A version-1 record
    kept no stream: the config's own stretches stand in for its history."""
    history, cut = [], 0
    if start is not None and start.record.stretches:
        cut = start.step
        history = [Stretch(index=i, start=r.start, end=min(r.end, cut),
                           phase=next((s.phase for s in spans if s.start <= r.start < s.end), spans[-1].phase),
                           global_batch_size=r.global_batch_size, corpora=tuple(recorded[k] for k in r.corpora),
                           shares=r.shares, first_draws=r.first_draws)
                   for i, r in enumerate(start.record.stretches) if r.start < cut]
    return _continue(history, spans, cut)


def _continue(history: list[Stretch], spans: list[Stretch], cut: int) -> list[Stretch]:
    """`history`, then the config's spans from step `cut` on, each corpus starting where the stream left it."""
    stretches = list(history)
    draws: dict[int, int] = {}
    for s in stretches:
        draws.update({c.key: int(n) for c, n in zip(s.corpora, s.drawn(s.end), strict=True)})
    for span in spans:
        if span.end <= cut:
            continue
        last = stretches[-1] if stretches else None
        # The stretch the start's record ends in goes on whenever the config's stretch across the start has its
        # batch, shares and corpora, whatever step either began at: a new stretch would round each corpus's
        # count afresh from the start step, and a plain resume would not see the uninterrupted batches.
        if last is not None and span.start < cut == last.end and (last.global_batch_size, last.shares, last.keys) == (
                span.global_batch_size, span.shares, span.keys):
            stretch = stretches[-1] = dataclasses.replace(last, end=span.end, phase=span.phase)  # it goes on
        else:
            stretch = dataclasses.replace(span, index=len(stretches), start=max(span.start, cut),
                                          first_draws=tuple(draws.get(k, 0) for k in span.keys))
            stretches.append(stretch)
        draws.update(zip(span.keys, map(int, stretch.drawn(span.end)), strict=True))
    return stretches
