"""Study definitions, study files, the token budget per arm, and the results table (no training)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ROOT, run_script

from pipeline.ablation.plan import plan_study
from pipeline.ablation.results import ArmResult, TaskScore, direction_checks, results_csv, results_markdown
from pipeline.ablation.studies import STUDIES, builtin_study, load_study
from pipeline.common.config.tree import ConfigError
from pipeline.common.errors import PipelineError

TINY = str(ROOT / "configs" / "tiny.json")  # global batch 32, micro 16, lr 1e-3


def test_batch_size_arms_train_on_equal_tokens_with_the_papers_lr_ratios():
    study = load_study("batch-size", 32, 1e-3)
    plans = plan_study(study, TINY, [], seq_len=128, budget_tokens=1_000_000, world_size=1)
    assert [p.global_batch for p in plans] == [32, 256, 1024]
    assert [p.lr for p in plans] == pytest.approx([1e-3, 7e-3, 1e-2])  # RoBERTa Table 3: 1e-4, 7e-4, 1e-3
    # The budget is rounded down to whole steps of the largest batch: 7 × 1024 × 128 tokens for every arm.
    assert {p.tokens for p in plans} == {7 * 1024 * 128}
    assert [p.steps for p in plans] == [224, 28, 7]
    assert [p.warmup_steps for p in plans] == [round(0.06 * s) for s in (224, 28, 7)]
    sqrt = load_study("batch-size", 32, 1e-3, "sqrt")
    assert [a.set["optimizer.lr"] for a in sqrt.arms] == pytest.approx([1e-3, 1e-3 * 8 ** 0.5, 1e-3 * 32 ** 0.5])


def test_builtin_studies_compare_what_the_paper_compared():
    arms = {name: builtin_study(name, 32, 1e-3).arms for name in STUDIES}
    assert [(a.name, a.set) for a in arms["masking"]] == [("static", {"masking.mode": "static"}),
                                                        ("dynamic", {"masking.mode": "dynamic"})]
    assert [a.pack for a in arms["input-format"]] == ["pairs", "full", "doc-packed"]
    assert arms["input-format"][0].set == {"model.architecture": "bert"}
    nsp, no_nsp = arms["nsp"]
    assert nsp.pack == no_nsp.pack == "pairs" and no_nsp.set == {**nsp.set, "model.next_sentence_loss": False}
    for name in STUDIES:  # every study states the paper's finding and its order of the arms
        study = builtin_study(name, 32, 1e-3)
        if name == "architecture":  # pre-LN RoBERTa is not in the ModernBERT paper: it has no place in its order
            assert study.paper and study.paper_order == ["modernbert", "roberta"]
            continue
        assert study.paper and sorted(study.paper_order) == sorted(a.name for a in study.arms)


def test_the_architecture_study_matches_parameters_with_a_narrower_geglu():
    """GeGLU has three matrices to GELU's two: at 2/3 the width the arms' counts come out close."""
    from pipeline.data.tokenizer import TokenizerInfo
    from pipeline.models.architectures.config import ModelConfig
    from pipeline.models.architectures.hf_model import build_model

    study = builtin_study("architecture", 32, 1e-3, intermediate_size=512)
    assert [a.name for a in study.arms] == ["roberta", "roberta-prelayernorm", "modernbert"]
    assert {a.pack for a in study.arms} == {"full"}  # the same shards and masking for every arm
    info = TokenizerInfo("t", "x", 8000, cls_id=0, sep_id=2, pad_id=1, mask_id=4, backend_json="{}")
    counts = {}
    for arm in study.arms:
        shape = {k.removeprefix("model."): v for k, v in arm.set.items()}
        model = build_model(ModelConfig(**{"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4,
                                           "intermediate_size": 512, **shape}), info, 128)
        counts[arm.name] = sum(p.numel() for p in model.parameters())
    assert study.arm("modernbert").set["model.intermediate_size"] == 341
    assert abs(counts["modernbert"] / counts["roberta"] - 1) < 0.05, counts


def write(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "study.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_study_file_with_unknown_keys_names_each_of_them(tmp_path):
    path = write(tmp_path, {"name": "mine", "arms": [{"name": "a", "pakc": "full"}, {"name": "b"}], "colour": 1,
                            "paper_order": ["a", "c"]})
    with pytest.raises(ConfigError) as err:
        load_study(path, 32, 1e-3)
    message = str(err.value)
    assert "arms[0].pakc: unknown key" in message and "colour: unknown key" in message
    assert "paper_order: 'c' is not an arm" in message


def test_a_study_file_may_not_set_what_the_runner_sets_and_its_arm_settings_are_checked(tmp_path):
    path = write(tmp_path, {"name": "mine", "arms": [
        {"name": "a", "set": {"train.max_steps": 5}}, {"name": "a", "pack": "zigzag"}]})
    with pytest.raises(ConfigError) as err:
        load_study(path, 32, 1e-3)
    assert "arms[0].set.train.max_steps: set by the study runner from --budget-tokens" in str(err.value)
    assert "2 arms are named 'a'" in str(err.value) and "arms[1].pack" in str(err.value)
    good = write(tmp_path, {"name": "mine", "arms": [{"name": "a", "set": {"masking.probabilty": 0.2}},
                                                     {"name": "b", "set": {"optimizer.lr": -1}}]})
    with pytest.raises(ConfigError) as err:  # the pretraining config's own checks, named by arm
        plan_study(load_study(good, 32, 1e-3), TINY, [], seq_len=128, budget_tokens=10**6, world_size=1)
    assert "arm a: masking.probabilty: unknown key" in str(err.value)
    assert "arm b: optimizer.lr: must be > 0" in str(err.value)


def test_unknown_study_and_too_small_budget_are_refused(tmp_path):
    with pytest.raises(PipelineError, match="not a study .*masking, input-format, batch-size, nsp"):
        load_study("maskingg", 32, 1e-3)
    with pytest.raises(PipelineError, match="need a multiple of 131,072 tokens"):
        plan_study(load_study("batch-size", 32, 1e-3), TINY, [], seq_len=128, budget_tokens=100_000, world_size=1)


def test_cli_refuses_a_bad_study_before_any_work(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n")
    proc = run_script("launchers/ablate.py", "--study", "nope", "--corpus", corpus, "--out", tmp_path / "out")
    assert proc.returncode == 2 and "error: --study 'nope': not a study" in proc.stderr
    assert not (tmp_path / "out").exists()


def result(arm, ppl, acc, seeds=3):
    return ArmResult(arm, f"{arm} arm", 10, 32, 40960, 0.5, None if ppl is None else 1.5, ppl,
                     {} if acc is None else {"sst2": TaskScore("accuracy", acc, seeds)}, 123_456)


def test_results_table_has_a_row_per_arm_and_checks_the_papers_direction():
    rows = [result("static", 12.0, 0.80), result("dynamic", 11.0, 0.78)]
    csv_text = results_csv(rows, ["sst2"])
    assert csv_text.splitlines()[0] == ("arm,description,parameters,steps,global batch,tokens,epochs,val MLM loss,"
                                        "val perplexity,sst2 accuracy (median),sst2 seeds")
    assert csv_text.splitlines()[2] == "dynamic,dynamic arm,123456,10,32,40960,0.5,1.5,11.0,0.78,3"
    checks = direction_checks(rows, ["sst2"], ["dynamic", "static"])
    assert checks[0].endswith("dynamic (11) > static (12): same direction as the paper")
    assert "static (0.8) > dynamic (0.78): differs from the paper (dynamic > static)" in checks[1]
    tied = [result("static", 12.0, 0.5), result("dynamic", 11.0, 0.5)]
    assert "dynamic (0.5) = static (0.5): some arms tie" in direction_checks(tied, ["sst2"], ["dynamic", "static"])[1]
    md = results_markdown("Study masking", ["corpus: c"], rows, ["sst2"], "dynamic ≥ static", ["dynamic", "static"],
                          "loss_curves.png")
    assert "| dynamic | dynamic arm | 123456 | 10 | 32 | 40960 | 0.50 | 1.5000 | 11.00 | 0.7800 | 3 |" in md
    assert "Paper: dynamic ≥ static" in md and "![loss curves](loss_curves.png)" in md
    unfinished = results_csv([result("a", None, None)], ["sst2"]).splitlines()[1]
    assert unfinished == "a,a arm,123456,10,32,40960,0.5,,,,"
