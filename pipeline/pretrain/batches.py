"""Training and evaluation batches: a seeded shuffle per epoch, a disjoint slice per rank.

The data order is a pure function of (seed, optimizer step): step `s` takes the global batch
`s mod steps_per_epoch` of epoch `s // steps_per_epoch`'s order (`data/epoch_order.py`, evaluated
for just the positions a micro batch needs; an epoch's last partial batch is dropped), and micro
batch `k` of it is `BatchPlan`'s slice. So the only data state a checkpoint needs is the step, and
a run resumed, on the same or another world size with the same global batch, sees exactly the
batches and masks an uninterrupted one would.

Each DataLoader item is a whole micro batch: the sampler (in the training process) names the
sequence indices, a worker gathers them from the cache and masks them in one vectorised call.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader

from pipeline.data.epoch_order import EpochOrder, ShardLayout
from pipeline.data.token_cache import ConcatenatedCaches, TokenCache
from pipeline.pretrain.batch_plan import BatchPlan
from pipeline.pretrain.masking import EVAL_STREAM, TRAIN_STREAM, Masker
from pipeline.pretrain.packed_attention import document_layout


@dataclass(frozen=True)
class MicroBatchKey:
    """Which sequences make up one micro batch, and the mask key's epoch (one, or one per sequence) and stream."""

    epoch: int | np.ndarray
    indices: np.ndarray
    stream: int = TRAIN_STREAM


class StepOrder:
    """A step → micro batches mapping under a BatchPlan: `GlobalShuffle`, or `mixture.MixedShuffle` for corpora."""

    plan: BatchPlan

    def micro_batch(self, step: int, micro_index: int) -> MicroBatchKey:
        raise NotImplementedError

    def rank_keys(self, rank: int, start_step: int, end_step: int) -> Iterator[MicroBatchKey]:
        """This rank's micro batches, in the order it runs them, from `start_step` up to `end_step`."""
        for step in range(start_step, end_step):
            for micro_step in range(self.plan.accumulation):
                yield self.micro_batch(step, self.plan.micro_batch_index(rank, micro_step))


class GlobalShuffle(StepOrder):
    """The epoch orders and the step → sequence mapping shared by every rank.

    `layout`: the folder's shards and shuffle blocks (`TokenCache.layout`), or a bare sequence count
    (one block). Epoch e's order is `EpochOrder(layout, [seed, e])`: computed per micro batch, never
    held as an array, so its memory does not grow with the corpus.
    """

    def __init__(self, layout: ShardLayout | int, plan: BatchPlan, seed: int):
        self.layout = ShardLayout.of(layout)
        self.num_sequences = self.layout.num_sequences
        self.plan = plan
        self.seed = seed
        self.steps_per_epoch = self.num_sequences // plan.global_batch_size
        self._order = EpochOrder(self.layout, [seed, 0])

    def order(self, epoch: int) -> EpochOrder:
        if self._order.key != [self.seed, epoch]:
            self._order = EpochOrder(self.layout, [self.seed, epoch])
        return self._order

    def micro_batch(self, step: int, micro_index: int) -> MicroBatchKey:
        """Micro batch `micro_index` (0 ≤ k < world × accumulation) of optimizer step `step`."""
        epoch, within = divmod(step, self.steps_per_epoch)
        start = within * self.plan.global_batch_size + micro_index * self.plan.micro_batch_size
        return MicroBatchKey(epoch, self.order(epoch).rows(np.arange(start, start + self.plan.micro_batch_size)))


class MaskedBatches(torch.utils.data.Dataset):
    """`dataset[MicroBatchKey]` → a model-ready batch of tensors (masked input, labels, …)."""

    def __init__(self, cache: TokenCache | ConcatenatedCaches, masker: Masker, *, with_segments: bool,
                 position_offset: int = 0):
        """`position_offset`: the first position id (RoBERTa: pad id + 1, BERT: 0), for doc-packed rows."""
        self.cache = cache
        self.masker = masker
        self.with_segments = with_segments
        self.position_offset = position_offset

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, key: MicroBatchKey) -> dict[str, torch.Tensor]:
        rows = np.sort(key.indices)  # sorted reads are sequential in the file; the order is restored below
        restore = np.argsort(np.argsort(key.indices))
        fields = {name: np.asarray(values[rows])[restore] for name, values in self.cache.fields.items()}
        ids = fields["input_ids"]
        corrupted, labels = self.masker(ids, key.epoch, key.indices, key.stream)
        batch = {"input_ids": torch.from_numpy(corrupted), "labels": torch.from_numpy(labels)}
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
        return batch


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens of text in a batch, padding excluded: what throughput figures count."""
    if "document_ids" in batch:
        return int((batch["document_ids"] >= 0).sum())
    if "attention_mask" in batch:
        return int(batch["attention_mask"].sum())
    return batch["input_ids"].numel()


def train_loader(batches: MaskedBatches, shuffle: StepOrder, *, rank: int, start_step: int, end_step: int,
                 num_workers: int) -> DataLoader:
    """This rank's micro batches from `start_step`, prefetched by `num_workers` processes."""
    keys = RankKeys(shuffle, rank, start_step, end_step)
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

    order: StepOrder
    rank: int
    start_step: int
    end_step: int

    def __iter__(self) -> Iterator[MicroBatchKey]:
        return self.order.rank_keys(self.rank, self.start_step, self.end_step)

    def __len__(self) -> int:
        return (self.end_step - self.start_step) * self.order.plan.accumulation


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
