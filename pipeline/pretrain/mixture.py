"""Weighted corpus mixing (Megatron's data blend), and the trainer's one view of its data.

With the weights normalised to shares p_c and cumulative shares P_c (P_0 = 0, P_K = 1), the
first s steps of global batch B hold

    K_c(s) = ⌊P_c·s·B⌋ − ⌊P_{c−1}·s·B⌋

sequences of corpus c. The counts sum to s·B (the sum telescopes), stay within one sequence of
p_c·s·B at every step, and are a closed form of the step: a resumed run and every rank compute
the same batches without replaying history (Megatron's greedy blend needs the whole index built
up front instead). Step s takes K_c(s+1) − K_c(s) sequences of c, which is never negative when
p_c·B ≥ 1 (checked in config.py). The arithmetic is exact (`fractions`), so no rounding can
break the sum at step 10⁶.

Corpus c's k-th draw is position k mod N_c of its epoch ⌊k / N_c⌋ permutation, seeded by (seed,
c, epoch): a corpus that runs out starts its next epoch on its own, and since the Masker keys a
mask by (epoch, sequence index) it gets new masks. Sequence indices are global over the corpora
laid end to end (corpus c's row i is row offset_c + i), so two corpora never share a mask key.
The B sequences of a step are then shuffled by a permutation seeded by (seed, step), so every
micro batch (and every rank) sees the mix rather than one corpus.

A single folder (`data.shards` a string) keeps `batches.GlobalShuffle`'s order exactly.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from fractions import Fraction
from itertools import accumulate
from pathlib import Path

import numpy as np
from torch.utils.data import DataLoader

from pipeline.data.epoch_order import EpochOrder, ShardLayout
from pipeline.data.token_cache import ConcatenatedCaches, TokenCache
from pipeline.pretrain.batch_plan import BatchPlan
from pipeline.pretrain.batches import GlobalShuffle, MaskedBatches, MicroBatchKey, StepOrder, eval_keys, train_loader
from pipeline.pretrain.config import DataConfig, corpus_shares
from pipeline.pretrain.masking import Masker

_ORDER, _MIX = 1, 2  # RNG salts: a corpus's epoch permutation, a step's shuffle


class MixedShuffle(StepOrder):
    """Step → micro batches drawn from several corpora in proportion to their weights (see the module doc)."""

    def __init__(self, sizes: list[ShardLayout | int], weights: list[float], plan: BatchPlan, seed: int):
        """`sizes`: each corpus's shard layout (`TokenCache.layout`), or its sequence count (one block)."""
        self.layouts = [ShardLayout.of(size) for size in sizes]
        self.sizes = [layout.num_sequences for layout in self.layouts]
        self.offsets = np.cumsum([0] + self.sizes[:-1])
        self.plan = plan
        self.seed = seed
        self._bounds = [Fraction(0), *accumulate(corpus_shares(weights))]  # the last is exactly 1
        self._orders: OrderedDict[tuple[int, int], EpochOrder] = OrderedDict()
        self._step, self._batch = -1, (np.empty(0, np.int64), np.empty(0, np.int64))

    def drawn(self, step: int) -> np.ndarray:
        """Sequences taken from each corpus by the first `step` steps."""
        n = step * self.plan.global_batch_size
        return np.diff([b.numerator * n // b.denominator for b in self._bounds]).astype(np.int64)

    def order(self, corpus: int, epoch: int) -> EpochOrder:
        """Corpus `corpus`'s sequence order in its epoch `epoch`; the last few are kept (one corpus at a time
        crosses an epoch boundary, and the logs ask about the current ones)."""
        key = (corpus, epoch)
        if key not in self._orders:
            self._orders[key] = EpochOrder(self.layouts[corpus], [self.seed, _ORDER, corpus, epoch])
            while len(self._orders) > 2 * len(self.sizes):
                self._orders.popitem(last=False)
        self._orders.move_to_end(key)
        return self._orders[key]

    def step_rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(global row, corpus epoch) of each of step `step`'s sequences, in global-batch order."""
        if step != self._step:
            start, end = self.drawn(step), self.drawn(step + 1)
            rows, epochs = [], []
            for c, size in enumerate(self.sizes):
                epoch, position = np.divmod(np.arange(start[c], end[c]), size)
                local = np.empty_like(position)
                for e in np.unique(epoch):
                    now = epoch == e
                    local[now] = self.order(c, int(e)).rows(position[now])
                rows.append(self.offsets[c] + local)
                epochs.append(epoch)
            mix = np.random.default_rng([self.seed, _MIX, step]).permutation(self.plan.global_batch_size)
            self._step, self._batch = step, (np.concatenate(rows)[mix], np.concatenate(epochs)[mix])
        return self._batch

    def micro_batch(self, step: int, micro_index: int) -> MicroBatchKey:
        rows, epochs = self.step_rows(step)
        mine = slice(micro_index * self.plan.micro_batch_size, (micro_index + 1) * self.plan.micro_batch_size)
        return MicroBatchKey(epochs[mine], rows[mine])


class PretrainData:
    """The trainer's data: masked train and validation batches, the step order, eval sets and progress; one
    object for a single folder and a mix, so the trainer asks the same questions of both."""

    def __init__(self, data: DataConfig, plan: BatchPlan, masker: Masker, *, seed: int, cache_dir: Path,
                 tokenizer_fingerprint: str, with_segments: bool, position_offset: int = 0,
                 eval_masker: Masker | None = None):
        """`eval_masker` masks the validation batches (`masking.eval_probability`); None: `masker`."""
        self.step_shift = 0
        """Added to the run's step to give the step of this data's order (a later phase: see phases.py)."""
        self.corpora = data.corpora()
        self.mixed = data.mixed
        train, val = [], []
        for source in self.corpora:  # one cache per corpus; seq_len is checked again against the first
            seq_len = train[0].seq_len if train else None
            train.append(TokenCache(source.path, "train", cache_dir, seq_len=seq_len,
                                    tokenizer_fingerprint=tokenizer_fingerprint))
            val.append(TokenCache(source.path, "val", cache_dir, seq_len=train[0].seq_len,
                                  tokenizer_fingerprint=tokenizer_fingerprint))
        self.seq_len = train[0].seq_len
        self.shares = [float(s) for s in corpus_shares([s.weight for s in self.corpora])]
        self._train, self._val_sizes = train, [len(v) for v in val]
        self._shard_tokens = [np.array([s["tokens"] for s in t.source.shards], dtype=np.int64) for t in train]
        self._counted: dict[int, tuple[tuple[int, int], int, int]] = {}
        """Per corpus: ((epoch, block start), position, tokens from the block start) at the last count."""
        if self.mixed:
            train_rows, val_rows = ConcatenatedCaches(train), ConcatenatedCaches(val)
            weights = [s.weight for s in self.corpora]
            self.order: StepOrder = MixedShuffle([t.layout for t in train], weights, plan, seed)
        else:
            train_rows, val_rows = train[0], val[0]
            self.order = GlobalShuffle(train[0].layout, plan, seed)
        self.train_batches = MaskedBatches(train_rows, masker, with_segments=with_segments,
                                           position_offset=position_offset)
        self.val_batches = MaskedBatches(val_rows, eval_masker or masker, with_segments=with_segments,
                                         position_offset=position_offset)

    @property
    def num_train_sequences(self) -> int:
        return sum(len(t) for t in self._train)

    def loader(self, *, rank: int, start_step: int, end_step: int, num_workers: int) -> DataLoader:
        shift = self.step_shift
        return train_loader(self.train_batches, self.order, rank=rank, start_step=start_step + shift,
                            end_step=end_step + shift, num_workers=num_workers)

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
        step += self.step_shift
        if not self.mixed:
            return {"train/epoch": step / self.order.steps_per_epoch}
        metrics = {}
        for c, (source, drawn) in enumerate(zip(self.corpora, self.order.drawn(step), strict=True)):
            metrics[f"data/{source.name}/epoch"] = float(drawn / len(self._train[c]))
            metrics[f"data/{source.name}/tokens"] = self._tokens(c, int(drawn))
        return metrics

    def epoch_state(self, step: int) -> int | dict[str, int]:
        """The epoch for the checkpoint's train state: one number, or one per corpus of a mix."""
        step += self.step_shift
        if not self.mixed:
            return step // self.order.steps_per_epoch
        return {s.name: int(d // len(t)) for s, d, t in zip(self.corpora, self.order.drawn(step), self._train,
                                                            strict=True)}

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
        order = self.order.order(corpus, epoch)
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
