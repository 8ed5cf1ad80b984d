"""budget_time_to_loss: targets below the plateau, honest ratios, and HF baselines on the budget recipe's model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

import budget_time_to_loss as bench  # noqa: E402
import hf_baselines  # noqa: E402

from pipeline.data.tokenizer import TokenizerInfo  # noqa: E402
from pipeline.pretrain.preflight import load_pretrain_config  # noqa: E402
from pipeline.tracking.loss_curve import EvalPoint  # noqa: E402

TOKENIZER = TokenizerInfo("test", "sha256:0", 500, cls_id=0, sep_id=2, pad_id=1, mask_id=4, backend_json="{}")


def budget_config(*overrides: str, path: str = "configs/budget-tiny.json"):
    return load_pretrain_config(ROOT / path, [*overrides, "data.shards=x", "data.tokenizer=x"], world_size=2,
                                check_files=False)


def curve(*losses: float, minutes_per_eval: float = 1.0) -> list[EvalPoint]:
    return [EvalPoint(10 * i, 60 * minutes_per_eval * i, loss) for i, loss in enumerate(losses)]


def test_all_three_recipes_write_the_main_record_and_a_subset_or_another_budget_config_its_own_variant():
    assert bench.record_variant(["hf-run_mlm", "budget", "hf-same"]) is None
    assert bench.record_variant(["hf-run_mlm", "budget"]) == "hf-run_mlm-vs-budget"
    assert bench.record_variant(["budget"], "configs/budget-modernbert-wide.json") == "budget.budget-modernbert-wide"
    assert bench.record_variant(["hf-run_mlm", "budget", "hf-same"], "configs/budget-tiny.json") == "budget-tiny"
    assert bench.STUDY.record("budget-tiny").name == "budget_time_to_loss.budget-tiny"


def test_the_targets_are_the_unigram_entropy_less_each_margin():
    assert bench.margin_targets(7.0) == {"1.0": 6.0, "1.5": 5.5}


def test_a_reached_target_is_interpolated_and_an_unreached_one_is_bounded_by_the_last_evaluation():
    assert bench.time_to(curve(7.0, 6.5, 5.5), 6.0) == {"step": 15.0, "seconds": 90.0, "reached": True}
    # Not reached: the run trained 2 minutes (20 steps) without getting there, so it needs more than that.
    assert bench.time_to(curve(7.0, 6.8, 6.6), 6.0) == {"step": 20, "seconds": 120.0, "reached": False}
    assert bench.time_to([], 6.0) == {"step": 0, "seconds": 0.0, "reached": False}


def test_the_median_counts_an_unreached_run_as_later_and_is_a_bound_when_the_median_run_did_not_reach_it():
    reached = {"step": 10, "seconds": 60.0, "reached": True}
    missed = {"step": 40, "seconds": 400.0, "reached": False}
    two_of_three = bench.median_time([reached, {**reached, "seconds": 90.0}, missed])
    assert two_of_three["exact"] and two_of_three["seconds"] == 90.0 and two_of_three["reached"] == 2
    one_of_three = bench.median_time([reached, missed, {**missed, "seconds": 300.0}])
    assert not one_of_three["exact"] and one_of_three["seconds"] == 300.0
    assert bench.time_cell(one_of_three, 7) == "not reached in 7 min (1/3): > 5.00 min"
    assert bench.time_cell(two_of_three, 7) == "10, 1.50 min (2/3)"


@pytest.mark.parametrize(("recipe", "budget", "text", "met_2x"), [
    ({"seconds": 300.0, "exact": True}, {"seconds": 100.0, "exact": True}, "3.0×", True),
    ({"seconds": 150.0, "exact": True}, {"seconds": 100.0, "exact": True}, "1.5×", False),
    # HF never got there in 400 s of training: at least 4× the budget's 100 s, whatever it would have taken.
    ({"seconds": 400.0, "exact": False}, {"seconds": 100.0, "exact": True}, "≥ 4.0×", True),
    ({"seconds": 150.0, "exact": False}, {"seconds": 100.0, "exact": True}, "≥ 1.5×", None),
    # The budget never got there: HF's 150 s is at most 1.5× the budget's unknown time.
    ({"seconds": 150.0, "exact": True}, {"seconds": 100.0, "exact": False}, "≤ 1.5×", False),
    ({"seconds": 300.0, "exact": True}, {"seconds": 100.0, "exact": False}, "≤ 3.0×", None),
    ({"seconds": 300.0, "exact": False}, {"seconds": 100.0, "exact": False}, "not measurable: neither reached it",
     None),
])
def test_a_ratio_is_exact_or_an_honest_bound_and_judges_the_goal_only_where_the_bound_decides(recipe, budget, text,
                                                                                                met_2x):
    ratio = bench.time_ratio(recipe, budget)
    assert ratio["text"] == text
    assert bench.goal_met(ratio, 2.0) is met_2x


def run(recipe: str, seed: int, losses: tuple[float, ...], minutes_per_eval: float = 1.0) -> dict:
    return {"recipe": recipe, "seed": seed, "model": "modernbert 2 × 128", "steps": 10 * (len(losses) - 1),
            "batch": 32, "curve": [vars(p) for p in curve(*losses, minutes_per_eval=minutes_per_eval)]}


def test_the_summary_shows_the_plateau_every_final_loss_beside_it_and_whether_each_hf_goal_is_met():
    runs = [run("budget", 1, (7.5, 6.8, 6.2, 5.9)),  # H − 1.0 = 6.0 at 2.67 min
            run("hf-same", 1, (7.5, 7.0, 6.6, 6.3, 6.1, 5.9)),  # at 4.5 min: 1.7×
            run("hf-run_mlm", 1, (7.5, 7.4, 7.3, 7.2, 7.1, 7.0, 6.9, 6.8))]  # not in 7 min: ≥ 7/2.67 = 2.6×
    summary, rows = bench.summarise(runs, 7.0, max_minutes=7)
    assert summary["targets"] == {"1.0": 6.0, "1.5": 5.5}
    assert "to H − 1.0 = 6.000 nats: steps, min (reached)" in rows[0]
    assert "to H − 1.5 = 5.500 nats: steps, min (reached)" in rows[0]
    assert rows[0]["final val loss (median)"] == "5.900 (unigram entropy 7.000: 1.100 nats below it)"
    assert rows[2]["final val loss (median)"] == "6.800 (unigram entropy 7.000: 0.200 nats below it)"
    ratios = {r["recipe"]: r["time to H − 1.0 ÷ budget"] for r in rows}
    assert ratios == {"budget": "—", "hf-same": "1.7×", "hf-run_mlm": "≥ 2.6×"}
    assert summary["goals"] == {"hf-same": {"goal": 2.0, "met": False}, "hf-run_mlm": {"goal": 5.0, "met": None}}
    assert rows[2]["to H − 1.0 = 6.000 nats: steps, min (reached)"] == "not reached in 7 min (0/1): > 7.00 min"


def test_hf_same_follows_the_budget_configs_recipe():
    config = budget_config("optimizer.lr=0.003", "train.gradient_clipping=0.7")
    arguments, differences = hf_baselines.same_recipe(config, ranks=2)
    t, o = config.train, config.optimizer
    assert arguments["per_device_train_batch_size"] * arguments["gradient_accumulation_steps"] == t.global_batch_size
    assert (arguments["learning_rate"], arguments["adam_beta1"], arguments["adam_beta2"], arguments["adam_epsilon"],
            arguments["weight_decay"]) == (0.003, *o.betas, o.eps, o.weight_decay)
    assert (arguments["warmup_steps"], arguments["max_steps"], arguments["lr_scheduler_type"]) == (
        config.schedule.warmup_steps, t.max_steps, "linear")
    assert arguments["max_grad_norm"] == 0.7
    assert any("warmup" in d for d in differences)
    ends_higher, _ = hf_baselines.same_recipe(budget_config("schedule.end_lr_ratio=0.1"), ranks=2)
    assert ends_higher["lr_scheduler_type"] == "polynomial"
    assert ends_higher["lr_scheduler_kwargs"] == {"lr_end": pytest.approx(0.0002), "power": 1.0}
    with pytest.raises(ValueError, match="Trainer has no lamb"):
        hf_baselines.same_recipe(budget_config("optimizer.name=lamb"), ranks=2)


@pytest.mark.parametrize("architecture", ["roberta-prelayernorm", "modernbert"])
def test_both_hf_recipes_build_the_budget_models_class_and_shape_and_run_mlm_keeps_the_class_dropout(architecture):
    from pipeline.models.architectures.hf_model import EXPORT_CLASSES, hf_config

    extra = ["model.architecture=modernbert", "model.intermediate_size=341"] if architecture == "modernbert" else []
    config = budget_config(*extra, "model.hidden_dropout_prob=0.05")
    cls = hf_baselines.masked_lm_class(architecture)
    assert cls is EXPORT_CLASSES[architecture]  # what an export of the budget recipe loads as
    same = hf_baselines.hf_model_config("hf-same", config, TOKENIZER, 128)
    assert same.to_dict() == hf_config(config.model, TOKENIZER, 128).to_dict()
    run_mlm = hf_baselines.hf_model_config("hf-run_mlm", config, TOKENIZER, 128)
    defaults = type(run_mlm)()
    for name in hf_baselines.DROPOUT_FIELDS:
        if hasattr(defaults, name):
            assert getattr(run_mlm, name) == getattr(defaults, name)
    shape = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    assert all(getattr(run_mlm, k) == getattr(same, k) for k in shape)


def test_hf_same_decays_the_pipelines_parameters_where_trainers_own_rule_would_decay_the_head_alone():
    from transformers import Trainer

    model = hf_baselines.masked_lm_class("roberta-prelayernorm")(
        hf_baselines.hf_model_config("hf-same", budget_config(), TOKENIZER, 128))
    names = hf_baselines.decay_parameter_names(model)
    assert names and all(n.endswith("weight") and "LayerNorm" not in n for n in names)
    assert "roberta_prelayernorm.encoder.layer.0.attention.self.query.weight" in names
    # Trainer's rule skips every name containing "layernorm": in the pre-LN RoBERTa, the whole encoder.
    trainers = Trainer.get_decay_parameter_names(None, model)
    assert trainers and all(n.startswith("lm_head.") for n in trainers)
