"""Two custom tasks fine-tuned from one export into one MLflow store keep their own columns in the comparison
table: each is named by its config's `name` (or `--set name=...`), not both `custom`."""

from __future__ import annotations

import json
import random

from helpers import WORDS
from model_folders import save_export


def rows(n: int, seed: int, word: str) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(6)]
        out.append({"text": " ".join(words + ([word] if i % 2 else [])), "label": "yes" if i % 2 else "no"})
    return out


def test_two_custom_tasks_have_their_own_tags_run_names_and_table_columns(tmp_path, bpe_tokenizer_dir, capsys):
    from mlflow.tracking import MlflowClient

    from pipeline.commands.compare import main as compare
    from pipeline.commands.finetune import main as finetune

    model = save_export(bpe_tokenizer_dir, tmp_path / "export")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for task, word in (("keywords", "river"), ("word-order", "seven")):
        folder = tmp_path / task
        folder.mkdir()
        for split, n, seed in (("train", 16, 0), ("dev", 8, 1)):
            (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(n, seed, word)))
        config = {"task": "custom", "name": task,
                  "data": {"train_file": str(folder / "train.jsonl"), "validation_file": str(folder / "dev.jsonl"),
                           "text_fields": ["text"], "label_field": "label", "max_seq_len": 32},
                  "train": {"output_dir": str(folder / "ft"), "batch_size": 8, "epochs": 1},
                  "tracking": {"enabled": True, "uri": uri, "experiment": "two-tasks"}}
        (folder / "config.json").write_text(json.dumps(config))
        finetune(["--config", str(folder / "config.json"), "--model", str(model), "--seeds", "1"])

    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("two-tasks").experiment_id])
    assert sorted((r.data.tags["stage"], r.data.tags["task"], r.info.run_name) for r in runs) == [
        ("finetune", "keywords", "keywords-pretrained-seed1"),
        ("finetune", "word-order", "word-order-pretrained-seed1"),
        ("finetune-summary", "keywords", "keywords-pretrained"),
        ("finetune-summary", "word-order", "word-order-pretrained")]
    capsys.readouterr()
    compare(["--uri", uri, "--experiment", "two-tasks", "--out", str(tmp_path / "plots")])
    header = capsys.readouterr().out.splitlines()[0]
    assert "keywords/accuracy (pretrained)" in header and "word-order/accuracy (pretrained)" in header
    assert "custom/" not in header


def test_the_name_is_the_task_unless_the_config_or_a_flag_gives_one():
    from helpers import ROOT

    from pipeline.finetune.preflight import load_finetune_config

    assert load_finetune_config(ROOT / "configs/glue/sst2.json", check_files=False).task_name == "sst2"
    keywords = ROOT / "configs/glue/embedded-docs.json"
    assert load_finetune_config(keywords, check_files=False).task_name == "keywords"
    assert load_finetune_config(keywords, ["name=topics"], check_files=False).task_name == "topics"
    assert load_finetune_config(ROOT / "configs/glue/word-order.json", check_files=False).task_name == "word-order"
