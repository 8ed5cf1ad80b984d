"""The pretraining loop, as torchtitan's `Trainer.train`: start from the plan, then step until the end, keeping only
the order of what happens after a step. The plan (plan/) says which data, batch and LR each step has and where the
run starts; each component beside the loop decides when it acts: the run log logs (report/run_log.py), the
validation evaluates (report/validation.py), the checkpointer saves (checkpointer.py), and the spike guard's
response goes on, leaves updates out or rolls the run back (spike_response.py). A run starts, and every rollback
starts again, through one path (`start`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from pipeline.common.processes.lost_rank import StepWatchdog, is_lost_peer, lost_rank_error
from pipeline.common.processes.stop_signal import StopRequest
from pipeline.common.processes.topology import Topology, init_process_group
from pipeline.common.run_kernel import seed_everything
from pipeline.data.epoch_order import splitmix64
from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
from pipeline.models.architectures.hf_model import build_model, use_rope_thetas
from pipeline.pretrain.batches.stretch_data import PretrainData, real_tokens, shut_down_workers
from pipeline.pretrain.checkpointer import Checkpointer
from pipeline.pretrain.guard.spike_guard import Drill, SpikeGuard, level_of
from pipeline.pretrain.guard.spike_response import SpikeResponse
from pipeline.pretrain.plan.run_plan import RunPlan
from pipeline.pretrain.plan.schedules import restore_step
from pipeline.pretrain.report.run_log import RunLog
from pipeline.pretrain.report.validation import Validation
from pipeline.pretrain.step.engine import initialize_engine, set_batch_plan
from pipeline.pretrain.step.step_sync import StepSync
from pipeline.tracking.model_store import record_in_model_store, shard_dataset

Batches = Iterator[dict[str, torch.Tensor]]


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
    """Carries out one run's plan on this rank: the engine, the current stretch's data, and the components beside."""

    def __init__(self, plan: RunPlan, topology: Topology, make_probes=None):
        config = plan.config
        self.config, self.topology = config, topology
        init_process_group(topology, config.train.collective_timeout_s)
        self.log = RunLog(plan, topology)
        self.checkpointer = Checkpointer(config, topology, self.log)
        try:
            # The run folder held (or every rank stops, naming the live run), the start made sure of: `start` loads it.
            self.plan = plan = self.checkpointer.open_run(plan)
            self.tokenizer = load_tokenizer(config.data.tokenizer)
            self.info = describe_tokenizer(self.tokenizer, config.data.tokenizer)
            seed_everything(config.train.seed)  # the same initial weights on every rank
            # Positions are sized for the longest stretch from the start, so a hand-over changes no shape.
            model = build_model(config.model, self.info, plan.max_seq_len, config.contrastive.model_term)
            if model.init_note and not plan.start:  # a resumed run loads the head it trained
                self.log.say(model.init_note)
            from deepspeed.accelerator import get_accelerator

            self.guard = SpikeGuard(config, get_accelerator().current_device_name(), topology.world_size)
            self.drill = Drill.of(config.train.inject_spike)
            # A universal checkpoint must be announced before DeepSpeed builds its optimizer.
            self.engine = initialize_engine(model, config, plan.stretch_at(plan.start_step).plan(topology.world_size),
                                            bool(plan.start and plan.start.universal), schedule=plan.schedule,
                                            guard=self.guard)
            self.validation = Validation(plan, topology, self.log, self.tokenizer, make_probes)
            self.sync = StepSync(topology.world_size, due=(self.log.due, self.validation.due, self.checkpointer.due),
                                 host=self.log.wait_shares, device=self.guard.readout)
            self.response = SpikeResponse(self.guard, self.checkpointer, self.log, self.info, topology)
            self.step = plan.start_step
            buckets = getattr(self.engine, "gradient_buckets", None)
            self.log.open(self.tokenizer, self.step, parameters=sum(p.numel() for p in model.parameters()),
                          allreduce_bytes=buckets.bytes_per_step if buckets else None)
        except BaseException:
            self.checkpointer.release()
            raise

    def train(self) -> RunResult:
        """Start, then step until the end or a stop signal: pass over a skipped range, start the next stretch at its
        first step; after each step the guard's response, the log, the validation and the checkpointer act."""
        stop = StopRequest().install()
        batches = self.start(self.plan)
        if already_done := self.step >= self.plan.end_step:  # a rerun of a finished run: a missing export is redone
            self.log.say(f"already trained to step {self.step} (the run ends at step {self.plan.end_step})")
        watchdog = StepWatchdog(self.step, self.topology.rank, self.topology.world_size,
                                self.config.train.collective_timeout_s, self.checkpointer.resume_hint)
        stopped_by = None
        try:
            while self.step < self.plan.end_step:
                if (skipped := self.plan.skip_at(self.step)) is not None:  # the loader never reads its batches
                    # The step count, and so the LR, move on as if they had trained; later steps keep their batches.
                    self.step = min(skipped.stop, self.plan.end_step)
                    restore_step(self.engine.lr_scheduler, self.step)
                    self.log.skipped(skipped, self.step)
                    continue
                if self.step >= self.data.stretch.end:  # the next phase, or the batch warmup's next batch
                    batches = self.start(self.plan, batches, handing_over=True)
                with watchdog.around(self.step):
                    lr = self.train_step(batches)
                    self.step += 1
                    checked = self.sync.after_step(self.step, stop.requested)
                response = self.response.after_check(self.plan, checked, self.step)
                self.log.after_step(self.step, checked, lr, self.engine)
                if response.plan is not None:  # rolled back: start again from the checkpoint it names
                    batches = self.start(response.plan, batches)
                    continue
                self.validation.after_step(self.step, self.data, self.engine)
                if checked is not None and checked.stop:
                    stopped_by = stop.signal_name or "a stop signal on another rank"
                    break
                self.checkpointer.after_step(self.engine, self.step, self.guard)
        finally:
            watchdog.close()
        return self.finish(stop, stopped_by, batches, already_done)

    def start(self, plan: RunPlan, batches: Batches | None = None, *, handing_over: bool = False) -> Batches:
        """The one way a stretch of training starts. At the run's start and after every rollback, from the plan's
        start checkpoint (weights, moments, step and LR, the guard's window); at a hand-over (the next phase, the
        batch warmup's next batch), from the step reached, weights, moments and LR carrying on. Then the stretch of
        that step: its data, batch, masking rate and RoPE bases, the guard at its level. Returns its loader."""
        self.plan = plan
        if not handing_over:
            self.step = self.checkpointer.load(self.engine, self.guard) if plan.start else 0
            restore_step(self.engine.lr_scheduler, self.step)
            self.log.start(self.step)
        stretch = plan.stretch_at(self.step)
        batch = stretch.plan(plan.world_size)
        shut_down_workers(batches)  # the previous loader's workers stop here, not at interpreter exit
        self.data = PretrainData.for_stretch(stretch, batch, run=plan, tokenizer=self.tokenizer, info=self.info)
        batches = self.data.loader(rank=self.topology.rank, start_step=self.step)
        use_rope_thetas(self.engine.module, stretch.phase.global_rope_theta, stretch.phase.local_rope_theta,
                        self.log.say)
        set_batch_plan(self.engine, self.data.plan)
        if self.guard.enter(level_of(stretch, self.config)):
            self.log.say(f"step {self.step}: the spike guard's window starts again (the phase, mix or recipe changed); "
                         f"it judges after guard.min_steps steps")
        self.log.use(self.data, self.engine.module.config, handed_over_at=self.step if handing_over else None)
        return batches

    def train_step(self, batches: Batches) -> float:
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
            for key in ("mlm_loss", "nsp_loss", "span_loss"):
                if key in out:
                    extra.setdefault(key, []).append(out[key].detach().float())
            if micro_step == plan.accumulation - 1:  # the guard judges the step by its loss before the update
                self.guard.loss(self.step + 1, losses)
            self.engine.step()  # DeepSpeed updates at the accumulation boundary (at ZeRO 0 the guard judges inside)
        self.guard.after_update(self.engine)  # at ZeRO 1-3 it judges here, on DeepSpeed's gradient norm
        self.sync.record(self.step + 1, losses, extra, tokens)
        self.log.stepped(time.perf_counter() - began, waited)
        return lr

    def finish(self, stop: StopRequest, stopped_by: str | None, batches: Batches | None,
               already_done: bool = False) -> RunResult:
        """The run's end: a last evaluation and checkpoint, the export, the model store; every rank returns."""
        shut_down_workers(batches)
        c, export_dir = self.config, None
        if stopped_by is None and not already_done:
            self.validation.run(self.step, self.data, self.engine)
            self.log.summary(self.step)
        self.checkpointer.save(self.engine, self.step, self.guard)
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
            folders = dict.fromkeys(s.path for stretch in self.plan.stretches for s in stretch.corpora)
            record_in_model_store(self.log.metrics, export_dir, [shard_dataset(f) for f in folders],
                                  c.tracking.registered_model)
        self.log.close("FINISHED" if stopped_by is None else "KILLED")
        stop.restore()
        dist.barrier()
        self.checkpointer.release()
        return RunResult(self.step, stopped_by, export_dir)


def run_pretraining(plan: RunPlan, topology: Topology, make_probes=None) -> RunResult:
    """`plan` carried out on this rank; `make_probes` builds the in-loop probes that `probes` configures."""
    trainer = None
    try:
        trainer = Pretrainer(plan, topology, make_probes)
        return trainer.train()
    except Exception as err:
        if trainer is not None:
            trainer.log.close("FAILED")
            trainer.checkpointer.release()
        if topology.world_size == 1 or not is_lost_peer(err):
            raise
        where = "while starting" if trainer is None else f"after step {trainer.step}"
        hint = trainer.checkpointer.resume_hint() if trainer is not None else "Rerun the same command."
        raise lost_rank_error(err, topology.rank, topology.world_size, where, plan.config.train.collective_timeout_s,
                              hint) from None
