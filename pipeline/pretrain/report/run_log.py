"""What a pretraining run reports: messages and a progress bar on screen, events and metrics in metrics.jsonl and
MLflow, and the throughput, MFU and data-wait share behind them.

The loop (trainer.py) says what happened; this says it, and decides when: the step metrics every
`train.log_every` steps and at the end. Rank 0 reports; the other ranks hold a sink that drops everything
(tracking/metrics.py), so the loop never asks which rank it is on. The validation losses are validation.py's.
"""

from __future__ import annotations

import time
from typing import Any

from tqdm.auto import tqdm

from pipeline.common.atomic_files import staged_folder, write_json_atomic
from pipeline.common.config.tree import flatten, to_dict
from pipeline.common.processes.topology import Topology
from pipeline.common.run_kernel import run_tags
from pipeline.models.architectures.flops import mfu, model_flops_per_token
from pipeline.pretrain.batches.stretch_data import PretrainData
from pipeline.pretrain.checkpoints.ledger import GaveUpEvent, RollbackEvent
from pipeline.pretrain.plan.run_plan import RunPlan
from pipeline.pretrain.step.deepspeed_patches import loss_scale
from pipeline.pretrain.step.step_sync import CheckedLosses
from pipeline.tracking.metrics import MetricsSink
from pipeline.tracking.sinks import open_metrics


class RunLog:
    """The run's reports on this rank, about the stretch it trains (`use`)."""

    def __init__(self, plan: RunPlan, topology: Topology):
        self.plan, self.config, self.is_main = plan, plan.config, topology.is_main
        self.log_every, self.end_step = plan.config.train.log_every, plan.end_step
        self.metrics = MetricsSink()
        self.progress: tqdm | None = None
        self._closed = False
        self._session_wait_share: float | None = None
        """The session's wait share of the rank that waited most, as of the last check."""

    def open(self, tokenizer, step: int, parameters: int, allreduce_bytes: int | None = None) -> None:
        """Rank 0: the config and a tokenizer copy in the run folder; metrics.jsonl and MLflow opened, tagged with the
        stretch the run starts in and the bytes a rank sends into the gradient all-reduce a step (None: one rank, or
        DeepSpeed's own all-reduce at ZeRO 1-3)."""
        c, layout = self.config, self.config.layout
        if not self.is_main:
            return
        layout.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(layout.config, to_dict(c))
        if not layout.tokenizer.exists():
            with staged_folder(layout.tokenizer) as tmp:
                tokenizer.save_pretrained(tmp)
        stretch = self.plan.stretch_at(step)
        tags = run_tags("pretrain", self.plan.world_size, parameters=parameters, output_dir=layout.root.resolve(),
                        gradient_accumulation=stretch.plan(self.plan.world_size).accumulation,
                        gradient_allreduce_bytes=allreduce_bytes)
        if c.phases:
            tags["phase"] = stretch.phase.name
        self.metrics = open_metrics(True, jsonl=layout.metrics, resume_step=step, tracking=c.tracking,
                                    run_name=c.tracking.run_name or layout.root.resolve().name,
                                    state_file=layout.tracking, tags=tags, params=flatten(to_dict(c)))
        self.metrics.log_artifact(layout.config)

    def say(self, message: str) -> None:
        if self.is_main:
            tqdm.write(message)

    def report(self, step: int, event: dict[str, Any], message: str | None = None) -> None:
        """An event in the metrics (written through at once), and its message on screen."""
        self.metrics.event(event, step)
        self.metrics.flush()
        if message:
            self.say(message)

    def use(self, data: PretrainData, hf_config, *, handed_over_at: int | None = None) -> None:
        """Report on `data`'s stretch from now on (its MFU from `hf_config`); announce it when a hand-over starts it."""
        self.data, phase = data, data.stretch.phase
        # MFU two ways: as trained (the head at the masked share, real tokens) and by the anchors' convention (a full
        # head on every position, padding included), which published MFU figures use
        self.flops_per_token = model_flops_per_token(hf_config, data.seq_len, phase.masking_probability)
        self.flops_per_position_full_head = model_flops_per_token(hf_config, data.seq_len, None)
        if handed_over_at is None:
            return
        shares = {c.name: round(float(p), 4) for c, p in zip(data.corpora, data.stretch.shares, strict=True)}
        event = {"global_batch_size": data.plan.global_batch_size, "accumulation": data.plan.accumulation,
                 "seq_len": data.seq_len, "masking_probability": phase.masking_probability,
                 **({"phase": phase.name} if phase.name else {}), **({"mix": shares} if data.mixed else {})}
        if phase.name:
            self.metrics.set_tags({"phase": phase.name})
        what = f"phase {phase.name} ({phase.steps} steps, " if phase.name else "("
        self.report(handed_over_at, event, f"step {handed_over_at}: {what}seq_len {data.seq_len}, global batch "
                    f"{data.plan.global_batch_size}, masking {phase.masking_probability:g}"
                    + (f", mix {shares})" if data.mixed else ")"))

    def start(self, step: int) -> None:
        """Training starts at `step` (the run's start, or a rollback's): the progress bar stands there, and the
        throughput since the last log (`window`) and over this session (`session`) is counted from the first."""
        if self.progress is not None:
            self._advance(step)
            return
        self.window, self.session = ThroughputWindow(), ThroughputWindow()
        if self.is_main:
            self.progress = tqdm(total=self.plan.end_step, initial=step, desc="pretrain", unit="step",
                                 dynamic_ncols=True, mininterval=1.0)

    def stepped(self, stepping: float, waited: float) -> None:
        """A step took `stepping` seconds, `waited` of them for the loader."""
        for window in (self.window, self.session):  # a hand-over may change the batch
            window.add(samples=self.data.plan.global_batch_size, stepping=stepping, waited=waited)

    def wait_shares(self) -> list[float]:
        """This rank's share of the steps' time spent waiting for data, since the last log and over the session:
        what it gives the loop's next check (`StepSync.check`), which gathers every rank's."""
        return [self.window.wait_share, self.session.wait_share]

    def due(self, step: int) -> bool:
        """Whether the step metrics are logged after `step` steps: every `train.log_every` and at the end."""
        return step % self.log_every == 0 or step >= self.end_step

    def after_step(self, step: int, checked: CheckedLosses | None, lr: float, engine) -> None:
        """The losses a check brought to the host after `step` steps, logged (with the window's rates) when due.
        The wait shares are the largest of any rank's (`checked.ranks`, from `wait_shares`): the slowest loader
        holds up every rank's step, so a slow one on another node must not read as compute."""
        if checked is None:
            return
        for window in (self.window, self.session):
            window.add(tokens=checked.tokens)
        if checked.ranks:
            self._session_wait_share = max(r[1] for r in checked.ranks)
        if not self.due(step):
            return
        tokens_per_s, samples_per_s, wait_share = self.window.rates()
        if checked.ranks:
            wait_share = max(r[0] for r in checked.ranks)
        grad_norm = engine.get_global_grad_norm()
        scale = loss_scale(engine) if self.config.train.precision == "fp16" else 1.0
        self.metrics.log({
            "train/loss": checked.loss, **{f"train/{k}": v for k, v in checked.extras.items()},
            "train/lr": lr,
            "train/grad_norm": float(grad_norm) if grad_norm is not None else None,
            "train/loss_scale": float(scale) if scale is not None else None,
            "train/tokens_per_s": tokens_per_s, "train/samples_per_s": samples_per_s,
            "train/data_wait_share": wait_share, "train/mfu": self._mfu(tokens_per_s),
            "train/mfu_full_head": self._mfu_full_head(samples_per_s),
            "train/phase": self.data.stretch.phase.index + 1 if self.config.phases else None,  # NVIDIA's numbers
            **self.data.progress(step),
        }, step)
        self._advance(step)
        if self.progress is not None:
            self.progress.set_postfix(loss=f"{checked.loss:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}",
                                      data_wait=f"{wait_share:.0%}", refresh=False)

    def skipped(self, skipped: range, step: int) -> None:
        """The loop passed over `skipped` (0-based step indices) and goes on at `step`."""
        label = f"{skipped.start + 1}:{skipped.stop}"
        self.report(step, {"skipped_steps": label}, f"steps {label} skipped (train.skip_steps): their batches are "
                    f"left out; step {step + 1} trains on its own batch")
        self._advance(step)

    def outliers(self, spike, step: int, config, *, left_out: bool) -> None:
        """The outliers the spike guard found since the last check (spike_guard.py `Spike`); `left_out`: their updates
        were left out (`skip`, and `rollback` before `guard.rollback_after` outliers)."""
        g = config.guard
        named = ", ".join(map(str, spike.since)) + (f" and {spike.count - len(spike.since)} more"
                                                      if spike.count > len(spike.since) else "")
        self.metrics.log({"guard/outliers": spike.count, "guard/nonfinite": spike.nonfinite,
                          **({"guard/skipped_updates": spike.count} if left_out else {})}, step)
        bar = f"loss or gradient norm above the last {g.window} steps' mean + {g.threshold:g} deviations" + (
            f", {spike.nonfinite} non-finite" if spike.nonfinite else "")
        watched = (f", {len(spike.window)} in the last {g.window} steps (guard.rollback_after {g.rollback_after})"
                   if config.train.spike_guard == "rollback" else "")
        what = ("update left out by the spike guard" if left_out else "an outlier for the spike guard") + watched
        self.report(step, {"spike_outliers": list(spike.since), "spike_count": spike.count,
                           "spike_nonfinite": spike.nonfinite, "spike_action": "skipped" if left_out else "watched"},
                    f"step{'s' * (spike.count > 1)} {named}: {what} ({bar})")

    def responded(self, response, step: int, config) -> None:
        """What the spike guard's response (spike_response.py `Response`) did after `step` steps."""
        self.outliers(response.spike, step, config,
                      left_out=response.action == "skip" or config.train.spike_guard == "skip")
        if response.action == "no rollback target":
            self.no_rollback_target(response.spike, step, left_out=response.left_out)
        elif response.action == "roll back":
            self.rolled_back(response.events[-1], response.rollbacks, step)
        elif response.action == "give up":
            self.gave_up(response.events[-1])

    def no_rollback_target(self, spike, step: int, *, left_out: bool) -> None:
        """`rollback` found outliers (spike_guard.py `Spike`) before any checkpoint of this run lies behind them."""
        what = ("their updates were left out" if left_out else
                "their updates stand (this step cannot leave one out: ZeRO 0 can)")
        self.report(step, {"spike_outliers": list(spike.since), "spike_action": "no rollback target"},
                    f"spike guard: outliers at steps {', '.join(map(str, spike.since))} and no checkpoint of this run "
                    f"before them to roll back to: {what}; the run goes on")

    def rolled_back(self, event: RollbackEvent, rollbacks: int, step: int) -> None:
        """The spike guard rolled the run back after `step` steps (`rollbacks` in all)."""
        self.metrics.log({"guard/rollbacks": rollbacks}, step)
        self.report(step, {k: v for k, v in event.to_json().items() if k != "time"} | {"event": "spike_rollback"},
                    f"spike guard: outliers at steps {', '.join(map(str, event.outliers))}; rolled back to "
                    f"{event.to} and leaving out steps {event.first}:{event.last} (recorded in the run's ledger)")

    def gave_up(self, event: GaveUpEvent) -> None:
        self.metrics.log({"guard/gave_up": 1}, event.at_step)
        self.report(event.at_step, {"event": "spike_gave_up", "outliers": list(event.outliers), "why": event.why},
                    event.why)

    def _advance(self, step: int) -> None:
        if self.progress is not None:
            self.progress.update(step - self.progress.n)

    def summary(self, step: int) -> None:
        """The session's throughput, MFU and share of time spent waiting for data (of the rank that waited most,
        as the last check gathered it)."""
        tokens_per_s, samples_per_s, wait_share = self.session.rates()
        wait_share = self._session_wait_share if self._session_wait_share is not None else wait_share
        run_mfu, full_head = self._mfu(tokens_per_s), self._mfu_full_head(samples_per_s)
        self.report(step, {"summary/tokens_per_s": round(tokens_per_s, 1), "summary/data_wait_share":
                           round(wait_share, 4), "summary/mfu": run_mfu, "summary/mfu_full_head": full_head},
                    f"this session trained to step {step}: {tokens_per_s:,.0f} tokens/s"
                    + (f", MFU {run_mfu:.1%} as trained, {full_head:.1%} with a full head" if run_mfu is not None
                       else "")
                    + f", waiting for data {wait_share:.1%} of the time")

    def _mfu(self, tokens_per_s: float) -> float | None:
        """As trained: the real tokens' FLOPs, the head at the masked share."""
        return mfu(tokens_per_s, self.flops_per_token, self.config.train.peak_tflops, self.data.plan.world_size)

    def _mfu_full_head(self, samples_per_s: float) -> float | None:
        """By the anchors' convention: every position's FLOPs with a full head."""
        return mfu(samples_per_s * self.data.seq_len, self.flops_per_position_full_head, self.config.train.peak_tflops,
                   self.data.plan.world_size)

    def close(self, status: str) -> None:
        """The progress bar and the metrics closed with the run's `status` (again: nothing)."""
        if self._closed:
            return
        self._closed = True
        if self.progress is not None:
            self.progress.close()
            self.progress = None
        self.metrics.close(status)


class ThroughputWindow:
    """Tokens and samples trained since the last log, the seconds they took, and of the steps' own seconds those
    spent waiting for the next batch: a share near 0 means the loader keeps up, one that grows means the steps
    wait on it. The times are the host's: on a GPU a wait overlapped by queued kernels costs nothing."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.started, self.tokens, self.samples = time.perf_counter(), 0.0, 0
        self.stepping = self.waited = 0.0

    def add(self, *, samples: int = 0, tokens: float = 0.0, stepping: float = 0.0, waited: float = 0.0) -> None:
        """`stepping`: seconds inside steps; `waited`: the part of them spent waiting for the loader."""
        self.samples += samples
        self.tokens += tokens
        self.stepping += stepping
        self.waited += waited

    @property
    def wait_share(self) -> float:
        """The share of the steps' time spent waiting for data, so far in the window."""
        return self.waited / max(self.stepping, 1e-9)

    def rates(self) -> tuple[float, float, float]:
        """(tokens/s, samples/s, share of the steps' time spent waiting for data) over the window; starts the
        next one."""
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        rates = self.tokens / elapsed, self.samples / elapsed, self.wait_share
        self.reset()
        return rates
