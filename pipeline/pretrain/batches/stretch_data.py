"""A stretch's data: the stream's micro batches (stream.py) gathered, masked and loaded, and the trainer's one view
of them (`PretrainData`): train and validation batches, the loader, the validation losses, eval metrics and
progress, the same questions for one folder and for a mix.

Each DataLoader item is a whole micro batch: the sampler (in the training process) names the
sequence indices, a worker gathers them from the cache and masks them in one vectorised call. Each
corpus of the stretch has its own token caches (data/token_cache.py, its block as the plan records);
the stream numbers corpus c's row i as row offset_c + i of them end to end, so two corpora never
share a mask key.
"""

from __future__ import annotations

import dataclasses
import math
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.data.token_cache import ConcatenatedCaches, TokenCache
from pipeline.data.tokenizer import TokenizerInfo
from pipeline.models.architectures.hf_model import first_position_id
from pipeline.models.architectures.packed_attention import document_layout
from pipeline.pretrain.batches.masked_slots import masked_count, masked_slots, slot_bound
from pipeline.pretrain.batches.span_sampler import SpanSampler, row_documents
from pipeline.pretrain.plan.masking import EVAL_STREAM, Masker, build_masker
from pipeline.pretrain.plan.run_plan import RunPlan, Stretch
from pipeline.pretrain.plan.stream import DataStream, MicroBatchKey


class MaskedBatches(torch.utils.data.Dataset):
    """`dataset[MicroBatchKey]` → a model-ready batch of tensors (masked input, the masked slots, …)."""

    def __init__(self, cache: TokenCache | ConcatenatedCaches, masker: Masker, *, with_segments: bool,
                 position_offset: int = 0, spans: SpanSampler | None = None):
        """`position_offset`: the first position id (RoBERTa: pad id + 1, BERT: 0), for doc-packed rows; `spans`
        draws each document's two spans for the span-contrastive term (`span_ids`; None: no spans)."""
        self.cache = cache
        self.masker = masker
        self.with_segments = with_segments
        self.position_offset = position_offset
        self.spans = spans

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, key: MicroBatchKey) -> dict[str, torch.Tensor]:
        rows = np.sort(key.indices)  # sorted reads are sequential in the file; the order is restored below
        restore = np.argsort(np.argsort(key.indices))
        fields = {name: np.asarray(values[rows])[restore] for name, values in self.cache.fields.items()}
        ids = fields["input_ids"]
        corrupted, labels = self.masker(ids, key.epoch, key.indices, key.stream)
        bound = slot_bound(ids.size, self.masker.probability, self.masker.masking)
        batch = {"input_ids": torch.from_numpy(corrupted), **masked_slots(labels, bound)}
        documents = None
        if "doc_starts" in fields:  # doc-packed rows: documents side by side, each attending to itself only
            documents, position_ids = document_layout(fields["doc_starts"], fields["length"].astype(np.int64),
                                                      ids.shape[1], self.position_offset)
            batch["document_ids"] = torch.from_numpy(documents)
            batch["position_ids"] = torch.from_numpy(position_ids)
        elif "length" in fields:
            positions = np.arange(ids.shape[1])
            lengths = fields["length"].astype(np.int64)
            if (lengths < ids.shape[1]).any():
                batch["attention_mask"] = torch.from_numpy((positions[None, :] < lengths[:, None]).astype(np.int64))
            if self.with_segments and "segment_b_start" in fields:  # pairs; BERT without NSP reads full rows too
                b_start = fields["segment_b_start"].astype(np.int64)
                segment_b = (positions[None, :] >= b_start[:, None]) & (positions[None, :] < lengths[:, None])
                batch["token_type_ids"] = torch.from_numpy(segment_b.astype(np.int64))
                batch["next_sentence_label"] = torch.from_numpy(fields["nsp_label"].astype(np.int64))
        if self.spans is not None:  # one document per row unless doc-packed
            if documents is None:
                documents = row_documents(*ids.shape, fields["length"].astype(np.int64) if "length" in fields else None)
            keys = self.masker.keys(key.epoch, np.asarray(key.indices), key.stream)
            batch["span_ids"] = torch.from_numpy(self.spans(keys, documents))
        return batch


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens of text in a batch, padding excluded: what throughput figures count."""
    if "document_ids" in batch:
        return int((batch["document_ids"] >= 0).sum())
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    return batch["input_ids"].numel()


def train_loader(batches: MaskedBatches, stream: DataStream, *, rank: int, start_step: int, end_step: int,
                 num_workers: int, skipped: tuple[range, ...] = ()) -> DataLoader:
    """This rank's micro batches of steps [start_step, end_step) but the `skipped` ones, prefetched by
    `num_workers` processes."""
    keys = RankKeys(stream, rank, start_step, end_step, skipped)
    # Pinned host memory lets the trainer's copies to a GPU run asynchronously.
    return DataLoader(batches, sampler=keys, batch_size=None, num_workers=num_workers,
                      prefetch_factor=4 if num_workers else None, pin_memory=torch.cuda.is_available(),
                      worker_init_fn=ignore_stop_signals if num_workers else None)


def shut_down_workers(batches: object) -> None:
    """Stop a DataLoader iterator's worker processes now (a no-op for anything else).

    Workers ignore SIGTERM (`ignore_stop_signals`), so a worker still alive at interpreter exit hangs the
    process: multiprocessing's exit handler terminates (SIGTERM) and then joins it. The iterator stops its
    workers when it is freed, but a reference that outlives the loop (seen under `train.compile` on CPU and
    on CUDA) delays that to exit. `_shutdown_workers` is what the iterator's own `__del__` calls.
    """
    shutdown = getattr(batches, "_shutdown_workers", None)
    if callable(shutdown):
        shutdown()


def ignore_stop_signals(worker_id: int) -> None:
    """In a DataLoader worker: leave SIGTERM and SIGINT to the rank, which stops after its step and checkpoints.

    Launchers that stop a job signal its whole process group (torchrun, SLURM's scancel, a terminal's
    Ctrl-C); a worker killed by that signal makes the rank's next batch raise, and the checkpoint
    the signal asked for is never written. The worker still exits when the loader shuts down, or
    when the rank dies (PyTorch's worker watchdog).
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclass(frozen=True)
class RankKeys:
    """The sampler: one rank's micro-batch keys, made as they are consumed rather than held in a list."""

    stream: DataStream
    rank: int
    start_step: int
    end_step: int
    skipped: tuple[range, ...] = ()
    """Steps whose batches are never read (a skipped range: their order positions stay theirs)."""

    def steps(self) -> Iterator[int]:
        return (step for step in range(self.start_step, self.end_step)
                if not any(step in skip for skip in self.skipped))

    def __iter__(self) -> Iterator[MicroBatchKey]:
        return self.stream.rank_keys(self.rank, self.steps())

    def __len__(self) -> int:
        return sum(1 for _ in self.steps()) * self.stream.plan.accumulation


def eval_keys(num_sequences: int, eval_sequences: int, micro_batch_size: int, rank: int,
              world_size: int) -> list[MicroBatchKey]:
    """This rank's fixed validation micro batches: an equal share of the first `eval_sequences` sequences.

    Every rank gets the same number of forward passes (ZeRO-3 gathers parameters collectively in
    each one, so an extra pass on one rank would hang the others): the set is trimmed to a multiple
    of the world size, and each rank takes a contiguous slice of it in micro batches.
    """
    per_rank = max(1, min(num_sequences, eval_sequences) // world_size)
    mine = np.arange(rank * per_rank, (rank + 1) * per_rank) % num_sequences  # wraps only if val < world size
    return [MicroBatchKey(0, mine[i: i + micro_batch_size], EVAL_STREAM) for i in range(0, per_rank, micro_batch_size)]


class PretrainData:
    """One stretch's data on this rank, as the trainer asks for it (see the module doc)."""

    def __init__(self, stretch: Stretch, plan: BatchPlan, masker: Masker, *, seed: int, cache_dir: Path,
                 tokenizer_fingerprint: str, with_segments: bool, position_offset: int = 0,
                 eval_masker: Masker | None = None, num_workers: int = 0, skipped: tuple[range, ...] = (),
                 spans: SpanSampler | None = None):
        """`plan`: the stretch's batch on this world size; `eval_masker` masks the validation batches
        (`masking.eval_probability`); None: `masker`. The loader reads with `num_workers` processes and leaves
        out the steps `skipped`; `spans` draws the training batches' spans (validation has none: its loss is the
        MLM loss alone)."""
        self.stretch, self.plan, self.num_workers, self.skipped = stretch, plan, num_workers, skipped
        self.corpora = stretch.corpora
        self.mixed = len(self.corpora) > 1 or stretch.phase.data.mixed
        train, val = [], []
        for corpus in self.corpora:  # one cache per corpus; seq_len is checked again against the first
            seq_len = train[0].seq_len if train else None
            train.append(TokenCache(corpus.path, "train", cache_dir, seq_len=seq_len,
                                    tokenizer_fingerprint=tokenizer_fingerprint,
                                    shards_per_block=corpus.shards_per_block))
            val.append(TokenCache(corpus.path, "val", cache_dir, seq_len=train[0].seq_len,
                                  tokenizer_fingerprint=tokenizer_fingerprint))
        self.seq_len = train[0].seq_len
        self.shares = [float(s) for s in stretch.shares]
        self._train, self._val_sizes = train, [len(v) for v in val]
        self._shard_tokens = [np.array([s["tokens"] for s in t.source.shards], dtype=np.int64) for t in train]
        self._counted: dict[int, tuple[tuple[int, int], int, int]] = {}
        """Per corpus: ((epoch, block start), position, tokens from the block start) at the last count."""
        train_rows = ConcatenatedCaches(train) if self.mixed else train[0]
        val_rows = ConcatenatedCaches(val) if self.mixed else val[0]
        self.stream = stretch.stream(seed, plan)
        self.train_batches = MaskedBatches(train_rows, masker, with_segments=with_segments,
                                           position_offset=position_offset, spans=spans)
        self.val_batches = MaskedBatches(val_rows, eval_masker or masker, with_segments=with_segments,
                                         position_offset=position_offset)

    @classmethod
    def for_stretch(cls, stretch: Stretch, plan: BatchPlan, run: RunPlan, tokenizer,
                    info: TokenizerInfo) -> PretrainData:
        """The data of one of the `run`'s stretches at its batch `plan` on this world size: a masker at its phase's
        masking rate, and validation masks at the run's one rate (`masking.eval_probability`), so every phase's
        losses compare."""
        config, seed = run.config, run.config.train.seed
        masking = dataclasses.replace(config.masking, probability=stretch.phase.masking_probability)
        masker = build_masker(masking, tokenizer, info.vocab_size, info.mask_id, seed)
        eval_masker = build_masker(config.masking, tokenizer, info.vocab_size, info.mask_id, seed, evaluation=True)
        return cls(stretch, plan, masker, seed=seed, cache_dir=config.cache_dir,
                   tokenizer_fingerprint=info.fingerprint,
                   with_segments=config.model.architecture == "bert",  # where the shards hold pairs
                   # doc-packed rows restart positions per document from the first position id
                   position_offset=first_position_id(config.model.architecture, info.pad_id),
                   eval_masker=eval_masker, num_workers=config.data.num_workers, skipped=run.skipped,
                   spans=SpanSampler(config.contrastive) if config.contrastive.on else None)

    def loader(self, *, rank: int, start_step: int) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's micro batches from `start_step` to the stretch's end, skipped steps left out, read lazily."""
        return iter(train_loader(self.train_batches, self.stream, rank=rank, start_step=start_step,
                                 end_step=self.stretch.end, num_workers=self.num_workers, skipped=self.skipped))

    @torch.no_grad()
    def evaluate(self, engine, eval_sequences: int, rank: int) -> np.ndarray:
        """Per corpus, (loss × masked tokens, masked tokens) summed over every rank's validation micro batches."""
        eval_sets = self.eval_sets(eval_sequences, self.plan.micro_batch_size, rank, self.plan.world_size)
        engine.eval()
        # On the engine's device: NCCL reduces no CPU tensor (a CPU one here failed every CUDA run's last
        # evaluation), and the batches' losses come to the host once, not each.
        totals = torch.zeros(len(eval_sets), 2, dtype=torch.float64, device=engine.device)
        for corpus, keys in enumerate(eval_sets):
            for key in keys:
                batch = {k: v.to(engine.device) for k, v in self.val_batches[key].items()}
                out = engine(**batch)
                masked = masked_count(batch)
                totals[corpus, 0] += out.get("mlm_loss", out["loss"]).detach().double() * masked
                totals[corpus, 1] += masked
        engine.train()
        dist.all_reduce(totals)
        return totals.cpu().numpy()

    def eval_sets(self, eval_sequences: int, micro_batch_size: int, rank: int,
                  world_size: int) -> list[list[MicroBatchKey]]:
        """Per corpus, this rank's fixed validation micro batches (`eval_sequences` of each corpus)."""
        sets, offset = [], 0
        for size in self._val_sizes:
            keys = eval_keys(size, eval_sequences, micro_batch_size, rank, world_size)
            sets.append([MicroBatchKey(k.epoch, k.indices + offset, k.stream) for k in keys])
            offset += size
        return sets

    def eval_metrics(self, totals: np.ndarray, entropies: list[float] | None = None) -> dict[str, float]:
        """Metrics from per-corpus (loss × masked tokens, masked tokens) sums over all ranks; with `entropies`
        (each corpus's unigram plateau, plateau.py) also the plateau's level and the margin below it.

        A mix weighs each corpus's loss and level by its share: the loss on the training mix, whatever the
        sizes of the validation splits.
        """
        losses = totals[:, 0] / np.maximum(totals[:, 1], 1)
        levels = [None] * len(losses) if entropies is None else entropies
        level = None if entropies is None else float(np.dot(self.shares, entropies))
        rows = [("eval/", float(np.dot(self.shares, losses)), level)]
        if self.mixed:
            rows += [(f"eval/{s.name}/", float(loss), h) for s, loss, h in zip(self.corpora, losses, levels,
                                                                                strict=True)]
        metrics = {}
        for prefix, loss, level in rows:
            metrics[f"{prefix}mlm_loss"] = loss
            if level is not None:
                metrics.update({f"{prefix}unigram_entropy": level, f"{prefix}margin_below_unigram": level - loss})
        metrics["eval/perplexity"] = math.exp(min(metrics["eval/mlm_loss"], 50.0))
        return metrics

    def progress(self, step: int) -> dict[str, float]:
        """How far training is through the data after `step` steps, for the step logs."""
        drawn = self.stream.drawn(step)
        if not self.mixed:
            return {"train/epoch": float(drawn[0] / len(self._train[0]))}
        metrics = {}
        for c, (corpus, n) in enumerate(zip(self.corpora, drawn, strict=True)):
            metrics[f"data/{corpus.name}/epoch"] = float(n / len(self._train[c]))
            metrics[f"data/{corpus.name}/tokens"] = self._tokens(c, int(n))
        return metrics

    def _tokens(self, corpus: int, drawn: int) -> int:
        """Real (unpadded) tokens in corpus `corpus`'s first `drawn` draws: exact, from the epoch's order.

        The blocks already read count by index.json's per-shard tokens; the block being read by the lengths
        of the sequences drawn from it, counted on from the last call (the logs ask at increasing steps).
        So no shard is read for this that training did not read.
        """
        cache = self._train[corpus]
        if "length" not in cache.fields:  # full packing: every sequence is seq_len real tokens
            return drawn * cache.seq_len
        epoch, position = divmod(drawn, len(cache))
        order = self.stream.order(corpus, epoch)
        block_start, _ = order.block_of(position)
        counted_at, counted, tokens = self._counted.get(corpus, ((epoch, block_start), block_start, 0))
        if counted_at != (epoch, block_start) or counted > position:
            counted, tokens = block_start, 0
        if position > counted:
            rows = order.rows(np.arange(counted, position))
            tokens += int(cache.fields["length"][rows].astype(np.int64).sum())
        self._counted[corpus] = ((epoch, block_start), position, tokens)
        before = int(self._shard_tokens[corpus][order.shards_before(position)].sum())
        return epoch * cache.num_tokens + before + tokens
