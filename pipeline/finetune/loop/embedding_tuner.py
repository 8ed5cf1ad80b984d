"""One embedding training (a seed, a sweep trial) on sentence-transformers' trainer, as `trainer.FineTuner` is for
the other families: train, keep the best epoch, score dev, save, mark complete.

The epoch is chosen as the other families choose it: by the selection slice when the run has one (its figures
named `select_`), else by dev; dev is then scored once, on that epoch. Each epoch is scored by the family's own
figure (retrieval nDCG@10, or Spearman) through the stage's encoder (`encoder.PooledEncoder`), the same code the
evaluator runs. A seed also records its model's zero-shot figure (before any step) and, for search, BM25's on the
same dev split, so the run's report sets what training bought beside what word overlap gets, and the geometry of
its dev texts' embeddings (`zero_shot_mean_cosine`, `zero_shot_effective_rank`: `hub/retrieval/geometry.py`). The
options of `embedding` act here: hard negatives are mined from the training split before the first step, prompts go
to the trainer by column and to the scoring encoder by role, and a Matryoshka width beyond the model's is refused
first.
"""

from __future__ import annotations

import tempfile

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.config.tree import flatten, to_dict
from pipeline.common.errors import PipelineError
from pipeline.common.run_kernel import seed_everything
from pipeline.data.tasks.embedding_records import count_truncated, warn_truncated
from pipeline.finetune.families.embedding.hard_negatives import mine_negatives
from pipeline.finetune.families.embedding.sentence_folder import (
    build_sentence_model,
    model_dropout,
    save_sentence_model,
)
from pipeline.finetune.families.embedding.sparse_folder import SPLADE_POOLING, build_sparse_model, save_sparse_model
from pipeline.finetune.loop.arm import SeedResult, Training
from pipeline.hub.retrieval.sparse_scoring import sparse_encode
from pipeline.models.embedding_encoder import PooledEncoder, RolePrompts
from pipeline.tracking.sinks import open_metrics

CHECK_TEXTS = 32
"""Dev texts the saved folder's proof embeds."""


class EmbeddingTuner:
    """`run()`: build the Sentence-Transformers model, train it (or take a finished trial's epoch over), save."""

    def __init__(self, training: Training):
        self.training, self.config, self.data = training, training.config, training.data
        self.family, self.arm, self.seed = training.family, training.arm, training.seed
        if training.plan.world_size > 1:
            raise PipelineError("embedding tasks train in one process: launch `roberta-finetune` without "
                                "accelerate or torchrun")

    def run(self, takes_over: SeedResult | None = None) -> SeedResult:
        training, c = self.training, self.config
        seed_everything(self.seed)
        source, self.sparse = self.arm.source.path, self.family.kind == "sparse"
        if self.sparse:  # SPLADE: a SparseEncoder over the masked-LM head (sparse_folder.py)
            self.model = build_sparse_model(source, max_seq_len=c.data.max_seq_len, from_scratch=self.arm.from_scratch)
        else:
            self.model = build_sentence_model(source, pooling=c.embedding.pooling, max_seq_len=c.data.max_seq_len,
                                              from_scratch=self.arm.from_scratch, dropout=c.embedding.dropout,
                                              prompts=c.embedding.prompts.named)
            width = self.model.get_embedding_dimension()
            if (too_wide := [d for d in c.embedding.matryoshka_dims or () if d > width]):
                raise PipelineError(f"embedding.matryoshka_dims: {too_wide} exceed the width of {source}'s "
                                    f"embeddings, {width}")
        if self.family.kind == "simcse" and model_dropout(self.model[0].auto_model.config) == 0:
            raise PipelineError(f"{source}: its config has no dropout, and SimCSE's only augmentation is dropout; "
                                "set embedding.dropout (0.1 in the SimCSE paper)")
        self.metrics = open_metrics(self.arm.is_main, tracking=c.tracking, run_name=training.run_name,
                                    tags=training.tags(), params={**flatten(to_dict(c)), "model": source,
                                                                  "seed": self.seed,
                                                                  "from_scratch": self.arm.from_scratch})
        extras = self._reference_figures() if training.keeps_weights else {}
        result = self._fit() if takes_over is None else self._take_over(takes_over)
        result.best.update(extras)
        self._save(result)
        result.state = self.best_state
        return result

    def encoder(self) -> PooledEncoder:
        """The stage's own encoder of the model as it is now, with its prompts (`embedding.prompts`)."""
        module, e = self.model[0], self.config.embedding
        return PooledEncoder(module.auto_model, module.tokenizer, e.pooling, self.config.data.max_seq_len,
                             self.config.train.eval_batch_size, RolePrompts.of(e.prompts.named))

    def score(self, split):
        """The family's figures of `split` under the model as it is now, queries and documents with their prompts."""
        if self.sparse:
            return self.family.score(self.encode, split)
        encoder = self.encoder()
        return self.family.score(encoder.encode_query, split, encoder.encode_document)

    def encode(self, texts):
        """`texts` under the model as it is now: sparse vectors (SPLADE), or the stage's dense encoder's."""
        if self.sparse:
            return sparse_encode(self.model, texts, self.config.train.eval_batch_size)
        return self.encoder().encode(texts)

    def _reference_figures(self) -> dict[str, float]:
        """Dev before any step (zero-shot) with its texts' geometry, and BM25 on dev: what the report sets the
        trained figure beside."""
        from pipeline.hub.retrieval.geometry import embedding_geometry

        dev, main = next(iter(self.data.dev.values())), self.family.main_metric
        figures = {f"zero_shot_{main}": self.score(dev)[main]}
        if not self.sparse:  # the geometry of dense vectors
            texts = list(dict.fromkeys(t for row in dev.texts for t in row))
            figures.update({f"zero_shot_{k}": v
                            for k, v in embedding_geometry(self.encoder().encode_document(texts)).items()})
        if (bm25 := self.family.bm25(dev)):
            figures[f"bm25_{main}"] = bm25[main]
        return figures

    def _fit(self) -> SeedResult:
        """Train every epoch, scoring each on the slice (or dev) and keeping the best epoch's weights."""
        from sentence_transformers import SentenceTransformerTrainer, SentenceTransformerTrainingArguments
        from sentence_transformers.base.sampler import BatchSamplers
        from sentence_transformers.sparse_encoder import SparseEncoderTrainer, SparseEncoderTrainingArguments
        from transformers import TrainerCallback

        training, t, main = self.training, self.config.train, self.family.main_metric
        choose = training.held_out if training.held_out is not None else next(iter(self.data.dev.values()))
        prefix = "select_" if training.on_slice else ""
        texts = [x for row in self.data.train.texts for x in row]
        length = self.config.data.max_seq_len
        warn_truncated(self.data.train.source, count_truncated(self.model.tokenizer, texts, length), len(texts), length)
        result, self.best_state, tuner = SeedResult(self.seed, {}, 0), None, self
        train_sets = self.family.training_sets(self._training_split())

        class EpochScores(TrainerCallback):
            """Scores each epoch when it ends; the step losses of the epoch give its mean training loss."""

            def __init__(self):
                self.losses: list[float] = []

            def on_log(self, args, state, control, logs=None, **kwargs):
                if logs and "loss" in logs:
                    self.losses.append(float(logs["loss"]))

            def on_epoch_end(self, args, state, control, **kwargs):
                epoch = len(result.history) + 1
                scores = {f"{prefix}{k}": v for k, v in tuner.score(choose).items()}
                loss = sum(self.losses) / max(1, len(self.losses))
                self.losses = []
                result.history.append({"epoch": epoch, "train_loss": loss, **scores})
                logged = {f"{'select' if prefix else 'eval'}/{k.removeprefix(prefix)}": v for k, v in scores.items()}
                tuner.metrics.log({"train/loss": loss, **logged}, epoch)
                if not result.best or scores[prefix + main] > result.best[prefix + main]:
                    result.best, result.best_epoch = scores, epoch
                    tuner.best_state = {k: v.detach().to("cpu", copy=True)
                                        for k, v in tuner.model.state_dict().items()}

        with tempfile.TemporaryDirectory(prefix="embed-trainer-") as scratch:
            Arguments = SparseEncoderTrainingArguments if self.sparse else SentenceTransformerTrainingArguments
            args = Arguments(
                output_dir=scratch, num_train_epochs=t.epochs, max_steps=self.config.embedding.max_steps or -1,
                per_device_train_batch_size=t.batch_size,
                learning_rate=t.learning_rate, warmup_steps=t.warmup_ratio, weight_decay=t.weight_decay,
                adam_beta1=t.adam_betas[0], adam_beta2=t.adam_betas[1], adam_epsilon=t.adam_eps,
                max_grad_norm=t.max_grad_norm, seed=self.seed, data_seed=self.seed,
                bf16=t.precision == "bf16", fp16=t.precision == "fp16", save_strategy="no", eval_strategy="no",
                logging_strategy="steps", logging_steps=1, report_to="none", dataloader_pin_memory=False,
                disable_tqdm=not self.arm.is_main,
                batch_sampler=BatchSamplers.NO_DUPLICATES if self.family.no_duplicates else BatchSamplers.BATCH_SAMPLER,
                prompts=self.config.embedding.prompts.columns(columns_of(train_sets)) or None)
            Trainer = SparseEncoderTrainer if self.sparse else SentenceTransformerTrainer
            trainer = Trainer(model=self.model, args=args, train_dataset=train_sets,
                              loss=self.family.loss(self.model, self.config.embedding), callbacks=[EpochScores()])
            trainer.train()
        return self._score_dev_once(result) if training.held_out is not None else result

    def _training_split(self):
        """The training split, with mined hard negatives when `embedding.hard_negatives` names a miner."""
        settings = self.config.embedding.hard_negatives
        self.mined = None
        if settings.miner is None:
            return self.data.train
        self.mined = mine_negatives(self.data.train, settings, model=self.model, prompts=self.config.embedding.prompts,
                                    batch_size=self.config.train.eval_batch_size)
        return self.mined.split

    def _take_over(self, done: SeedResult) -> SeedResult:
        """A finished trial this seed would repeat step for step: its best epoch's weights, dev scored once."""
        if self.training.held_out is None or done.state is None:
            raise ValueError("take_over: only a seed whose best epoch the selection slice picks repeats a trial")
        for entry in done.history:
            self.metrics.log({"train/loss": entry["train_loss"], **{f"select/{k.removeprefix('select_')}": v
                                                                    for k, v in entry.items()
                                                                    if k.startswith("select_")}}, entry["epoch"])
        self.best_state = done.state
        return self._score_dev_once(SeedResult(self.seed, dict(done.best), done.best_epoch, list(done.history)))

    def _score_dev_once(self, result: SeedResult) -> SeedResult:
        self.model.load_state_dict(self.best_state)
        dev = {k: v for name, split in self.data.dev.items()
               for k, v in self.score(split).items()}
        result.best = {**dev, **result.best}
        self.metrics.log({f"eval/{k}": v for k, v in dev.items()}, result.best_epoch)
        return result

    def _options(self) -> dict:
        """The training options in effect, for the folder's provenance."""
        e, mined = self.config.embedding, getattr(self, "mined", None)
        return {**({"matryoshka_dims": e.matryoshka_dims} if e.matryoshka_dims else {}),
                **({"prompts": e.prompts.named} if e.prompts.named else {}),
                **({"hard_negatives": mined.record()} if mined else {})}

    def _save(self, result: SeedResult) -> None:
        """Reports, the Sentence-Transformers folder (a seed's), `complete.json` last."""
        out, t, source = self.training.folder, self.config.train, self.arm.source
        if self.best_state is not None:
            self.model.load_state_dict(self.best_state)
        out.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out.metrics, {**result.best, "best_epoch": result.best_epoch, "seed": self.seed,
                                        "from_scratch": self.arm.from_scratch, "processes": 1})
        write_json_atomic(out.history, result.history)
        if self.training.keeps_weights:
            dev = next(iter(self.data.dev.values()))
            check = [x for row in dev.texts for x in row][:CHECK_TEXTS]
            save = save_sparse_model if self.sparse else save_sentence_model
            save(out.model, self.model, {
                **self.family.provenance(), "name": self.config.task_name, "seed": self.seed,
                "metrics": result.best, "best_epoch": result.best_epoch, "max_seq_len": self.config.data.max_seq_len,
                "pooling": f"splade-{SPLADE_POOLING}" if self.sparse else self.config.embedding.pooling,
                "loss": self.family.loss_name(self.config.embedding),
                "from_scratch": self.arm.from_scratch, "source_model": source.path, **self._options(),
                "pretrain_run_id": source.pretrain_run_id, "pretrain_checkpoint": source.pretrain_checkpoint,
                "recipe": {"learning_rate": t.learning_rate, "batch_size": t.batch_size, "epochs": t.epochs,
                           "max_steps": self.config.embedding.max_steps, "warmup_ratio": t.warmup_ratio,
                           "weight_decay": t.weight_decay, "precision": t.precision},
                **({"selection": self.training.protocol} if self.training.protocol else {})}, check)
        self.metrics.log({f"best/{k}": v for k, v in result.best.items()} | {"best/epoch": result.best_epoch},
                         t.epochs)
        for path in (out.metrics, out.history):
            self.metrics.log_artifact(path)
        self.training.mark_complete({"metrics": result.best, "best_epoch": result.best_epoch, "processes": 1})
        self.metrics.close()


def columns_of(train_sets) -> list[str]:
    """The training columns of one dataset or of each in a dict of them."""
    sets = train_sets.values() if isinstance(train_sets, dict) else [train_sets]
    return list(dict.fromkeys(name for one in sets for name in one.column_names))
