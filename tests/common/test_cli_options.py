"""Command lines generated from options dataclasses: every flag defined once, old flag names and defaults kept."""

from __future__ import annotations

import argparse
import importlib
import os
import re
from dataclasses import dataclass, field
from typing import Literal

import pytest
from helpers import ROOT, run_script

from pipeline.common.config.cli_options import add_options, cli_options, options_from_namespace
from pipeline.data.shards.options import ShardOptions
from pipeline.data.tokenizer_options import TokenizerOptions


@dataclass(frozen=True)
class Toy:
    """Every kind of field the generator supports."""

    paths: tuple[str, ...] = field(metadata={"flag": "--path"})
    """Input files."""
    size: int
    """Size in bytes."""
    mode: Literal["fast", "exact"] = "fast"
    """How to run."""
    ratio: float = 0.5
    """A fraction, 0 to 1."""
    name: str | None = None
    """An optional name."""
    limit: int | None = None
    """At most this many items (default: no limit)."""
    verbose: bool = False
    """Say more."""
    color: bool | None = None
    """Colour the output (default: when a terminal)."""
    tags: list[str] = field(default_factory=list)
    """Labels."""


def parse(cls, argv: list[str]):
    parser = argparse.ArgumentParser(prog="toy")
    add_options(parser, cls)
    return options_from_namespace(cls, parser.parse_args(argv), parser)


def script_parser(name: str, monkeypatch) -> argparse.ArgumentParser:
    monkeypatch.syspath_prepend(str(ROOT / "data_prep"))
    return importlib.import_module(name).build_parser()


def flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", parser.format_usage()))


def test_each_field_becomes_a_flag_of_its_type():
    toy = parse(Toy, ["--path", "a", "b", "--size", "3", "--mode", "exact", "--ratio", "0.25", "--name", "n",
                      "--limit", "7", "--verbose", "--no-color", "--tags", "x", "y"])
    assert toy == Toy(("a", "b"), 3, "exact", 0.25, "n", 7, True, False, ["x", "y"])
    assert parse(Toy, ["--path", "a", "--size", "3"]) == Toy(("a",), 3)


def test_options_round_trip_through_their_command_line_words():
    toy = Toy(("a", "b c"), 3, "exact", 0.25, "n", 7, True, True, ["x"])
    argv = [w for o in cli_options(Toy) for w in o.to_argv(getattr(toy, o.field))]
    assert parse(Toy, argv) == toy


def test_bad_values_and_missing_options_are_argparse_errors(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(Toy, ["--path", "a", "--size", "3", "--mode", "slow"])
    assert exit_.value.code == 2 and "invalid choice: 'slow'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse(Toy, ["--mode", "exact"])
    assert "the following arguments are required: --path, --size" in capsys.readouterr().err


def test_help_is_the_field_docstring_with_the_default():
    parser = argparse.ArgumentParser(prog="toy")
    add_options(parser, Toy)
    text = " ".join(parser.format_help().split())
    for fragment in ("--path PATH [PATH ...] Input files (required)", "--mode {fast,exact} How to run (default: fast)",
                     "--ratio RATIO A fraction, 0 to 1 (default: 0.5)", "--color, --no-color Colour the output",
                     "--limit LIMIT At most this many items (default: no limit)"):
        assert fragment in text, fragment


@pytest.mark.parametrize("cls", [ShardOptions, TokenizerOptions])
def test_every_stage_option_has_a_one_line_docstring(cls):
    undocumented = [o.field for o in cli_options(cls) if not o.help]
    assert undocumented == []


def test_shard_py_keeps_every_flag_name_and_default(monkeypatch):
    parser = script_parser("shard", monkeypatch)
    assert flags_of(parser) == {
        "--input", "--tokenizer", "--seq-len", "--out", "--pack", "--workers", "--val-fraction", "--shard-size",
        "--text-field", "--one-doc-per-line", "--max-doc-bytes", "--hf-config", "--hf-split", "--rank",
        "--world-size", "--seed", "--compression-level", "--overwrite", "--strict", "--combine", "--quiet",
        "--dedup", "--dedup-hashes-only"}
    a = parser.parse_args(["--input", "a.jsonl", "b.txt", "--tokenizer", "tok", "--seq-len", "32", "--out", "s"])
    options = options_from_namespace(ShardOptions, a, parser)
    assert options == ShardOptions(inputs=("a.jsonl", "b.txt"), tokenizer="tok", seq_len=32, out="s", pack="full",
                                   workers=os.cpu_count() or 1, val_fraction=0.05, shard_size=8192,
                                   text_field="text", one_doc_per_line=False, max_doc_bytes=10_000_000,
                                   hf_config=None, hf_split="train", rank=0, world_size=1, overwrite=False,
                                   strict=False, seed=0, compression_level=3, quiet=False, dedup="none")
    assert a.combine is False


def test_train_tokenizer_py_keeps_every_flag_name_and_default(monkeypatch):
    parser = script_parser("train_tokenizer", monkeypatch)
    assert flags_of(parser) == {"--input", "--type", "--vocab-size", "--out", "--min-frequency", "--lowercase",
                                "--no-lowercase", "--text-field", "--one-doc-per-line", "--max-documents",
                                "--model-max-length"}
    a = parser.parse_args(["--input", "c.jsonl", "--out", "tok", "--no-lowercase"])
    assert options_from_namespace(TokenizerOptions, a, parser) == TokenizerOptions(
        inputs=("c.jsonl",), out="tok", type="bpe", vocab_size=None, min_frequency=2, lowercase=False,
        text_field="text", one_doc_per_line=False, max_documents=None, model_max_length=512)


def test_shard_py_help_shows_the_validation_default_and_why():
    proc = run_script("data_prep/shard.py", "--help", check=True)
    text = " ".join(proc.stdout.split())
    assert "--val-fraction VAL_FRACTION Fraction of documents (0 to 1) held out whole for validation" in text
    assert "pretraining needs a validation split (default: 0.05)" in text
    assert "--pack {full,doc,doc-packed,pairs}" in text
