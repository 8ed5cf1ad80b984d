"""The share of the steps' time spent waiting for data, as the loader is slowed on purpose.

    python benchmarks/loader_wait.py [--corpus PATH] [--delays-ms 0 300 1500] [--steps 30]

The pretraining command's own loop on one rank (a 2-layer encoder on 2,000 WikiText-2 documents, or
the embedded corpus without the shared data), with one loader worker; each arm makes every micro
batch the worker gathers take `delay` ms longer. While the worker keeps ahead the steps do not wait;
once a batch takes longer to make than a step to train, the share the run reports
(`summary/data_wait_share`, the same figure every log line gives as `train/data_wait_share`) rises
towards delay ÷ (delay + step).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import harness

STUDY = harness.Study(
    "loader_wait", question="Does the run report when its steps wait for data?",
    metric="the run's reported data-wait share (summary and last log line), tokens/s",
    baseline="no delay: the loader keeps ahead of the step", arms=("delay 0 ms", "each --delays-ms"))
WIKITEXT = harness.SHARED / "corpus" / "wikitext2"


def run_arm(work: Path, shards: Path, tokenizer: Path, delay_ms: float, steps: int) -> dict:
    """One short run with every micro batch `delay_ms` slower to make; its reported wait share and step time."""
    from pipeline.common.topology import prepare_environment
    from pipeline.pretrain import batches
    from pipeline.pretrain.preflight import prepare_run
    from pipeline.pretrain.trainer import run_pretraining

    gather = batches.MaskedBatches.__getitem__

    def slowed(self, key):  # runs in the loader worker (forked after the patch)
        time.sleep(delay_ms / 1000)
        return gather(self, key)

    out = work / f"run-{delay_ms:g}ms"
    batches.MaskedBatches.__getitem__ = slowed
    try:
        plan = prepare_run(harness.ROOT / "configs" / "tiny.json", [
            f"data.shards={shards}", f"data.tokenizer={tokenizer}", "data.num_workers=1",
            f"data.cache_dir={work / 'cache'}", f"train.output_dir={out}", f"train.max_steps={steps}",
            "train.log_every=5", "train.export=false", "tracking.enabled=false", f"checkpoint.every={steps}"])
        run_pretraining(plan, prepare_environment())
    finally:
        batches.MaskedBatches.__getitem__ = gather
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = next(e for e in events if "summary/data_wait_share" in e)
    logged = [e["train/data_wait_share"] for e in events if "train/data_wait_share" in e]
    return {"delay per micro batch (ms)": delay_ms, "wait share (run)": round(summary["summary/data_wait_share"], 3),
            "wait share (last log line)": round(logged[-1], 3), "tokens/s": round(summary["summary/tokens_per_s"])}


def main() -> None:
    from pipeline.data.tokenizer import train_tokenizer

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--corpus", default=str(WIKITEXT) if WIKITEXT.exists() else None)
    p.add_argument("--documents", type=int, default=2000)
    p.add_argument("--delays-ms", type=float, nargs="+", default=[0, 300, 1500])
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with STUDY.record() as rec, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        source, texts, corpus = harness.sample_corpus(a.corpus, a.documents, work)
        tokenizer = work / "tokenizer"
        train_tokenizer(texts, "bpe", 4000, tokenizer, model_max_length=128)
        shards = harness.make_shards(corpus, tokenizer, work / "shards", 128, workers=1, val_fraction=0.05)
        rows = [run_arm(work, shards, tokenizer, delay, a.steps) for delay in a.delays_ms]
        rec.table(f"configs/tiny.json on 1 rank, 1 loader worker, {a.steps} steps, {a.documents:,} documents of "
                  f"{Path(source).name}", rows)
        rise = rows[-1]["wait share (run)"] - rows[0]["wait share (run)"]
        rec.headline(f"wait share, {a.delays_ms[-1]:g} ms delay against none", f"{rows[0]['wait share (run)']} → "
                     f"{rows[-1]['wait share (run)']}", target="rises", met=rise > 0.2)


if __name__ == "__main__":
    main()
