"""Time to a validation MLM loss: the budget recipe against configs/tiny.json and HF Trainer's run_mlm defaults.

    python benchmarks/budget_time_to_loss.py [--recipes budget,tiny,hf] [--seeds 1,2,3] [--max-minutes 8]
        [--thresholds 6.0,5.0] [--set RECIPE:KEY=VALUE ...] [--out DIR]

1. A 16k byte-level BPE tokenizer and 128-token shards from the IMDB corpus (../shared/data), made
   once in `--out` by the user-facing commands (as benchmarks/pretraining_gain.py makes them).
2. Each recipe and seed runs in its own process until its schedule ends or `--max-minutes` of wall
   time from its launch pass (then SIGTERM: it stops after the step):
   - budget: `launchers/pretrain.py --config configs/budget-tiny.json` on 2 ranks;
   - tiny:   `launchers/pretrain.py --config configs/tiny.json` on 2 ranks, its max_steps replaced by
             the budget recipe's horizon in sequences, so both schedules span the same data;
   - hf:     `transformers.Trainer` on `RobertaForMaskedLM` of tiny.json's size (post-LN, dropout 0.1)
             with `DataCollatorForLanguageModeling` and run_mlm's defaults: LR 5e-5, AdamW (0.9, 0.999),
             eps 1e-8, weight decay 0, no warmup, linear decay over a 3-epoch horizon, per-device
             batch 8, mlm_probability 0.15, one process.
3. Every recipe is evaluated on the same validation sequences with the same masks: the first
   `--eval-sequences` of the validation split, masked by the pipeline's hashed masker under the
   run's seed (so for one seed, every recipe sees identical masked inputs). The HF run is evaluated
   on those batches from a callback; HF's own eval would draw new random masks each time.
   Evaluations happen every `--eval-every-sequences` training sequences, whatever the batch.
4. Time is wall time from the process's launch (start-up included), less the time spent evaluating
   (pipeline/tracking/loss_curve.py). The step and time where a loss is reached are interpolated
   linearly between the evaluations either side of it.
Output: `results.json` (every curve, per-run load averages) and `table.md` (medians over seeds;
a median that is not reached is reported as "not reached in N min").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from result_record import BenchmarkRecord  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
CORPUS = SHARED / "corpus" / "imdb-reviews.jsonl.zst"
RECIPES = {  # name: (config, ranks)
    # 2 ranks × 1 thread: 4.7× the tokens/s of 1 process × 2 threads on 2 shared cores (README).
    "budget": ("configs/budget-tiny.json", 2),
    "tiny": ("configs/tiny.json", 2),
}


def hf_worker(spec: dict) -> None:
    """HF Trainer with run_mlm's defaults, evaluated on the pipeline's fixed masked validation batches."""
    import torch
    from transformers import (
        AutoTokenizer,
        DataCollatorForLanguageModeling,
        RobertaForMaskedLM,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    from pipeline.common.config_tree import read_json_config
    from pipeline.data.token_cache import TokenCache
    from pipeline.data.tokenizer import describe_tokenizer
    from pipeline.pretrain.batches import MaskedBatches, eval_keys
    from pipeline.pretrain.config import MaskingConfig, ModelConfig
    from pipeline.pretrain.masking import build_masker
    from pipeline.pretrain.model import hf_config

    launched, cap, seed = spec["launched_at"], 60 * spec["max_minutes"], spec["seed"]
    tokenizer = AutoTokenizer.from_pretrained(spec["tokenizer"])
    info = describe_tokenizer(tokenizer)
    train = TokenCache(spec["shards"], "train", spec["cache_dir"])
    val = TokenCache(spec["shards"], "val", spec["cache_dir"])
    ids = train.fields["input_ids"]

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return len(ids)

        def __getitem__(self, i):
            return {"input_ids": torch.from_numpy(ids[i].astype("int64"))}

    masker = build_masker(MaskingConfig(), tokenizer, info.vocab_size, info.mask_id, seed)
    val_batches = MaskedBatches(val, masker, with_segments=False, position_offset=info.pad_id + 1)
    fixed = [val_batches[k] for k in eval_keys(len(val), spec["eval_sequences"], 32, 0, 1)]
    model_section = read_json_config(ROOT / "configs" / "tiny.json")["model"]
    set_seed(seed)
    model = RobertaForMaskedLM(hf_config(ModelConfig(**model_section), info, train.seq_len))
    curve, eval_seconds = [], 0.0

    def evaluate(step: int) -> None:
        nonlocal eval_seconds
        started = time.time()
        model.eval()
        total = count = 0.0
        with torch.no_grad():
            for batch in fixed:
                masked = int((batch["labels"] != -100).sum())
                total += model(input_ids=batch["input_ids"], labels=batch["labels"]).loss.item() * masked
                count += masked
        model.train()
        curve.append({"step": step, "seconds": started - launched - eval_seconds, "loss": total / count})
        eval_seconds += time.time() - started

    class EvalAndCap(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % spec["eval_every"] == 0:
                evaluate(state.global_step)
            if time.time() - launched > cap:
                control.should_training_stop = True

        def on_train_end(self, args, state, control, **kwargs):
            if not curve or curve[-1]["step"] != state.global_step:
                evaluate(state.global_step)

    args = TrainingArguments(
        output_dir=spec["out"], per_device_train_batch_size=8, num_train_epochs=3, learning_rate=5e-5,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, lr_scheduler_type="linear",
        warmup_steps=0, max_grad_norm=1.0, logging_steps=10**9, save_strategy="no", report_to="none",
        dataloader_num_workers=0, use_cpu=True, seed=seed, data_seed=seed)
    trainer = Trainer(model=model, args=args, train_dataset=Rows(),
                      data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15),
                      callbacks=[EvalAndCap()])
    trainer.train()
    Path(spec["result"]).write_text(json.dumps({"curve": curve, "steps": trainer.state.global_step,
                                                "batch": 8}))


def prepare_data(out: Path, env: dict) -> tuple[Path, Path]:
    """Tokenizer and shards in `out`, made once (the shard stage skips a completed folder)."""
    py = sys.executable
    tokenizer, shards = out / "tokenizer", out / "shards"
    if not (tokenizer / "tokenizer.json").exists():
        subprocess.run([py, "data_prep/train_tokenizer.py", "--input", str(CORPUS), "--type", "bpe", "--vocab-size",
                        "16000", "--model-max-length", "128", "--out", str(tokenizer)], cwd=ROOT, env=env, check=True)
    if not (shards / "index.json").exists():
        subprocess.run([py, "data_prep/shard.py", "--input", str(CORPUS), "--tokenizer", str(tokenizer), "--seq-len",
                        "128", "--val-fraction", "0.01", "--out", str(shards), "--quiet"], cwd=ROOT, env=env,
                       check=True)
    return tokenizer, shards


def run_capped(cmd: list[str], env: dict, deadline: float, log: Path) -> None:
    """Run `cmd` until it ends or `deadline` (unix time) passes; then SIGTERM it (it stops after the step).

    The signal goes to the launched process only: the trainer (or torchrun, which passes it on to its
    ranks) shuts its DataLoader workers down itself; signalling them too would crash the rank.
    """
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return  # stopped at the cap: what it logged until then is the result
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])}… failed ({proc.returncode}); see {log}")


def run_one(recipe: str, seed: int, a, tokenizer: Path, shards: Path, overrides: list[str]) -> dict:
    """One run of `recipe` under `seed`: its evaluation curve, steps, batch and the load averages around it."""
    from pipeline.common.config_tree import read_json_config
    from pipeline.tracking.loss_curve import EvalPoint, curve_from_metrics

    folder = a.out / "runs" / f"{recipe}-seed{seed}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cache = a.out / "token_cache"
    load_before = os.getloadavg()
    launched = time.time()
    deadline = launched + 60 * a.max_minutes
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    if recipe == "hf":
        spec = {"launched_at": launched, "max_minutes": a.max_minutes, "seed": seed, "tokenizer": str(tokenizer),
                "shards": str(shards), "cache_dir": str(cache), "eval_sequences": a.eval_sequences,
                "eval_every": max(1, a.eval_every_sequences // 8), "out": str(folder / "trainer"),
                "result": str(folder / "result.json")}
        env["OMP_NUM_THREADS"] = str(a.threads)
        # The worker stops itself at the cap (after the step); the deadline here is a backstop.
        run_capped([sys.executable, __file__, "--hf-worker", json.dumps(spec)], env, deadline + 300,
                   folder / "log.txt")
        result = json.loads((folder / "result.json").read_text())
        curve, steps, batch = [EvalPoint(**p) for p in result["curve"]], result["steps"], result["batch"]
    else:
        config, ranks = RECIPES[recipe]
        batch = read_json_config(ROOT / config)["train"]["global_batch_size"]
        sets = [f"data.shards={shards}", f"data.tokenizer={tokenizer}", f"data.cache_dir={cache}",
                f"train.output_dir={folder}", f"train.seed={seed}", "train.log_every=1", "train.export=false",
                f"train.eval_every={max(1, a.eval_every_sequences // batch)}",
                f"train.eval_sequences={a.eval_sequences}", "checkpoint.every=1000000000", "checkpoint.resume=never",
                "tracking.enabled=false"]
        if recipe == "tiny":  # the budget recipe's horizon, in sequences
            budget = read_json_config(ROOT / RECIPES["budget"][0])["train"]
            sets.append(f"train.max_steps={budget['max_steps'] * budget['global_batch_size'] // batch}")
        sets += overrides
        args = [x for s in sets for x in ("--set", s)]
        env["OMP_NUM_THREADS"] = str(max(1, a.threads // ranks))
        launcher = [sys.executable] if ranks == 1 else [sys.executable, "-m", "torch.distributed.run",
                                                         "--nproc_per_node", str(ranks)]
        run_capped([*launcher, "launchers/pretrain.py", "--config", config, *args], env, deadline, folder / "log.txt")
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        curve = curve_from_metrics(records, launched)
        steps = max((r["step"] for r in records if "train/loss" in r), default=0)
    return {"recipe": recipe, "seed": seed, "steps": steps, "batch": batch,
            "wall_seconds": round(time.time() - launched, 1), "load_before": load_before,
            "load_after": os.getloadavg(), "overrides": overrides,
            "curve": [vars(p) for p in curve]}


def summarise(runs: list[dict], thresholds: list[float], max_minutes: float,
              entropy: float | None = None) -> tuple[dict, str, list[dict]]:
    """Medians over seeds per recipe and threshold (an unreached one counts as infinitely late), the table, its rows.

    `entropy`: the validation tokens' unigram entropy (the plateau's level), printed beside each final loss.
    """
    from pipeline.pretrain.plateau import beside_plateau
    from pipeline.tracking.loss_curve import EvalPoint, first_crossing

    summary: dict = {}
    for run in runs:
        curve = [EvalPoint(**p) for p in run["curve"]]
        row = summary.setdefault(run["recipe"], {"seeds": [], "final_loss": [], "steps": [], "batch": run["batch"],
                                                 **{str(t): [] for t in thresholds}})
        row["seeds"].append(run["seed"])
        row["final_loss"].append(curve[-1].loss if curve else None)
        row["steps"].append(run["steps"])
        for t in thresholds:
            hit = first_crossing(curve, t)
            row[str(t)].append(None if hit is None else {"step": hit.step, "seconds": hit.seconds})
    header = " | ".join(f"to {t} nats: steps, min (reached)" for t in thresholds)
    lines = [f"| recipe | batch | seeds | {header} | final val loss (median) | steps run (median) |",
             "|---|---|---|" + "---|" * len(thresholds) + "---|---|"]
    rows = []
    for name, row in summary.items():
        cells = []
        for t in thresholds:
            hits = row[str(t)]
            seconds = statistics.median([h["seconds"] if h else float("inf") for h in hits])
            step = statistics.median([h["step"] if h else float("inf") for h in hits])
            reached = sum(h is not None for h in hits)
            row[f"median_{t}"] = None if seconds == float("inf") else {"step": step, "seconds": seconds}
            cells.append(f"not reached in {max_minutes:g} min ({reached}/{len(hits)})" if seconds == float("inf")
                         else f"{step:,.0f}, {seconds / 60:.2f} ({reached}/{len(hits)})")
        finals = [x for x in row["final_loss"] if x is not None]
        lines.append(f"| {name} | {row['batch']} | {','.join(map(str, row['seeds']))} | " + " | ".join(cells)
                     + f" | {beside_plateau(statistics.median(finals), entropy)} | "
                     f"{statistics.median(row['steps']):,.0f} |")
        rows.append({"recipe": name, "batch": row["batch"], "seeds": ",".join(map(str, row["seeds"])),
                     **{f"to {t} nats: steps, min (reached)": c for t, c in zip(thresholds, cells, strict=True)},
                     "final val loss (median)": beside_plateau(statistics.median(finals), entropy),
                     "steps run (median)": f"{statistics.median(row['steps']):,.0f}"})
    last = str(thresholds[-1])
    if "hf" in summary and "budget" in summary and summary["budget"].get(f"median_{last}"):
        budget = summary["budget"][f"median_{last}"]["seconds"]
        hf = summary["hf"].get(f"median_{last}")
        ratio = f"{hf['seconds'] / budget:.1f}×" if hf else f"> {60 * max_minutes / budget:.1f}× (HF did not reach it)"
        summary["ratio_hf_over_budget"] = ratio
        lines.append(f"\nHF / budget wall time to {last} nats: **{ratio}**")
    elif "hf" in summary and "budget" in summary:
        summary["ratio_hf_over_budget"] = None
        lines.append(f"\nHF / budget wall time to {last} nats: not measurable, the budget recipe did not reach it "
                     f"in {max_minutes:g} min")
    return summary, "\n".join(lines), rows


def target_met(ratio: str) -> bool | None:
    """Whether "N×" meets the 5× target; for "> N× (HF did not reach it)", met if N ≥ 5, else unknown."""
    value = float(ratio.lstrip("> ").split("×")[0])
    return value >= 5 if not ratio.startswith(">") else (True if value >= 5 else None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--recipes", default="budget,tiny,hf", help=f"comma list of {', '.join([*RECIPES, 'hf'])}")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--baseline-seeds", default=None, help="seeds of tiny and hf (default: --seeds), when time is short")
    p.add_argument("--max-minutes", type=float, default=7.0, help="wall-clock cap per run, from its launch")
    p.add_argument("--thresholds", default="6.0,5.0", help="validation MLM losses (nats) to time")
    p.add_argument("--eval-every-sequences", type=int, default=320, help="evaluate every N training sequences")
    p.add_argument("--eval-sequences", type=int, default=128, help="fixed validation sequences per evaluation")
    p.add_argument("--threads", type=int, default=2, help="CPU threads per run (split between ranks)")
    p.add_argument("--set", action="append", default=[], metavar="RECIPE:KEY=VALUE",
                   help="override a key of one recipe's config, e.g. budget:optimizer.lr=0.002")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "budget-time-to-loss")
    p.add_argument("--hf-worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.hf_worker:
        return hf_worker(json.loads(a.hf_worker))
    if not CORPUS.exists():
        raise SystemExit(f"needs {CORPUS}")
    recipes, seeds = a.recipes.split(","), [int(s) for s in a.seeds.split(",")]
    baseline_seeds = [int(s) for s in (a.baseline_seeds or a.seeds).split(",")]
    unknown = [r for r in recipes if r not in (*RECIPES, "hf")]
    bad_sets = [s for s in a.set if ":" not in s or s.split(":", 1)[0] not in RECIPES]
    if unknown or bad_sets:
        raise SystemExit(f"unknown recipes {unknown} or --set without a pipeline recipe prefix {bad_sets}")
    with BenchmarkRecord("budget_time_to_loss", argv=sys.argv) as rec:
        measure(a, recipes, seeds, baseline_seeds, rec)


def measure(a: argparse.Namespace, recipes: list[str], seeds: list[int], baseline_seeds: list[int],
            rec: BenchmarkRecord) -> None:
    thresholds = [float(t) for t in a.thresholds.split(",")]
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    tokenizer, shards = prepare_data(a.out, {**os.environ, "PYTHONPATH": str(ROOT)})
    from pipeline.data.tokenizer import load_tokenizer
    from pipeline.pretrain.plateau import validation_unigram_entropy

    entropy = validation_unigram_entropy(shards, load_tokenizer(tokenizer).all_special_ids)
    print(f"unigram entropy of the validation tokens (the plateau's level): {entropy:.3f} nats", flush=True)
    runs = []
    for recipe in recipes:  # seeds inside recipes: the budget's seeds finish first if time runs short
        overrides = [s.split(":", 1)[1] for s in a.set if s.split(":", 1)[0] == recipe]
        for seed in seeds if recipe == "budget" else baseline_seeds:
            runs.append(run_one(recipe, seed, a, tokenizer, shards, overrides))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "curve"}
                             | {"last_eval": runs[-1]["curve"][-1:] or None}), flush=True)
            (a.out / "results.json").write_text(json.dumps({"runs": runs}, indent=1))
    summary, table, rows = summarise(runs, thresholds, a.max_minutes, entropy)
    summary["unigram_entropy"] = entropy
    loads = [r["load_before"][0] for r in runs] + [r["load_after"][0] for r in runs]
    table += (f"\n\n{len(runs)} runs, cap {a.max_minutes:g} min each, {a.threads} threads; 1-min load average "
              f"{min(loads):.2f}–{max(loads):.2f} around the runs")
    (a.out / "results.json").write_text(json.dumps({"runs": runs, "summary": summary,
                                                    "args": {k: str(v) for k, v in vars(a).items()}}, indent=1))
    (a.out / "table.md").write_text(table + "\n")
    print(table)
    rec.table(f"{len(runs)} runs, cap {a.max_minutes:g} min each, {a.threads} threads; medians over seeds; 1-min load "
              f"average {min(loads):.2f}–{max(loads):.2f} around the runs", rows)
    if "ratio_hf_over_budget" in summary:
        ratio = summary["ratio_hf_over_budget"]
        rec.headline(f"HF ÷ budget wall time to {thresholds[-1]} nats",
                     ratio or "not measurable: the budget recipe did not reach it", target="≥ 5×",
                     met=None if ratio is None else target_met(ratio))


if __name__ == "__main__":
    main()
