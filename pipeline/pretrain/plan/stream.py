"""The data stream: which sequences each optimizer step trains on, as a closed form of the step.

Corpus c's d-th draw is position d mod N_c of its epoch ⌊d / N_c⌋ order (`data/epoch_order.py`, keyed by
(seed, the corpus's key, epoch)): a corpus that runs out starts its next epoch on its own, and since the
Masker keys a mask by (epoch, sequence) it gets new masks.

A stretch of steps [start, end) at global batch B and shares p_c (cumulative P_c, P_0 = 0, P_K = 1) draws
in its first k steps

    K_c(k) = ⌊P_c·k·B⌋ − ⌊P_{c−1}·k·B⌋

sequences of corpus c, on top of the draws the corpus had when the stretch began (`first_draws`). The
counts sum to k·B, stay within one sequence of p_c·k·B, and are exact (`fractions`): Megatron's data
blend without its index. A later stretch (a phase, the next batch of a batch warmup, a resume into an
edited mix) starts each corpus where the earlier ones left it, so a change of batch, mix or phase
repeats and skips nothing within an epoch. One folder is a mix of one corpus.

The B sequences of a step are then shuffled by a permutation keyed by (seed, step), so every micro
batch (and every rank) sees the mix; micro batch k holds positions [k·m, (k+1)·m) of it (batch_plan.py).
So the only data state a checkpoint needs is the step and the stretches, and a run resumed, on the
same or another world size, sees exactly the batches and masks an uninterrupted one would.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from itertools import accumulate

import numpy as np

from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.data.epoch_order import CorpusLayout, EpochOrder
from pipeline.pretrain.plan.masking import TRAIN_STREAM

_ORDER, _MIX = 1, 2  # RNG salts: a corpus's epoch order, a step's shuffle


def shares_of(weights: Sequence[float]) -> tuple[Fraction, ...]:
    """Weights normalised to sum exactly 1, each read as the decimal the user wrote (0.7 is 7/10, not the float)."""
    exact = [Fraction(repr(float(w))) for w in weights]
    total = sum(exact)
    return tuple(w / total for w in exact)


def drawn(shares: Sequence[Fraction], sequences: int) -> np.ndarray:
    """Sequences of each corpus among the first `sequences` of a stretch: K_c above, for k·B = `sequences`."""
    bounds = [Fraction(0), *accumulate(shares)]
    return np.diff([b.numerator * sequences // b.denominator for b in bounds]).astype(np.int64)


@dataclass(frozen=True)
class MicroBatchKey:
    """Which sequences make up one micro batch, and the mask key's epoch (one, or one per sequence) and stream."""

    epoch: int | np.ndarray
    indices: np.ndarray
    stream: int = TRAIN_STREAM


class DataStream:
    """Step → the sequences of its global batch, for one stretch (see the module doc)."""

    def __init__(self, corpora: Sequence[CorpusLayout | int], plan: BatchPlan, seed: int, *,
                 shares: Sequence[Fraction] | None = None, first_draws: Sequence[int] | None = None, start: int = 0):
        """`corpora`: layouts, or bare sequence counts (one block each); `shares`: None for equal shares;
        `first_draws`: each corpus's draws before `start`, the stretch's first step."""
        self.corpora = [c if isinstance(c, CorpusLayout) else CorpusLayout.of_size(c, i) for i, c in enumerate(corpora)]
        self.sizes = np.array([c.num_sequences for c in self.corpora], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        """Corpus c's row i is row offsets[c] + i of the stretch's row space (its token caches end to end)."""
        self.plan, self.seed, self.start = plan, seed, start
        self.shares = tuple(shares) if shares is not None else shares_of([1.0] * len(self.corpora))
        self.first_draws = np.zeros(len(self.corpora), np.int64) if first_draws is None else np.array(first_draws)
        self._orders: OrderedDict[tuple[int, int], EpochOrder] = OrderedDict()
        self._step, self._batch = -1, (np.empty(0, np.int64),) * 3

    def drawn(self, step: int) -> np.ndarray:
        """Each corpus's draws, this stretch's and before it, after the run's first `step` steps."""
        return self.first_draws + drawn(self.shares, max(step - self.start, 0) * self.plan.global_batch_size)

    def order(self, corpus: int, epoch: int) -> EpochOrder:
        """Corpus `corpus`'s order in its epoch `epoch`; the last few are kept (logs ask about the current ones)."""
        key = (corpus, epoch)
        if key not in self._orders:
            layout = self.corpora[corpus]
            self._orders[key] = EpochOrder(layout.shard_layout, [self.seed, _ORDER, layout.key, epoch])
            while len(self._orders) > 2 * len(self.corpora):
                self._orders.popitem(last=False)
        self._orders.move_to_end(key)
        return self._orders[key]

    def step_sequences(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(corpus, row within the corpus, the corpus's epoch) of each of step `step`'s sequences, in batch order."""
        if step != self._step:
            first, after = self.drawn(step), self.drawn(step + 1)
            corpus, rows, epochs = [], [], []
            for c, size in enumerate(self.sizes):
                epoch, position = np.divmod(np.arange(first[c], after[c]), size)
                local = np.empty_like(position)
                for e in np.unique(epoch):
                    now = epoch == e
                    local[now] = self.order(c, int(e)).rows(position[now])
                corpus.append(np.full(len(local), c))
                rows.append(local)
                epochs.append(epoch)
            mix = np.random.default_rng([self.seed, _MIX, step]).permutation(self.plan.global_batch_size)
            self._step = step
            self._batch = tuple(np.concatenate(parts)[mix] for parts in (corpus, rows, epochs))
        return self._batch

    def micro_batch(self, step: int, micro_index: int) -> MicroBatchKey:
        """Micro batch `micro_index` (0 ≤ k < world × accumulation) of optimizer step `step`."""
        corpus, rows, epochs = self.step_sequences(step)
        mine = slice(micro_index * self.plan.micro_batch_size, (micro_index + 1) * self.plan.micro_batch_size)
        return MicroBatchKey(epochs[mine], self.offsets[corpus[mine]] + rows[mine])

    def rank_keys(self, rank: int, steps: Iterator[int]) -> Iterator[MicroBatchKey]:
        """This rank's micro batches of `steps`, in the order it runs them."""
        for step in steps:
            for micro_step in range(self.plan.accumulation):
                yield self.micro_batch(step, self.plan.micro_batch_index(rank, micro_step))
