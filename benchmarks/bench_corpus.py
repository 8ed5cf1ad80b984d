"""The benchmarks' shared corpus sample: the first N documents of a corpus, as a JSONL file and a list."""

from __future__ import annotations

import json
from pathlib import Path


def sample_corpus(source: str | None, documents: int, folder: Path) -> tuple[str, list[str], Path]:
    """(source used, texts, `folder/corpus.jsonl`): the first `documents` texts of `source`.

    With no `source`, the embedded default corpus (Python's documentation) is written and used.
    """
    from pipeline.data.corpus import CorpusOptions, iter_texts, resolve_inputs
    from pipeline.data.default_corpus import write_embedded_corpus

    if source is None:
        source = str(folder / "embedded.jsonl")
        write_embedded_corpus(Path(source))
    texts = []
    for text in iter_texts(resolve_inputs([source]), CorpusOptions()):
        texts.append(text)
        if len(texts) >= documents:
            break
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return source, texts, corpus


def bench_tokenizer(corpus: str | Path, out: Path, vocab_size: int = 16_000, documents: int = 20_000) -> Path:
    """A byte-level BPE trained by `data_prep/train_tokenizer.py` on the first `documents` of `corpus`."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "data_prep/train_tokenizer.py", "--input", str(corpus), "--vocab-size",
                    str(vocab_size), "--max-documents", str(documents), "--out", str(out)], cwd=root, check=True,
                   capture_output=True)
    return out
