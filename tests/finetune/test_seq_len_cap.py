"""Fine-tuning never asks a model for more tokens than its position embeddings hold: a `max_seq_len` above
that is capped, once, with a line saying so, and a QA stride that no longer fits is an error."""

from __future__ import annotations

import json
import random

import pytest
from helpers import WORDS
from model_folders import save_export


def finetune(*args) -> None:
    from pipeline.commands.finetune import main

    main([str(a) for a in args])


def long_rows(n: int, seed: int) -> list[dict]:
    """100-word texts (well over 64 tokens); the label says whether `river` is among the first ten words."""
    rng = random.Random(seed)
    others = [w for w in WORDS if w != "river"]
    rows = []
    for i in range(n):
        words = [rng.choice(others) for _ in range(100)]
        if i % 2:
            words[rng.randrange(10)] = "river"
        rows.append({"text": " ".join(words), "label": "yes" if i % 2 else "no"})
    return rows


def write_task(root, task: str, rows: dict[str, list[dict]], **data) -> tuple:
    files = {}
    for key, name in (("train_file", "train"), ("validation_file", "dev")):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[name]))
        files[key] = str(root / f"{name}.jsonl")
    config = {"task": task, "data": {**files, "text_fields": ["text"], "label_field": "label", **data},
              "train": {"output_dir": str(root / "ft"), "learning_rate": 1e-3, "batch_size": 8, "epochs": 1,
                        "eval_batch_size": 16},
              "tracking": {"enabled": False}}
    (root / "config.json").write_text(json.dumps(config))
    return root / "config.json", root / "ft"


@pytest.mark.parametrize("architecture", ["roberta", "bert", "modernbert"])
def test_a_longer_max_seq_len_is_capped_at_the_models_positions_and_said_once(tmp_path, bpe_tokenizer_dir,
                                                                              architecture, capsys):
    # The tiny export holds positions for 64 tokens (RoBERTa's table: 64 + pad id + 1 slots), as `--config tiny`
    # pretrained on 64-token shards does; the shipped custom config asks for 128.
    model = save_export(bpe_tokenizer_dir, tmp_path / "export", architecture)
    config, out = write_task(tmp_path, "custom", {"train": long_rows(16, 0), "dev": long_rows(8, 1)},
                             max_seq_len=128)
    finetune("--config", config, "--model", model, "--seeds", "1,2")
    said = [line for line in capsys.readouterr().out.splitlines() if "takes at most" in line]
    assert said == [f"data.max_seq_len 128: {model} takes at most 64 tokens (its position embeddings); "
                    "fine-tuning uses 64"]
    for seed in (1, 2):
        assert json.loads((out / f"seed_{seed}" / "model" / "pipeline_finetune.json").read_text())["max_seq_len"] == 64


def test_every_setting_of_a_sweep_is_capped_too_and_a_swept_length_says_so(tmp_path, bpe_tokenizer_dir, capsys):
    model = save_export(bpe_tokenizer_dir, tmp_path / "export")  # positions for 64 tokens
    config, out = write_task(tmp_path, "custom", {"train": long_rows(24, 0), "dev": long_rows(8, 1)}, max_seq_len=128)
    finetune("--config", config, "--model", model, "--seeds", "1", "--sweep", "data.max_seq_len=32,96",
             "--select-fraction", "0.25")
    said = [line for line in capsys.readouterr().out.splitlines() if "takes at most" in line]
    assert said == [f"data.max_seq_len {n}: {model} takes at most 64 tokens (its position embeddings); fine-tuning "
                    "uses 64" for n in (128, 96)]
    records = out.glob("selection/*/seed_1/complete.json")
    assert {json.loads(record.read_text())["recipe"]["data.max_seq_len"] for record in records} == {32, 64}
    chosen = int(json.loads((out / "metrics.json").read_text())["chosen_setting"]["data.max_seq_len"])
    saved = json.loads((out / "seed_1" / "model" / "pipeline_finetune.json").read_text())
    assert saved["max_seq_len"] == min(chosen, 64)


def test_a_max_seq_len_the_model_holds_is_kept_and_nothing_is_said(tmp_path, bpe_tokenizer_dir, capsys):
    model = save_export(bpe_tokenizer_dir, tmp_path / "export")
    config, out = write_task(tmp_path, "custom", {"train": long_rows(8, 0), "dev": long_rows(8, 1)}, max_seq_len=48)
    finetune("--config", config, "--model", model, "--seeds", "1")
    assert "takes at most" not in capsys.readouterr().out
    assert json.loads((out / "seed_1" / "model" / "pipeline_finetune.json").read_text())["max_seq_len"] == 48


def test_a_qa_stride_too_long_for_the_capped_windows_is_an_error(tmp_path, bpe_tokenizer_dir, capsys):
    model = save_export(bpe_tokenizer_dir, tmp_path / "export")
    context = " ".join(WORDS * 3)
    row = {"id": "q0", "question": "which word?", "context": context,
           "answers": {"text": ["river"], "answer_start": [context.index("river")]}}
    # doc_stride 40 fits 128-token windows (under 64), not the 64 tokens the model takes (under 32).
    config, _ = write_task(tmp_path, "qa-custom", {"train": [row], "dev": [row]}, max_seq_len=128, doc_stride=40)
    with pytest.raises(SystemExit):
        finetune("--config", config, "--model", model, "--seeds", "1")
    assert ("error: data.doc_stride: must be > 0 and under half of data.max_seq_len (64), got 40: data.max_seq_len "
            f"128 is capped to 64, the most tokens {model} takes") in capsys.readouterr().err
