"""Domain-adaptive continued pretraining of a released encoder on IMDB (Gururangan et al. 2020).

    pip install -e .[reference]         # MiniLM-L6-H384-uncased, the default --model
    python benchmarks/continued_pretraining.py [--model DIR] [--minutes 30] [--steps 1500] [--seeds 1,2,3]
        [--max-docs N] [--cloze-texts 256] [--max-train 2000] [--max-eval N] [--out DIR]

1. IMDB (../shared/data/corpus/imdb-reviews.jsonl.zst; the first --max-docs reviews when given) is
   sharded with the model's own WordPiece tokenizer (`data_prep/shard.py`, 128 tokens, full packing).
2. `launchers/pretrain.py` continues pretraining from the model: `model.architecture` bert,
   `model.init_from` the model, `model.next_sentence_loss` false (MLM alone on full rows; a
   headless model gets its MLM head created, tied to the word embeddings), fp32, for --steps
   optimizer steps or --minutes of wall time, whichever ends first (SIGTERM: the run finishes its
   step and checkpoints; its newest checkpoint is what is used).
3. Reported:
   - the validation MLM loss (first and last evaluation) beside the unigram entropy of the
     validation tokens (`pipeline.pretrain.plateau.validation_unigram_entropy`) and the margin below it;
   - the cloze accuracy: top-1 fill-mask accuracy at 15% masked positions of held-out IMDB reviews
     (imdb-test.tsv.zst, never trained on), through the hub interface (`pipeline.hub.cloze`); the
     released model itself has no MLM head, so it has no cloze figure;
   - SST-2 (the first --max-train training examples, --seeds seeds) fine-tuned by
     `launchers/finetune.py` from the adapted model and from the released model, same recipe;
     the median, the spread, and the gain whatever its direction.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from pretraining_gain import pretrain  # the one budgeted pretraining launch
from released_encoder_finetune import SHARED, capped_glue, model_name, pipeline_run
from result_record import BenchmarkRecord

ROOT = Path(__file__).resolve().parents[1]


def run(*cmd) -> None:
    print("$", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, check=True)


def zst_lines(path: Path, limit: int | None):
    """The first `limit` lines (all when None) of a zstd-compressed text file."""
    import zstandard

    with path.open("rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as reader:
        for i, line in enumerate(io.TextIOWrapper(reader, encoding="utf-8")):
            if limit is not None and i >= limit:
                return
            yield line


def pretrain_config(model: str, shards: Path, out: Path, steps: int, lr: float) -> dict:
    """Continued pretraining from `model`: BERT, MLM alone (no NSP), fp32, ZeRO 0."""
    return {
        "model": {"architecture": "bert", "init_from": model, "next_sentence_loss": False},
        "data": {"shards": str(shards), "tokenizer": model, "num_workers": 1},
        "optimizer": {"lr": lr, "weight_decay": 0.01, "betas": [0.9, 0.98], "eps": 1e-6},
        "schedule": {"warmup_steps": max(1, steps // 16), "decay": "linear"},
        "train": {"output_dir": str(out), "max_steps": steps, "global_batch_size": 32, "micro_batch_size": 16,
                  "eval_every": max(1, steps // 6), "eval_sequences": 256, "log_every": 10},
        "checkpoint": {"every": max(1, steps // 6), "keep_last": 1},
        "tracking": {"enabled": False},
    }


def cloze(model: str, texts: list[str]) -> float | None:
    """Top-1 cloze accuracy through the hub interface; None for a model without a trained MLM head."""
    from pipeline.hub import Encoder
    from pipeline.hub.cloze import cloze_accuracy

    encoder = Encoder.from_pretrained(model)
    if encoder.lm_head is None:
        return None
    return cloze_accuracy(encoder, texts, mask_rate=0.15, seed=0, max_texts=len(texts))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="HF folder (default: the [reference] extra's MiniLM)")
    p.add_argument("--minutes", type=float, default=30.0, help="wall-clock budget of pretraining (at most 30)")
    p.add_argument("--steps", type=int, default=1500, help="optimizer steps (the schedule's length)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--max-docs", type=int, default=None, help="shard only the first N IMDB reviews (smoke runs)")
    p.add_argument("--cloze-texts", type=int, default=256, help="held-out IMDB test reviews scored for cloze")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--max-train", type=int, default=2000, help="SST-2 training examples (the first N)")
    p.add_argument("--max-eval", type=int, default=None, help="cap SST-2 dev (smoke runs only)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--ft-lr", type=float, default=5e-5, help="fine-tuning LR")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "continued-pretraining")
    a = p.parse_args()
    sys.path.insert(0, str(ROOT))
    from pipeline.common.reference_model import reference_encoder_folder

    model = a.model or str(reference_encoder_folder())
    corpus, held_out, glue = (SHARED / "corpus" / "imdb-reviews.jsonl.zst", SHARED / "corpus" / "imdb-test.tsv.zst",
                              SHARED / "glue")
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 2))
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    with BenchmarkRecord("continued_pretraining", argv=sys.argv) as rec:
        source = corpus
        if a.max_docs:
            source = out / "imdb-capped.jsonl"
            source.write_text("".join(zst_lines(corpus, a.max_docs)), encoding="utf-8")
        shards = out / "shards"
        run(sys.executable, "data_prep/shard.py", "--input", source, "--tokenizer", model, "--seq-len", 128,
            "--val-fraction", "0.01", "--out", shards, "--overwrite", "--quiet")
        config = out / "pretrain.json"
        config.write_text(json.dumps(pretrain_config(model, shards, out / "pretrain", a.steps, a.lr), indent=2))
        seconds = pretrain([sys.executable, "launchers/pretrain.py", "--config", config], None, min(a.minutes, 30.0))

        from pipeline.pretrain.plateau import plateau_level

        entropy = plateau_level(shards, model)  # the tokenizer the shards were made with
        records = [json.loads(x) for x in (out / "pretrain" / "metrics.jsonl").read_text().splitlines()]
        evals = [r for r in records if "eval/mlm_loss" in r]
        steps_done = max((r["step"] for r in records if "train/loss" in r), default=0)
        reviews = [line.split("\t")[0] for line in list(zst_lines(held_out, a.cloze_texts + 1))[1:]]
        adapted_cloze, released_cloze = cloze(str(out / "pretrain"), reviews), cloze(model, reviews)

        seeds = [int(s) for s in a.seeds.split(",")]
        capped = capped_glue(glue, out / "glue", {"sst2": a.max_train, "rte": 1}, a.max_eval)
        recipe = {"lr": a.ft_lr, "epochs": a.epochs, "batch": 32, "max_seq_len": 128, "warmup_ratio": 0.06,
                  "weight_decay": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "max_grad_norm": 1.0}
        sst2 = {name: [pipeline_run(path, "sst2", capped, seed, recipe, out / "sst2" / name, False) for seed in seeds]
                for name, path in (("adapted", str(out / "pretrain")), ("released", model))}
        median = {name: statistics.median(r["best"] for r in runs) for name, runs in sst2.items()}

        last = evals[-1]["eval/mlm_loss"] if evals else float("nan")
        rec.table(f"continued pretraining of {model_name(model)} on IMDB: {steps_done} of {a.steps} steps × 32 "
                  f"sequences × 128 tokens, LR {a.lr}, fp32, {seconds / 60:.1f} min on {os.cpu_count()} cores", [
                      {"evaluation step": r["step"], "validation MLM loss": f"{r['eval/mlm_loss']:.3f}",
                       "unigram entropy": f"{entropy:.3f}", "margin below": f"{entropy - r['eval/mlm_loss']:+.3f}"}
                      for r in evals])
        rec.table(f"the released model vs the adapted one: cloze top-1 at 15% of {len(reviews)} held-out IMDB "
                  f"reviews; SST-2 dev accuracy from the first {a.max_train} training examples, seeds {a.seeds}, "
                  f"LR {a.ft_lr}, {a.epochs} epochs" + (f", dev capped at {a.max_eval} (smoke)" if a.max_eval else ""),
                  [{"model": name, "cloze top-1": "no MLM head" if score is None else f"{score:.4f}",
                    "SST-2 (median, best epoch)": f"{median[name]:.4f}",
                    "SST-2 spread (min–max)": f"{min(r['best'] for r in sst2[name]):.4f}–"
                                              f"{max(r['best'] for r in sst2[name]):.4f}"}
                   for name, score in (("released", released_cloze), ("adapted", adapted_cloze))])
        rec.headline("validation MLM loss (last) vs unigram entropy", f"{last:.3f} vs {entropy:.3f} nats "
                     f"({entropy - last:+.3f} below)")
        rec.headline("SST-2 gain of the adapted model", f"{100 * (median['adapted'] - median['released']):+.2f} points",
                     target="a gain (> 0)", met=median["adapted"] > median["released"])
        if adapted_cloze is not None:
            rec.headline("cloze top-1 of the adapted model", f"{adapted_cloze:.4f}")
        print(f"\nvalidation MLM loss {last:.3f}, unigram entropy {entropy:.3f} ({entropy - last:+.3f} below); "
              f"cloze top-1 adapted {adapted_cloze}; SST-2 median adapted {median['adapted']:.4f} vs released "
              f"{median['released']:.4f}")


if __name__ == "__main__":
    main()
