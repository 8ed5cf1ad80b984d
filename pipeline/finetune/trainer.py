"""GLUE-style fine-tuning with accelerate: one seed per run, best dev epoch kept, outputs and MLflow.

Works in one process, under `accelerate launch` (several processes: gloo on CPU, NCCL on GPUs,
DeepSpeed when accelerate is configured for it) and with mixed precision.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.common.atomic_files import write_json_atomic, write_text_atomic
from pipeline.common.config_tree import flatten, to_dict
from pipeline.common.errors import PipelineError
from pipeline.common.hub_names import local_or_hub
from pipeline.finetune.config import FinetuneConfig
from pipeline.finetune.metrics import task_metrics
from pipeline.finetune.task_data import Split, TaskData, load_custom, load_glue_folder, load_hf_glue
from pipeline.finetune.tasks import task_spec
from pipeline.pretrain.export import PROVENANCE_FILE
from pipeline.pretrain.model import parameter_groups
from pipeline.tracking.mlflow_run import MlflowRun, git_commit
from pipeline.tracking.model_store import record_in_model_store, task_datasets


@dataclass(frozen=True)
class ModelSource:
    """The model to fine-tune: an HF folder, and where it came from (for the MLflow link)."""

    path: str
    pretrain_run_id: str | None = None
    pretrain_checkpoint: str | None = None


def resolve_model(model: str, work_dir: Path) -> ModelSource:
    """An HF model folder or hub name; a pretraining checkpoint or output folder is exported first."""
    from pipeline.pretrain.checkpoints import COMPLETE_MARKER, checkpoint_root

    path = Path(local_or_hub(model, "--model"))
    if path.is_dir() and ((path / COMPLETE_MARKER).exists() or checkpoint_root(path).is_dir()):
        from pipeline.pretrain.export import export_checkpoint  # a pretraining checkpoint or output folder

        path = export_checkpoint(path, work_dir / "model", overwrite=True)
    elif path.is_dir() and not (path / "config.json").exists():
        raise PipelineError(f"--model {model}: not an HF model folder (no config.json) nor a pretraining "
                            "checkpoint or output folder")
    provenance = path / PROVENANCE_FILE
    if provenance.exists():
        info = json.loads(provenance.read_text())
        return ModelSource(str(path), info.get("pretrain_run_id"), info.get("checkpoint"))
    return ModelSource(str(path))


def load_task(config: FinetuneConfig) -> TaskData:
    d = config.data
    if config.task == "custom":
        data = load_custom(d.train_file, d.validation_file, d.test_file, d.text_fields, d.label_field, d.task_type,
                           d.labels)
    elif d.use_datasets and not d.glue_dir:
        data = load_hf_glue(task_spec(config.task))
    else:
        data = load_glue_folder(task_spec(config.task), d.glue_dir)
    if d.max_train_examples:
        t = data.train
        n = d.max_train_examples
        data.train = Split(t.source, t.texts[:n], t.labels[:n] if t.labels is not None else None, t.ids[:n])
    return data


class Encoded(torch.utils.data.Dataset):
    """Tokenized examples (one batch call to the fast tokenizer), padded per batch by the collator."""

    def __init__(self, split: Split, tokenizer, max_len: int, regression: bool):
        pairs = len(split.texts[0]) == 2
        first = [t[0] for t in split.texts]
        second = [t[1] for t in split.texts] if pairs else None
        self.encodings = tokenizer(first, second, truncation=True, max_length=max_len)
        self.labels = split.labels
        self.regression = regression

    def __len__(self) -> int:
        return len(self.encodings["input_ids"])

    def __getitem__(self, i: int) -> dict:
        item = {k: v[i] for k, v in self.encodings.items()}
        if self.labels is not None:
            item["labels"] = float(self.labels[i]) if self.regression else int(self.labels[i])
        return item


def finetune_one_seed(config: FinetuneConfig, data: TaskData, source: ModelSource, seed: int, from_scratch: bool,
                      parent_run_id: str | None) -> dict[str, float]:
    """Train one seed; write its outputs to `<output_dir>/seed_<seed>/`; return its best dev metrics."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm
    from transformers import (
        AutoConfig,
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        get_linear_schedule_with_warmup,
    )

    t, spec = config.train, data.spec
    # Without cpu=True, processes started by `accelerate launch` on a machine with no GPU each
    # train alone (DistributedType.NO); with it they form a gloo group (MULTI_CPU).
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=t.mixed_precision,
                              gradient_accumulation_steps=t.gradient_accumulation)
    set_seed(seed)
    out = config.output_dir / f"seed_{seed}"
    tokenizer = AutoTokenizer.from_pretrained(source.path)
    problem = "regression" if spec.is_regression else "single_label_classification"
    if from_scratch:
        model_config = AutoConfig.from_pretrained(source.path, num_labels=spec.num_labels, problem_type=problem)
        model = AutoModelForSequenceClassification.from_config(model_config)
    else:
        from transformers.utils import logging as hf_logging

        # transformers prints a table of every newly initialised weight; the classifier head is
        # always new here, so one line says it instead (on the main process).
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            model = AutoModelForSequenceClassification.from_pretrained(source.path, num_labels=spec.num_labels,
                                                                       problem_type=problem)
        finally:
            hf_logging.set_verbosity(verbosity)
        if accelerator.is_main_process:
            print(f"loaded {source.path} with a new {spec.num_labels}-way classification head", flush=True)
    collate = DataCollatorWithPadding(tokenizer)
    train_set = Encoded(data.train, tokenizer, config.data.max_seq_len, spec.is_regression)
    generator = torch.Generator().manual_seed(seed)
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=t.batch_size, shuffle=True, collate_fn=collate,
                                               generator=generator)
    dev_loaders = {name: torch.utils.data.DataLoader(Encoded(split, tokenizer, config.data.max_seq_len,
                                                             spec.is_regression),
                                                     batch_size=t.eval_batch_size, collate_fn=collate)
                   for name, split in data.dev.items()}
    optimizer = torch.optim.AdamW(parameter_groups(model, t.weight_decay), lr=t.learning_rate, betas=(0.9, 0.98),
                                  eps=1e-6)
    steps = math.ceil(len(train_loader) / t.gradient_accumulation) * t.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, int(t.warmup_ratio * steps), steps)
    model, optimizer, train_loader, scheduler, *loaders = accelerator.prepare(
        model, optimizer, train_loader, scheduler, *dev_loaders.values())
    dev_loaders = dict(zip(dev_loaders, loaders, strict=True))

    run = None
    if accelerator.is_main_process and config.tracking.enabled:
        run = MlflowRun(config.tracking.uri, config.tracking.experiment,
                        f"{spec.name}-{'scratch' if from_scratch else 'pretrained'}-seed{seed}", state_file=None,
                        flush_seconds=config.tracking.flush_seconds,
                        tags=_run_tags(config, source, seed, from_scratch, parent_run_id))
        run.log_params({**flatten(to_dict(config)), "model": source.path, "seed": seed, "from_scratch": from_scratch})

    best, best_state, best_epoch, history = None, None, 0, []
    main_metric = spec.metrics[0]
    label = f"{spec.name} seed {seed}{' (scratch)' if from_scratch else ''}"
    progress = tqdm(total=math.ceil(len(train_loader) / t.gradient_accumulation) * t.epochs, desc=label,
                    disable=not accelerator.is_main_process, mininterval=1.0)
    global_step = 0
    for epoch in range(1, t.epochs + 1):
        model.train()
        losses = []
        for batch in train_loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients and t.max_grad_norm:
                    accelerator.clip_grad_norm_(model.parameters(), t.max_grad_norm)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            losses.append(loss.detach().float())
            if accelerator.sync_gradients:
                global_step += 1
                progress.update(1)
        train_loss = accelerator.gather(torch.stack(losses).mean()[None]).mean().item()
        predictions, labels = predict_dev(model, dev_loaders, accelerator, spec.is_regression)
        metrics = task_metrics(spec.metrics, predictions, labels)
        history.append({"epoch": epoch, "train_loss": train_loss, **metrics})
        if run:
            run.log_metrics({"train/loss": train_loss, **{f"eval/{k}": v for k, v in metrics.items()}}, epoch)
        progress.set_postfix(loss=f"{train_loss:.3f}", **{main_metric: f"{metrics[main_metric]:.4f}"})
        if best is None or metrics[main_metric] > best[main_metric]:
            best, best_epoch = metrics, epoch
            best_state = copy.deepcopy(accelerator.unwrap_model(model).state_dict())
            best_predictions = predictions
    progress.close()
    accelerator.unwrap_model(model).load_state_dict(best_state)

    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        result = {**best, "best_epoch": best_epoch, "seed": seed, "from_scratch": from_scratch,
                  "processes": accelerator.num_processes}
        write_json_atomic(out / "metrics.json", result)
        write_json_atomic(out / "history.json", history)
        artifacts = [out / "metrics.json", out / "history.json"]
        if not spec.is_regression:
            artifacts += write_confusion_matrices(out, spec, best_predictions, labels)
    test_files = write_test_predictions(model, data, tokenizer, collate, config, accelerator, out)
    if run:
        run.log_metrics({f"best/{k}": v for k, v in best.items()} | {"best/epoch": best_epoch}, t.epochs, flush=True)
        for path in artifacts + test_files:
            run.log_artifact(path)
        record_in_model_store(run, None, task_datasets(data))  # model_dir: the seed's saved model, once it is saved
        run.finish()
    accelerator.wait_for_everyone()
    return best


@torch.no_grad()
def predict_dev(model, loaders, accelerator, regression: bool):
    model.eval()
    predictions, labels = {}, {}
    for name, loader in loaders.items():
        preds, golds = [], []
        for batch in loader:
            logits = model(**batch).logits
            pred = logits.squeeze(-1) if regression else logits.argmax(-1)
            pred, gold = accelerator.gather_for_metrics((pred, batch["labels"]))
            preds.append(pred.float().cpu())
            golds.append(gold.float().cpu())
        predictions[name] = torch.cat(preds).numpy()
        labels[name] = torch.cat(golds).numpy()
        if not regression:
            predictions[name], labels[name] = predictions[name].astype(int), labels[name].astype(int)
    return predictions, labels


@torch.no_grad()
def write_test_predictions(model, data: TaskData, tokenizer, collate, config, accelerator, out: Path) -> list[Path]:
    """Test-set predictions in the GLUE submission format: `index<TAB>prediction`, labels as in the task."""
    spec, written = data.spec, []
    model.eval()
    for name, split in data.test.items():
        loader = accelerator.prepare(torch.utils.data.DataLoader(
            Encoded(split, tokenizer, config.data.max_seq_len, spec.is_regression),
            batch_size=config.train.eval_batch_size, collate_fn=collate))
        preds = []
        for batch in loader:
            logits = model(**batch).logits
            preds.append(accelerator.gather_for_metrics(logits.squeeze(-1) if spec.is_regression
                                                        else logits.argmax(-1)).cpu())
        if not accelerator.is_main_process:
            continue
        values = torch.cat(preds).tolist()
        shown = [f"{v:.3f}" for v in values] if spec.is_regression else [spec.labels[int(v)] for v in values]
        path = out / (f"test_{name}.tsv" if name != "test" else "test_predictions.tsv")
        write_text_atomic(path, "index\tprediction\n"
                          + "".join(f"{i}\t{p}\n" for i, p in zip(split.ids, shown, strict=True)))
        written.append(path)
    return written


def write_confusion_matrices(out: Path, spec, predictions: dict, labels: dict) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import ConfusionMatrixDisplay

    written = []
    for name in predictions:
        fig, ax = plt.subplots(figsize=(4 + 0.4 * spec.num_labels, 3.5 + 0.4 * spec.num_labels))
        ConfusionMatrixDisplay.from_predictions(labels[name], predictions[name], labels=list(range(spec.num_labels)),
                                                display_labels=list(spec.labels), ax=ax, colorbar=False)
        ax.set_title(f"{spec.name} dev{'' if name == 'dev' else ' ' + name}")
        path = out / f"confusion_{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _run_tags(config, source: ModelSource, seed: int, from_scratch: bool, parent_run_id: str | None) -> dict:
    import transformers

    tags = {"stage": "finetune", "task": config.task, "seed": str(seed), "from_scratch": str(from_scratch).lower(),
            "model": source.path, "git_commit": git_commit(), "transformers_version": transformers.__version__,
            "pretrain_run_id": source.pretrain_run_id or "", "pretrain_checkpoint": source.pretrain_checkpoint or ""}
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    return tags


def summarize(results: list[dict[str, float]], metric_names: tuple[str, ...]) -> dict:
    """Median (the headline), mean and standard deviation over seeds, for each metric."""
    summary = {}
    for name in metric_names:
        values = [r[name] for r in results]
        summary[name] = statistics.median(values)
        summary[f"{name}_mean"] = statistics.fmean(values)
        summary[f"{name}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return summary


def run_finetuning(config: FinetuneConfig, model: str, seeds: list[int], from_scratch: bool) -> dict:
    """Fine-tune every seed; write `<output_dir>/metrics.json` (medians over seeds); return it."""
    import os

    out = config.output_dir
    is_main = int(os.environ.get("RANK", "0")) == 0
    data = load_task(config)  # every problem with the data surfaces here, before any model is loaded
    source = resolve_model(model, out)
    parent = None
    if is_main and config.tracking.enabled:
        parent = MlflowRun(config.tracking.uri, config.tracking.experiment,
                           f"{data.spec.name}-{'scratch' if from_scratch else 'pretrained'}", state_file=None,
                           tags=_run_tags(config, source, -1, from_scratch, None) | {"seeds": ",".join(map(str, seeds)),
                                                                                   "stage": "finetune-summary"})
    results = [finetune_one_seed(config, data, source, seed, from_scratch, parent.run_id if parent else None)
               for seed in seeds]
    summary = summarize(results, data.spec.metrics)
    report = {**summary, "task": data.spec.name, "seeds": seeds, "from_scratch": from_scratch, "model": source.path,
              "pretrain_run_id": source.pretrain_run_id, "per_seed": results}
    if is_main:
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / "metrics.json", report)
        if parent:
            parent.log_params({"model": source.path, "seeds": ",".join(map(str, seeds)),
                               **flatten(to_dict(config))})
            parent.log_metrics(summary, 0, flush=True)
            parent.log_artifact(out / "metrics.json")
            parent.finish()
    return report
