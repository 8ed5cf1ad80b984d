"""The pretraining loop: train steps, evaluation, checkpoints, resume, stop signals and metrics."""

from __future__ import annotations

import json
import math
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from pipeline.common.atomic_files import staged_folder, write_json_atomic
from pipeline.common.config_tree import flatten, to_dict
from pipeline.common.errors import PipelineError
from pipeline.common.lost_rank import RankWatchdog, is_lost_peer, lost_rank_error, lost_rank_message
from pipeline.common.run_kernel import run_tags, seed_everything
from pipeline.common.stop_signal import StopRequest
from pipeline.common.topology import Topology, init_process_group
from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
from pipeline.pretrain import checkpoints
from pipeline.pretrain.batches import real_tokens
from pipeline.pretrain.config import PretrainConfig
from pipeline.pretrain.engine import initialize_engine, phase_lr_multiplier, set_phase_batch
from pipeline.pretrain.flops import mfu, model_flops_per_token
from pipeline.pretrain.masking import IGNORE_INDEX, build_masker, eval_probability, splitmix64
from pipeline.pretrain.mixture import PretrainData
from pipeline.pretrain.model import build_model, first_position_id
from pipeline.pretrain.phases import (
    Phase,
    longest_seq_len,
    phase_at,
    resolve_phases,
    samples_consumed,
    stream_start,
)
from pipeline.pretrain.plateau import at_mask_rate, metrics_beside_plateau, plateau_level
from pipeline.pretrain.rope import set_rope_theta
from pipeline.pretrain.step_sync import CheckedLosses, StepSync
from pipeline.pretrain.universal_resume import UNIVERSAL_DIR, convert_to_universal, needs_universal
from pipeline.tracking.metrics import MetricsSink
from pipeline.tracking.model_store import record_in_model_store, shard_dataset
from pipeline.tracking.sinks import open_metrics


@dataclass
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

    def __init__(self, config: PretrainConfig, topology: Topology):
        self.config = config
        self.layout = config.layout
        self.topology = topology
        self.phases = resolve_phases(config)
        for phase in self.phases:  # every phase's batch arithmetic, before any process group starts
            phase.plan(topology.world_size)
        init_process_group(topology, config.train.collective_timeout_s)
        self.tokenizer = load_tokenizer(config.data.tokenizer)
        self.tokenizer_info = describe_tokenizer(self.tokenizer, config.data.tokenizer)
        m = config.masking
        self.masker = build_masker(m, self.tokenizer, self.tokenizer_info.vocab_size, self.tokenizer_info.mask_id,
                                   config.train.seed)
        # Validation masks at masking.eval_probability (the same masker when it is the training rate).
        self.eval_masker = (self.masker if eval_probability(m) == m.probability else
                            build_masker(m, self.tokenizer, self.tokenizer_info.vocab_size,
                                         self.tokenizer_info.mask_id, config.train.seed, evaluation=True))
        self.step = 0
        self._entropies: dict[str, float] = {}
        """Validation unigram entropy per shard folder (the plateau's level), computed at the first evaluation."""
        self.resumed_from: Path | None = None
        self.resume_seconds = self.verify_seconds = 0.0
        resume = self._resume_source() if config.checkpoint.resume == "auto" else None
        start = int(checkpoints.read_marker(resume[0])["step"]) if resume else 0

        seed_everything(config.train.seed)  # the same initial weights on every rank
        # Positions are sized for the longest phase from the start, so a hand-over changes no shape.
        model = build_model(config.model, self.tokenizer_info, longest_seq_len(self.phases))
        if model.init_note and not resume:  # a resumed run loads the head it trained
            self._print(model.init_note)
        self.model_config = model.config
        self.num_parameters = sum(p.numel() for p in model.parameters())
        self._use_phase(phase_at(self.phases, start))
        self._use_rope(model)
        # A universal checkpoint must be announced before DeepSpeed builds its optimizer.
        self.engine = initialize_engine(model, config, self.plan, load_universal=bool(resume and resume[2]))
        if resume:
            self._load(*resume)
        self.metrics = self._open_metrics()

    @property
    def phased(self) -> bool:
        """True when the config lists phases (a run without them logs no phase)."""
        return bool(self.config.phases)

    def _use_phase(self, phase: Phase) -> None:
        """This phase's batch plan, data (continuing its folder's stream, see phases.py) and FLOPs per token."""
        c, info = self.config, self.tokenizer_info
        self.phase = phase
        self.plan = phase.plan(self.topology.world_size)
        self.data = PretrainData(phase.data, self.plan, self.masker, seed=c.train.seed, cache_dir=c.cache_dir,
                                 tokenizer_fingerprint=info.fingerprint,
                                 with_segments=c.model.architecture == "bert",  # where the shards hold pairs
                                 # doc-packed rows restart positions per document from the first position id
                                 position_offset=first_position_id(c.model.architecture, info.pad_id),
                                 eval_masker=self.eval_masker)
        if phase.index:
            self.data.step_shift = stream_start(self.phases, phase.index, self.data.num_train_sequences) - phase.start
        self.seq_len = self.data.seq_len
        self.flops_per_token = model_flops_per_token(self.model_config, self.seq_len, c.masking.probability)

    def _hand_over(self, phase: Phase) -> None:
        """Start the next phase: its data and batch settings; weights, optimizer moments and step carry on."""
        self._use_phase(phase)
        self._use_rope(self.engine.module)
        set_phase_batch(self.engine, self.plan)
        self.metrics.set_tags({"phase": phase.name})
        self.metrics.event({"phase": phase.name, "global_batch_size": self.plan.global_batch_size,
                            "accumulation": self.plan.accumulation, "seq_len": self.seq_len}, self.step)
        self._print(f"step {self.step}: phase {phase.name} ({phase.steps} steps, seq_len {self.seq_len}, "
                    f"global batch {self.plan.global_batch_size})")

    def _use_rope(self, model: torch.nn.Module) -> None:
        """ModernBERT: this phase's rotary bases (a context-extension phase raises them; see rope.py)."""
        phase = self.phase
        if phase.global_rope_theta is not None and set_rope_theta(model, phase.global_rope_theta,
                                                                  phase.local_rope_theta):
            self._print(f"RoPE theta: global {phase.global_rope_theta:g}, local {phase.local_rope_theta:g}")

    # --- set-up ---------------------------------------------------------------------------

    def _resume_source(self) -> tuple[Path, Path, bool] | None:
        """(complete checkpoint, folder DeepSpeed loads it from, universal?) or None for a fresh start."""
        newest = self._newest_intact()
        if newest is None:
            return None
        marker = checkpoints.read_marker(newest)
        saved = marker.get("batch_plan", {})
        # The batch that trained the checkpoint's last step, in this config: the order of the data depends on it.
        last = phase_at(self.phases, int(marker["step"]) - 1)
        if saved.get("global_batch_size") != last.global_batch_size:
            where = f" (phase {last.name})" if self.phased else ""
            raise PipelineError(f"checkpoint {newest} was trained with global batch {saved.get('global_batch_size')}, "
                                f"this run has {last.global_batch_size} at step {marker['step']}{where}; resuming "
                                f"would change the data order (use another train.output_dir, or the same global batch)")
        world_size = self.topology.world_size
        if not needs_universal(newest, saved.get("world_size"), world_size):
            return newest, newest.parent, False
        if self.topology.is_main:
            self._print(f"checkpoint {newest.name} was written by {saved.get('world_size')} ranks, this run has "
                        f"{world_size}: converting it to a universal checkpoint")
            convert_to_universal(newest)
        dist.barrier()
        return newest, newest / UNIVERSAL_DIR, True

    def _newest_intact(self) -> Path | None:
        """The newest complete checkpoint whose checksums hold: checked once, by rank 0, for every rank."""
        root = self.layout.checkpoints
        started = time.perf_counter()
        found = [None]
        if self.topology.is_main:
            newest = checkpoints.newest_intact(root, self._warn)
            found = [newest.name if newest else None]
        if self.topology.world_size > 1:
            dist.broadcast_object_list(found, src=0)
        self.verify_seconds = time.perf_counter() - started
        return root / found[0] if found[0] else None

    def _warn(self, message: str) -> None:
        if self.topology.is_main:
            print(f"warning: {message}", file=sys.stderr, flush=True)

    def _load(self, checkpoint: Path, load_root: Path, universal: bool) -> None:
        started = time.perf_counter()
        _, client_state = self.engine.load_checkpoint(str(load_root), tag=checkpoint.name)
        if client_state is None:
            raise PipelineError(f"checkpoint {checkpoint}: DeepSpeed could not load it")
        state = client_state.get("train_state") or checkpoints.read_marker(checkpoint)["train_state"]
        self.step = int(state["step"])
        self.resumed_from = checkpoint
        self.resume_seconds = time.perf_counter() - started
        # The optimizer comes back with the LR it had; put the schedule's LR for the next step in
        # place, which differs when train.max_steps or the schedule was changed for the resume.
        scheduler = self.engine.lr_scheduler
        scheduler.last_epoch = self.step
        multiplier = phase_lr_multiplier(self.step, self.phases, self.config.schedule, self.config.optimizer.lr)
        for group, base in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, strict=True):
            group["lr"] = base * multiplier

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
        tags = run_tags("pretrain", self.plan.world_size, gradient_accumulation=self.plan.accumulation,
                        parameters=self.num_parameters, output_dir=layout.root.resolve())
        if self.phased:
            tags["phase"] = self.phase.name
        metrics = open_metrics(True, jsonl=layout.metrics, resume_step=self.step, tracking=c.tracking,
                               run_name=c.tracking.run_name or layout.root.resolve().name, state_file=layout.tracking,
                               tags=tags, params=flatten(to_dict(c)))
        metrics.log_artifact(layout.config)
        if self.resumed_from is not None:
            metrics.event({"resumed_from": str(self.resumed_from),
                           "resume_load_seconds": round(self.resume_seconds, 3),
                           "checkpoint_verify_seconds": round(self.verify_seconds, 3)}, self.step)
        return metrics

    # --- the loop ---------------------------------------------------------------------------

    def train(self) -> RunResult:
        c, topo = self.config, self.topology
        stop = StopRequest().install()
        if self.step >= c.train.max_steps:  # a rerun of a finished run: only a missing export is redone
            self._print(f"already trained to step {self.step} (train.max_steps {c.train.max_steps})")
            return self._finish(stop, None, already_done=True)
        loader = None
        progress = self._progress_bar()
        window_start, window_tokens, window_samples = time.perf_counter(), 0, 0
        sync = StepSync(self.plan.world_size)
        stopped_by = None
        watchdog = self._watchdog()
        first_step = self.step
        self.engine.train()
        while self.step < c.train.max_steps:
            if self.step >= self.phase.end:
                self._hand_over(phase_at(self.phases, self.step))
                loader = None
            if loader is None:  # this phase's batches, up to its end
                loader = iter(self.data.loader(rank=topo.rank, start_step=self.step, end_step=self.phase.end,
                                               num_workers=c.data.num_workers))
            plan = self.plan
            micro_losses, extra, step_tokens = [], {}, 0
            lr = self.engine.get_lr()[0]  # the LR this step uses; the scheduler moves on inside engine.step()
            # The first step of a process carries one-off costs (workers starting, compilation): not guarded.
            guard: AbstractContextManager = (watchdog.guard(f"at step {self.step + 1}")
                                             if watchdog and self.step > first_step else nullcontext())
            with guard:
                for micro_step in range(plan.accumulation):
                    batch = next(loader)
                    step_tokens += real_tokens(batch)
                    seed_micro_batch(c.train.seed, self.step, plan.micro_batch_index(topo.rank, micro_step))
                    out = self.engine(**{k: v.to(self.engine.device, non_blocking=True) for k, v in batch.items()})
                    self.engine.backward(out["loss"])
                    self.engine.step()
                    micro_losses.append(out["loss"].detach().float())
                    for key in ("mlm_loss", "nsp_loss"):
                        if key in out:
                            extra.setdefault(key, []).append(out[key].detach().float())
                sync.record(self.step + 1, micro_losses, extra, step_tokens)
                stop_now = sync.stop_requested(stop.requested)
            self.step += 1
            window_samples += plan.global_batch_size  # phases may change the batch
            last = self.step == c.train.max_steps
            log_now = self.step % c.train.log_every == 0 or last
            eval_now = bool(c.train.eval_every) and self.step % c.train.eval_every == 0 and not last
            save_now = self.step % c.checkpoint.every == 0 and not last
            if log_now or eval_now or save_now or stop_now:  # only then do the losses come to the host
                checked = sync.check()
                window_tokens += checked.tokens
                if not math.isfinite(checked.window_loss) and c.precision != "fp16":
                    self._stop_on_nonfinite(checked)
                if log_now:
                    elapsed = time.perf_counter() - window_start
                    self._log_step(checked.loss, checked.extras, lr, window_tokens / elapsed,
                                   window_samples / elapsed, progress)
                    window_start, window_tokens, window_samples = time.perf_counter(), 0, 0
            if eval_now:
                self._evaluate()
            if stop_now:
                stopped_by = stop.signal_name or "a stop signal on another rank"
                break
            if save_now:
                self._checkpoint()
        if progress is not None:
            progress.close()
        if watchdog:
            watchdog.close()
        return self._finish(stop, stopped_by)

    def _watchdog(self) -> RankWatchdog | None:
        """With several ranks: a thread that ends this rank when a step outlasts train.collective_timeout_s."""
        if self.topology.world_size == 1:
            return None
        t = self.config.train
        return RankWatchdog(t.collective_timeout_s, lambda where: lost_rank_message(
            self.topology.rank, self.topology.world_size, where, t.collective_timeout_s, self.resume_hint(),
            f"the step has waited {t.collective_timeout_s:g} s"))

    def resume_hint(self) -> str:
        """Where a rerun of the same command resumes (the newest complete checkpoint), in words."""
        newest = checkpoints.newest_complete(self.layout.checkpoints)
        if newest is None:
            return "No checkpoint is complete yet: a rerun starts from step 0."
        return (f"Rerun the same command to resume from the last complete checkpoint, {newest} "
                f"(step {checkpoints.read_marker(newest)['step']}).")

    def _finish(self, stop: StopRequest, stopped_by: str | None, already_done: bool = False) -> RunResult:
        c = self.config
        export_dir = None
        if stopped_by is None and not already_done:
            self._evaluate()
        newest = checkpoints.newest_complete(self.layout.checkpoints)
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

            newest = checkpoints.newest_complete(self.layout.checkpoints)
            export_dir = export_checkpoint(newest, self.layout.export, overwrite=True)
            self._print(f"exported {export_dir}")
            self.metrics.log_artifact(export_dir, "export")
        if self.topology.is_main:  # every corpus of a mix is a dataset input of the run
            folders = dict.fromkeys(s.path for p in self.phases for s in p.data.corpora())
            record_in_model_store(self.metrics, export_dir, [shard_dataset(f) for f in folders],
                                  c.tracking.registered_model)
        self.metrics.close("FINISHED" if stopped_by is None else "KILLED")
        stop.restore()
        dist.barrier()
        return RunResult(self.step, stopped_by, export_dir)

    def _stop_on_nonfinite(self, checked: CheckedLosses) -> None:
        newest = checkpoints.newest_complete(self.layout.checkpoints)
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
    def _evaluate(self) -> dict[str, float]:
        eval_sets = self.data.eval_sets(self.config.train.eval_sequences, self.plan.micro_batch_size,
                                        self.topology.rank, self.topology.world_size)
        self.engine.eval()
        totals = torch.zeros(len(eval_sets), 2, dtype=torch.float64)  # per corpus: loss × masked, masked
        for corpus, keys in enumerate(eval_sets):
            for key in keys:
                batch = {k: v.to(self.engine.device) for k, v in self.data.val_batches[key].items()}
                out = self.engine(**batch)
                masked = (batch["labels"] != IGNORE_INDEX).sum().item()
                totals[corpus] += torch.tensor([out.get("mlm_loss", out["loss"]).float().item() * masked, masked],
                                               dtype=torch.float64)
        self.engine.train()
        dist.all_reduce(totals)
        metrics = {**self.data.eval_metrics(totals.numpy()), "eval/mask_rate": eval_probability(self.config.masking)}
        if self.topology.is_main:
            metrics.update(self._plateau_metrics(metrics))
        self.metrics.log(metrics, self.step)
        self.metrics.flush()
        per_corpus = "".join(f", {s.name} {metrics_beside_plateau(metrics, f'eval/{s.name}/')}"
                             for s in self.data.corpora if self.data.mixed)
        self._print(f"step {self.step}: eval MLM loss{at_mask_rate(metrics)} {metrics_beside_plateau(metrics)}"
                    f"{per_corpus}, perplexity {metrics['eval/perplexity']:.2f}")
        return metrics

    def _plateau_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """The unigram plateau's level beside the loss: the validation tokens' unigram entropy, and the margin below.

        A loss means little on its own: a model that knows only token frequencies reaches the entropy
        (plateau.py says why). A mix's level weighs each corpus's entropy by its share, as its loss does.
        """
        entropies = []
        for source in self.data.corpora:
            key = str(source.path)
            if key not in self._entropies:  # once per folder: a bincount over its validation shards
                self._entropies[key] = plateau_level(source.path, self.tokenizer)
            entropies.append(self._entropies[key])
        entropy = float(np.dot(self.data.shares, entropies)) if self.data.mixed else entropies[0]
        out = {"eval/unigram_entropy": entropy, "eval/margin_below_unigram": entropy - metrics["eval/mlm_loss"]}
        if self.data.mixed:
            for source, value in zip(self.data.corpora, entropies, strict=True):
                out[f"eval/{source.name}/unigram_entropy"] = value
                out[f"eval/{source.name}/margin_below_unigram"] = value - metrics[f"eval/{source.name}/mlm_loss"]
        return out

    def _checkpoint(self) -> None:
        plan = self.plan
        state = {"step": self.step, "samples_consumed": samples_consumed(self.phases, self.step),
                 "epoch": self.data.epoch_state(self.step)}
        if self.phased:  # the phase that trained the last step; a resume picks its own from the step
            state["phase"] = self.phase.name
        marker = {"batch_plan": {"global_batch_size": plan.global_batch_size, "micro_batch_size": plan.micro_batch_size,
                                 "world_size": plan.world_size, "accumulation": plan.accumulation},
                  "architecture": self.config.model.architecture, "seq_len": self.seq_len,
                  "zero_stage": self.config.zero_stage, "precision": self.config.precision,
                  "config": to_dict(self.config), **({"phase": self.phase.name} if self.phased else {}),
                  # the model's own shape: with model.init_from it is the folder's, not the model section's
                  "hf_config": json.loads(self.model_config.to_json_string())}
        start = time.perf_counter()
        folder = checkpoints.save_checkpoint(self.engine, self.layout.checkpoints, self.step, state, marker,
                                             self.config.checkpoint.keep_last)
        self.metrics.event({"checkpoint": str(folder), "checkpoint_seconds": round(time.perf_counter() - start, 3)},
                           self.step)
        self.metrics.flush()

    def _log_step(self, loss: float, extras: dict[str, float], lr: float, tokens_per_s: float,
                  samples_per_s: float, progress) -> None:
        engine = self.engine
        grad_norm = engine.get_global_grad_norm()
        scale = getattr(engine.optimizer, "cur_scale", None) if self.config.precision == "fp16" else 1.0
        metrics: dict[str, Any] = {
            "train/loss": loss, **{f"train/{k}": v for k, v in extras.items()},
            "train/lr": lr,
            "train/grad_norm": float(grad_norm) if grad_norm is not None else None,
            "train/loss_scale": float(scale) if scale is not None else None,
            "train/tokens_per_s": tokens_per_s, "train/samples_per_s": samples_per_s,
            "train/mfu": mfu(tokens_per_s, self.flops_per_token, self.config.train.peak_tflops, self.plan.world_size),
            "train/phase": self.phase.index + 1 if self.phased else None,  # 1, 2, …: NVIDIA's phase numbers
            **self.data.progress(self.step),
        }
        self.metrics.log(metrics, self.step)
        if progress is not None:
            progress.update(self.step - progress.n)
            progress.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}",
                                 refresh=False)

    def _progress_bar(self):
        if not self.topology.is_main:
            return None
        from tqdm.auto import tqdm

        return tqdm(total=self.config.train.max_steps, initial=self.step, desc="pretrain", unit="step",
                    dynamic_ncols=True, mininterval=1.0)

    def _print(self, message: str) -> None:
        if self.topology.is_main:
            from tqdm.auto import tqdm

            tqdm.write(message)


def run_pretraining(config: PretrainConfig, topology: Topology) -> RunResult:
    trainer = None
    try:
        trainer = Pretrainer(config, topology)
        if trainer.resumed_from is not None:
            trainer._print(f"resumed from {trainer.resumed_from} (step {trainer.step})")
        return trainer.train()
    except Exception as err:
        if topology.world_size == 1 or not is_lost_peer(err):
            raise
        where = "while starting" if trainer is None else f"after step {trainer.step}"
        hint = trainer.resume_hint() if trainer is not None else "Rerun the same command."
        if trainer is not None and hasattr(trainer, "metrics"):
            trainer.metrics.close("FAILED")
        raise lost_rank_error(err, topology.rank, topology.world_size, where, config.train.collective_timeout_s,
                              hint) from None
