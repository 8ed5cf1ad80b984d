"""The share of the steps' time spent waiting for data: near 0 while the loader keeps ahead, most of it once every
batch takes longer to make than a step to train, in every step log and in the run's summary."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON, ROOT

SLOWED_LOADER = """
import sys, time
from pipeline.pretrain.batches import stretch_data as batches
gather, delay = batches.MaskedBatches.__getitem__, float(sys.argv.pop(1))
def slowed(self, key):  # runs in the loader worker, forked after the patch
    time.sleep(delay)
    return gather(self, key)
batches.MaskedBatches.__getitem__ = slowed
from pipeline.commands.pretrain import main
main(sys.argv[1:])
"""


def wait_shares(tmp_path: Path, shards: Path, tokenizer: Path, delay_s: float) -> tuple[float, list[float]]:
    """(the run's summary share, each step log's share) of a short run whose loader worker sleeps `delay_s` a batch."""
    out = tmp_path / f"run-{delay_s:g}"
    sets = [f"data.shards={shards}", f"data.tokenizer={tokenizer}", "data.num_workers=1",
            f"data.cache_dir={tmp_path / 'cache'}", f"train.output_dir={out}", "train.max_steps=12",
            "train.global_batch_size=8", "train.micro_batch_size=8", "train.log_every=4", "train.export=false",
            "tracking.enabled=false", "checkpoint.every=12"]
    done = subprocess.run([PYTHON, "-c", SLOWED_LOADER, str(delay_s), "--config", "configs/tiny.json",
                           *(x for s in sets for x in ("--set", s))], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"}, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    summary = next(e["summary/data_wait_share"] for e in events if "summary/data_wait_share" in e)
    return summary, [e["train/data_wait_share"] for e in events if "train/data_wait_share" in e]


@pytest.mark.slow
def test_the_wait_share_rises_from_near_nothing_to_most_of_the_step_when_the_loader_is_slowed(
        tmp_path, roberta_shards, bpe_tokenizer_dir):
    kept_up, logged_fast = wait_shares(tmp_path, roberta_shards, bpe_tokenizer_dir, 0.0)
    starved, logged_slow = wait_shares(tmp_path, roberta_shards, bpe_tokenizer_dir, 0.5)
    assert len(logged_fast) == len(logged_slow) == 3  # every step log carries it
    assert kept_up < 0.5 < starved and starved - kept_up > 0.4, (kept_up, starved)
    assert logged_slow[-1] > 0.5 > logged_fast[-1], (logged_fast, logged_slow)
