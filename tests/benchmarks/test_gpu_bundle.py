"""benchmarks/gpu_bundle.py: what a lease carries is cut to what the GPU check reads, within the carry limit."""

from __future__ import annotations

import json
import sys

import zstandard
from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

import gpu_bundle  # noqa: E402


def test_the_first_reviews_are_kept_whole_and_in_order(tmp_path):
    lines = [json.dumps({"id": i, "text": f"review {i} " + "word " * (i * 50)}) for i in range(40)]
    source = tmp_path / "all.jsonl.zst"
    source.write_bytes(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
    kept = gpu_bundle.first_reviews(source, tmp_path / "cut" / "imdb.jsonl.zst", 25)
    text = zstandard.ZstdDecompressor().stream_reader((tmp_path / "cut" / "imdb.jsonl.zst").read_bytes()).read()
    assert kept == 25 and text.decode().splitlines() == lines[:25]
    assert gpu_bundle.first_reviews(source, tmp_path / "all-of-it.jsonl.zst", 1000) == 40  # fewer than asked


def test_the_tree_that_travels_is_measured_without_ignored_files():
    assert 0.5 < gpu_bundle.tree_mib() < gpu_bundle.CARRY_LIMIT_MIB / 4  # the checkout alone: a few MiB
