"""Training and evaluation batches: the stream's micro batches (stream.py), gathered, masked and loaded.

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

from pipeline.data.token_cache import ConcatenatedCaches, TokenCache
from pipeline.pretrain.masking import EVAL_STREAM, Masker
from pipeline.pretrain.packed_attention import document_layout
from pipeline.pretrain.stream import DataStream, MicroBatchKey


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
