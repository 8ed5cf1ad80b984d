"""The shard stage: corpus → tokenized, packed, zstd-compressed shards with an index written last.

One process reads raw records in a fixed order and hands batches to `--workers` processes, which
decode and tokenize them (`pipeline.data.tokenize_worker`). Results come back in input order and are
packed and written by the reading process, so the bytes written never depend on the number of
workers. Memory stays flat: a bounded number of batches is in flight, and a shard is written as
soon as it is full.

Restartable (the datatrove executor's pattern): after every batch that completed a shard, a
resume snapshot records the input position and the packers' and writers' state. A rerun with
the same arguments checks the shards already written against their checksums and carries on
from the snapshot; the result is byte-identical to an uninterrupted run.

Distributed: `rank`/`world_size` give every rank every `world_size`-th record batch; each rank
writes its own part, and the last one to finish combines all parts into `index.json`.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import sha256_bytes, write_atomic, write_json_atomic
from pipeline.common.errors import PipelineError
from pipeline.data.corpus import CorpusOptions, check_sources, iter_record_batches, resolve_inputs
from pipeline.data.packers import Packer, PackMode, PackStats, Sequences, make_packer, token_dtype
from pipeline.data.shard_format import FORMAT_VERSION, decode, encode
from pipeline.data.shard_index import (
    INDEX_NAME,
    SKIP_REASONS,
    SPLITS,
    check_shard,
    combine_parts,
    part_name,
    part_summary_path,
    read_json,
    resume_path,
)
from pipeline.data.tokenize_worker import MAX_EXAMPLES, TokenizedBatch, WorkerSettings, init_worker, tokenize_batch
from pipeline.data.tokenizer import TokenizerInfo, describe_tokenizer, load_tokenizer


@dataclass(frozen=True)
class ShardArgs:
    """Arguments of the shard stage (the flags of `data_prep/shard.py`)."""

    inputs: tuple[str, ...]
    tokenizer: str
    seq_len: int
    out: str
    pack: PackMode = "full"
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Tokenizer processes; does not change the output."""
    val_fraction: float = 0.0
    """Fraction of documents held out whole for validation, chosen by a hash of each document."""
    shard_size: int = 8192
    """Sequences per shard file."""
    text_field: str = "text"
    one_doc_per_line: bool = False
    max_doc_bytes: int = 10_000_000
    hf_config: str | None = None
    hf_split: str = "train"
    rank: int = 0
    world_size: int = 1
    overwrite: bool = False
    strict: bool = False
    seed: int = 0
    """Seed of the random choices in `pairs` mode."""
    compression_level: int = 3
    progress: bool = True

    def problems(self) -> list[str]:
        """Every invalid argument, so they can be reported together."""
        found = []
        if self.pack not in ("full", "doc", "doc-packed", "pairs"):
            found.append(f"--pack {self.pack!r}: expected full, doc, doc-packed or pairs")
        if self.seq_len < 8:
            found.append(f"--seq-len {self.seq_len}: must be at least 8")
        if not 0.0 <= self.val_fraction < 1.0:
            found.append(f"--val-fraction {self.val_fraction}: must be in [0, 1)")
        if self.shard_size < 1:
            found.append(f"--shard-size {self.shard_size}: must be at least 1 sequence")
        if self.workers < 1:
            found.append(f"--workers {self.workers}: must be at least 1")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            found.append(f"--rank {self.rank} --world-size {self.world_size}: need 0 <= rank < world size")
        if self.max_doc_bytes < 1:
            found.append(f"--max-doc-bytes {self.max_doc_bytes}: must be positive")
        if not 1 <= self.compression_level <= 22:
            found.append(f"--compression-level {self.compression_level}: zstd levels are 1 to 22")
        return found

    def corpus_options(self) -> CorpusOptions:
        return CorpusOptions(self.text_field, self.one_doc_per_line, self.max_doc_bytes,
                             self.hf_config, self.hf_split)

    def identity(self, tokenizer: TokenizerInfo) -> dict:
        """What determines the output: every argument but workers, rank, progress and overwrite."""
        skip = {"workers", "rank", "progress", "overwrite", "out"}
        values = {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}
        values["inputs"] = list(self.inputs)
        values["tokenizer_fingerprint"] = tokenizer.fingerprint
        values["format_version"] = FORMAT_VERSION
        return values


# ----------------------------------------------------------------------------- writing shards


class ShardWriter:
    """Collects sequences of one split and writes them in shards of exactly `shard_size` (the last may be short)."""

    def __init__(self, out: Path, split: str, rank: int, shard_size: int, meta: dict, level: int):
        self.out, self.split, self.rank = out, split, rank
        self.shard_size, self.meta, self.level = shard_size, meta, level
        self.pending: list[Sequences] = []
        self.pending_rows = 0
        self.shards: list[dict] = []

    def add(self, seqs: Sequences) -> bool:
        """Queue sequences; write every full shard. True if a shard was written."""
        n = len(seqs["input_ids"])
        if n:
            self.pending.append(seqs)
            self.pending_rows += n
        wrote = False
        while self.pending_rows >= self.shard_size:
            merged = self._take_all()
            self._write({k: v[: self.shard_size] for k, v in merged.items()})
            rest = {k: v[self.shard_size:] for k, v in merged.items()}
            if len(rest["input_ids"]):
                self.pending, self.pending_rows = [rest], len(rest["input_ids"])
            wrote = True
        return wrote

    def close(self) -> None:
        if self.pending_rows:
            self._write(self._take_all())

    def _take_all(self) -> Sequences:
        merged = {k: np.concatenate([p[k] for p in self.pending]) for k in self.pending[0]}
        self.pending, self.pending_rows = [], 0
        return merged

    def _write(self, seqs: Sequences) -> None:
        name = f"{self.split}/{part_name(self.rank)}-shard{len(self.shards):06d}.zst"
        data = encode(seqs, {**self.meta, "split": self.split}, self.level)
        write_atomic(self.out / name, data)
        tokens = int(seqs["length"].sum()) if "length" in seqs else seqs["input_ids"].size
        self.shards.append({"file": name, "sequences": len(seqs["input_ids"]), "tokens": tokens,
                            "bytes": len(data), "sha256": sha256_bytes(data)})

    def state(self) -> tuple[list[dict], dict[str, np.ndarray]]:
        pending = {k: np.concatenate([p[k] for p in self.pending]) for k in self.pending[0]} if self.pending else {}
        return self.shards, pending

    def load_state(self, shards: list[dict], pending: dict[str, np.ndarray]) -> None:
        self.shards = list(shards)
        self.pending = [dict(pending)] if pending and len(pending["input_ids"]) else []
        self.pending_rows = len(pending["input_ids"]) if self.pending else 0


# ----------------------------------------------------------------------------- the stage


@dataclass
class StageState:
    """Everything that changes while a part is written; what a resume snapshot restores."""

    position: int = 0
    """Index of the next record batch to read (counting every rank's batches)."""
    counts: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    seconds: float = 0.0


def run_shard_stage(args: ShardArgs) -> dict:
    """Run the stage for one rank; returns the combined index when it was written, else this part's summary."""
    if problems := args.problems():
        raise PipelineError("invalid arguments:\n  " + "\n  ".join(problems))
    options = args.corpus_options()
    sources = resolve_inputs(list(args.inputs))
    check_sources(sources, options)
    tokenizer = describe_tokenizer(load_tokenizer(args.tokenizer), args.tokenizer)
    if tokenizer.vocab_size > np.iinfo(np.uint32).max:
        raise PipelineError(f"tokenizer {args.tokenizer}: vocabulary of {tokenizer.vocab_size} does not fit uint32")
    identity = args.identity(tokenizer)
    out = _prepare_output(Path(args.out), args, identity)

    done = _completed_part(out, args.rank, identity)
    if done is not None:
        _log(args, f"{part_name(args.rank)} is already complete and its shards verify; nothing to do")
        return combine_parts(out, args.world_size) or done

    dtype = token_dtype(tokenizer.vocab_size)
    packers = {split: make_packer(args.pack, args.seq_len, tokenizer.cls_id, tokenizer.sep_id,
                                  tokenizer.pad_id, dtype, seed=args.seed + i)
               for i, split in enumerate(SPLITS)}
    meta = {"seq_len": args.seq_len, "pack": args.pack, "tokenizer_fingerprint": tokenizer.fingerprint}
    writers = {split: ShardWriter(out, split, args.rank, args.shard_size, meta, args.compression_level)
               for split in SPLITS}
    state = _resume(out, args, identity, packers, writers)

    settings = WorkerSettings(tokenizer.backend_json, options, args.val_fraction, args.strict)
    batches = ((i, (b.source, b.format, b.lines, b.payloads))
               for i, b in enumerate(iter_record_batches(sources, options))
               if i >= state.position and i % args.world_size == args.rank)
    started = time.monotonic()
    progress = _Progress(args.progress, state, packers)
    try:
        for position, result in ordered_map(tokenize_batch, batches, args.workers, init_worker, (settings,)):
            if result.error:
                raise PipelineError(result.error)
            state.counts.update(result.counts)
            state.examples.extend(result.examples[: MAX_EXAMPLES - len(state.examples)])
            state.position = position + 1
            wrote = False
            for split, mask in (("train", ~result.is_val), ("val", result.is_val)):
                if mask.any():
                    ids, lengths = _select_documents(result.ids, result.lengths, mask)
                    wrote |= writers[split].add(packers[split].add(ids, lengths))
            progress.update(result)
            if wrote:
                _save_snapshot(out, args.rank, identity, state, packers, writers,
                               state.seconds + time.monotonic() - started)
    finally:
        progress.close()

    for split in SPLITS:
        writers[split].add(packers[split].finish())
        writers[split].close()
    stats = _part_stats(packers, state.counts)
    if stats["documents"] == 0 and args.world_size == 1:
        raise PipelineError("the corpus has no usable document: every record was empty or skipped"
                            + (f" (e.g. {state.examples[0]})" if state.examples else ""))
    summary = {
        "rank": args.rank, "world_size": args.world_size, "complete": True, "identity": identity,
        "dtype": dtype.name, "fields": list(packers["train"].fields),
        "tokenizer": {k: v for k, v in dataclasses.asdict(tokenizer).items() if k != "backend_json"},
        "shards": {split: writers[split].shards for split in SPLITS},
        "stats": stats, "examples": state.examples,
        "seconds": round(state.seconds + time.monotonic() - started, 3),
    }
    write_json_atomic(part_summary_path(out, args.rank), summary)
    resume_path(out, args.rank).unlink(missing_ok=True)
    index = combine_parts(out, args.world_size)
    return index if index is not None else summary


def _select_documents(ids: np.ndarray, lengths: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The documents where `keep` is True, still as flat ids plus lengths."""
    if keep.all():
        return ids, lengths
    doc_of_token = np.repeat(np.arange(len(lengths)), lengths)
    return ids[keep[doc_of_token]], lengths[keep]


def _part_stats(packers: dict[str, Packer], counts: Counter) -> dict:
    total = PackStats()
    for packer in packers.values():
        total.merge(packer.stats)
    stats = dataclasses.asdict(total)
    stats["val_documents"] = packers["val"].stats.documents
    stats["skipped"] = {reason: counts.get(reason, 0) for reason in SKIP_REASONS}
    return stats


# ----------------------------------------------------------------------------- output folder


def _prepare_output(out: Path, args: ShardArgs, identity: dict) -> Path:
    """Create or check the output folder; refuse to mix runs with different arguments."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        for split in (*SPLITS, "parts"):
            (out / split).mkdir(exist_ok=True)
        probe = out / "parts" / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise PipelineError(f"output folder {out} cannot be written: {err.strerror or err}") from None

    previous = _previous_identity(out, args.rank)
    foreign = [p.name for p in out.iterdir() if p.name not in (*SPLITS, "parts", INDEX_NAME)]
    if previous is None and foreign and not args.overwrite:
        raise PipelineError(f"output folder {out} is not empty and holds no shard index "
                            f"({', '.join(sorted(foreign)[:3])} ...); choose another --out or pass --overwrite")
    if previous is not None and previous != identity:
        if not args.overwrite:
            changed = sorted(k for k in set(previous) | set(identity) if previous.get(k) != identity.get(k))
            raise PipelineError(
                f"output folder {out} holds shards made with different arguments (changed: "
                f"{', '.join(changed)}); pass --overwrite to replace them, or choose another --out")
    if args.overwrite and previous != identity:
        _remove_outputs(out, args.rank, args.world_size)
    return out


def _previous_identity(out: Path, rank: int) -> dict | None:
    """The arguments that made what is already in `out`, if anything."""
    if (out / INDEX_NAME).is_file():
        return read_json(out / INDEX_NAME).get("args")
    for path in (part_summary_path(out, rank), *sorted((out / "parts").glob("part*.json"))):
        if path.is_file():
            return read_json(path).get("identity")
    snapshot = resume_path(out, rank)
    if snapshot.is_file():
        try:
            return decode(snapshot.read_bytes(), str(snapshot))[1]["identity"]
        except Exception:
            return {"unreadable resume snapshot": str(snapshot)}
    return None


def _remove_outputs(out: Path, rank: int, world_size: int) -> None:
    """Delete this run's own files only (the whole shard set when world_size is 1), never foreign ones."""
    (out / INDEX_NAME).unlink(missing_ok=True)
    pattern = "*" if world_size == 1 else f"{part_name(rank)}*"
    for folder in (*SPLITS, "parts"):
        for path in (out / folder).glob(pattern):
            path.unlink()


def _completed_part(out: Path, rank: int, identity: dict) -> dict | None:
    path = part_summary_path(out, rank)
    if not path.is_file():
        return None
    summary = read_json(path)
    if summary.get("identity") != identity or not summary.get("complete"):
        return None
    for shards in summary["shards"].values():
        for shard in shards:
            if check_shard(out, shard, identity["seq_len"], summary["dtype"]) is not None:
                path.unlink()  # redo this part; until then no index may list its bad shard
                (out / INDEX_NAME).unlink(missing_ok=True)
                return None
    return summary


# ----------------------------------------------------------------------------- resume snapshots


def _save_snapshot(out, rank, identity, state: StageState, packers, writers, seconds: float) -> None:
    arrays: dict[str, np.ndarray] = {}
    meta: dict = {"identity": identity, "position": state.position, "counts": dict(state.counts),
                  "examples": state.examples, "seconds": seconds, "packers": {}, "shards": {}}
    for split in SPLITS:
        scalars, packer_arrays = packers[split].state()
        meta["packers"][split] = scalars
        arrays.update({f"{split}/packer/{k}": v for k, v in packer_arrays.items()})
        shards, pending = writers[split].state()
        meta["shards"][split] = shards
        arrays.update({f"{split}/pending/{k}": v for k, v in pending.items()})
    write_atomic(resume_path(out, rank), encode(arrays, meta, level=1))


def _resume(out: Path, args: ShardArgs, identity: dict, packers, writers) -> StageState:
    """Restore the newest snapshot if its shards verify; otherwise start this part afresh."""
    path = resume_path(out, args.rank)
    if not path.is_file():
        return StageState()
    try:
        arrays, meta = decode(path.read_bytes(), str(path))
    except Exception as err:
        _log(args, f"resume snapshot unreadable ({err}); starting {part_name(args.rank)} afresh")
        return StageState()
    if meta["identity"] != identity:
        return StageState()
    for split in SPLITS:
        for shard in meta["shards"][split]:
            if problem := check_shard(out, shard, args.seq_len, packers[split].dtype.name):
                _log(args, f"{problem}; starting {part_name(args.rank)} afresh")
                return StageState()
    for split in SPLITS:
        prefix = f"{split}/packer/"
        packers[split].load_state(meta["packers"][split],
                                  {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
        prefix = f"{split}/pending/"
        writers[split].load_state(meta["shards"][split],
                                  {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)})
    done = sum(len(meta["shards"][s]) for s in SPLITS)
    _log(args, f"resuming {part_name(args.rank)}: {done} shards verified, carrying on from record batch "
               f"{meta['position']}")
    return StageState(meta["position"], Counter(meta["counts"]), meta["examples"], meta["seconds"])


# ----------------------------------------------------------------------------- parallel map


def ordered_map(
    fn: Callable, items: Iterable[tuple[int, tuple]], workers: int, initializer: Callable, initargs: tuple,
    window_per_worker: int = 4,
) -> Iterator[tuple[int, TokenizedBatch]]:
    """Apply `fn` to (key, args) items in worker processes; yield (key, result) in input order.

    At most `window_per_worker * workers` items are in flight, so memory does not grow with the
    input (`Pool.imap` reads its whole input eagerly). With one worker everything runs in-process.
    """
    if workers <= 1:
        initializer(*initargs)
        for key, fn_args in items:
            yield key, fn(*fn_args)
        return
    # spawn, not fork: the parent may already hold tokenizer or torch threads.
    with mp.get_context("spawn").Pool(workers, initializer, initargs) as pool:
        pending: deque = deque()
        for key, fn_args in items:
            pending.append((key, pool.apply_async(fn, fn_args)))
            if len(pending) >= window_per_worker * workers:
                key0, result = pending.popleft()
                yield key0, result.get()
        while pending:
            key0, result = pending.popleft()
            yield key0, result.get()


# ----------------------------------------------------------------------------- reporting


def _log(args: ShardArgs, message: str) -> None:
    if args.progress:
        print(message, file=sys.stderr)


class _Progress:
    """A tqdm bar counting documents, with tokens/s alongside."""

    def __init__(self, enabled: bool, state: StageState, packers: dict[str, Packer]):
        self.bar = None
        self.packers = packers
        self.started = time.monotonic()
        self.tokens0 = self._tokens()
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(unit=" docs", desc="shard", dynamic_ncols=True, file=sys.stderr,
                            initial=sum(p.stats.documents for p in packers.values()))

    def _tokens(self) -> int:
        return sum(p.stats.document_tokens for p in self.packers.values())

    def update(self, result: TokenizedBatch) -> None:
        if self.bar is not None:
            rate = (self._tokens() - self.tokens0) / max(time.monotonic() - self.started, 1e-9)
            self.bar.set_postfix_str(f"{rate / 1e6:.2f}M tok/s", refresh=False)
            self.bar.update(len(result.lengths))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def format_summary(result: dict) -> str:
    """A short human summary of an index (or of one part's summary)."""
    stats = result.get("totals") or result.get("stats", {})
    seconds = sum(p["seconds"] for p in result.get("parts", [result]))
    per_split = {split: sum(s["sequences"] for s in shards) for split, shards in result["shards"].items()} \
        if "shards" in result else {split: entry["sequences"] for split, entry in result["splits"].items()}
    lines = [
        f"documents        {stats.get('documents', 0):>14,}  ({stats.get('val_documents', 0):,} in validation)",
        f"document tokens  {stats.get('document_tokens', 0):>14,}",
        f"sequences        {stats.get('sequences', 0):>14,}  ("
        + ", ".join(f"{split} {n:,}" for split, n in per_split.items()) + ")",
        f"padding          {stats.get('padding_tokens', 0):>14,}  "
        f"({stats.get('padding_fraction', 0.0) * 100 if 'padding_fraction' in stats else 0:.2f}% of slots)",
        f"dropped tokens   {stats.get('dropped_tokens', 0):>14,}  (final partial sequence / leftovers)",
        "skipped records  " + ", ".join(f"{k}={v}" for k, v in stats.get("skipped", {}).items()),
        f"time             {seconds:>14.1f} s  "
        f"({stats.get('document_tokens', 0) / max(seconds, 1e-9) / 1e6:.2f}M tokens/s)",
    ]
    return "\n".join(lines)
