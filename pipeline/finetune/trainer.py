"""Fine-tuning with accelerate: setup → fit → validate → save, one seed at a time; seeds summarized.

Works in one process, under `accelerate launch` (several processes: gloo on CPU, NCCL on GPUs,
DeepSpeed when accelerate is configured for it) and with mixed precision. The loop knows nothing
of the task: a `TaskFamily` builds the model, encodes the data, turns outputs into predictions
and metrics, and writes the prediction files.
"""

from __future__ import annotations

import json
import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.config_tree import flatten, to_dict
from pipeline.common.fingerprints import model_fingerprint
from pipeline.common.lost_rank import RankWatchdog, lost_rank_message
from pipeline.common.run_kernel import run_tags, seed_everything
from pipeline.common.run_layout import SeedLayout
from pipeline.finetune.accelerator import bare_model
from pipeline.finetune.config import FinetuneConfig
from pipeline.finetune.model_source import ModelSource
from pipeline.finetune.outputs import (
    mark_complete,
    save_model,
)
from pipeline.finetune.select_split import SELECT
from pipeline.finetune.task_data import Split, TaskData
from pipeline.finetune.task_family import TaskFamily
from pipeline.pretrain.batch_plan import BatchPlan
from pipeline.pretrain.model import parameter_groups
from pipeline.tracking.metrics import MetricsSink
from pipeline.tracking.model_store import record_in_model_store, task_datasets
from pipeline.tracking.sinks import open_metrics

# Settings that change where or how fast a run reports, not what it trains: a rerun may differ in them
# and still skip finished seeds. (`train.seed` is the default seed; each seed's own is in its record.)
RESULT_NEUTRAL_SETTINGS = ("name", "train.output_dir", "train.eval_batch_size", "train.collective_timeout_s",
                           "train.seed")


def build_accelerator(config: FinetuneConfig, plan: BatchPlan):
    from pipeline.finetune.accelerator import build_accelerator as accelerator_for

    return accelerator_for(config.train.precision, accumulation=plan.accumulation, world_size=plan.world_size,
                           collective_timeout_s=config.train.collective_timeout_s)


RERUN_HINT = "Rerun the same command: seeds with a complete.json are skipped, the others start again from epoch 1."


@dataclass
class Evaluation:
    """Dev predictions and labels by split (gathered from every process), and the task's metrics on them."""

    metrics: dict[str, float]
    predictions: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]


@dataclass
class SeedResult:
    seed: int
    best: dict[str, float]
    best_epoch: int
    history: list[dict] = field(default_factory=list)


@dataclass
class TrainedRun:
    """A finished training's best-epoch weights (on the CPU) and result: what a seed that would repeat the very
    same training (the selection seed on the chosen setting, see sweep.py) takes over instead of retraining."""

    state: dict[str, torch.Tensor]
    result: SeedResult


class RunInputs:
    """What every training of one run shares, made once: the tokenizer, and each split's encoding.

    A run with a sweep, seeds and a label curve trains a dozen times on the same few splits; loading
    the tokenizer and tokenizing a split once per run, not once per training, is the fixed cost saved.
    An encoding is kept per (family, split, max_seq_len): a family's options (a token task's
    `label_all_tokens`, QA's stride) change what it encodes. The encodings are read-only datasets.
    """

    def __init__(self, model_path: str):
        self.model_path = model_path
        self._tokenizer = None
        self._encodings: dict[tuple[int, int, int], tuple[Any, Any, torch.utils.data.Dataset]] = {}

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        return self._tokenizer

    def encoded(self, family: TaskFamily, split, max_seq_len: int) -> torch.utils.data.Dataset:
        key = (id(family), id(split), max_seq_len)
        if key not in self._encodings:  # the value holds the family and split too, so their ids are never reused
            self._encodings[key] = (family, split, family.encode(split, self.tokenizer, max_seq_len))
        return self._encodings[key][2]


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


class FineTuner:
    """One seed: `setup()` builds model, data and optimizer; `fit()` trains and keeps the best dev
    epoch; `validate()` scores the dev splits; `save()` writes the seed's folder, `complete.json` last."""

    def __init__(self, config: FinetuneConfig, data: TaskData, family: TaskFamily, source: ModelSource,
                 accelerator, plan: BatchPlan, seed: int, from_scratch: bool, parent_run_id: str | None = None,
                 *, held_out=None, protocol: dict | None = None, trial: str | None = None,
                 point: str | None = None, score_every: int = 1, inputs: RunInputs | None = None):
        """`held_out`: a split of training data (the selection slice) that picks the best epoch; dev is then
        scored once, on that epoch (the family must know the slice as `SELECT`). `protocol`: what the
        completion record must also match (the selection slice, the trial's setting). `trial`: a selection
        trial of that name: its own MLflow run name and tags, and no saved weights. `point`: a point of the
        label-efficiency curve (`label_curve.py`, e.g. "8-per-class"): named and tagged so, no saved weights;
        `score_every`: its epochs between scorings (the last epoch is always scored).
        `inputs`: the run's shared tokenizer and encodings (default: this training's own)."""
        self.config, self.data, self.family, self.source = config, data, family, source
        self.inputs = inputs or RunInputs(source.path)
        self.accelerator, self.plan, self.seed, self.from_scratch = accelerator, plan, seed, from_scratch
        self.parent_run_id = parent_run_id
        self.held_out, self.protocol, self.trial, self.point = held_out, protocol, trial, point
        self.score_every = score_every
        self.keeps_weights = trial is None and point is None
        self.out: SeedLayout = config.layout.seed(seed)
        self.watchdog: RankWatchdog | None = None
        if plan.world_size > 1:  # see pipeline/common/lost_rank.py
            timeout = config.train.collective_timeout_s
            self.watchdog = RankWatchdog(timeout, lambda where: lost_rank_message(
                accelerator.process_index, plan.world_size, f"in {self.label}, {where}", timeout, RERUN_HINT,
                f"a micro batch has waited {timeout:g} s"))
        self.label = (f"{config.task_name}{f' trial {trial}' if trial else ''}{f' {point}' if point else ''} "
                      f"seed {seed}{' (scratch)' if from_scratch else ''}")

    def setup(self) -> None:
        from transformers import get_linear_schedule_with_warmup
        from transformers.trainer_pt_utils import LengthGroupedSampler

        c, t, acc = self.config, self.config.train, self.accelerator
        seed_everything(self.seed)
        self.tokenizer = self.inputs.tokenizer
        model = self.family.build_model(self.source.path, self.from_scratch)
        if not self.from_scratch and acc.is_main_process:
            print(f"loaded {self.source.path} with a new {self.family.task_type} head", flush=True)
        collate = self.family.collator(self.tokenizer)
        train_set = self.inputs.encoded(self.family, self.data.train, c.data.max_seq_len)
        # Batches of similar lengths (HF Trainer's `group_by_length`): shuffled, then sorted within mega-batches of
        # 50 batches, so a batch pads to a length near its rows' own instead of the longest of 16 random ones.
        # On short-sentence tasks random batches are mostly padding, and padding costs as much as text.
        sampler = LengthGroupedSampler(self.plan.micro_batch_size, lengths=row_lengths(train_set),
                                       generator=torch.Generator().manual_seed(self.seed))
        train_loader = torch.utils.data.DataLoader(train_set, batch_size=self.plan.micro_batch_size, sampler=sampler,
                                                   collate_fn=collate)
        dev_loaders = [self.eval_loader(split) for split in self.data.dev.values()]
        if self.held_out is not None:
            dev_loaders.append(self.eval_loader(self.held_out))
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
        if self.held_out is not None:
            self.select_loaders = {SELECT: loaders.pop()}
        self.dev_loaders = dict(zip(self.data.dev, loaders, strict=True))
        self.metrics = self._open_metrics()

    def eval_loader(self, split: Split):
        dataset = LengthSorted(self.inputs.encoded(self.family, split, self.config.data.max_seq_len))
        return torch.utils.data.DataLoader(dataset, batch_size=self.config.train.eval_batch_size,
                                           collate_fn=self.family.collator(self.tokenizer))

    def _open_metrics(self) -> MetricsSink:
        c = self.config
        kind = "scratch" if self.from_scratch else "pretrained"
        source = self.source
        stage, trial = ("finetune-trial", {"trial": self.trial}) if self.trial else ("finetune", {})
        if self.point:
            stage, trial = "finetune-label-curve", {"point": self.point}
        tags = run_tags(stage, self.plan.world_size, task=c.task_name, seed=self.seed, **trial,
                        from_scratch=str(self.from_scratch).lower(), model=source.path,
                        pretrain_run_id=source.pretrain_run_id, pretrain_checkpoint=source.pretrain_checkpoint)
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        params = {**flatten(to_dict(c)), "model": self.source.path, "seed": self.seed,
                  "from_scratch": self.from_scratch, "gradient_accumulation": self.plan.accumulation}
        part = f"-trial-{self.trial}" if self.trial else f"-{self.point}" if self.point else ""
        name = f"{c.task_name}-{kind}{part}-seed{self.seed}"
        return open_metrics(self.accelerator.is_main_process, tracking=c.tracking, run_name=name, tags=tags,
                            params=params)

    def fit(self) -> SeedResult:
        """Train every epoch and keep the best one: best on dev, or with `held_out` best on the selection slice
        (its metrics prefixed `select_`), and dev scored once, on that epoch's weights."""
        from tqdm.auto import tqdm

        acc, epochs = self.accelerator, self.config.train.epochs
        main_metric = self.family.main_metric
        if self.held_out is not None:
            choose, prefix, log_prefix = self.select_loaders, "select_", "select/"
        elif self.trial:  # a trial's only "dev" split is the slice: its scores are named as the slice's
            choose, prefix, log_prefix = self.dev_loaders, "select_", "select/"
        else:
            choose, prefix, log_prefix = self.dev_loaders, "", "eval/"
        result, self.best_state = SeedResult(self.seed, {}, 0), None
        progress = tqdm(total=self.steps_per_epoch * epochs, desc=self.label, disable=not acc.is_main_process,
                        mininterval=1.0)
        for epoch in range(1, epochs + 1):
            train_loss = self._train_epoch(progress)
            if epoch % self.score_every and epoch < epochs:  # a curve point's short epochs: scored every few
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
        return self._score_dev_once(result) if self.held_out is not None else result

    def take_over(self, trained: TrainedRun) -> SeedResult:
        """The result of `trained`, a training this seed would repeat exactly (the same data, setting and seed,
        the same slice choosing the epoch): its epochs are logged as this seed's, and dev is scored once, on its
        best epoch's weights, as `fit` would."""
        if self.held_out is None:
            raise ValueError("take_over: only a seed whose best epoch the selection slice picks repeats a trial")
        done = trained.result
        for entry in done.history:  # as `fit` logged them: the loss and the slice's scores, per epoch
            scores = {f"select/{k.removeprefix('select_')}": v for k, v in entry.items() if k.startswith("select_")}
            self.metrics.log({"train/loss": entry["train_loss"], **scores}, entry["epoch"])
        self.best_state = trained.state
        return self._score_dev_once(SeedResult(self.seed, dict(done.best), done.best_epoch, list(done.history)))

    def _score_dev_once(self, result: SeedResult) -> SeedResult:
        """Dev, read once: on the epoch the selection slice chose."""
        bare_model(self.model).load_state_dict(self.best_state)
        self.best_evaluation = self.validate()
        result.best = {**self.best_evaluation.metrics, **result.best}
        self.metrics.log({f"eval/{k}": v for k, v in self.best_evaluation.metrics.items()}, result.best_epoch)
        return result

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

    @torch.no_grad()
    def validate(self, loaders: dict | None = None) -> Evaluation:
        """Score the dev splits (or the given `loaders`, by split name) with the task's metrics."""
        predictions, labels = {}, {}
        for name, loader in (self.dev_loaders if loaders is None else loaders).items():
            predictions[name], labels[name] = self._predict(loader)
        return Evaluation(self.family.metrics(predictions, labels), predictions, labels)

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

    def save(self, result: SeedResult) -> None:
        """The best epoch's weights as an HF folder, reports, test predictions; `complete.json` last."""
        acc, out = self.accelerator, self.out
        bare_model(self.model).load_state_dict(self.best_state)
        test_predictions = {name: self._predict(self.accelerator.prepare(self.eval_loader(split)))[0]
                            for name, split in self.data.test.items()}  # every process takes part
        if acc.is_main_process:
            out.root.mkdir(parents=True, exist_ok=True)
            summary = {**result.best, "best_epoch": result.best_epoch, "seed": self.seed,
                       "from_scratch": self.from_scratch, "processes": acc.num_processes}
            write_json_atomic(out.metrics, summary)
            write_json_atomic(out.history, result.history)
            artifacts = [out.metrics, out.history]
            best = self.best_evaluation
            # Figures for the seeds that keep their model; a trial or a curve point reports in files alone.
            artifacts += self.family.write_dev_reports(out, self.data.dev, best.predictions, best.labels,
                                                       figures=self.keeps_weights)
            for name, values in test_predictions.items():
                artifacts += self.family.write_test_predictions(out, name, self.data.test[name], values)
            if self.keeps_weights:  # a trial's setting is retrained over the seeds; a curve point only reports
                self._save_model(result)
            self.metrics.log({f"best/{k}": v for k, v in result.best.items()} | {"best/epoch": result.best_epoch},
                             self.config.train.epochs)
            for path in artifacts:
                self.metrics.log_artifact(path)
            if self.keeps_weights:
                record_in_model_store(self.metrics, out.model, task_datasets(self.data),
                                      self.config.tracking.registered_model)
            mark_complete(out, {**self.completion_key(), "metrics": result.best, "best_epoch": result.best_epoch,
                                "processes": acc.num_processes})
        self.metrics.close()
        acc.wait_for_everyone()
        acc.free_memory()  # drop the prepared model and optimizer before the next seed
        if self.watchdog:
            self.watchdog.close()

    def _save_model(self, result: SeedResult) -> None:
        out, t = self.out, self.config.train
        first_dev = next(iter(self.eval_loader(next(iter(self.data.dev.values())))))
        save_model(out.model, bare_model(self.model), self.tokenizer, {
            **self.family.provenance(), "name": self.config.task_name, "seed": self.seed, "metrics": result.best,
            "best_epoch": result.best_epoch, "max_seq_len": self.config.data.max_seq_len,
            "from_scratch": self.from_scratch, "source_model": self.source.path,
            "pretrain_run_id": self.source.pretrain_run_id,
            "pretrain_checkpoint": self.source.pretrain_checkpoint,
            "recipe": {"learning_rate": t.learning_rate, "batch_size": t.batch_size, "epochs": t.epochs,
                       "warmup_ratio": t.warmup_ratio, "weight_decay": t.weight_decay, "precision": t.precision},
            **({"selection": self.protocol} if self.protocol else {})}, check_batch=first_dev, precision=t.precision)

    def completion_key(self) -> dict:
        """What a finished seed must match to be skipped by a rerun: the task, the model's content (its
        config and tokenizer alone from scratch) and every setting that changes what is trained."""
        recipe = flatten(to_dict(self.config))
        for key in [k for k in recipe if k.startswith("tracking.")] + list(RESULT_NEUTRAL_SETTINGS):
            recipe.pop(key, None)
        key = {"task": self.data.spec.name, "from_scratch": self.from_scratch, "model": self.source.path,
               "model_fingerprint": model_fingerprint(self.source.path, weights=not self.from_scratch),
               "recipe": recipe}
        if self.protocol is not None:
            key["protocol"] = self.protocol
        return json.loads(json.dumps(key))  # as the record reads back (tuples as lists)

    def run(self, trained: TrainedRun | None = None) -> SeedResult:
        """setup → fit (or, given `trained`, `take_over` that training) → save."""
        self.setup()
        result = self.fit() if trained is None else self.take_over(trained)
        self.save(result)
        return result

    def trained(self, result: SeedResult) -> TrainedRun:
        """This finished training's best epoch, for a seed that would repeat it (`run(trained=...)`)."""
        return TrainedRun(self.best_state, result)
