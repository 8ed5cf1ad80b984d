"""The masked-LM "unigram plateau": the validation loss a model reaches without using any context.

Masked-LM pretraining first learns word frequencies: the loss falls fast to a level and stays
there a while before the model starts to use the words around a mask. That level is the unigram
entropy of the tokens that are predicted.

Why. The targets are tokens at positions chosen uniformly among the ordinary (non-special) tokens
(masking.py: every ordinary token has the same chance, whatever it is), so a target is a draw from
the unigram distribution p of the split's ordinary tokens. A model that ignores the context and
predicts q at every masked position has expected cross-entropy

    E[-ln q(y)] = H(p) + KL(p || q)  >=  H(p) = -sum_t p(t) ln p(t),

with equality when q = p. So H(p), in nats like the MLM loss, is the best loss of a model that
knows only frequencies; a validation loss is worth reading only by its margin below H(p).

One caveat with BERT's 80/10/10 corruption. At the 10% of targets left unchanged the input token
is the answer, and a context-free model may learn to copy a visible token: `copy_floor_nats` gives
the best loss of such a model (frequencies plus copying, still no context). It lies below H(p) by
roughly 0.1 H(p) for 80/10/10 and equals H(p) when every target is replaced by `<mask>`.

Neither level depends on the masking rate: a target is a uniform draw among ordinary tokens at
any rate, and the corruption mix is per target. So the level is right for a validation loss at
`masking.eval_probability` as at the training rate; the loss itself does depend on the rate (less
context at 30%), which is why every validation loss is printed and logged with its rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from pipeline.data.shards.reader import ShardedDataset


def unigram_entropy_nats(counts: np.ndarray) -> float:
    """H(p) in nats of the distribution given by token `counts` (zeros ignored); 0.0 for one token type."""
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1 or (counts < 0).any():
        raise ValueError("counts must be a 1-D array of non-negative token counts")
    total = counts.sum()
    if total <= 0:
        raise ValueError("counts sum to zero: no tokens to take an entropy of")
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum() + 0.0)  # + 0.0: -0.0 for one token type reads 0.0


def token_counts(shards: str | Path, special_ids: Iterable[int], split: str = "val") -> np.ndarray:
    """Counts of each token id over one split of a shard folder, with `special_ids` (padding too) set to 0."""
    data = ShardedDataset(shards, split, cache_shards=1)
    counts = np.zeros(int(data.index["tokenizer"]["vocab_size"]), dtype=np.int64)
    for shard in range(len(data.shards)):
        ids = data._load(shard)["input_ids"].ravel()  # checks the shard's sha256 and row count
        found = np.bincount(ids, minlength=len(counts))
        if len(found) > len(counts):  # ids beyond the index's vocabulary size: keep them, do not drop silently
            counts = np.concatenate([counts, np.zeros(len(found) - len(counts), dtype=np.int64)])
        counts[: len(found)] += found
    specials = [i for i in special_ids if 0 <= i < len(counts)]
    counts[specials] = 0
    return counts


def validation_unigram_entropy(shards: str | Path, special_ids: Iterable[int]) -> float:
    """The plateau's level for a shard folder: H(p) in nats over its validation split, special tokens excluded
    (one `np.bincount` per shard through the checked reader: about a second for IMDB's)."""
    return unigram_entropy_nats(token_counts(shards, special_ids, "val"))


def plateau_level(shards: str | Path, tokenizer) -> float:
    """`validation_unigram_entropy` without the ids the masker skips (`tokenizer.all_special_ids`): the one place
    that says so, for the trainer and the benchmarks. `tokenizer`: loaded, or its folder or hub name."""
    if isinstance(tokenizer, str | Path):
        from pipeline.data.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(str(tokenizer))
    return validation_unigram_entropy(shards, tokenizer.all_special_ids)


def copy_floor_nats(counts: np.ndarray, ordinary_ids: int, mask_token_fraction: float = 0.8,
                    random_token_fraction: float = 0.1) -> float:
    """The best loss without context when the model may copy the visible token: frequencies plus copying.

    A target's input is `<mask>` (fraction m), itself (k = 1 - m - r) or a uniformly random
    ordinary token (r; masking.py draws among the `ordinary_ids` non-special ids). Given `<mask>`
    the best guess is p (loss H(p)); given a visible token x it is P(y | x) from the joint
    P(x, y) = k p(y) [x = y] + r p(y) / V, so the floor is m H(p) + (1 - m) H(Y | X).
    """
    counts = np.asarray(counts, dtype=np.float64)
    p = counts[counts > 0] / counts.sum()
    if ordinary_ids < len(p):
        raise ValueError(f"{len(p)} token types occur but ordinary_ids is {ordinary_ids}")
    m, r = mask_token_fraction, random_token_fraction
    visible = 1.0 - m
    if visible <= 0:
        return unigram_entropy_nats(counts)
    k, r = (1.0 - m - r) / visible, r / visible  # the chances of "kept" and "random", given a visible input
    vocab = ordinary_ids
    diagonal = p * (k + r / vocab)  # P(x = y = t)
    off = p * r / vocab  # P(x = s, y = t) for each of the V - 1 ordinary s != t
    joint = -(diagonal * np.log(diagonal)).sum()
    if r > 0:
        joint -= ((vocab - 1) * off * np.log(off)).sum()
    marginal = k * p + r / vocab  # P(x) where x occurs as a target; elsewhere r / V
    entropy_x = -(marginal * np.log(marginal)).sum()
    if r > 0:
        entropy_x -= (vocab - len(p)) * (r / vocab) * np.log(r / vocab)
    return float(m * unigram_entropy_nats(counts) + visible * (joint - entropy_x))


def beside_plateau(loss: float, entropy: float | None) -> str:
    """A validation loss as reports print it: `5.300 (unigram entropy 6.422: 1.122 nats below it)`."""
    if entropy is None:
        return f"{loss:.3f}"
    margin = entropy - loss
    side = "below" if margin >= 0 else "above"
    return f"{loss:.3f} (unigram entropy {entropy:.3f}: {abs(margin):.3f} nats {side} it)"


def metrics_beside_plateau(record: dict, prefix: str = "eval/") -> str:
    """`beside_plateau` for a metrics.jsonl record: `<prefix>mlm_loss` and `<prefix>unigram_entropy` (if logged)."""
    return beside_plateau(record[f"{prefix}mlm_loss"], record.get(f"{prefix}unigram_entropy"))


def at_mask_rate(record: dict) -> str:
    """` at 15% masking` for a metrics record holding `eval/mask_rate` (the validation masking rate); else ``."""
    rate = record.get("eval/mask_rate")
    return "" if rate is None else f" at {100 * rate:.3g}% masking"
