"""Fine-tuning with accelerate: setup → fit → validate → save, for one `training.Training`.

Works in one process, under `accelerate launch` (several processes: gloo on CPU, NCCL on GPUs,
DeepSpeed when accelerate is configured for it) and with mixed precision. The loop knows nothing
of the task: a `TaskFamily` builds the model, encodes the data, turns outputs into predictions
and metrics, and writes the prediction files. Nor does it know which training it runs (a seed, a
sweep trial, a label-curve point): the `Training` says its name, tags and whether it keeps weights.
"""

from __future__ import annotations

import functools
import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.config.tree import flatten, to_dict
from pipeline.common.processes.lost_rank import RankWatchdog, lost_rank_message
from pipeline.common.run_kernel import seed_everything
from pipeline.data.tasks.splits import Split
from pipeline.finetune.loop.accelerator import bare_model, build_accelerator
from pipeline.finetune.loop.arm import RERUN_HINT, SELECT, SeedResult, Training
from pipeline.finetune.loop.clock import Phase
from pipeline.finetune.outputs.folders import save_model
from pipeline.models.parameter_groups import parameter_groups
from pipeline.tracking.metrics import MetricsSink
from pipeline.tracking.model_store import record_in_model_store, task_datasets
from pipeline.tracking.sinks import open_metrics


@dataclass
class Evaluation:
    """Dev predictions and labels by split (gathered from every process), and the task's metrics on them."""

    metrics: dict[str, float]
    predictions: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]


def row_lengths(dataset: torch.utils.data.Dataset) -> list[int]:
    """Each encoded row's length in tokens, what a batch pads to."""
    return [len(dataset[i]["input_ids"]) for i in range(len(dataset))]


class LengthSorted(torch.utils.data.Dataset):
    """An encoded split read shortest first, so that each evaluation batch pads to rows of about its own length;
    `unsort` puts predictions made in this order back in the split's order."""

    def __init__(self, dataset: torch.utils.data.Dataset):
        self.dataset = dataset
        self.order = np.argsort(row_lengths(dataset), kind="stable")

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> dict:
        return self.dataset[int(self.order[i])]

    def unsort(self, rows: np.ndarray) -> np.ndarray:
        restored = np.empty_like(rows)
        restored[self.order] = rows
        return restored


def charged(phase: Phase):
    """A `FineTuner` method whose time goes to `phase` of the run's clock (`run_clock.py`)."""
    def wrap(method):
        @functools.wraps(method)
        def charged_method(self: FineTuner, *args, **kwargs):
            with self.arm.clock.phase(phase):
                return method(self, *args, **kwargs)
        return charged_method
    return wrap


class FineTuner:
    """One `Training`: `setup()` builds its accelerator, model, data and optimizer; `fit()` trains and keeps the
    best epoch; `validate()` scores the dev splits; `save()` writes its folder, `complete.json` last."""

    def __init__(self, training: Training):
        self.training = training
        self.config, self.data, self.family, self.seed = training.config, training.data, training.family, training.seed
        self.arm, self.plan, self.out, self.label = training.arm, training.plan, training.folder, training.label
        self.watchdog: RankWatchdog | None = None
        if self.plan.world_size > 1:  # see pipeline/common/processes/lost_rank.py
            timeout, rank = self.config.train.collective_timeout_s, self.arm.processes.process_index
            self.watchdog = RankWatchdog(timeout, lambda where: lost_rank_message(
                rank, self.plan.world_size, f"in {self.label}, {where}", timeout, RERUN_HINT,
                f"a micro batch has waited {timeout:g} s"))

    @charged("model set-up")
    def setup(self) -> None:
        from transformers import get_linear_schedule_with_warmup
        from transformers.trainer_pt_utils import LengthGroupedSampler

        c, t, plan = self.config, self.config.train, self.plan
        # An accelerator of this training's own plan: a swept batch size changes the accumulation.
        acc = self.accelerator = build_accelerator(t.precision, accumulation=plan.accumulation,
                                                   world_size=plan.world_size,
                                                   collective_timeout_s=t.collective_timeout_s)
        seed_everything(self.seed)
        self.tokenizer = self.arm.tokenizer
        model = self.family.build_model(self.arm.source.path, self.arm.from_scratch)
        if not self.arm.from_scratch and acc.is_main_process:
            print(f"loaded {self.arm.source.path} with a new {self.family.task_type} head", flush=True)
        collate = self.family.collator(self.tokenizer)
        train_set = self.arm.encoded(self.family, self.data.train, c.data.max_seq_len)
        # Batches of similar lengths (HF Trainer's `group_by_length`): shuffled, then sorted within mega-batches of
        # 50 batches, so a batch pads to a length near its rows' own instead of the longest of 16 random ones.
        # On short-sentence tasks random batches are mostly padding, and padding costs as much as text.
        sampler = LengthGroupedSampler(self.plan.micro_batch_size, lengths=row_lengths(train_set),
                                       generator=torch.Generator().manual_seed(self.seed))
        train_loader = torch.utils.data.DataLoader(train_set, batch_size=self.plan.micro_batch_size, sampler=sampler,
                                                   collate_fn=collate)
        dev_loaders = [self.eval_loader(split) for split in self.data.dev.values()]
        held_out = self.training.held_out
        if held_out is not None:
            dev_loaders.append(self.eval_loader(held_out))
        # Fused: one kernel over all parameters, HF Trainer's default too (`adamw_torch_fused`). torch's default
        # on CPU is a Python loop over tensors, which took 10× as long per step on a 15M-parameter encoder: on a
        # small model, longer than its forward and backward.
        optimizer = torch.optim.AdamW(parameter_groups(model, t.weight_decay), lr=t.learning_rate,
                                      betas=tuple(t.adam_betas), eps=t.adam_eps, fused=True)
        # Optimizer steps per epoch: accelerate hands each process every world_size-th micro batch
        # (the last ones repeated to even them out), and steps once per `accumulation` of them.
        micro_per_process = math.ceil(len(train_loader) / self.plan.world_size)
        self.steps_per_epoch = math.ceil(micro_per_process / self.plan.accumulation)
        total = self.steps_per_epoch * t.epochs
        # Stepped by hand once per optimizer step (accelerate would step it once per process).
        self.scheduler = get_linear_schedule_with_warmup(optimizer, int(t.warmup_ratio * total), total)
        self.model, self.optimizer, self.train_loader, *loaders = acc.prepare(model, optimizer, train_loader,
                                                                             *dev_loaders)
        if held_out is not None:
            self.select_loaders = {SELECT: loaders.pop()}
        self.dev_loaders = dict(zip(self.data.dev, loaders, strict=True))
        self.metrics = self._open_metrics()

    def eval_loader(self, split: Split):
        dataset = LengthSorted(self.arm.encoded(self.family, split, self.config.data.max_seq_len))
        return torch.utils.data.DataLoader(dataset, batch_size=self.config.train.eval_batch_size,
                                           collate_fn=self.family.collator(self.tokenizer))

    @charged("tracking")
    def _open_metrics(self) -> MetricsSink:
        training, arm = self.training, self.arm
        params = {**flatten(to_dict(self.config)), "model": arm.source.path, "seed": self.seed,
                  "from_scratch": arm.from_scratch, "gradient_accumulation": self.plan.accumulation}
        return open_metrics(self.accelerator.is_main_process, tracking=self.config.tracking, run_name=training.run_name,
                            tags=training.tags(), params=params)

    def fit(self) -> SeedResult:
        """Train every epoch and keep the best one: best on dev, or on the selection slice (its metrics prefixed
        `select_`); with `held_out`, dev is then scored once, on that epoch's weights."""
        from tqdm.auto import tqdm

        acc, epochs, training = self.accelerator, self.config.train.epochs, self.training
        main_metric = self.family.main_metric
        choose = self.select_loaders if training.held_out is not None else self.dev_loaders
        prefix, log_prefix = ("select_", "select/") if training.on_slice else ("", "eval/")
        result, self.best_state = SeedResult(self.seed, {}, 0), None
        progress = tqdm(total=self.steps_per_epoch * epochs, desc=self.label, disable=not acc.is_main_process,
                        mininterval=1.0)
        for epoch in range(1, epochs + 1):
            train_loss = self._train_epoch(progress)
            if epoch % training.score_every and epoch < epochs:  # a curve point's short epochs: scored every few
                result.history.append({"epoch": epoch, "train_loss": train_loss})
                self.metrics.log({"train/loss": train_loss}, epoch)
                continue
            evaluation = self.validate(choose)
            scores = {f"{prefix}{k}": v for k, v in evaluation.metrics.items()}
            result.history.append({"epoch": epoch, "train_loss": train_loss, **scores})
            self.metrics.log({"train/loss": train_loss, **{f"{log_prefix}{k}": v
                                                           for k, v in evaluation.metrics.items()}}, epoch)
            progress.set_postfix(loss=f"{train_loss:.3f}", **{main_metric: f"{evaluation.metrics[main_metric]:.4f}"})
            if not result.best or scores[prefix + main_metric] > result.best[prefix + main_metric]:
                result.best, result.best_epoch, self.best_evaluation = scores, epoch, evaluation
                self.best_state = {k: v.detach().to("cpu", copy=True)
                                   for k, v in bare_model(self.model).state_dict().items()}
        progress.close()
        return self._score_dev_once(result) if training.held_out is not None else result

    def take_over(self, done: SeedResult) -> SeedResult:
        """The result of `done`, a training this seed would repeat exactly (the same data, setting and seed, the
        same slice choosing the epoch): its epochs are logged as this seed's, and dev is scored once, on its best
        epoch's weights, as `fit` would."""
        if self.training.held_out is None or done.state is None:
            raise ValueError("take_over: only a seed whose best epoch the selection slice picks repeats a trial, "
                             "and only a training of this process has its weights")
        for entry in done.history:  # as `fit` logged them: the loss and the slice's scores, per epoch
            scores = {f"select/{k.removeprefix('select_')}": v for k, v in entry.items() if k.startswith("select_")}
            self.metrics.log({"train/loss": entry["train_loss"], **scores}, entry["epoch"])
        self.best_state = done.state
        return self._score_dev_once(SeedResult(self.seed, dict(done.best), done.best_epoch, list(done.history)))

    def _score_dev_once(self, result: SeedResult) -> SeedResult:
        """Dev, read once: on the epoch the selection slice chose."""
        bare_model(self.model).load_state_dict(self.best_state)
        self.best_evaluation = self.validate()
        result.best = {**self.best_evaluation.metrics, **result.best}
        self.metrics.log({f"eval/{k}": v for k, v in self.best_evaluation.metrics.items()}, result.best_epoch)
        return result

    @charged("training steps")
    def _train_epoch(self, progress) -> float:
        acc, t = self.accelerator, self.config.train
        self.model.train()
        losses = []
        for index, batch in enumerate(self.train_loader):
            # The first micro batch of an epoch starts the loader (and the first of a seed, the model): not guarded.
            guard: AbstractContextManager = (self.watchdog.guard(f"at micro batch {index + 1} of an epoch")
                                             if self.watchdog and index else nullcontext())
            with guard, acc.accumulate(self.model):
                loss = self.model(**batch).loss
                acc.backward(loss)
                if acc.sync_gradients and t.max_grad_norm:
                    acc.clip_grad_norm_(self.model.parameters(), t.max_grad_norm)
                self.optimizer.step()
                self.optimizer.zero_grad()
            losses.append(loss.detach().float())
            if acc.sync_gradients:
                if not acc.optimizer_step_was_skipped:  # fp16 overflow: the schedule waits too
                    self.scheduler.step()
                progress.update(1)
        return acc.gather(torch.stack(losses).mean()[None]).mean().item()

    @charged("evaluation")
    @torch.no_grad()
    def validate(self, loaders: dict | None = None) -> Evaluation:
        """Score the dev splits (or the given `loaders`, by split name) with the task's metrics."""
        predictions, labels = {}, {}
        for name, loader in (self.dev_loaders if loaders is None else loaders).items():
            predictions[name], labels[name] = self._predict(loader)
        return Evaluation(self.family.metrics(predictions, labels), predictions, labels)

    @charged("evaluation")
    @torch.no_grad()
    def _predict(self, loader) -> tuple[np.ndarray, np.ndarray | None]:
        self.model.eval()
        preds, golds = [], []
        for batch in loader:
            pred, gold = self.family.predict(self.model(**batch), batch)
            if gold is None:  # an unlabelled test split
                preds.append(self.accelerator.gather_for_metrics(pred).cpu())
                continue
            pred, gold = self.accelerator.gather_for_metrics((pred, gold))
            preds.append(pred.cpu())
            golds.append(gold.cpu())
        unsort = loader.dataset.unsort
        return unsort(torch.cat(preds).numpy()), unsort(torch.cat(golds).numpy()) if golds else None

    @charged("saving")
    def save(self, result: SeedResult) -> None:
        """The best epoch's weights as an HF folder, reports, test predictions; `complete.json` last."""
        acc, out = self.accelerator, self.out
        bare_model(self.model).load_state_dict(self.best_state)
        test_predictions = {name: self._predict(self.accelerator.prepare(self.eval_loader(split)))[0]
                            for name, split in self.data.test.items()}  # every process takes part
        if acc.is_main_process:
            out.root.mkdir(parents=True, exist_ok=True)
            summary = {**result.best, "best_epoch": result.best_epoch, "seed": self.seed,
                       "from_scratch": self.arm.from_scratch, "processes": acc.num_processes}
            write_json_atomic(out.metrics, summary)
            write_json_atomic(out.history, result.history)
            artifacts = [out.metrics, out.history]
            best = self.best_evaluation
            # Figures for the seeds that keep their model; a trial or a curve point reports in files alone.
            artifacts += self.family.write_dev_reports(out, self.data.dev, best.predictions, best.labels,
                                                       figures=self.training.keeps_weights)
            for name, values in test_predictions.items():
                artifacts += self.family.write_test_predictions(out, name, self.data.test[name], values)
            if self.training.keeps_weights:
                self._save_model(result)
            self.metrics.log({f"best/{k}": v for k, v in result.best.items()} | {"best/epoch": result.best_epoch},
                             self.config.train.epochs)
            for path in artifacts:
                self.metrics.log_artifact(path)
            if self.training.keeps_weights:
                with self.arm.clock.phase("tracking"):
                    record_in_model_store(self.metrics, out.model, task_datasets(self.data),
                                          self.config.tracking.registered_model)
            self.training.mark_complete({"metrics": result.best, "best_epoch": result.best_epoch,
                                         "processes": acc.num_processes})
        with self.arm.clock.phase("tracking"):
            self.metrics.close()  # waits while its thread sends what is left
        acc.wait_for_everyone()
        acc.free_memory()  # drop the prepared model and optimizer before the next seed
        if self.watchdog:
            self.watchdog.close()

    def _save_model(self, result: SeedResult) -> None:
        out, t, source, protocol = self.out, self.config.train, self.arm.source, self.training.protocol
        first_dev = next(iter(self.eval_loader(next(iter(self.data.dev.values())))))
        save_model(out.model, bare_model(self.model), self.tokenizer, {
            **self.family.provenance(), "name": self.config.task_name, "seed": self.seed, "metrics": result.best,
            "best_epoch": result.best_epoch, "max_seq_len": self.config.data.max_seq_len,
            "from_scratch": self.arm.from_scratch, "source_model": source.path,
            "pretrain_run_id": source.pretrain_run_id,
            "pretrain_checkpoint": source.pretrain_checkpoint,
            "recipe": {"learning_rate": t.learning_rate, "batch_size": t.batch_size, "epochs": t.epochs,
                       "warmup_ratio": t.warmup_ratio, "weight_decay": t.weight_decay, "precision": t.precision},
            **({"selection": protocol} if protocol else {})}, check_batch=first_dev, precision=t.precision)

    def run(self, takes_over: SeedResult | None = None) -> SeedResult:
        """setup → fit (or, given `takes_over`, `take_over` that training) → save; the result holds the best
        epoch's weights (`SeedResult.state`)."""
        self.setup()
        result = self.fit() if takes_over is None else self.take_over(takes_over)
        self.save(result)
        result.state = self.best_state
        return result


def train_or_reuse(training: Training, takes_over: SeedResult | None = None) -> SeedResult:
    """`training`'s result: read back when it finished before (and said so), else trained; or, given `takes_over`
    (the result of a training this one would repeat step for step), that training's best epoch taken over and dev
    scored on it."""
    done = training.finished()
    if done is not None:
        if training.arm.is_main:
            print(f"{training.label}: finished before ({training.folder.complete}), skipped", flush=True)
        return SeedResult(training.seed, done["metrics"], done["best_epoch"])
    if takes_over is not None and training.arm.is_main:
        print(f"{training.label}: the chosen trial's training (same data, setting and seed), taken over; dev "
              "scored on its best epoch", flush=True)
    # Embeddings train on sentence-transformers' trainer (embedding_tuner.py); every other family on this module's.
    if training.family.task_type == "embedding":
        from pipeline.finetune.loop.embedding_tuner import EmbeddingTuner

        return EmbeddingTuner(training).run(takes_over)
    return FineTuner(training).run(takes_over)
