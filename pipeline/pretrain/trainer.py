"""The pretraining loop: load, hand over, skip, step, log, evaluate, save. The plan (plan.py) says which data,
batch and LR each step has and where the run starts; the cadence (cadence.py) says when to log, evaluate
and save; the checkpointer (checkpointer.py) loads and saves."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from pipeline.common.atomic_files import staged_folder, write_json_atomic
from pipeline.common.config_tree import flatten, to_dict
from pipeline.common.errors import PipelineError
from pipeline.common.lost_rank import RankWatchdog, is_lost_peer, lost_rank_error, lost_rank_message
from pipeline.common.run_kernel import run_tags, seed_everything
from pipeline.common.stop_signal import StopRequest
from pipeline.common.topology import Topology, init_process_group
from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
from pipeline.pretrain import checkpoints
from pipeline.pretrain.batches import real_tokens, shut_down_workers
from pipeline.pretrain.cadence import Cadence, StepGuard, ThroughputWindow
from pipeline.pretrain.checkpointer import Checkpointer
from pipeline.pretrain.engine import initialize_engine, restore_step, set_batch_plan
from pipeline.pretrain.flops import mfu, model_flops_per_token
from pipeline.pretrain.masking import IGNORE_INDEX, build_masker, eval_probability, splitmix64
from pipeline.pretrain.model import build_model
from pipeline.pretrain.plan import RunPlan, Stretch
from pipeline.pretrain.plateau import at_mask_rate, metrics_beside_plateau, plateau_level
from pipeline.pretrain.pretrain_data import PretrainData
from pipeline.pretrain.rope import set_rope_theta
from pipeline.pretrain.step_sync import CheckedLosses, StepSync
from pipeline.tracking.metrics import MetricsSink
from pipeline.tracking.model_store import record_in_model_store, shard_dataset
from pipeline.tracking.sinks import open_metrics


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
    """Owns the engine, data and logs of one pretraining run on this rank."""

    def __init__(self, plan: RunPlan, topology: Topology):
        self.config = config = plan.config
        self.layout = config.layout
        self.topology = topology
        self.cadence = Cadence(plan.end_step, config.train.log_every, config.train.eval_every, config.checkpoint.every)
        init_process_group(topology, config.train.collective_timeout_s)
        self.checkpointer = Checkpointer(self.layout.checkpoints, topology)
        self.plan = plan = self.checkpointer.confirm_start(plan)  # files only; train() loads it, before the loop
        self.step = plan.start_step
        self.tokenizer = load_tokenizer(config.data.tokenizer)
        self.tokenizer_info = info = describe_tokenizer(self.tokenizer, config.data.tokenizer)
        self.eval_masker = build_masker(config.masking, self.tokenizer, info.vocab_size, info.mask_id,
                                        config.train.seed, evaluation=True)  # one rate for every phase's losses
        self._entropies: dict[str, float] = {}
        """Validation unigram entropy per shard folder (the plateau's level), computed at the first evaluation."""
        seed_everything(config.train.seed)  # the same initial weights on every rank
        # Positions are sized for the longest phase from the start, so a hand-over changes no shape.
        model = build_model(config.model, info, plan.max_seq_len)
        if model.init_note and not plan.start:  # a resumed run loads the head it trained
            self._print(model.init_note)
        self.model_config = model.config
        self.num_parameters = sum(p.numel() for p in model.parameters())
        self._use_stretch(plan.stretch_at(self.step))
        self._use_rope(model)
        # A universal checkpoint must be announced before DeepSpeed builds its optimizer.
        universal = bool(plan.start and plan.start.universal)
        self.engine = initialize_engine(model, config, self.batch, universal, schedule=plan.schedule)
        self.metrics = self._open_metrics()

    def _use_stretch(self, stretch: Stretch) -> None:
        """This stretch's phase, batch plan, data (at its masking rate) and FLOPs per token."""
        self.stretch, self.phase = stretch, stretch.phase
        self.data = PretrainData.for_stretch(stretch, self.config, self.tokenizer, self.tokenizer_info,
                                             self.topology.world_size, self.eval_masker)
        self.batch, self.seq_len = self.data.plan, self.data.seq_len
        self.flops_per_token = model_flops_per_token(self.model_config, self.seq_len, self.data.masking_probability)

    def _hand_over(self, stretch: Stretch) -> None:
        """Start the next stretch (a phase, the batch warmup's next batch, an edited mix): its data, batch,
        masking rate and RoPE bases; weights, optimizer moments, the step and so the LR carry on."""
        self._use_stretch(stretch)
        self._use_rope(self.engine.module)
        set_batch_plan(self.engine, self.batch)
        phase = self.phase
        shares = {c.name: round(float(p), 4) for c, p in zip(stretch.corpora, stretch.shares, strict=True)}
        event = {"global_batch_size": self.batch.global_batch_size, "accumulation": self.batch.accumulation,
                 "seq_len": self.seq_len, "masking_probability": phase.masking_probability,
                 **({"phase": phase.name} if phase.name else {}), **({"mix": shares} if self.data.mixed else {})}
        if phase.name:
            self.metrics.set_tags({"phase": phase.name})
        self.metrics.event(event, self.step)
        what = f"phase {phase.name} ({phase.steps} steps, " if phase.name else "("
        self._print(f"step {self.step}: {what}seq_len {self.seq_len}, global batch {self.batch.global_batch_size}, "
                    f"masking {phase.masking_probability:g}" + (f", mix {shares})" if self.data.mixed else ")"))

    def _use_rope(self, model: torch.nn.Module) -> None:
        """ModernBERT: this phase's rotary bases (a context-extension phase raises them; see rope.py)."""
        phase = self.phase
        if phase.global_rope_theta is not None and set_rope_theta(model, phase.global_rope_theta,
                                                                  phase.local_rope_theta):
            self._print(f"RoPE theta: global {phase.global_rope_theta:g}, local {phase.local_rope_theta:g}")

    # --- set-up ---------------------------------------------------------------------------

    def _open_metrics(self) -> MetricsSink:
        """Rank 0: write the config and a tokenizer copy into the run folder, open metrics.jsonl and MLflow."""
        c, layout = self.config, self.layout
        if not self.topology.is_main:
            return MetricsSink()
        layout.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(layout.config, to_dict(c))
        if not layout.tokenizer.exists():
            with staged_folder(layout.tokenizer) as tmp:
                self.tokenizer.save_pretrained(tmp)
        tags = run_tags("pretrain", self.plan.world_size, gradient_accumulation=self.batch.accumulation,
                        parameters=self.num_parameters, output_dir=layout.root.resolve())
        if self.config.phases:
            tags["phase"] = self.phase.name
        metrics = open_metrics(True, jsonl=layout.metrics, resume_step=self.step, tracking=c.tracking,
                               run_name=c.tracking.run_name or layout.root.resolve().name, state_file=layout.tracking,
                               tags=tags, params=flatten(to_dict(c)))
        metrics.log_artifact(layout.config)
        return metrics

    def _load_checkpoint(self) -> None:
        """Continue from the plan's start (own checkpoint, or the anneal's source), if any."""
        start = self.plan.start
        if start is None:
            return
        ckpt = self.checkpointer
        if start.universal:
            self._print(f"checkpoint {start.checkpoint.name} was written by {start.record.world_size} ranks, this "
                        f"run has {self.topology.world_size}: converting it to a universal checkpoint")
        if start.record.version < 2 and not start.anneal:
            self._print(f"checkpoint {start.checkpoint.name} was written by an earlier release, which kept no record "
                        "of its data order: the run goes on in this release's order")
        self.step = ckpt.load(self.engine, start)
        event = {"resumed_from": str(start.checkpoint), "resume_load_seconds": round(ckpt.load_seconds, 3),
                 "checkpoint_verify_seconds": round(ckpt.verify_seconds, 3)}
        if start.anneal:
            a, peak = self.plan.anneal, self.config.optimizer.lr
            event["anneal_steps"] = a.steps
            lr_from, lr_to = (self.plan.schedule.multiplier(step) * peak for step in (a.start, a.start + a.steps))
            self._print(f"annealing from {start.checkpoint} (step {a.start}) for {a.steps} steps: LR "
                        f"{lr_from:.3g} to {lr_to:.3g} ({self.config.schedule.decay})")
        else:
            self._print(f"resumed from {start.checkpoint} (step {self.step})")
        self.metrics.event(event, self.step)

    # --- the loop ---------------------------------------------------------------------------

    def train(self) -> RunResult:
        """Load, then step until the end or a stop signal: pass over a skipped range, hand over to the next stretch
        at its start; log, evaluate and save when the cadence says."""
        self._load_checkpoint()
        stop = StopRequest().install()
        if self.cadence.done(self.step):  # a rerun of a finished run: only a missing export is redone
            self._print(f"already trained to step {self.step} (the run ends at step {self.plan.end_step})")
            return self._finish(stop, None, already_done=True)
        progress = self._progress_bar()
        self.window, self.whole_run = ThroughputWindow(), ThroughputWindow()
        guard = StepGuard(self.step, self._watchdog())
        self.sync = StepSync(self.batch.world_size)
        stopped_by, batches = None, None
        self.engine.train()
        try:
            batches = self._batches()
            while not self.cadence.done(self.step):
                if (skipped := self.plan.skip_at(self.step)) is not None:
                    self._skip(skipped, progress)  # the loader never reads its batches
                    continue
                if self.step >= self.stretch.end:  # the next phase, or the batch warmup's next batch
                    shut_down_workers(batches)
                    self._hand_over(self.plan.stretch_at(self.step))  # builds data: not under the watchdog
                    batches = self._batches()
                with guard.around(self.step):
                    lr = self.train_step(batches)
                    stop_now = self.sync.stop_requested(stop.requested)
                self.step += 1
                due = self.cadence.due(self.step)
                if due.any or stop_now:  # only then do the losses come to the host
                    self._check_losses(due.log, lr, progress)
                if due.evaluate:
                    self._evaluate()
                if stop_now:
                    stopped_by = stop.signal_name or "a stop signal on another rank"
                    break
                if due.save:
                    self._checkpoint()
        finally:
            shut_down_workers(batches)  # the loader's workers stop here, not at interpreter exit
        if progress is not None:
            progress.close()
        guard.close()
        return self._finish(stop, stopped_by)

    def train_step(self, batches: Iterator[dict[str, torch.Tensor]]) -> float:
        """One optimizer step over this rank's micro batches; the losses stay on the device, the time spent waiting
        for the loader is counted. Returns the step's LR."""
        seed, rank = self.config.train.seed, self.topology.rank
        began = time.perf_counter()
        lr = self.engine.get_lr()[0]  # the LR this step uses; the scheduler moves on inside engine.step()
        losses, extra, tokens, waited = [], {}, 0, 0.0
        for micro_step in range(self.batch.accumulation):
            asked = time.perf_counter()
            batch = next(batches)
            waited += time.perf_counter() - asked
            tokens += real_tokens(batch)
            seed_micro_batch(seed, self.step, self.batch.micro_batch_index(rank, micro_step))
            out = self.engine(**{k: v.to(self.engine.device, non_blocking=True) for k, v in batch.items()})
            self.engine.backward(out["loss"])
            self.engine.step()  # DeepSpeed updates at the accumulation boundary
            losses.append(out["loss"].detach().float())
            for key in ("mlm_loss", "nsp_loss"):
                if key in out:
                    extra.setdefault(key, []).append(out[key].detach().float())
        self.sync.record(self.step + 1, losses, extra, tokens)
        stepping = time.perf_counter() - began
        for window in (self.window, self.whole_run):  # a hand-over may change the batch
            window.add(samples=self.batch.global_batch_size, stepping=stepping, waited=waited)
        return lr

    def _skip(self, skipped: range, progress) -> None:
        """Pass over the steps of a skipped range: the step count and so the LR move on as if they had trained, and
        every later step keeps its own batch (the order is a function of the step)."""
        self.step = min(skipped.stop, self.plan.end_step)
        restore_step(self.engine.lr_scheduler, self.step)
        label = f"{skipped.start + 1}:{skipped.stop}"
        self.metrics.event({"skipped_steps": label}, self.step)
        self._print(f"steps {label} skipped (train.skip_steps): their batches are left out; step {self.step + 1} "
                    "trains on its own batch")
        if progress is not None:
            progress.update(self.step - progress.n)

    def _batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's micro batches from the current step to the stretch's end, skipped steps left out, read lazily."""
        return iter(self.data.loader(rank=self.topology.rank, start_step=self.step, end_step=self.stretch.end,
                                     num_workers=self.config.data.num_workers, skipped=self.plan.skipped))

    def _check_losses(self, log: bool, lr: float, progress) -> None:
        """Bring the losses since the last check to the host: stop on a non-finite one, log when due."""
        checked = self.sync.check()
        for window in (self.window, self.whole_run):
            window.add(tokens=checked.tokens)
        if not math.isfinite(checked.window_loss) and self.config.train.precision != "fp16":
            self._stop_on_nonfinite(checked)
        if log:
            self._log_step(checked.loss, checked.extras, lr, self.window.rates(), progress)

    def _watchdog(self) -> RankWatchdog | None:
        """With several ranks: a thread that ends this rank when a step outlasts train.collective_timeout_s."""
        if self.topology.world_size == 1:
            return None
        t = self.config.train
        return RankWatchdog(t.collective_timeout_s, lambda where: lost_rank_message(
            self.topology.rank, self.topology.world_size, where, t.collective_timeout_s,
            self.checkpointer.resume_hint(self.plan), f"the step has waited {t.collective_timeout_s:g} s"))

    def _finish(self, stop: StopRequest, stopped_by: str | None, already_done: bool = False) -> RunResult:
        c = self.config
        export_dir = None
        if stopped_by is None and not already_done:
            self._evaluate()
        if not already_done:
            self._summarise()
        newest = self.checkpointer.newest_complete()
        if newest is None or newest.name != checkpoints.tag_for(self.step):
            self._checkpoint()
        if stopped_by is not None:
            seconds = time.monotonic() - (stop.received_at or time.monotonic())
            self._print(f"stopped by {stopped_by} after step {self.step}; checkpoint saved, {seconds:.1f} s after "
                        "the signal")
            self.metrics.event({"stopped_by": stopped_by, "signal_to_checkpoint_seconds": round(seconds, 3)},
                               self.step)
        elif c.train.export and self.topology.is_main and not (already_done and self.layout.export.is_dir()):
            from pipeline.pretrain.export import export_checkpoint

            newest = self.checkpointer.newest_complete()
            export_dir = export_checkpoint(newest, self.layout.export, overwrite=True)
            self._print(f"exported {export_dir}")
            self.metrics.log_artifact(export_dir, "export")
        if self.topology.is_main:  # every corpus of a mix is a dataset input of the run
            folders = dict.fromkeys(c.path for s in self.plan.stretches for c in s.corpora)
            record_in_model_store(self.metrics, export_dir, [shard_dataset(f) for f in folders],
                                  c.tracking.registered_model)
        self.metrics.close("FINISHED" if stopped_by is None else "KILLED")
        stop.restore()
        dist.barrier()
        return RunResult(self.step, stopped_by, export_dir)

    def _stop_on_nonfinite(self, checked: CheckedLosses) -> None:
        newest = self.checkpointer.newest_complete()
        self.metrics.close("FAILED")
        loss = checked.loss if not math.isfinite(checked.loss) else checked.window_loss
        since = "" if checked.first_step == self.step else (
            f" (checked at logging, evaluation and checkpoint steps: it became non-finite at one of steps "
            f"{checked.first_step}-{self.step})")
        raise PipelineError(f"the training loss is {loss} at step {self.step}{since}; stopping without saving. "
                            f"The last good checkpoint is {newest or 'none (no checkpoint yet)'}. Lower "
                            f"optimizer.lr, raise schedule.warmup_steps or check the data")

    # --- evaluation, checkpoints, logging ------------------------------------------------------

    @torch.no_grad()
    def _evaluate(self) -> None:
        eval_sets = self.data.eval_sets(self.config.train.eval_sequences, self.batch.micro_batch_size,
                                        self.topology.rank, self.topology.world_size)
        self.engine.eval()
        # Per corpus: loss × masked, masked. On the engine's device: NCCL reduces no CPU tensor (a CPU one here
        # failed every CUDA run's last evaluation), and the batches' losses come to the host once, not each.
        totals = torch.zeros(len(eval_sets), 2, dtype=torch.float64, device=self.engine.device)
        for corpus, keys in enumerate(eval_sets):
            for key in keys:
                batch = {k: v.to(self.engine.device) for k, v in self.data.val_batches[key].items()}
                out = self.engine(**batch)
                masked = (batch["labels"] != IGNORE_INDEX).sum()
                totals[corpus, 0] += out.get("mlm_loss", out["loss"]).detach().double() * masked
                totals[corpus, 1] += masked
        self.engine.train()
        dist.all_reduce(totals)
        levels = self._plateau_levels() if self.topology.is_main else None
        metrics = {**self.data.eval_metrics(totals.cpu().numpy(), levels),
                   "eval/mask_rate": eval_probability(self.config.masking)}
        self.metrics.log(metrics, self.step)
        self.metrics.flush()
        per_corpus = "".join(f", {s.name} {metrics_beside_plateau(metrics, f'eval/{s.name}/')}"
                             for s in self.data.corpora if self.data.mixed)
        self._print(f"step {self.step}: eval MLM loss{at_mask_rate(metrics)} {metrics_beside_plateau(metrics)}"
                    f"{per_corpus}, perplexity {metrics['eval/perplexity']:.2f}")

    def _plateau_levels(self) -> list[float]:
        """Each corpus's unigram plateau: a loss means little without it (plateau.py says why)."""
        for source in self.data.corpora:
            if source.path not in self._entropies:  # once per folder: a bincount over its validation shards
                self._entropies[source.path] = plateau_level(source.path, self.tokenizer)
        return [self._entropies[source.path] for source in self.data.corpora]

    def _checkpoint(self) -> None:
        record = self.plan.record(self.step, phase=self.phase.name, seq_len=self.seq_len, batch=self.batch,
                                  # the model's own shape: with model.init_from it is the folder's, not the config's
                                  hf_config=json.loads(self.model_config.to_json_string()))
        start = time.perf_counter()
        folder = self.checkpointer.save(self.engine, record, self.config.checkpoint.keep_last)
        self.metrics.event({"checkpoint": str(folder), "checkpoint_seconds": round(time.perf_counter() - start, 3)},
                           self.step)
        self.metrics.flush()

    def _summarise(self) -> None:
        """The run's throughput, MFU and share of time spent waiting for data, on screen and in the metrics."""
        tokens_per_s, _, wait_share = self.whole_run.rates()
        run_mfu = mfu(tokens_per_s, self.flops_per_token, self.config.train.peak_tflops, self.batch.world_size)
        self.metrics.event({"summary/tokens_per_s": round(tokens_per_s, 1), "summary/data_wait_share":
                            round(wait_share, 4), "summary/mfu": run_mfu}, self.step)
        self._print(f"this session trained to step {self.step}: {tokens_per_s:,.0f} tokens/s"
                    + (f", MFU {run_mfu:.1%}" if run_mfu is not None else "")
                    + f", waiting for data {wait_share:.1%} of the time")

    def _log_step(self, loss: float, extras: dict[str, float], lr: float, rates: tuple[float, float, float],
                  progress) -> None:
        tokens_per_s, samples_per_s, wait_share = rates
        engine = self.engine
        grad_norm = engine.get_global_grad_norm()
        scale = getattr(engine.optimizer, "cur_scale", None) if self.config.train.precision == "fp16" else 1.0
        metrics: dict[str, Any] = {
            "train/loss": loss, **{f"train/{k}": v for k, v in extras.items()},
            "train/lr": lr,
            "train/grad_norm": float(grad_norm) if grad_norm is not None else None,
            "train/loss_scale": float(scale) if scale is not None else None,
            "train/tokens_per_s": tokens_per_s, "train/samples_per_s": samples_per_s,
            "train/data_wait_share": wait_share,
            "train/mfu": mfu(tokens_per_s, self.flops_per_token, self.config.train.peak_tflops, self.batch.world_size),
            "train/phase": self.phase.index + 1 if self.config.phases else None,  # 1, 2, …: NVIDIA's phase numbers
            **self.data.progress(self.step),
        }
        self.metrics.log(metrics, self.step)
        if progress is not None:
            progress.update(self.step - progress.n)
            progress.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}",
                                 data_wait=f"{wait_share:.0%}", refresh=False)

    def _progress_bar(self) -> tqdm | None:
        if not self.topology.is_main:
            return None
        return tqdm(total=self.plan.end_step, initial=self.step, desc="pretrain", unit="step",
                    dynamic_ncols=True, mininterval=1.0)

    def _print(self, message: str) -> None:
        if self.topology.is_main:
            tqdm.write(message)


def run_pretraining(plan: RunPlan, topology: Topology) -> RunResult:
    trainer = None
    try:
        trainer = Pretrainer(plan, topology)
        return trainer.train()
    except Exception as err:
        if topology.world_size == 1 or not is_lost_peer(err):
            raise
        where = "while starting" if trainer is None else f"after step {trainer.step}"
        hint = trainer.checkpointer.resume_hint(trainer.plan) if trainer is not None else "Rerun the same command."
        if trainer is not None and hasattr(trainer, "metrics"):
            trainer.metrics.close("FAILED")
        raise lost_rank_error(err, topology.rank, topology.world_size, where, plan.config.train.collective_timeout_s,
                              hint) from None
