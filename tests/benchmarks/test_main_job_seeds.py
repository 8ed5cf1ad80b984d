"""main_job_seeds' figures per seed and over seeds, from run folders laid out as the main job's stages write them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the benchmarks import each other as top-level modules, as when run

import main_job_seeds as seeds  # noqa: E402
from harness import BenchmarkRecord  # noqa: E402

from pipeline.common.run_layout import MainJobLayout  # noqa: E402
from pipeline.tracking.job_summary import SEED_SPREAD  # noqa: E402

H = 6.3


def seed_folder(root: Path, losses: list[float], pairs: dict[str, tuple[float, float]],
                word_order: tuple[float, float] | None = None) -> MainJobLayout:
    """A pretraining evaluated every 100 steps with `losses`, its minimal pairs (model, unigram) per phenomenon,
    and word order's (pretrained, from scratch) medians."""
    layout = MainJobLayout(root)
    layout.pretrain.root.mkdir(parents=True)
    layout.pretrain.config.write_text(json.dumps({"train": {"seed": 0, "max_steps": 100 * len(losses)}}))
    records = []
    for i, loss in enumerate(losses):
        records += [{"step": 100 * (i + 1), "time": 10.0 * i + 5, "train/loss": loss},
                    {"step": 100 * (i + 1), "time": 10.0 * i + 6, "eval/mlm_loss": loss, "eval/unigram_entropy": H}]
    layout.pretrain.metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    layout.minimal_pairs_result.write_text(json.dumps({
        "model_scores": {"groups": {g: {"accuracy": m} for g, (m, _) in pairs.items()}},
        "unigram_scores": {"groups": {g: {"accuracy": u} for g, (_, u) in pairs.items()}}}))
    for arm, value in zip(("pretrained", "from-scratch"), word_order or (), strict=False):
        layout.finetune("word-order", arm).root.mkdir(parents=True)
        layout.finetune("word-order", arm).metrics.write_text(json.dumps({
            "metric": "accuracy", "accuracy": value, "per_seed": [{"accuracy": value}]}))
    return layout


def record() -> BenchmarkRecord:
    rec = BenchmarkRecord.__new__(BenchmarkRecord)  # the results only: nothing is written
    rec.results = {}
    return rec


def test_the_plateau_exit_is_where_the_loss_first_falls_half_a_nat_below_h_interpolated(tmp_path):
    # H − 0.5 = 5.8: crossed a quarter of the way from step 200 (5.9) to 300 (5.5)
    layout = seed_folder(tmp_path, [6.4, 5.9, 5.5, 4.2], {"agreement": (0.8, 0.7), "word_order": (0.6, 0.5)})
    figures = seeds.seed_figures(layout)
    assert figures == {"max_steps": 400, "exit_step": 225, "final_loss": 4.2, "entropy": H,
                       "pairs": {"agreement": (0.8, 0.7), "word_order": (0.6, 0.5)}}
    stuck = seeds.seed_figures(seed_folder(tmp_path / "stuck", [6.4, 6.0, 5.9], {"agreement": (0.6, 0.7)}))
    assert stuck["exit_step"] is None
    row = seeds.seed_row("shipped", 1, {**stuck, "seconds": 200.0}, scratch=None, pretrained=None)
    assert row["off the plateau (H − 0.5) at step"] == "not by 300" and row["above unigram on all"] is False
    assert "gain, points" not in row  # a screen: no word order


def run(tmp_path, arm: str, per_seed: list[tuple[list[float], dict, float]]) -> tuple[list[dict], list[dict]]:
    """Rows and figures of one arm whose seeds had these losses, minimal pairs and pretrained word order (scratch
    0.50)."""
    rows, figures = [], []
    for seed, (losses, pairs, word_order) in enumerate(per_seed):
        layout = seed_folder(tmp_path / arm / str(seed), losses, pairs, (word_order, 0.50))
        figures.append({**seeds.seed_figures(layout), "seconds": 200.0 + seed})
        rows.append(seeds.seed_row(arm, seed, figures[-1], seeds.word_order_median(layout, "from-scratch"),
                                   seeds.word_order_median(layout, "pretrained")))
    return rows, figures


GOOD, BAD = {"agreement": (0.8, 0.7), "determiner": (0.9, 0.8)}, {"agreement": (0.7, 0.72), "determiner": (0.9, 0.8)}


def test_the_targets_are_judged_over_the_seeds_and_one_sentence_carries_the_spread(tmp_path):
    rows, figures = run(tmp_path, "shipped", [([6.4, 5.5, 5.0, 4.0], GOOD, 0.65), ([6.4, 6.2, 5.7, 4.5], GOOD, 0.58),
                                              ([6.4, 5.6, 5.0, 4.1], BAD, 0.62)])
    assert [r["gain, points"] for r in rows] == [15.0, 8.0, 12.0]
    rec = record()
    seeds.record_headline(rec, rows, figures)
    headline = rec.results["headline"]
    # the second seed crosses 5.8 at step 280 (6.2 at 200 → 5.7 at 300), past mid-run (200 of 400)
    assert headline["worst seed off the plateau (H − 0.5) at step"] == {"value": "280", "target": "≤ 200 (mid-run)",
                                                                        "met": False}
    assert headline["seeds with minimal pairs above the unigram model on every phenomenon"]["value"] == "2 of 3"
    assert headline["word-order gain, median of the seeds"] == {"value": "+12.0 points", "target": "≥ +10 points",
                                                                "met": True}
    assert headline["word-order gain, worst seed"]["met"] is True
    assert headline[SEED_SPREAD]["value"] == (
        "3 pretraining seeds: final validation loss 4.10 [4.00 – 4.50] (H 6.30); minimal pairs above the unigram "
        "model on every phenomenon for 2 of 3; word order +12.0 [+8.0 – +15.0] points over scratch (median "
        "[min – max])")
    summary = seeds.arm_summary("shipped", [], rows, figures)
    assert summary["exit (H − 0.5): median, worst step"] == "175, 280 of 400"
    assert summary["pretraining s: median"] == 201.0


def test_a_seed_that_never_leaves_the_plateau_is_the_worst(tmp_path):
    rows, figures = run(tmp_path, "mask30", [([6.4, 5.5], GOOD, 0.6), ([6.4, 6.3], GOOD, 0.5), ([6.4, 6.2], GOOD, 0.5)])
    summary = seeds.arm_summary("mask30", ["masking.probability=0.3"], rows, figures)
    assert summary["exit (H − 0.5): median, worst step"] == "never, never of 200"
    assert summary["overrides"] == "masking.probability=0.3"
    rec = record()
    seeds.record_headline(rec, rows, figures)
    assert rec.results["headline"]["worst seed off the plateau (H − 0.5) at step"]["value"] == "never"


def test_each_seeds_folder_links_the_shared_data_and_starts_empty(tmp_path):
    data = MainJobLayout(tmp_path / "data")
    for name in seeds.SHARED:
        (data.root / name).mkdir(parents=True)
    stale = seeds.seed_layout(tmp_path, data, "shipped", 2)
    (stale.root / "pretrain").mkdir()
    layout = seeds.seed_layout(tmp_path, data, "shipped", 2)
    assert layout.root == tmp_path / "shipped" / "seed-2" and not layout.pretrain.root.exists()
    assert layout.shards.resolve() == data.shards and layout.task("word-order").parent.resolve() == data.root / "tasks"
