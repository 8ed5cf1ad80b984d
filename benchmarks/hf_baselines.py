"""The HF `Trainer` baselines, each the way an HF user runs it: pretraining for budget_time_to_loss.py (`worker`,
evaluated on the pipeline's own fixed masked batches) and run_glue's fine-tuning (`finetune`).

- `hf-same`: transformers' own masked-LM class for the budget config's model, trained with its recipe as far as
  `TrainingArguments` can say it (`same_recipe` lists what still differs): what is left is the pipeline's efficiency.
- `hf-run_mlm`: the same model with `run_mlm.py`'s defaults (`RUN_MLM`) and the HF class's dropout.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from pipeline.pretrain.config import PretrainConfig

RECIPES = ("hf-same", "hf-run_mlm")

RUN_MLM = {  # run_mlm.py's TrainingArguments defaults (the optimizer too: TrainingArguments' default `optim`)
    "per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_train_epochs": 3,
    "learning_rate": 5e-5, "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8,
    "lr_scheduler_type": "linear", "warmup_steps": 0, "max_grad_norm": 1.0, "dataloader_num_workers": 0,
}
RUN_MLM_PROBABILITY = 0.15
DROPOUT_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "embedding_dropout", "mlp_dropout",
                  "attention_dropout")
"""Dropout settings of the HF config classes (RoBERTa/BERT names, then ModernBERT's)."""


def same_recipe(config: PretrainConfig, ranks: int) -> tuple[dict, list[str]]:
    """`TrainingArguments` keywords for the budget config's recipe on one process, and what still differs; the
    per-device batch is the `ranks` pipeline ranks' micro batches together, so the accumulation steps are the same."""
    o, s, t = config.optimizer, config.schedule, config.train
    refused = []
    if o.name != "adamw":
        refused.append(f"optimizer.name {o.name}: Trainer has no {o.name}")
    if config.phases:
        refused.append("phases: Trainer trains in one phase")
    if config.data.mixed:
        refused.append("data.shards as a mix of corpora: the benchmark feeds one folder")
    if refused:
        raise ValueError("hf-same cannot follow this config: " + "; ".join(refused))
    per_device = t.micro_batch_size * ranks
    if t.global_batch_size % per_device:
        raise ValueError(f"train.global_batch_size {t.global_batch_size} is not a multiple of "
                         f"train.micro_batch_size × {ranks} ranks = {per_device}")
    if s.decay == "constant":
        scheduler, scheduler_kwargs = "constant_with_warmup", {}
    elif s.decay == "linear" and s.end_lr_ratio == 0:
        scheduler, scheduler_kwargs = "linear", {}
    else:  # transformers' polynomial schedule ends at an absolute LR
        scheduler = "polynomial"
        scheduler_kwargs = {"lr_end": o.lr * s.end_lr_ratio, "power": 1.0 if s.decay == "linear" else s.power}
    arguments = {
        "per_device_train_batch_size": per_device, "gradient_accumulation_steps": t.global_batch_size // per_device,
        "max_steps": t.max_steps, "learning_rate": o.lr, "adam_beta1": o.betas[0], "adam_beta2": o.betas[1],
        "adam_epsilon": o.eps, "weight_decay": o.weight_decay,
        # The pipeline's AdamW is torch's (fused only with optimizer.fused); TrainingArguments' default is fused.
        "optim": "adamw_torch_fused" if o.fused else "adamw_torch",
        "lr_scheduler_type": scheduler, "lr_scheduler_kwargs": scheduler_kwargs, "warmup_steps": s.warmup_steps,
        "max_grad_norm": t.gradient_clipping,  # 0 turns clipping off in both
        "bf16": t.precision == "bf16", "torch_compile": t.compile,
        # Each pipeline rank reads with data.num_workers loader processes; Trainer gets as many.
        "dataloader_num_workers": config.data.num_workers,
    }
    differences = [
        "data order and masks: Trainer's seeded RandomSampler and DataCollatorForLanguageModeling's random masks, "
        "not the pipeline's step-keyed shuffle and hashed masks (same probability and corruption split)",
    ]
    if s.warmup_steps:
        differences.append("warmup: Trainer's starts at LR 0 on the first step, the pipeline's at 1/(warmup+1) "
                           "of the peak (one step apart)")
    if config.masking.unit != "token" or config.masking.mode != "dynamic":
        differences.append(f"masking.unit {config.masking.unit}, mode {config.masking.mode}: the collator "
                           "masks single tokens, drawn anew each time")
    if config.model.architecture == "bert" and config.model.next_sentence_loss:
        differences.append("BertForMaskedLM: masked LM only, without the next-sentence task")
    return arguments, differences


def masked_lm_class(architecture: str):
    """transformers' own masked-LM class for a `model.architecture` (what an export loads as)."""
    from transformers import BertForMaskedLM, ModernBertForMaskedLM, RobertaForMaskedLM, RobertaPreLayerNormForMaskedLM

    return {"roberta": RobertaForMaskedLM, "roberta-prelayernorm": RobertaPreLayerNormForMaskedLM,
            "modernbert": ModernBertForMaskedLM, "bert": BertForMaskedLM}[architecture]


def hf_model_config(recipe: str, config: PretrainConfig, tokenizer_info, seq_len: int):
    """The HF config of a recipe's model: the pipeline's own (`hf_config`); for run_mlm, with the class's dropout."""
    from pipeline.models.architectures.hf_model import hf_config

    built = hf_config(config.model, tokenizer_info, seq_len)
    if recipe == "hf-run_mlm":
        defaults = type(built)()
        for name in DROPOUT_FIELDS:
            if hasattr(defaults, name):
                setattr(built, name, getattr(defaults, name))
    return built


def decay_parameter_names(model) -> list[str]:
    """The parameters the pipeline decays (`parameter_groups`), by name, for `Trainer.get_decay_parameter_names`:
    Trainer's own rule skips every name holding "layernorm", every encoder parameter of the pre-LN RoBERTa."""
    from pipeline.models.parameter_groups import parameter_groups

    decay = {id(p) for p in parameter_groups(model, 0.0)[0]["params"]}
    return [name for name, p in model.named_parameters() if id(p) in decay]


def worker(spec: dict) -> None:
    """Train one HF recipe until its schedule ends or the cap passes; write its curve to `spec["result"]`."""
    import torch
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments, set_seed

    from pipeline.data.token_cache import TokenCache
    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
    from pipeline.models.architectures.hf_model import first_position_id
    from pipeline.pretrain.batches.masked_slots import dense_labels
    from pipeline.pretrain.batches.stretch_data import MaskedBatches, eval_keys
    from pipeline.pretrain.plan.masking import build_masker
    from pipeline.pretrain.preflight import load_pretrain_config

    recipe, seed, launched, cap = spec["recipe"], spec["seed"], spec["launched_at"], 60 * spec["max_minutes"]
    config = load_pretrain_config(spec["config"], [*spec["overrides"], f"data.shards={spec['shards']}",
                                                   f"data.tokenizer={spec['tokenizer']}", f"train.seed={seed}"],
                                  world_size=spec["ranks"], check_files=False)
    tokenizer = load_tokenizer(spec["tokenizer"])
    info = describe_tokenizer(tokenizer)
    train = TokenCache(spec["shards"], "train", spec["cache_dir"])
    val = TokenCache(spec["shards"], "val", spec["cache_dir"])
    ids, lengths = train.fields["input_ids"], train.fields.get("length")

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(ids)

        def __getitem__(self, i):
            row = {"input_ids": torch.from_numpy(ids[i].astype("int64"))}
            if lengths is not None:  # a padded row attends to its text only
                row["attention_mask"] = (torch.arange(ids.shape[1]) < int(lengths[i])).long()
            return row

    # The budget recipe's evaluation: its masking section (at masking.eval_probability), the run's seed, the same
    # first sequences.
    masker = build_masker(config.masking, tokenizer, info.vocab_size, info.mask_id, seed, evaluation=True)
    val_batches = MaskedBatches(val, masker, with_segments=False,
                                position_offset=first_position_id(config.model.architecture, info.pad_id))
    # HF's models take the labels per position, not the pipeline's masked slots.
    fixed = [{k: v for k, v in b.items() if not k.startswith("masked_")} | {"labels": dense_labels(b)}
             for b in (val_batches[k] for k in eval_keys(len(val), spec["eval_sequences"], 32, 0, 1))]
    set_seed(seed)
    model = masked_lm_class(config.model.architecture)(hf_model_config(recipe, config, info, train.seq_len))
    if recipe == "hf-same":
        arguments, differences = same_recipe(config, spec["ranks"])
        probability = config.masking.probability
        corruption = {"mask_replace_prob": config.masking.mask_token_fraction,
                      "random_replace_prob": config.masking.random_token_fraction}
    else:
        arguments, differences, probability, corruption = dict(RUN_MLM), [], RUN_MLM_PROBABILITY, {}
    batch = arguments["per_device_train_batch_size"] * arguments["gradient_accumulation_steps"]
    eval_every = max(1, spec["eval_every_sequences"] // batch)
    curve, eval_seconds = [], 0.0

    def evaluate(step: int) -> None:
        nonlocal eval_seconds
        started = time.time()
        model.eval()
        total = count = 0.0
        with torch.no_grad():
            for b in fixed:
                if "document_ids" in b:
                    raise SystemExit("hf baselines need full or doc shards, not doc-packed ones")
                masked = int((b["labels"] != -100).sum())
                inputs = {k: b[k] for k in ("input_ids", "attention_mask", "labels") if k in b}
                total += model(**inputs).loss.item() * masked
                count += masked
        model.train()
        curve.append({"step": step, "seconds": started - launched - eval_seconds, "loss": total / count})
        eval_seconds += time.time() - started

    class EvalAndCap(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % eval_every == 0:
                evaluate(state.global_step)
            if time.time() - launched > cap:
                control.should_training_stop = True

        def on_train_end(self, args, state, control, **kwargs):
            if not curve or curve[-1]["step"] != state.global_step:
                evaluate(state.global_step)

    class SameDecayTrainer(Trainer):
        def get_decay_parameter_names(self, model):
            return decay_parameter_names(model)

    args = TrainingArguments(output_dir=spec["out"], logging_steps=10**9, save_strategy="no", report_to="none",
                             disable_tqdm=True, use_cpu=True, seed=seed, data_seed=seed, **arguments)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=probability, **corruption)
    trainer = (SameDecayTrainer if recipe == "hf-same" else Trainer)(
        model=model, args=args, train_dataset=Rows(), data_collator=collator, callbacks=[EvalAndCap()])
    trainer.train()
    Path(spec["result"]).write_text(json.dumps({
        "curve": curve, "steps": trainer.state.global_step, "batch": batch, "model_class": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()), "differences": differences}))


def encode(tokenizer, texts: list[tuple[str, ...]], labels: list[int], max_seq_len: int) -> list[dict]:
    """run_glue's tokenization: one or two texts per example, truncated, padded later by the collator."""
    enc = tokenizer(*zip(*texts, strict=True), truncation=True, max_length=max_seq_len)
    return [{**{k: v[i] for k, v in enc.items()}, "labels": label} for i, label in enumerate(labels)]


def pipeline_sets(recipe: dict) -> dict:
    """The pipeline's fine-tuning keys for the run_glue `recipe` that `finetune` trains with."""
    return {"data.max_seq_len": recipe["max_seq_len"], "train.learning_rate": recipe["lr"],
            "train.batch_size": recipe["batch"], "train.epochs": recipe["epochs"],
            "train.warmup_ratio": recipe["warmup_ratio"], "train.weight_decay": recipe["weight_decay"],
            "train.adam_betas": json.dumps(list(recipe["betas"])), "train.adam_eps": recipe["eps"],
            "train.max_grad_norm": recipe["max_grad_norm"],
            **({"train.eval_batch_size": recipe["eval_batch"]} if "eval_batch" in recipe else {})}


def finetune(model: str, tokenizer, train: list[dict], dev: list[dict], num_labels: int, recipe: dict, seed: int,
             out: str, *, save: bool = False, progress: bool = True,
             report_to: tuple[str, ...] = ()) -> tuple[list[float], float]:
    """(dev accuracy after each epoch, seconds of `Trainer.train`) of run_glue's way on `encode`d examples;
    `report_to`: Trainer's trackers (`("mlflow",)`: its MLflow callback, which reads MLFLOW_TRACKING_URI)."""
    import numpy as np
    from transformers import (
        AutoModelForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    accuracies: list[float] = []

    def accuracy(prediction) -> dict:
        accuracies.append(float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean()))
        return {"accuracy": accuracies[-1]}

    args = TrainingArguments(
        output_dir=out, learning_rate=recipe["lr"], num_train_epochs=recipe["epochs"],
        per_device_train_batch_size=recipe["batch"], per_device_eval_batch_size=recipe.get("eval_batch", 64),
        warmup_steps=recipe["warmup_ratio"],  # transformers 5: a fraction below 1 is a ratio of the total steps
        weight_decay=recipe["weight_decay"], adam_beta1=recipe["betas"][0], adam_beta2=recipe["betas"][1],
        adam_epsilon=recipe["eps"], max_grad_norm=recipe["max_grad_norm"], seed=seed, eval_strategy="epoch",
        save_strategy="no", logging_strategy="no", report_to=list(report_to), use_cpu=True, dataloader_num_workers=0,
        disable_tqdm=not progress)
    set_seed(seed)  # before the model, as run_glue.py does: the new head's weights are the seed's
    hf = AutoModelForSequenceClassification.from_pretrained(model, num_labels=num_labels)
    trainer = Trainer(model=hf, args=args, train_dataset=train, eval_dataset=dev,
                      data_collator=DataCollatorWithPadding(tokenizer), compute_metrics=accuracy)
    started = time.monotonic()
    trainer.train()
    seconds = time.monotonic() - started
    if save:
        trainer.save_model()
    return accuracies, seconds
