"""How much the main job's result hangs on its pretraining seed: its recipe pretrained on several seeds, each judged.

Through the main job's own stages: its data and tasks once, then per arm and seed a fresh main-job folder
(pretraining, minimal pairs) and, unless `--screen`, word order through the fair protocol; with `--search`, the
main job's search rows too (the corpus stage → pairs chain and SPLADE, each arm's seeds and from scratch once).
docs/benchmarks.md says what is judged; the main job's summary and the README quote the default record
(pipeline/tracking/job_summary.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
from pathlib import Path

from harness import BenchmarkRecord, Study, metrics, work_dir

from pipeline.commands import run_default as job
from pipeline.common.processes.topology import use_environment_extensions_dir
from pipeline.common.run_layout import MainJobLayout
from pipeline.tracking.job_summary import SEED_SPREAD, recipe_fingerprint

STUDY = Study(
    "main_job_seeds", question="How much does the main job's result hang on its pretraining seed?",
    metric="step off the plateau (H − 0.5), final validation loss, minimal pairs against the unigram model, "
           "word order's dev accuracy through the fair protocol",
    baseline="the unigram entropy H and the unigram model; word order from scratch; targets: gain median ≥ +10 "
             "and worst ≥ +5 points, minimal pairs above unigram on all for ≥ 4 of 5 seeds",
    arms=("pretraining seeds", "recipe arms"))
MARGIN = 0.5
"""Nats below the unigram entropy that count as off the plateau."""
TASK = "word-order"
SHARED = ("corpus.jsonl", "tokenizer", "shards", "tasks")
"""The data folder's entries every seed's folder links to."""


def seed_figures(layout: MainJobLayout) -> dict:
    """One pretraining's plateau exit, final loss and H (from metrics.jsonl), max_steps, and minimal pairs."""
    from pipeline.tracking.finetune_report import read_json
    from pipeline.tracking.loss_curve import curve_from_metrics, first_crossing

    records = metrics(layout.pretrain.root)
    evals = [r for r in records if "eval/mlm_loss" in r]
    entropy = evals[-1]["eval/unigram_entropy"]
    exit_point = first_crossing(curve_from_metrics(records, records[0]["time"]), entropy - MARGIN)
    pairs = read_json(layout.minimal_pairs_result) or {}
    model, unigram = pairs.get("model_scores", {}).get("groups", {}), pairs.get("unigram_scores", {}).get("groups", {})
    return {"max_steps": json.loads(layout.pretrain.config.read_text())["train"]["max_steps"],
            "exit_step": None if exit_point is None else round(exit_point.step),
            "final_loss": evals[-1]["eval/mlm_loss"], "entropy": entropy,
            "pairs": {g: (model[g]["accuracy"], unigram[g]["accuracy"]) for g in model}}


def word_order_median(layout: MainJobLayout, arm: str) -> float | None:
    from pipeline.tracking.finetune_report import finetune_result

    result = finetune_result(layout.finetune(TASK, arm).metrics)
    return None if result is None else result.median


def search_figures(layout: MainJobLayout, arm: str) -> dict[str, float] | None:
    """The main job's search rows of one arm (nDCG@10 on the dev docstrings): dense after the corpus stage and
    after the pairs, sparse, hybrid, and BM25's; None when they were not run."""
    from pipeline.tracking.finetune_report import read_json

    dense, sparse = (read_json(layout.finetune(task, arm).metrics) for task in ("search", "search-sparse"))
    if not (dense and sparse):
        return None
    return {"corpus stage": dense["zero_shot_ndcg_at_10"], "dense": dense["ndcg_at_10"],
            "sparse": sparse["ndcg_at_10"], "hybrid": dense["hybrid_ndcg_at_10"], "bm25": dense["bm25_ndcg_at_10"]}


def search_cells(search: dict[str, float], scratch: dict[str, float] | None) -> dict[str, str]:
    """A row's search cells: each figure, and from scratch's beside it."""
    cells = {f"search {k} (scratch)": f"{v:.3f}" + (f" ({scratch[k]:.3f})" if scratch else "")
             for k, v in search.items() if k != "bm25"}
    return {**cells, "search BM25": f"{search['bm25']:.3f}"}


def seed_row(arm: str, seed: int, figures: dict, scratch: float | None, pretrained: float | None) -> dict:
    """A seed's row of the record's table."""
    pairs = figures["pairs"]
    row = {"arm": arm, "seed": seed,
           f"off the plateau (H − {MARGIN}) at step": (f"not by {figures['max_steps']}" if figures["exit_step"] is None
                                                        else figures["exit_step"]),
           "final val loss (H)": f"{figures['final_loss']:.3f} ({figures['entropy']:.3f})",
           "minimal pairs, model/unigram": ", ".join(f"{g} {m:.2f}/{u:.2f}" for g, (m, u) in pairs.items()),
           "above unigram on all": bool(pairs) and all(m > u for m, u in pairs.values()),
           "pretraining s": figures["seconds"]}
    if pretrained is not None and scratch is not None:
        row["word order, pretrained (scratch)"] = f"{pretrained:.3f} ({scratch:.3f})"
        row["gain, points"] = round(100 * (pretrained - scratch), 1)
    return row


def step(value: float) -> str:
    return "never" if value == math.inf else f"{value:.0f}"


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} [{format(min(values), fmt)} – {format(max(values), fmt)}]"


def arm_summary(arm: str, overrides: list[str], rows: list[dict], figures: list[dict]) -> dict:
    """One arm's line: the median and worst plateau exit, final loss, minimal pairs and word-order gain."""
    exits = sorted(math.inf if f["exit_step"] is None else f["exit_step"] for f in figures)
    gains = [r["gain, points"] for r in rows if "gain, points" in r]
    return {"arm": arm, "overrides": ", ".join(overrides) or "none", "seeds": len(rows),
            f"exit (H − {MARGIN}): median, worst step": f"{step(statistics.median(exits))}, {step(exits[-1])} of "
                                                       f"{figures[0]['max_steps']}",
            "final val loss: median [min – max]": spread([f["final_loss"] for f in figures], ".3f"),
            "minimal pairs above unigram on all": f"{sum(r['above unigram on all'] for r in rows)} of {len(rows)}",
            "word-order gain, points": spread(gains, "+.1f") if gains else "not measured",
            "pretraining s: median": statistics.median(f["seconds"] for f in figures)}


def record_headline(rec: BenchmarkRecord, rows: list[dict], figures: list[dict]) -> None:
    """The targets over the seeds of one arm, and the one sentence the main job's summary and the README quote."""
    worst = max(math.inf if f["exit_step"] is None else f["exit_step"] for f in figures)
    half = min(f["max_steps"] for f in figures) / 2
    rec.headline(f"worst seed off the plateau (H − {MARGIN}) at step", step(worst), target=f"≤ {half:.0f} (mid-run)",
                 met=worst <= half)
    above = sum(r["above unigram on all"] for r in rows)
    rec.headline("seeds with minimal pairs above the unigram model on every phenomenon", f"{above} of {len(rows)}",
                 target=f"≥ {len(rows) - 1} of {len(rows)}", met=above >= len(rows) - 1)
    gains = [r["gain, points"] for r in rows if "gain, points" in r]
    sentence = (f"{len(rows)} pretraining seeds: final validation loss "
                f"{spread([f['final_loss'] for f in figures], '.2f')} (H {figures[0]['entropy']:.2f}); minimal "
                f"pairs above the unigram model on every phenomenon for {above} of {len(rows)}")
    if gains:
        rec.headline("word-order gain, median of the seeds", f"{statistics.median(gains):+.1f} points",
                     target="≥ +10 points", met=statistics.median(gains) >= 10)
        rec.headline("word-order gain, worst seed", f"{min(gains):+.1f} points", target="≥ +5 points",
                     met=min(gains) >= 5)
        sentence += f"; word order {spread(gains, '+.1f')} points over scratch (median [min – max])"
    rec.headline(SEED_SPREAD, sentence)


def seed_layout(out: Path, data: MainJobLayout, arm: str, seed: int) -> MainJobLayout:
    """A fresh main-job folder for one arm and seed whose data and tasks are the shared folder's."""
    layout = MainJobLayout(out / arm / f"seed-{seed}")
    shutil.rmtree(layout.root, ignore_errors=True)
    layout.root.mkdir(parents=True)
    for name in SHARED:
        (layout.root / name).symlink_to(data.root / name)
    return layout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--ranks", type=int, default=2, help="pretraining processes (the main job's 2; 1 gives the same "
                                                       "losses at the same global batch)")
    p.add_argument("--arms", default="shipped", help="comma-separated names; each takes its --set overrides")
    p.add_argument("--set", action="append", default=[], metavar="ARM:KEY=VALUE",
                   help="a pretraining config override for one arm, e.g. mask30:masking.probability=0.3")
    p.add_argument("--screen", action="store_true", help="pretraining and minimal pairs only (no word order)")
    p.add_argument("--search", action="store_true", help="the main job's search rows too, both arms")
    p.add_argument("--variant", help="record as main_job_seeds.VARIANT (a search round), not the default record")
    p.add_argument("--out", type=Path, help="work folder (default: the benchmarks' work folder, main-job-seeds)")
    a = p.parse_args()
    arms, seeds = a.arms.split(","), [int(s) for s in a.seeds.split(",")]
    bad = [s for s in a.set if ":" not in s or s.split(":", 1)[0] not in arms]
    if bad or len(set(arms)) != len(arms):
        raise SystemExit(f"--set {bad}: each must name one of --arms {arms} (ARM:KEY=VALUE), and arms must differ")
    overrides = {arm: [s.split(":", 1)[1] for s in a.set if s.split(":", 1)[0] == arm] for arm in arms}
    out = work_dir("main-job-seeds", a.out)
    with STUDY.record(a.variant) as rec:
        rec.data["recipe_sha256"] = recipe_fingerprint()
        measure(rec, out, arms, seeds, overrides, a.ranks, a.screen, a.search)


def measure(rec: BenchmarkRecord, out: Path, arms: list[str], seeds: list[int], overrides: dict[str, list[str]],
            ranks: int, screen: bool, search: bool = False) -> None:
    use_environment_extensions_dir()  # as the main job: DeepSpeed's comm op built once per environment
    data = MainJobLayout(out / "data")
    data.root.mkdir(parents=True, exist_ok=True)
    shared = job.MainJob(data.root, verbose=False)
    job.make_data(shared, data, workers=os.cpu_count() or 1)
    job.make_tasks(shared, data)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    layouts: dict[str, dict[int, MainJobLayout]] = {arm: {} for arm in arms}
    seconds: dict[tuple[str, int], float] = {}
    for arm in arms:
        for seed in seeds:
            layout = layouts[arm][seed] = seed_layout(out, data, arm, seed)
            stages = job.MainJob(layout.root, verbose=False)
            job.pretrain(stages, layout, env, ranks=ranks, seed=seed, overrides=overrides[arm])
            seconds[arm, seed] = stages.seconds["pretrain"]
            job.score_minimal_pairs(stages, layout, env)
    if not screen:  # every arm's runs two at a time; the from-scratch arm once per arm, in its first seed's folder
        runs = []
        for arm in arms:
            first = layouts[arm][seeds[0]]
            for seed, layout in layouts[arm].items():
                name, stage, args = job.finetune_run(layout, TASK, "pretrained", layout.pretrain.export, [], None)
                runs.append((f"{name}-{arm}-seed-{seed}", stage, args))
            name, stage, args = job.finetune_run(first, TASK, "from-scratch", first.pretrain.export, [], None)
            runs.append((f"{name}-{arm}", stage, args))
        job.MainJob(out, verbose=False).run_together(f"{TASK} through the fair protocol, all labels", runs, env)
    if search:  # every arm's seeds through the search rows; from scratch once, in the first arm's first seed
        def named(run: job.Run, arm: str, seed: int) -> job.Run:
            return (f"{run[0]}-{arm}-seed-{seed}", *run[1:])

        first = layouts[arms[0]][seeds[0]]
        runs = [[named(r, arm, seed) for r in job.search_chain(layout, "pretrained")]
                for arm in arms for seed, layout in layouts[arm].items()]
        runs += [named(job.sparse_search_run(layout, "pretrained"), arm, seed)
                 for arm in arms for seed, layout in layouts[arm].items()]
        runs += [job.search_chain(first, "from-scratch"), job.sparse_search_run(first, "from-scratch")]
        job.MainJob(out, verbose=False).run_together("the search rows", runs, env)

    summaries, every_row = [], []
    for arm in arms:
        scratch = None if screen else word_order_median(layouts[arm][seeds[0]], "from-scratch")
        figures = [{**seed_figures(layouts[arm][s]), "seconds": seconds[arm, s]} for s in seeds]
        rows = [seed_row(arm, s, f, scratch, None if screen else word_order_median(layouts[arm][s], "pretrained"))
                for s, f in zip(seeds, figures, strict=True)]
        if search:
            from_scratch = search_figures(layouts[arms[0]][seeds[0]], "from-scratch")
            for row, s in zip(rows, seeds, strict=True):
                if (found := search_figures(layouts[arm][s], "pretrained")) is not None:
                    row.update(search_cells(found, from_scratch))
        summaries.append(arm_summary(arm, overrides[arm], rows, figures))
        every_row += rows
        if len(arms) == 1:
            record_headline(rec, rows, figures)
    rec.table(f"each arm over {len(seeds)} pretraining seeds ({ranks} rank{'s' if ranks > 1 else ''})", summaries,
              note=f"exit: the step where the validation loss first falls {MARGIN} nats below the unigram entropy H "
                   "(the copy floor of 80/10/10 masking is about 0.54 below it); gain: word order's dev accuracy, "
                   "pretrained − from scratch, medians of 3 fine-tuning seeds, each arm's learning rate chosen on "
                   "held-out train")
    rec.table("every seed", every_row)


if __name__ == "__main__":
    main()
