"""Test helpers shared by every test folder: small corpora, script runner, a tiny pretraining config."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKOUT_RUNS = ROOT / "runs"
"""The user's own runs (the main job's `runs/default/`): no test reads or writes there (tests/conftest.py fails one)."""
PYTHON = sys.executable

WORDS = ("the a model token encoder shard packing corpus reader document sequence batch mask "
         "river mountain quietly seven orange language tensor gradient learning pretraining").split()


def make_documents(n: int, seed: int = 0, min_words: int = 5, max_words: int = 120) -> list[str]:
    """Deterministic pseudo-English documents; each starts with a unique marker `docN`."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))]
        docs.append(f"doc{i} " + " ".join(words) + ".")
    return docs


def write_records(path: Path, records: list[dict]) -> Path:
    """`records` as JSON lines at `path`."""
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({"id": i, field: d}) + "\n" for i, d in enumerate(docs)))
    return path


def run_script(script: str, *args: str, check: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a data_prep/ or launchers/ script as a user would, capturing its output."""
    proc = subprocess.run([PYTHON, str(ROOT / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def tiny_pretrain_config(shards: Path, tokenizer: Path, output_dir: Path, **sections) -> dict:
    """A config for a 2-layer encoder on the test shards; `sections` update whole sections' keys."""
    config = {
        "model": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128},
        "data": {"shards": str(shards), "tokenizer": str(tokenizer), "num_workers": 0},
        "optimizer": {"lr": 2e-3},
        "schedule": {"warmup_steps": 2},
        "train": {"output_dir": str(output_dir), "max_steps": 8, "global_batch_size": 16, "micro_batch_size": 4,
                  "eval_sequences": 32, "log_every": 1, "zero_stage": 0},
        "checkpoint": {"every": 4, "keep_last": 2},
        "tracking": {"enabled": False},
    }
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    return config


def probe_files(root: Path, documents: list[str]) -> dict[str, list[str]]:
    """Probe files in `root` made from `documents`: minimal pairs (word order reversed), a search file (first words
    → the rest) and an STS file, by the config key that takes each."""
    texts = [d for d in documents if len(d.split()) >= 12][:16]
    files = {"minimal_pairs": [{"sentence_good": " ".join(t.split()[:8]),
                                "sentence_bad": " ".join(reversed(t.split()[:8]))} for t in texts],
             "retrieval": [{"query": " ".join(t.split()[:4]), "positive": " ".join(t.split()[4:])} for t in texts],
             "sts": [{"sentence1": a, "sentence2": b, "score": float(i % 6)}
                     for i, (a, b) in enumerate(zip(texts, texts[1:] + texts[:1], strict=True))]}
    for kind, records in files.items():
        (root / f"{kind}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return {kind: [str(root / f"{kind}.jsonl")] for kind in files}


def record_at(step: int, **fields):
    """A checkpoint record of `step` with placeholder model facts, for tests of the checkpoint files."""
    from pipeline.pretrain.checkpoints.record import CheckpointRecord

    return CheckpointRecord(**{"step": step, "config": {}, "architecture": "roberta", "seq_len": 64, "zero_stage": 0,
                               "precision": "fp32", "batch_plan": None, **fields})


def plan_of(config, sequences: dict[str, int], world_size: int = 1, seq_len: int = 64):
    """The run plan of a config checked without files, each folder it names holding `sequences[path]` in one shard."""
    from pipeline.data.epoch_order import CorpusLayout
    from pipeline.pretrain.plan.run_plan import build_plan

    layouts = {path: CorpusLayout(Path(path).name, path, key, (n,), 1, seq_len)
               for key, (path, n) in enumerate(sequences.items())}
    return build_plan(config, world_size, layouts, None)


def predict_with_saved_model(folder: Path, texts: list[str], batch_size: int):
    """(model, class ids) from a saved fine-tuned folder alone, batched as the trainer's dev evaluation."""
    import numpy as np
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    max_len = json.loads((Path(folder) / "pipeline_finetune.json").read_text())["max_seq_len"]
    encoded = tokenizer(texts, truncation=True, max_length=max_len)
    collate = DataCollatorWithPadding(tokenizer)
    predictions = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            rows = [{k: v[i] for k, v in encoded.items()} for i in range(start, min(start + batch_size, len(texts)))]
            predictions.append(model(**collate(rows)).logits.argmax(-1).numpy())
    return model, np.concatenate(predictions)


def decode_documents(folder: Path, split: str, tokenizer_dir: Path) -> list[str]:
    """Texts of a doc-packed shard split, one per document (sequences never cross documents)."""
    from transformers import AutoTokenizer

    from pipeline.data.shards.reader import ShardedDataset

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    ds = ShardedDataset(folder, split)
    return [tok.decode(ds[i]["input_ids"][1: ds[i]["length"] - 1]) for i in range(len(ds))]


HOLD = ("import sys, time; from pipeline.common.folder_lock import FolderLock; FolderLock(sys.argv[1]).acquire(); "
        "print('held', flush=True); time.sleep(120)")


def holder_process(folder, **env) -> subprocess.Popen:
    """A live process holding `folder` (common/folder_lock.py), with `env` added to its environment."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **env})
    assert proc.stdout.readline().strip() == "held"
    return proc
