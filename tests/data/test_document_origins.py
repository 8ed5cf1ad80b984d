"""Document origins: every sequence names the file and line of each document it holds, in every packing mode,
for every input format, on several ranks and across a resume; damage is named; old shards still work."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import WORDS

from pipeline.common.errors import PipelineError
from pipeline.data.packers import PACKERS
from pipeline.data.shards import stage as shard_stage
from pipeline.data.shards.index import INDEX_NAME, load_index, verify_folder
from pipeline.data.shards.options import ShardOptions
from pipeline.data.shards.origins import DocumentOrigin, OriginReader
from pipeline.data.shards.reader import ShardedDataset
from pipeline.data.shards.stage import run_shard_stage
from pipeline.data.token_cache import TokenCache

SPLITS = ("train", "val")


def shard(inputs, tokenizer, out, **overrides) -> dict:
    settings = dict(inputs=tuple(map(str, inputs)), tokenizer=str(tokenizer), seq_len=32, out=str(out), workers=1,
                    shard_size=20, val_fraction=0.2, quiet=True)
    settings.update(overrides)
    return run_shard_stage(ShardOptions(**settings))


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def write_jsonl_corpus(path: Path, n: int, seed: int = 0) -> Path:
    """Line k holds a document that says "line k"; some lines are blank, malformed or repeat an earlier text."""
    rng = random.Random(seed)
    lines, texts = [], []
    for k in range(1, n + 1):
        if k % 17 == 0:
            lines.append("" if k % 34 else "{not json")
        elif k % 23 == 0:
            lines.append(json.dumps({"text": texts[-5]}))  # a repeat: dropped by --dedup exact
        else:
            texts.append(f"line {k} " + words(rng, rng.randint(4, 60)))
            lines.append(json.dumps({"text": texts[-1]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_txt_corpus(path: Path, n: int, seed: int = 1) -> Path:
    """Blank-line-separated documents, some over several lines, each saying the line it starts on."""
    rng = random.Random(seed)
    lines: list[str] = []
    for _ in range(n):
        first = len(lines) + 1
        lines += [f"line {first} " + words(rng, rng.randint(3, 30))] + [words(rng, 8) for _ in range(rng.randint(0, 2))]
        lines += [""] * rng.randint(1, 2)
    path.write_text("\n".join(lines) + "\n")
    return path


def write_parquet_corpus(path: Path, n: int, seed: int = 2) -> Path:
    rng = random.Random(seed)
    pq.write_table(pa.table({"text": [f"line {k} " + words(rng, rng.randint(4, 50)) for k in range(1, n + 1)]}),
                   path, row_group_size=max(1, n // 4))
    return path


def record_text(origin: DocumentOrigin) -> str:
    """The text of the record an origin names, read straight from its file."""
    path = Path(origin.file)
    if path.suffix == ".parquet":
        return pq.read_table(path)["text"][origin.line - 1].as_py()
    lines = path.read_text().split("\n")
    if path.suffix == ".jsonl":
        return json.loads(lines[origin.line - 1])["text"]
    end = origin.line - 1
    while end < len(lines) and lines[end].strip():
        end += 1
    return "\n".join(lines[origin.line - 1: end])


def row_pieces(row: dict[str, np.ndarray], pack: str, sep: int) -> list[np.ndarray]:
    """The runs of document tokens of one row, in order: one per document it holds."""
    ids = row["input_ids"]
    if pack == "full":
        body = ids[1:-1]
        runs = (run[run != sep] for run in np.split(body, np.flatnonzero(body == sep)))
        return [run for run in runs if len(run)]
    if pack == "doc":
        return [ids[1: row["length"] - 1]]
    if pack == "doc-packed":
        bounds = [int(s) for s in row["doc_starts"] if s >= 0] + [int(row["length"])]
        return [ids[a + 1: b - 1] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    b, n = int(row["segment_b_start"]), int(row["length"])
    a_part, b_part = ids[1: b - 1], ids[b: n - 1]
    return [np.concatenate([a_part, b_part])] if row["nsp_label"] == 0 else [a_part, b_part]


def contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i: i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def check_origins(folder: Path, tokenizer_dir: Path) -> set[DocumentOrigin]:
    """Each row's origins against the text: one per run of document tokens, each run a slice of the tokens of the
    record its origin names, and that record says it sits at that line. Returns every origin seen."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tok.encode_special_tokens = True
    sep = tok.token_to_id("</s>")
    tokens: dict[DocumentOrigin, list[int]] = {}
    seen = set()
    for split in SPLITS:
        ds, reader = ShardedDataset(folder, split), OriginReader(folder, split)
        assert reader.available
        for i, documents in enumerate(reader.documents(range(len(ds)))):
            pieces = row_pieces(ds[i], ds.pack, sep)
            assert len(pieces) == len(documents), (split, i, documents)
            for piece, origin in zip(pieces, documents, strict=True):
                if origin not in tokens:
                    text = record_text(origin)
                    assert text.startswith(f"line {origin.line} "), (origin, text[:40])
                    tokens[origin] = tok.encode(text, add_special_tokens=False).ids
                assert contains(tokens[origin], piece.tolist()), (split, i, origin)
                seen.add(origin)
    return seen


def expected_jsonl_origins(path: Path) -> set[DocumentOrigin]:
    """The documents the stage keeps: readable, non-empty, and not a repeat of an earlier text."""
    kept, texts = set(), set()
    for k, line in enumerate(path.read_text().split("\n")[:-1], start=1):
        try:
            text = json.loads(line)["text"]
        except ValueError:
            continue
        if text not in texts:
            kept.add(DocumentOrigin(str(path), k))
            texts.add(text)
    return kept


def test_a_relative_input_is_named_by_its_absolute_path_so_a_trace_opens_it_from_anywhere(
        tmp_path, bpe_tokenizer_dir, monkeypatch):
    (tmp_path / "corpora").mkdir()
    write_jsonl_corpus(tmp_path / "corpora" / "c.jsonl", 60)
    monkeypatch.chdir(tmp_path / "corpora")
    index = shard(["c.jsonl"], bpe_tokenizer_dir, tmp_path / "s")
    assert index["origins"]["files"] == [str(tmp_path / "corpora" / "c.jsonl")]
    monkeypatch.chdir(tmp_path)
    origin = OriginReader(tmp_path / "s", "train").documents([0])[0][0]
    assert Path(origin.file).read_text().splitlines()[origin.line - 1]  # opens from another folder


@pytest.mark.parametrize("pack", list(PACKERS))
def test_every_sequence_names_the_file_and_line_of_each_document_it_holds(tmp_path, bpe_tokenizer_dir, pack):
    corpus = write_jsonl_corpus(tmp_path / "c.jsonl", 240)
    index = shard([corpus], bpe_tokenizer_dir, tmp_path / "s", pack=pack, dedup="exact")
    assert index["totals"]["duplicates"]["documents"] > 0 and index["totals"]["skipped"]["bad_record"] > 0
    assert index["origins"]["files"] == [str(corpus)]
    seen = check_origins(tmp_path / "s", bpe_tokenizer_dir)
    expected = expected_jsonl_origins(corpus)
    assert seen <= expected
    # Only FULL-SENTENCES drops text: the final partial sequence of each split.
    assert len(expected - seen) <= (6 if pack == "full" else 0)
    assert verify_folder(tmp_path / "s") == []


def test_txt_and_parquet_inputs_name_their_own_files_lines_and_rows(tmp_path, bpe_tokenizer_dir):
    inputs = tmp_path / "in"
    inputs.mkdir()
    txt = write_txt_corpus(inputs / "a.txt", 80)
    table = write_parquet_corpus(inputs / "b.parquet", 90)
    lines = inputs / "c.txt"
    lines.write_text("\n".join(f"line {k} " + words(random.Random(k), 12) for k in range(1, 71)) + "\n")
    shard([txt, table], bpe_tokenizer_dir, tmp_path / "s")
    seen = check_origins(tmp_path / "s", bpe_tokenizer_dir)
    assert {o.file for o in seen} == {str(txt), str(table)}
    assert {o.line for o in seen if o.file == str(table)} >= set(range(1, 80))
    assert max(o.line for o in seen if o.file == str(txt)) > 80  # lines, not document numbers
    shard([lines], bpe_tokenizer_dir, tmp_path / "lines", pack="doc", one_doc_per_line=True)
    assert {o.line for o in check_origins(tmp_path / "lines", bpe_tokenizer_dir)} == set(range(1, 71))


@pytest.mark.parametrize("kind", ["jsonl", "txt", "parquet"])
def test_ranks_reading_pieces_of_one_file_give_the_files_own_lines(tmp_path, bpe_tokenizer_dir, kind):
    make = {"jsonl": lambda p: write_jsonl_corpus(p, 300), "txt": lambda p: write_txt_corpus(p, 150),
            "parquet": lambda p: write_parquet_corpus(p, 200)}[kind]
    corpus = make(tmp_path / f"c.{kind}")
    settings = dict(pack="doc-packed", dedup="exact")
    whole = shard([corpus], bpe_tokenizer_dir, tmp_path / "one", **settings)
    for rank in (1, 2, 0):
        index = shard([corpus], bpe_tokenizer_dir, tmp_path / "three", rank=rank, world_size=3, **settings)
    pieces = [piece for part in sorted((tmp_path / "three" / "parts").glob("part*.json"))
              for piece in json.loads(part.read_text())["inputs"]]
    assert {p["kind"] for p in pieces} == {"bytes" if kind != "parquet" else "row_groups"}
    if kind != "parquet":  # ranks 1 and 2 count from their byte range's first line; the index carries on
        assert [len(offsets) for offsets in index["origins"]["line_offsets"]] == [0, 1, 1]
    assert check_origins(tmp_path / "three", bpe_tokenizer_dir) == check_origins(tmp_path / "one", bpe_tokenizer_dir)
    assert index["totals"]["documents"] == whole["totals"]["documents"]


class Interrupted(Exception):
    pass


@pytest.mark.parametrize("pack", list(PACKERS))
def test_a_resumed_stage_writes_the_same_origins_as_an_uninterrupted_one(tmp_path, bpe_tokenizer_dir, monkeypatch,
                                                                        pack):
    corpus = write_jsonl_corpus(tmp_path / "c.jsonl", 1500)
    settings = dict(pack=pack, shard_size=8)
    shard([corpus], bpe_tokenizer_dir, tmp_path / "whole", **settings)
    save = shard_stage.save_snapshot
    saved = []

    def save_then_stop(*args, **kwargs):
        save(*args, **kwargs)
        saved.append(1)
        if len(saved) == 2:  # killed mid-corpus: packers hold open rows, the pool, a carry
            raise Interrupted

    monkeypatch.setattr(shard_stage, "save_snapshot", save_then_stop)
    with pytest.raises(Interrupted):
        shard([corpus], bpe_tokenizer_dir, tmp_path / "resumed", **settings)
    monkeypatch.setattr(shard_stage, "save_snapshot", save)
    assert not (tmp_path / "resumed" / INDEX_NAME).exists()
    shard([corpus], bpe_tokenizer_dir, tmp_path / "resumed", **settings)
    whole, resumed = ([p for p in sorted((tmp_path / run).rglob("*.zst")) if "parts" not in p.parts]
                      for run in ("whole", "resumed"))
    assert [p.name for p in whole] == [p.name for p in resumed]
    assert sum(p.name.endswith(".origins.zst") for p in whole) > 4
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(whole, resumed, strict=True))
    assert load_index(tmp_path / "whole")["splits"] == load_index(tmp_path / "resumed")["splits"]


def test_a_resume_snapshot_made_before_origins_is_not_resumed_but_started_afresh(tmp_path, bpe_tokenizer_dir,
                                                                               monkeypatch):
    from pipeline.data.shards.format import decode, encode
    from pipeline.data.shards.index import resume_path

    corpus = write_jsonl_corpus(tmp_path / "c.jsonl", 1500)
    shard([corpus], bpe_tokenizer_dir, tmp_path / "whole", shard_size=8)
    save = shard_stage.save_snapshot

    def save_then_stop(*args, **kwargs):
        save(*args, **kwargs)
        raise Interrupted

    monkeypatch.setattr(shard_stage, "save_snapshot", save_then_stop)
    with pytest.raises(Interrupted):
        shard([corpus], bpe_tokenizer_dir, tmp_path / "old", shard_size=8)
    monkeypatch.setattr(shard_stage, "save_snapshot", save)
    snapshot = resume_path(tmp_path / "old", 0)
    arrays, meta = decode(snapshot.read_bytes())
    del meta["origins"]  # as the stage wrote it before origins: no origin state in its packers either
    snapshot.write_bytes(encode({k: v for k, v in arrays.items() if "keys" not in k and "spans" not in k}, meta))
    shard([corpus], bpe_tokenizer_dir, tmp_path / "old", shard_size=8)
    assert {p.name: p.read_bytes() for p in (tmp_path / "old").rglob("*.origins.zst")} == \
        {p.name: p.read_bytes() for p in (tmp_path / "whole").rglob("*.origins.zst")}


def test_a_damaged_origins_file_is_named_and_the_other_shards_still_answer(tmp_path, bpe_tokenizer_dir):
    out = tmp_path / "s"
    index = shard([write_jsonl_corpus(tmp_path / "c.jsonl", 300)], bpe_tokenizer_dir, out)
    entries = index["splits"]["train"]["shards"]
    victim = out / entries[1]["origins"]["file"]
    reader = OriginReader(out, "train")
    second = entries[0]["sequences"]
    first_shard = reader.documents(range(second))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(PipelineError, match=f"origins file .*{victim.name} is corrupt"):
        reader.documents([second])
    assert reader.documents(range(second)) == first_shard  # only the shards the rows are in are read
    problems = verify_folder(out)
    assert len(problems) == 1 and victim.name in problems[0] and "sha256" in problems[0]
    victim.write_bytes(bytes(data[: len(data) // 2]))
    assert "truncated" in verify_folder(out)[0]
    victim.unlink()
    with pytest.raises(PipelineError, match=f"origins file .*{victim.name}: cannot read"):
        reader.documents([second])


def test_an_index_whose_origins_leave_the_folder_or_name_no_part_is_refused(tmp_path, roberta_shards):
    folder = tmp_path / "s"
    shutil.copytree(roberta_shards, folder)
    index = json.loads((folder / INDEX_NAME).read_text())
    entry = index["splits"]["train"]["shards"][0]["origins"]
    for change, message in [({"file": "../outside.origins.zst"}, "origins.file .*inside the folder"),
                            ({"part": 3}, "holds 1 parts, a shard's origins name part 3")]:
        (folder / INDEX_NAME).write_text(json.dumps(index | {"splits": {
            **index["splits"], "train": {**index["splits"]["train"], "shards": [
                {**index["splits"]["train"]["shards"][0], "origins": entry | change},
                *index["splits"]["train"]["shards"][1:]]}}}))
        with pytest.raises(PipelineError, match=message):
            OriginReader(folder, "train")


def strip_origins(folder: Path) -> None:
    """Make `folder` look as shards made before origins existed: no origins in index.json, no origins files."""
    index = json.loads((folder / INDEX_NAME).read_text())
    del index["origins"]
    for split in SPLITS:
        for entry in index["splits"][split]["shards"]:
            (folder / entry.pop("origins")["file"]).unlink()
    (folder / INDEX_NAME).write_text(json.dumps(index))


def test_shards_made_before_origins_still_verify_read_and_load_and_say_they_have_none(
        tmp_path, roberta_shards, bpe_tokenizer_dir):
    from helpers import tiny_pretrain_config

    from pipeline.pretrain.preflight import load_pretrain_config

    old = tmp_path / "old"
    shutil.copytree(roberta_shards, old)
    strip_origins(old)
    assert not list(old.rglob("*.origins.zst"))
    assert verify_folder(old) == []
    cache = TokenCache(old, "train", tmp_path / "cache")
    rows = np.array([3, 120, 7])
    reference = ShardedDataset(old)
    assert np.array_equal(cache.fields["input_ids"][rows], np.stack([reference[i]["input_ids"] for i in rows]))
    reader = OriginReader(old, "train")
    assert not reader.available
    with pytest.raises(PipelineError, match="made before the shard stage recorded document origins"):
        reader.documents([0])
    config = tmp_path / "pretrain.json"
    config.write_text(json.dumps(tiny_pretrain_config(old, bpe_tokenizer_dir, tmp_path / "run")))
    load_pretrain_config(config, check_files=True)


def test_a_part_made_before_origins_combines_into_a_folder_without_them(tmp_path, bpe_tokenizer_dir):
    corpus = write_jsonl_corpus(tmp_path / "c.jsonl", 300)
    out = tmp_path / "s"
    shard([corpus], bpe_tokenizer_dir, out, rank=1, world_size=2)
    summary_path = out / "parts" / "part00001.json"
    summary = json.loads(summary_path.read_text())
    del summary["origin_files"]  # as the stage wrote a part before origins existed
    for split in SPLITS:
        for entry in summary["shards"][split]:
            (out / entry.pop("origins")["file"]).unlink()
    summary_path.write_text(json.dumps(summary))
    index = shard([corpus], bpe_tokenizer_dir, out, rank=0, world_size=2)
    assert "origins" not in index and not OriginReader(out, "train").available
    assert verify_folder(out) == []


def test_an_unlisted_origins_file_is_reported(tmp_path, roberta_shards):
    folder = tmp_path / "s"
    shutil.copytree(roberta_shards, folder)
    (folder / "train" / "stray.origins.zst").write_bytes(b"x")
    assert verify_folder(folder) == [f"{folder / 'train' / 'stray.origins.zst'}: origins file not listed in "
                                     f"{INDEX_NAME}"]
