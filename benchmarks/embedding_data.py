"""The embedding benchmark's data (`embeddings.py`): the task files and the corpus stage's documents, every text cut to
what every neural arm reads, so BM25 and TF-IDF read exactly the text the models read.

- SQuAD v1.1 dev split by article: the even articles' questions train (their last tenth held out as the fine-tuning
  runs' dev file, the "held-out training questions"), one question per paragraph of the odd articles is searched
  against every one of their paragraphs (the reported file).
- STS-B train (a tenth held out as dev) → the reported STS-B dev; MRPC dev; BBC News.
- The corpus stage: a sample of the export's pretraining text (equal shares of each source, seeded) and SQuAD's
  paragraphs of every article with their article's title (a user's own search corpus, unlabelled), a seeded fraction
  of the documents held out as its validation file.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

import harness

PRETRAINING_TEXT = ("imdb-reviews.jsonl.zst", "wikitext2/valid.txt wikitext2/test.txt", "shakespeare")
"""The export's pretraining sources under ../shared/data/corpus (docs/embeddings.md's commands), one share each
(a space joins the files of one source)."""
MAX_SEQ_LEN = 128
"""Every arm reads at most 128 tokens: the export's positions. The task files are cut to what every neural arm's
tokenizer reads within them (`same_text`), so BM25 and TF-IDF read exactly the text the models read."""
CORPUS_SEED = 0
"""The seed of the corpus sample and of which documents its validation file holds."""


def read_squad() -> list[dict]:
    import zstandard

    path = harness.SHARED / "qa" / "squad_v1.1" / "dev-v1.1.json.zst"
    return json.loads(zstandard.ZstdDecompressor().stream_reader(path.open("rb")).read())["data"]


def spread(rows: list, n: int) -> list:
    return rows if len(rows) <= n else [rows[i * len(rows) // n] for i in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def tsv(path: Path) -> list[dict]:
    from pipeline.data.tasks.text_files import table_rows

    return [row for _, row, _ in table_rows(path)]


def same_text(tokenizers: list, max_len: int = MAX_SEQ_LEN) -> Callable[[str], str]:
    """A function cutting a text to its longest prefix of whole words that every tokenizer reads within `max_len`
    tokens (special tokens included): what a neural arm reads is then all of it, for BM25 too."""

    def fits(text: str) -> bool:
        return all(len(t(text, truncation=False)["input_ids"]) <= max_len for t in tokenizers)

    def cut(text: str) -> str:
        if fits(text):
            return text
        words = text.split()
        low, high = 0, len(words)  # words[:low] fits, words[:high] does not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(" ".join(words[:middle])) else (low, middle)
        return " ".join(words[:low])

    return cut


def squad_files(a: argparse.Namespace, folder: Path, cut, articles: list[dict]) -> dict[str, Path]:
    training, searched = articles[0::2], articles[1::2]
    held = max(1, len(training) // 10)
    train = [{"query": qa["question"], "positive": cut(p["context"])}
             for art in training[:-held] for p in art["paragraphs"] for qa in p["qas"]]
    dev = [{"query": p["qas"][0]["question"], "positive": cut(p["context"])} for art in training[-held:]
           for p in art["paragraphs"]]
    # One question per paragraph of the held-out articles is searched; the corpus is every one of their paragraphs.
    test = [{"query": p["qas"][0]["question"], "positive": cut(p["context"])} for art in searched
            for p in art["paragraphs"]]
    return {"squad-train": write_jsonl(folder / "squad-train.jsonl", spread(train, a.squad_train)),
            "squad-dev": write_jsonl(folder / "squad-dev.jsonl", spread(dev, a.squad_dev)),
            "squad": write_jsonl(folder / "squad.jsonl", spread(test, a.eval_rows or 1 << 30))}


def similarity_files(a: argparse.Namespace, folder: Path, cut) -> dict[str, Path]:
    glue = harness.SHARED / "glue"

    def scored(rows: list[dict]) -> list[dict]:
        return [{"sentence1": cut(r["sentence1"]), "sentence2": cut(r["sentence2"]), "score": float(r["score"])}
                for r in rows]

    sts_rows = scored(tsv(glue / "STS-B" / "train.tsv"))
    sts_held = spread(sts_rows, max(1, len(sts_rows) // 10))
    held_ids = {id(r) for r in sts_held}
    sts = [r for r in sts_rows if id(r) not in held_ids]
    mrpc = [{"sentence1": cut(r["#1 String"]), "sentence2": cut(r["#2 String"]), "label": int(r["Quality"])}
            for r in tsv(glue / "MRPC" / "dev.tsv")]
    bbc = [json.loads(line) for line in (harness.SHARED / "tasks" / "bbc_news.jsonl").read_text().splitlines()]
    cap = a.eval_rows or 1 << 30
    return {"stsb-train": write_jsonl(folder / "stsb-train.jsonl", spread(sts, a.stsb_train)),
            "stsb-dev": write_jsonl(folder / "stsb-dev.jsonl", sts_held),
            "stsb": write_jsonl(folder / "stsb.jsonl", spread(scored(tsv(glue / "STS-B" / "dev.tsv")), cap)),
            "mrpc": write_jsonl(folder / "mrpc.jsonl", spread(mrpc, cap)),
            "bbc": write_jsonl(folder / "bbc.jsonl", [{"text": cut(r["text"]), "label": r["category"]}
                                                      for r in spread(bbc, a.bbc)])}


def pretraining_sample(sources: list[list[str]], documents: int) -> list[dict]:
    """`documents` texts drawn (seeded) in equal shares from `sources` (each a list of files or folders read as
    the sharder reads them)."""
    from pipeline.data.corpus import CorpusOptions, iter_texts, resolve_inputs

    rng, share, drawn = random.Random(CORPUS_SEED), -(-documents // len(sources)), []
    for files in sources:
        texts = [t for t in iter_texts(resolve_inputs(files), CorpusOptions()) if len(t.split()) >= 16]
        drawn += [{"text": texts[i]} for i in sorted(rng.sample(range(len(texts)), min(share, len(texts))))]
    return drawn


def corpus_files(a: argparse.Namespace, folder: Path, cut, articles: list[dict]) -> dict[str, Path]:
    """The corpus stage's documents: the pretraining sample and every SQuAD paragraph (title: its article's), a
    seeded `a.corpus_held_out` of them held out as its validation file."""
    sources = [[f] for f in a.corpus] if a.corpus else [
        [str(harness.SHARED / "corpus" / f) for f in source.split()] for source in PRETRAINING_TEXT]
    documents = pretraining_sample(sources, a.corpus_docs)
    documents += [{"title": art["title"].replace("_", " "), "text": cut(p["context"])}
                  for art in articles for p in art["paragraphs"]]
    held = set(random.Random(CORPUS_SEED).sample(range(len(documents)),
                                                 max(1, round(a.corpus_held_out * len(documents)))))
    return {"corpus-train": write_jsonl(folder / "corpus-train.jsonl",
                                        [d for i, d in enumerate(documents) if i not in held]),
            "corpus-dev": write_jsonl(folder / "corpus-dev.jsonl", [d for i, d in enumerate(documents) if i in held])}


def make_data(a: argparse.Namespace, folder: Path, cut) -> dict[str, Path]:
    """Every file the benchmark reads, by name (`squad`, `squad-train`, `squad-dev`, `stsb…`, `mrpc`, `bbc`,
    `corpus-train`, `corpus-dev`); the fine-tuning runs' dev files are held out of their training data, never the
    reported files."""
    articles = read_squad()
    return {**squad_files(a, folder, cut, articles), **similarity_files(a, folder, cut),
            **corpus_files(a, folder, cut, articles)}
