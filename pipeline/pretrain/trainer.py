"""The pretraining loop, as torchtitan's `Trainer.train`: load, then step until the end, logging, evaluating and
saving when the cadence says. The plan (plan.py) says which data, batch and LR each step has and where the run
starts; side concerns sit behind small objects: the cadence (cadence.py) says when, the checkpointer
(checkpoints.py) loads and saves, the stretch's data (batches.py) feeds and evaluates, the spike guard
(spike_guard.py) judges each step and says when to roll back, and the run log (run_log.py) reports."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from pipeline.common.lost_rank import is_lost_peer, lost_rank_error
from pipeline.common.run_kernel import seed_everything
from pipeline.common.stop_signal import StopRequest
from pipeline.common.topology import Topology, init_process_group
from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
from pipeline.pretrain.batches.stretch_data import PretrainData, real_tokens, shut_down_workers
from pipeline.pretrain.checkpoints.storage import Checkpointer
from pipeline.pretrain.model.hf_model import build_model, use_phase_rope
from pipeline.pretrain.plan.ledger import UpdatesSkippedEvent
from pipeline.pretrain.plan.masking import splitmix64
from pipeline.pretrain.plan.run_plan import RunPlan, Stretch
from pipeline.pretrain.report.run_log import RunLog
from pipeline.pretrain.step.cadence import Cadence, StepGuard, StepSync
from pipeline.pretrain.step.engine import initialize_engine, restore_step, set_batch_plan
from pipeline.pretrain.step.spike_guard import (
    Drill,
    GiveUp,
    Spike,
    SpikeGuard,
    plan_after_rollback,
    rollback_event,
)
from pipeline.tracking.model_store import record_in_model_store, shard_dataset


@dataclasses.dataclass
class RunResult:
    last_step: int
    stopped_by: str | None
    export_dir: Path | None


def seed_micro_batch(seed: int, step: int, micro_index: int) -> None:
    """Seed dropout from the micro batch's place in the run, not from the RNG's history.

    So a resumed run draws the same dropout masks as an uninterrupted one, and 2 ranks × 2 micro
    steps draw the same as 1 rank × 4.
    """
    key = np.array([(seed << 20) ^ (step << 8) ^ micro_index], dtype=np.uint64)
    torch.manual_seed(int(splitmix64(key)[0] >> np.uint64(1)))


class Pretrainer:
    """Carries out one run's plan on this rank: the engine, the current stretch's data, and the objects beside."""

    def __init__(self, plan: RunPlan, topology: Topology):
        config = plan.config
        self.config, self.topology = config, topology
        init_process_group(topology, config.train.collective_timeout_s)
        self.log = RunLog(plan, topology)
        self.checkpointer = Checkpointer(config.layout.checkpoints, topology, self.log)
        self.plan = plan = self.checkpointer.confirm_start(plan)  # files only; train() loads it, before the loop
        self.step = plan.start_step
        self.cadence = Cadence(plan.end_step, config.train.log_every, config.train.eval_every, config.checkpoint.every)
        tokenizer = load_tokenizer(config.data.tokenizer)
        self.info = info = describe_tokenizer(tokenizer, config.data.tokenizer)
        seed_everything(config.train.seed)  # the same initial weights on every rank
        # Positions are sized for the longest stretch from the start, so a hand-over changes no shape.
        model = build_model(config.model, info, plan.max_seq_len)
        if model.init_note and not plan.start:  # a resumed run loads the head it trained
            self.log.say(model.init_note)
        self.tokenizer = tokenizer
        self.data_for = partial(PretrainData.for_stretch, run=plan, tokenizer=tokenizer, info=info)
        self.data = self.data_for(plan.stretch_at(self.step))
        use_phase_rope(model, self.data.stretch.phase, self.log.say)
        self.log.use(self.data, model.config)
        # A universal checkpoint must be announced before DeepSpeed builds its optimizer.
        universal = bool(plan.start and plan.start.universal)
        from deepspeed.accelerator import get_accelerator

        self.spike_guard = SpikeGuard(config, get_accelerator().current_device_name(), topology.world_size)
        self.drill = Drill.of(config.train.inject_spike)
        self.engine = initialize_engine(model, config, self.data.plan, universal, schedule=plan.schedule,
                                        guard=self.spike_guard)
        self.log.open(tokenizer, self.step, parameters=sum(p.numel() for p in model.parameters()))

    def train(self) -> RunResult:
        """Load, then step until the end or a stop signal: pass over a skipped range, hand over to the next stretch
        at its start; log, evaluate and save when the cadence says."""
        if self.plan.start:
            self.step = self.checkpointer.load(self.engine, self.spike_guard)
        stop = StopRequest().install()
        if self.cadence.done(self.step):  # a rerun of a finished run: only a missing export is redone
            self.log.say(f"already trained to step {self.step} (the run ends at step {self.plan.end_step})")
            return self._finish(stop, None, already_done=True)
        self.log.start(self.step)
        guard = StepGuard(self.step, self.topology, self.config.train.collective_timeout_s,
                          self.checkpointer.resume_hint)
        self.sync = StepSync(self.topology.world_size)
        stopped_by, batches = None, None
        try:
            batches = self.data.loader(rank=self.topology.rank, start_step=self.step)
            while not self.cadence.done(self.step):
                if (skipped := self.plan.skip_at(self.step)) is not None:  # the loader never reads its batches
                    # The step count, and so the LR, move on as if they had trained; later steps keep their batches.
                    self.step = min(skipped.stop, self.plan.end_step)
                    restore_step(self.engine.lr_scheduler, self.step)
                    self.log.skipped(skipped, self.step)
                    continue
                if self.step >= self.data.stretch.end:  # the next phase, or the batch warmup's next batch
                    shut_down_workers(batches)
                    batches = self._hand_over(self.plan.stretch_at(self.step))  # builds data: not under the watchdog
                with guard.around(self.step):
                    lr = self.train_step(batches)
                    stop_now = self.sync.stop_requested(stop.requested)
                self.step += 1
                due = self.cadence.due(self.step)
                if due.any or stop_now:  # only then do the losses (and the guard's findings) come to the host
                    checked = self.sync.check(self.log.wait_shares(), self.spike_guard.readout())
                    spike = self.spike_guard.verdict(checked.guard, self.step)
                    if (not math.isfinite(checked.window_loss) and self.config.train.precision != "fp16"
                            and not self.spike_guard.on):  # with the guard on, a non-finite step is its business
                        newest = self.checkpointer.newest_complete()
                        self.log.close("FAILED")
                        raise checked.nonfinite_error(self.step, newest)
                    self.log.losses(checked, self.step, lr, self.engine, due.log)
                    if spike is not None and self._outliers_found(spike):  # before anything is saved
                        batches = self._roll_back(spike, batches)
                        continue
                if due.evaluate:
                    self.log.evaluation(self.data.evaluate(self.engine, self.config.train.eval_sequences,
                                                           self.topology.rank), self.step)
                if stop_now:
                    stopped_by = stop.signal_name or "a stop signal on another rank"
                    break
                if due.save:
                    self.checkpointer.save(self.engine, self.step, self.spike_guard)
        except GiveUp as err:
            self.checkpointer.note(self.plan.ledger, [err.event])
            self.log.gave_up(err.event)
            self.log.close("FAILED")
            raise
        finally:
            shut_down_workers(batches)  # the loader's workers stop here, not at interpreter exit
            guard.close()
        return self._finish(stop, stopped_by)

    def train_step(self, batches: Iterator[dict[str, torch.Tensor]]) -> float:
        """One optimizer step over this rank's micro batches; the losses stay on the device, the time spent waiting
        for the loader is counted. Returns the step's LR."""
        seed, rank, plan = self.config.train.seed, self.topology.rank, self.data.plan
        began = time.perf_counter()
        lr = self.engine.get_lr()[0]  # the LR this step uses; the scheduler moves on inside engine.step()
        losses, extra, tokens, waited = [], {}, 0, 0.0
        for micro_step in range(plan.accumulation):
            asked = time.perf_counter()
            batch = next(batches)
            waited += time.perf_counter() - asked
            tokens += real_tokens(batch)
            seed_micro_batch(seed, self.step, plan.micro_batch_index(rank, micro_step))
            out = self.engine(**{k: v.to(self.engine.device, non_blocking=True) for k, v in batch.items()})
            self.engine.backward(self.drill.scaled(out["loss"], self.step + 1))  # the drill's planted spike, or not
            losses.append(out["loss"].detach().float())
            for key in ("mlm_loss", "nsp_loss"):
                if key in out:
                    extra.setdefault(key, []).append(out[key].detach().float())
            if micro_step == plan.accumulation - 1:  # the guard judges the step by its loss before the update
                self.spike_guard.loss(self.step + 1, losses)
            self.engine.step()  # DeepSpeed updates at the accumulation boundary (at ZeRO 0 the guard judges inside)
        self.spike_guard.after_update(self.engine)  # at ZeRO 1-3 it judges here, on DeepSpeed's gradient norm
        self.sync.record(self.step + 1, losses, extra, tokens)
        self.log.stepped(time.perf_counter() - began, waited)
        return lr

    def _hand_over(self, stretch: Stretch) -> Iterator[dict[str, torch.Tensor]]:
        """Start the next stretch (a phase, the batch warmup's next batch, an edited mix): its data, batch,
        masking rate and RoPE bases; weights, optimizer moments, the step and so the LR carry on. Returns its
        loader."""
        if stretch.phase.index != self.data.stretch.phase.index:  # a new phase has its own loss level
            self.spike_guard.reset_window()
        return self._start_stretch(stretch, handed_over_at=self.step)

    def _start_stretch(self, stretch: Stretch, handed_over_at: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
        """This stretch's data, batch, masking rate and RoPE bases in the engine; returns its loader from the step."""
        self.data = self.data_for(stretch)
        use_phase_rope(self.engine.module, stretch.phase, self.log.say)
        set_batch_plan(self.engine, self.data.plan)
        self.log.use(self.data, self.engine.module.config, handed_over_at=handed_over_at)
        return self.data.loader(rank=self.topology.rank, start_step=self.step)

    def _outliers_found(self, spike: Spike) -> bool:
        """Report the outliers a check found (with `skip`, the ledger names the updates left out); True when the run
        must roll back. Raises GiveUp when `skip` leaves out more than half the window."""
        if spike.count:
            self.log.outliers(spike, self.step, self.config)
        if spike.count and self.spike_guard.mode == "skip":
            self.checkpointer.note(self.plan.ledger, [UpdatesSkippedEvent(spike.since, spike.count, self.step)])
        self.spike_guard.stop_if_diverging(spike, self.step)
        return self.spike_guard.rolls_back(spike)

    def _roll_back(self, spike: Spike, batches) -> Iterator[dict[str, torch.Tensor]]:
        """Go back to the newest checkpoint before the spike's first outlier and leave out the spike's batches (with
        `guard.margin` around them), as `--skip-steps` would: the ledger records the range (rank 0), the checkpoints
        after it are set aside, and this process goes on from the checkpoint's weights, optimizer, window and step.
        The data order is stateless, so every other step trains on the batch it would have had. Returns the loader."""
        event = rollback_event(self.plan, spike, self.step)  # or GiveUp: the bound, or no checkpoint before it
        ledger = self.checkpointer.note(self.plan.ledger, [event])
        plan = plan_after_rollback(self.plan, ledger, self.info)
        shut_down_workers(batches)
        dist.barrier()  # every rank has read the checkpoints before rank 0 sets the later ones aside
        self.plan = self.checkpointer.confirm_start(plan)
        self.log.rolled_back(event, self.plan.ledger.rollbacks, self.step)
        self.step = self.checkpointer.load(self.engine, self.spike_guard)
        self.data_for = partial(PretrainData.for_stretch, run=self.plan, tokenizer=self.tokenizer, info=self.info)
        return self._start_stretch(self.plan.stretch_at(self.step))

    def _finish(self, stop: StopRequest, stopped_by: str | None, already_done: bool = False) -> RunResult:
        """The run's end: a last evaluation and checkpoint, the export, the model store; every rank returns."""
        c, export_dir = self.config, None
        if stopped_by is None and not already_done:
            self.log.evaluation(self.data.evaluate(self.engine, c.train.eval_sequences, self.topology.rank), self.step)
        if not already_done:
            self.log.summary(self.step)
        self.checkpointer.save(self.engine, self.step, self.spike_guard)
        if stopped_by is not None:
            seconds = time.monotonic() - (stop.received_at or time.monotonic())
            self.log.report(self.step, {"stopped_by": stopped_by, "signal_to_checkpoint_seconds": round(seconds, 3)},
                            f"stopped by {stopped_by} after step {self.step}; checkpoint saved, {seconds:.1f} s after "
                            "the signal")
        elif c.train.export and self.topology.is_main and not (already_done and c.layout.export.is_dir()):
            from pipeline.pretrain.export.folder import export_checkpoint

            export_dir = export_checkpoint(self.checkpointer.newest_complete(), c.layout.export, overwrite=True)
            self.log.say(f"exported {export_dir}")
            self.log.metrics.log_artifact(export_dir, "export")
        if self.topology.is_main:  # every corpus of a mix is a dataset input of the run
            folders = dict.fromkeys(c.path for s in self.plan.stretches for c in s.corpora)
            record_in_model_store(self.log.metrics, export_dir, [shard_dataset(f) for f in folders],
                                  c.tracking.registered_model)
        self.log.close("FINISHED" if stopped_by is None else "KILLED")
        stop.restore()
        dist.barrier()
        return RunResult(self.step, stopped_by, export_dir)


def run_pretraining(plan: RunPlan, topology: Topology) -> RunResult:
    trainer = None
    try:
        trainer = Pretrainer(plan, topology)
        return trainer.train()
    except Exception as err:
        if topology.world_size == 1 or not is_lost_peer(err):
            raise
        where = "while starting" if trainer is None else f"after step {trainer.step}"
        hint = trainer.checkpointer.resume_hint() if trainer is not None else "Rerun the same command."
        if trainer is not None:
            trainer.log.close("FAILED")
        raise lost_rank_error(err, topology.rank, topology.world_size, where, plan.config.train.collective_timeout_s,
                              hint) from None
