"""How representative a global batch is under the block shuffle, against a global shuffle, at 100B-token scale
(docs/benchmarks.md, "How far a batch's mix strays under the block shuffle"); no data is read."""

from __future__ import annotations

import argparse

import harness
import numpy as np

from pipeline.data.epoch_order import EpochOrder, ShardLayout, default_shards_per_block

STUDY = harness.Study(
    "order_quality", question="How representative is a global batch under the block shuffle?",
    metric="total variation of a batch's source shares from the corpus's (median, 95th percentile)",
    baseline="a global shuffle (one block of every shard); MosaicML streaming's py1e block as the bar",
    arms=("global shuffle", "this release's default block", "py1e's block", "blocks of --blocks shards"))
SOURCES = {"web": 0.55, "books": 0.15, "wiki": 0.10, "code": 0.10, "papers": 0.06, "forums": 0.04}
"""The sources of the sorted corpus and their shares: a typical pretraining mix, laid end to end."""
PY1E_SAMPLES = 262_144


def stray(order: EpochOrder, source_of_shard: np.ndarray, shard_size: int, shares: np.ndarray, batch: int,
          batches: int, rng: np.random.Generator) -> np.ndarray:
    """Total variation distance of `batches` global batches at random places of the epoch from `shares`."""
    starts = rng.integers(0, order.num_sequences // batch, batches) * batch
    out = np.empty(batches)
    for i, start in enumerate(starts):
        rows = order.rows(np.arange(start, start + batch))
        counts = np.bincount(source_of_shard[rows // shard_size], minlength=len(shares))
        out[i] = 0.5 * np.abs(counts / batch - shares).sum()
    return out


def measure(a: argparse.Namespace, rec: harness.BenchmarkRecord) -> None:
    sequences = int(a.tokens) // a.seq_len
    shards = sequences // a.shard_size
    shares = np.array(list(SOURCES.values()))
    # Sorted by source: the first 55% of the shards are web, then books, …
    source_of_shard = np.minimum(np.searchsorted(np.cumsum(shares) * shards, np.arange(shards), side="right"),
                                 len(shares) - 1)
    realised = np.bincount(source_of_shard, minlength=len(shares)) / shards
    sizes = (a.shard_size,) * shards
    blocks = {"global shuffle": shards, "py1e's 262,144 samples": PY1E_SAMPLES // a.shard_size,
              "this release's default": default_shards_per_block(sizes, a.seq_len)}
    for k in a.blocks:
        blocks.setdefault(f"{k} shards", k)
    rng = np.random.default_rng(0)
    rows, headline = [], {}
    for batch in a.batch_sizes:
        reference = None
        for label, width in sorted(blocks.items(), key=lambda kv: -kv[1]):
            order = EpochOrder(ShardLayout(sizes, width), [0, 0])
            tv = stray(order, source_of_shard, a.shard_size, realised, batch, a.batches, rng)
            reference = reference if reference is not None else float(np.median(tv))
            cache_gib = 2 * width * a.shard_size * a.seq_len * 2 / 2**30
            rows.append({"global batch": batch, "block": label, "shards per block": width,
                         "median stray": round(float(np.median(tv)), 4),
                         "95th percentile": round(float(np.quantile(tv, 0.95)), 4),
                         "÷ global shuffle": round(float(np.median(tv)) / reference, 2),
                         "token cache per node (GiB)": round(cache_gib, 2)})
            headline.setdefault(batch, {})[label] = rows[-1]["÷ global shuffle"]
    rec.table(f"{a.tokens:.0e} tokens at seq {a.seq_len}: {shards:,} shards of {a.shard_size:,} sequences, "
              f"sorted by source ({', '.join(f'{k} {v:.0%}' for k, v in SOURCES.items())}); {a.batches} batches "
              "each", rows)
    for batch, ratios in headline.items():  # the anchor: MosaicML streaming's default block
        ours, py1e = ratios["this release's default"], ratios["py1e's 262,144 samples"]
        rec.headline(f"batch {batch}: the default block's stray ÷ a global shuffle's", f"{ours}",
                     target=f"≤ py1e's block ({py1e})", met=ours <= py1e)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=float, default=1e11)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--shard-size", type=int, default=8192, help="sequences per shard (the shard stage's default)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--blocks", type=int, nargs="+", default=[8, 64, 256, 1024, 4096], help="shards per block to try")
    p.add_argument("--batches", type=int, default=200, help="global batches sampled per row")
    a = p.parse_args()
    with STUDY.record() as rec:
        measure(a, rec)


if __name__ == "__main__":
    main()
