"""launchers/ablate.py end to end at smoke scale: every study, one tiny task, one seed; reruns skip finished work."""

from __future__ import annotations

import csv
import json
import random

import pytest
from helpers import make_documents, run_script, write_jsonl

pytestmark = pytest.mark.slow


def sst2_rows(n: int, rng: random.Random) -> str:
    words = "good great fine bad awful poor movie film plot".split()
    rows = ["sentence\tlabel"]
    for _ in range(n):
        label = rng.randint(0, 1)
        cue = rng.choice(words[:3] if label else words[3:6])
        rows.append(" ".join([cue, *rng.choices(words[6:], k=4)]) + f"\t{label}")
    return "\n".join(rows) + "\n"


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ablate")
    corpus = write_jsonl(root / "corpus.jsonl", make_documents(400))
    rng = random.Random(0)
    (root / "glue/SST-2").mkdir(parents=True)
    (root / "glue/SST-2/train.tsv").write_text(sst2_rows(32, rng))
    (root / "glue/SST-2/dev.tsv").write_text(sst2_rows(16, rng))
    config = {"model": {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128},
              "data": {"shards": "set by the study", "tokenizer": "set by the study", "num_workers": 0},
              "optimizer": {"lr": 2e-3}, "train": {"global_batch_size": 4, "micro_batch_size": 4, "eval_sequences": 16},
              "checkpoint": {"every": 1000}, "deepspeed": {}}
    (root / "tiny.json").write_text(json.dumps(config))
    return {"root": root, "corpus": corpus, "out": root / "out"}


def ablate(work: dict, study: str, *extra: str, budget: int = 1024):
    """One study; the 3-arm ones pass --no-finetune-sweep (their arms' fine-tuning is not what they check), nsp
    keeps the default learning-rate sweep and masking sweeps its own grid."""
    args = ["--study", study, "--corpus", work["corpus"], "--out", work["out"], "--budget-tokens", budget,
            "--tasks", "sst2", "--glue-dir", work["root"] / "glue", "--seeds", "1", "--config",
            work["root"] / "tiny.json", "--seq-len", 64, "--vocab-size", 300, "--workers", 1,
            "--finetune-set", "train.epochs=1", "--finetune-set", "train.batch_size=8", *extra]
    proc = run_script("launchers/ablate.py", *args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def table(work: dict, study: str) -> list[dict]:
    with open(work["out"] / study / "results.csv") as f:
        return list(csv.DictReader(f))


def check_study_folder(work: dict, study: str, arms: list[str]) -> list[dict]:
    folder = work["out"] / study
    rows = table(work, study)
    assert [r["arm"] for r in rows] == arms
    assert len({r["tokens"] for r in rows}) == 1  # every arm at the same budget
    for row in rows:
        assert float(row["val perplexity"]) > 1 and 0 <= float(row["sst2 accuracy (median)"]) <= 1
        assert row["sst2 seeds"] == "1"
        assert (folder / "arms" / row["arm"] / "pretrain" / "export" / "config.json").exists()
    assert (folder / "loss_curves.png").read_bytes()[:4] == b"\x89PNG"
    assert "## Against the paper" in (folder / "results.md").read_text()
    return rows


def test_masking_study_end_to_end_in_mlflow_then_a_rerun_skips_every_finished_arm_and_seed(work):
    ablate(work, "masking", "--finetune-sweep", "train.learning_rate=1e-4,1e-3")
    check_study_folder(work, "masking", ["static", "dynamic"])
    for arm in ("static", "dynamic"):  # each arm's learning rate chosen on held-out train, not dev
        selection = json.loads((work["out"] / "masking/arms" / arm / "finetune/sst2/selection.json").read_text())
        assert [t["setting"] for t in selection["trials"]] == [{"train.learning_rate": "1e-4"},
                                                               {"train.learning_rate": "1e-3"}]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{work['out'] / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ablation-masking").experiment_id])
    by_role = {}
    for run in runs:
        by_role.setdefault(run.data.tags.get("ablation.role"), []).append(run)
    (study_run,) = by_role["study"]
    assert {a.data.tags["mlflow.parentRunId"] for a in by_role["arm"]} == {study_run.info.run_id}
    arm_ids = {a.data.tags["ablation.arm"]: a.info.run_id for a in by_role["arm"]}
    assert set(arm_ids) == {"static", "dynamic"}
    for role in ("pretrain", "finetune-summary"):  # the arm's own runs hang beneath the arm's run
        assert sorted(arm_ids[r.data.tags["ablation.arm"]] == r.data.tags["mlflow.parentRunId"]
                      for r in by_role[role]) == [True, True]
    assert "sst2/accuracy_median" in by_role["arm"][0].data.metrics
    assert {"results.md", "results.csv", "loss_curves.png"} <= {
        a.path for a in client.list_artifacts(study_run.info.run_id)}

    again = ablate(work, "masking", "--finetune-sweep", "train.learning_rate=1e-4,1e-3").stdout
    assert again.count("pretraining: finished before") == 2 and again.count("sst2: seeds 1 finished before") == 2
    assert "== static: pretrain" not in again and "reused" in again


def test_input_format_study_trains_bert_pairs_full_and_doc_packed(work):
    ablate(work, "input-format", "--no-tracking", "--no-finetune-sweep")
    check_study_folder(work, "input-format", ["segment-pair-nsp", "full-sentences", "doc-sentences"])
    assert sorted(p.name for p in (work["out"] / "shards").iterdir()) == ["doc-packed", "full", "pairs"]


def test_nsp_study_trains_bert_with_and_without_the_next_sentence_loss(work):
    ablate(work, "nsp", "--no-tracking")
    check_study_folder(work, "nsp", ["bert-nsp", "bert-no-nsp"])
    logged = {arm: [json.loads(line) for line in (work["out"] / "nsp/arms" / arm / "pretrain/metrics.jsonl")
                    .read_text().splitlines()] for arm in ("bert-nsp", "bert-no-nsp")}
    assert any("train/nsp_loss" in r for r in logged["bert-nsp"])
    assert not any("train/nsp_loss" in r for r in logged["bert-no-nsp"])


def test_batch_size_study_trains_three_batches_on_equal_tokens(work):
    ablate(work, "batch-size", "--no-tracking", "--no-finetune-sweep", budget=128 * 64)
    rows = check_study_folder(work, "batch-size", ["batch-4", "batch-32", "batch-128"])
    assert [int(r["steps"]) for r in rows] == [32, 4, 1]


def test_architecture_study_trains_roberta_pre_ln_roberta_and_modernbert_at_similar_sizes(work):
    ablate(work, "architecture", "--no-tracking", "--no-finetune-sweep")
    rows = check_study_folder(work, "architecture", ["roberta", "roberta-prelayernorm", "modernbert"])
    counts = {r["arm"]: int(r["parameters"]) for r in rows}
    assert abs(counts["modernbert"] / counts["roberta"] - 1) < 0.1, counts  # GeGLU at 2/3 of the base's width
    config = json.loads((work["out"] / "architecture/arms/modernbert/pretrain/export/config.json").read_text())
    assert config["model_type"] == "modernbert" and config["intermediate_size"] == 85  # 2/3 of 128
    md = (work["out"] / "architecture" / "results.md").read_text()
    assert "| arm | description | parameters |" in md and "ModernBERT-base beats" in md
