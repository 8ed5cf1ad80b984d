"""The shard stage: corpus → tokenized, packed, zstd-compressed shards with an index written last.

One process reads raw records in a fixed order and hands batches to `--workers` processes, which
decode and tokenize them (`pipeline.data.shards.tokenize_worker`, through `pipeline.common.processes.ordered_pool`).
Results come back in input order and are packed and written by the reading process
(`pipeline.data.shards.writer`), so the bytes written never depend on the number of workers.
Memory stays flat: a bounded number of batches is in flight, and a shard is written as soon as it
is full.

Every document keeps its origin (input file and line, or record number) through tokenizing, the
split, dedup and packing; each shard's sequences' documents are written beside it
(`pipeline.data.shards.origins`).

Restartable (the datatrove executor's pattern): after every batch that completed a shard, a
resume snapshot (`pipeline.data.shards.resume_snapshot`) records the input position and the packers' and
writers' state. A rerun with the same arguments checks the shards already written against their
checksums and carries on from the snapshot; the result is byte-identical to an uninterrupted run.
What may be written where is `pipeline.data.shards.output_folder`'s policy.

Distributed: each of `world_size` ranks reads only its own piece of the corpus
(`pipeline.data.input_pieces`: whole files, byte ranges or parquet row groups) and writes its own
part; the last one to finish combines all parts into `index.json`.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.errors import PipelineError
from pipeline.common.processes.ordered_pool import ordered_map
from pipeline.data.corpus import RecordBatch, Source, check_sources, resolve_inputs
from pipeline.data.input_pieces import InputPiece, assign_inputs, iter_piece_batches
from pipeline.data.packers import Packer, PackStats, make_packer, token_dtype
from pipeline.data.record_reader import ByteCounter
from pipeline.data.shards.exact_dedup import all_hashes, drop_mask, hashes_path, load_hashes, save_hashes
from pipeline.data.shards.index import SKIP_REASONS, SPLITS, combine_parts, part_name, part_summary_path, resume_path
from pipeline.data.shards.options import ShardOptions
from pipeline.data.shards.origins import origin_name
from pipeline.data.shards.output_folder import completed_part, prepare_output
from pipeline.data.shards.resume_snapshot import restore_snapshot, save_snapshot
from pipeline.data.shards.stage_report import Progress, log
from pipeline.data.shards.tokenize_worker import MAX_EXAMPLES, WorkerSettings, hash_batch, init_worker, tokenize_batch
from pipeline.data.shards.writer import ShardWriter
from pipeline.data.tokenizer import TokenizerInfo, describe_tokenizer, load_tokenizer


def run_shard_stage(options: ShardOptions) -> dict:
    """Run the stage for one rank; returns the combined index when it was written, else this part's summary."""
    sources, tokenizer, identity, out, settings = _start(options)
    corpus, rank = options.corpus_options(), options.rank
    done = completed_part(out, rank, identity)
    if done is not None:
        log(options.quiet, f"{part_name(rank)} is already complete and its shards verify; nothing to do")
        return combine_parts(out, options.world_size) or done

    dtype = token_dtype(tokenizer.vocab_size)
    packers = {split: make_packer(options.pack, options.seq_len, tokenizer.cls_id, tokenizer.sep_id,
                                  tokenizer.pad_id, dtype, seed=options.seed + i)
               for i, split in enumerate(SPLITS)}
    meta = {"seq_len": options.seq_len, "pack": options.pack, "tokenizer_fingerprint": tokenizer.fingerprint}
    writers = {split: ShardWriter(out, split, rank, options.shard_size, meta, options.compression_level)
               for split in SPLITS}
    state = restore_snapshot(out, rank, identity, packers, writers, lambda message: log(options.quiet, message))

    pieces = assign_inputs(sources, rank, options.world_size)
    drop = None
    if options.dedup == "exact":
        def hash_rank(r: int) -> np.ndarray:
            return _hash_records(options, sources, settings, r)

        drop = drop_mask(all_hashes(out, options.world_size, rank, options.reading_key(), hash_rank))
    bytes_read = ByteCounter()
    piece_lines: dict[InputPiece, int] = {}
    batches = _numbered_batches(iter_piece_batches(pieces, corpus, rank, options.world_size, bytes_read, piece_lines),
                                state.position, drop)
    started = time.monotonic()
    progress = Progress(not options.quiet, packers)
    try:
        for position, result in ordered_map(tokenize_batch, batches, options.workers, init_worker, (settings,)):
            if result.error:
                raise PipelineError(result.error)
            state.counts.update(result.counts)
            state.examples.extend(result.examples[: MAX_EXAMPLES - len(state.examples)])
            state.position = position + 1
            wrote = False
            for split, mask in (("train", ~result.is_val), ("val", result.is_val)):
                if mask.any():
                    ids, lengths, origins = _select_documents(result.ids, result.lengths, result.origins, mask)
                    wrote |= writers[split].add(packers[split].add(ids, lengths, origins))
            progress.update(result)
            if wrote:
                save_snapshot(out, rank, identity, state, packers, writers,
                              state.seconds + time.monotonic() - started)
    finally:
        progress.close()

    for split in SPLITS:
        writers[split].add(packers[split].finish())
        writers[split].close()
    stats = _part_stats(packers, state.counts, options.dedup == "exact")
    if stats["documents"] == 0 and options.world_size == 1:
        raise PipelineError("the corpus has no usable document: every record was empty or skipped"
                            + (f" (e.g. {state.examples[0]})" if state.examples else ""))
    summary = {
        "rank": rank, "world_size": options.world_size, "complete": True, "identity": identity,
        "dtype": dtype.name, "fields": list(packers["train"].fields),
        "tokenizer": {k: v for k, v in dataclasses.asdict(tokenizer).items() if k != "backend_json"},
        "shards": {split: writers[split].shards for split in SPLITS},
        "stats": stats, "examples": state.examples,
        "seconds": round(state.seconds + time.monotonic() - started, 3),
        "inputs": [{"path": p.source.path, "file": p.file, "kind": p.kind, "start": p.start, "stop": p.stop,
                    **({"lines": piece_lines[p]} if p.kind == "bytes" else {})} for p in pieces],
        "input_bytes_read": bytes_read.total,
        "origin_files": [origin_name(source.path, source.format) for source in sources],
    }
    write_json_atomic(part_summary_path(out, rank), summary)
    resume_path(out, rank).unlink(missing_ok=True)
    index = combine_parts(out, options.world_size)
    return index if index is not None else summary


def _numbered_batches(batches: Iterator[RecordBatch], start: int, drop: np.ndarray | None) -> Iterator[tuple]:
    """(index, tokenize_batch arguments) of the record batches from `start` on, with their slice of `drop`."""
    first = 0
    for i, b in enumerate(batches):
        n = len(b.lines)
        if i >= start:
            yield i, (b.source, b.format, b.lines, b.payloads, None if drop is None else drop[first: first + n],
                      b.file)
        first += n


def run_hash_pass(options: ShardOptions) -> Path:
    """The first pass of `--dedup exact` for this rank alone: hash its records (an array job's first step)."""
    if options.dedup != "exact":
        raise PipelineError("--dedup-hashes-only needs --dedup exact")
    sources, _, _, out, settings = _start(options)
    key = options.reading_key()
    if load_hashes(out, options.rank, key) is None:
        save_hashes(out, options.rank, key, _hash_records(options, sources, settings, options.rank))
    return hashes_path(out, options.rank)


def _start(options: ShardOptions) -> tuple[list[Source], TokenizerInfo, dict, Path, WorkerSettings]:
    """Check the options, inputs, tokenizer and output folder before any heavy work."""
    if problems := options.problems():
        raise PipelineError("invalid arguments:\n  " + "\n  ".join(problems))
    corpus = options.corpus_options()
    sources = resolve_inputs(list(options.inputs))
    check_sources(sources, corpus)
    tokenizer = describe_tokenizer(load_tokenizer(options.tokenizer), options.tokenizer)
    if tokenizer.vocab_size > np.iinfo(np.uint32).max:
        raise PipelineError(f"tokenizer {options.tokenizer}: vocabulary of {tokenizer.vocab_size} does not fit uint32")
    identity = options.identity(tokenizer)
    out = prepare_output(Path(options.out), identity, rank=options.rank, world_size=options.world_size,
                         overwrite=options.overwrite)
    settings = WorkerSettings(tokenizer.backend_json, corpus, options.val_fraction, options.strict)
    return sources, tokenizer, identity, out, settings


def _hash_records(options: ShardOptions, sources: list[Source], settings: WorkerSettings, rank: int) -> np.ndarray:
    """The normalised-text hash of every record that rank `rank` reads, in its order."""
    log(options.quiet, f"dedup: hashing the records of {part_name(rank)}")
    pieces = assign_inputs(sources, rank, options.world_size)
    batches = ((i, (b.source, b.format, b.lines, b.payloads)) for i, b in
               enumerate(iter_piece_batches(pieces, options.corpus_options(), rank, options.world_size)))
    hashes = [h for _, h in ordered_map(hash_batch, batches, options.workers, init_worker, (settings,))]
    return np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)


def _select_documents(ids: np.ndarray, lengths: np.ndarray, origins: np.ndarray,
                      keep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The documents where `keep` is True, still as flat ids plus lengths, and their origins."""
    if keep.all():
        return ids, lengths, origins
    doc_of_token = np.repeat(np.arange(len(lengths)), lengths)
    return ids[keep[doc_of_token]], lengths[keep], origins[keep]


def _part_stats(packers: dict[str, Packer], counts: Counter, dedup: bool) -> dict:
    total = PackStats()
    for packer in packers.values():
        total.merge(packer.stats)
    stats = dataclasses.asdict(total)
    stats["val_documents"] = packers["val"].stats.documents
    stats["skipped"] = {reason: counts.get(reason, 0) for reason in SKIP_REASONS}
    if dedup:
        stats["duplicates"] = {"documents": counts.get("duplicate_documents", 0),
                               "tokens": counts.get("duplicate_tokens", 0)}
    return stats
