"""Token tagging and extractive QA on real data: a pipeline-pretrained encoder vs the same one from scratch.

    python benchmarks/token_and_qa_tasks.py --model runs/default/pretrain/export [--seeds 1,2,3] [--out DIR]

Every run goes through `launchers/finetune.py` with `configs/tasks/<task>.json`, as a user runs it:
- CoNLL-2003 NER (../shared/data/ner/conll2003): the first `--ner-train` training sentences; the
  full dev (eng.testa) and test (eng.testb) sets; entity micro F1.
- UD English-EWT UPOS (../shared/data/pos/ud_en_ewt): the first `--pos-train` training sentences;
  full dev and test; word accuracy.
- SQuAD v1.1 dev (../shared/data/qa/squad_v1.1), split by article (questions on one paragraph
  share answers, so never by question): the last `--squad-eval-articles` articles are the
  evaluation part, the first `--squad-train` questions of the others the training part; EM and F1.
Each task is fine-tuned from `--model` and from scratch (same architecture, recipe, seeds).

Then every metric is recomputed from the saved prediction files alone, with code independent of
the pipeline's: seqeval on the CoNLL files (dev and test), word accuracy on the POS CoNLL files,
and the official SQuAD v1.1 evaluation (its normalisation, copied below) on `predictions.json`.
The benchmark fails unless every recomputed value equals the reported one exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import string
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from result_record import BenchmarkRecord

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
TASKS = ("ner", "pos", "squad")
HEADLINE = {"ner": "f1", "pos": "accuracy", "squad": "f1"}


def run(*cmd, env=None) -> None:
    print("$", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env, check=True)


def first_sentences(path: Path, n: int | None, out: Path) -> Path:
    """The first `n` blank-line-separated sentences of a CoNLL / CoNLL-U file (all of it when n is None)."""
    if n is None:
        return path
    blocks = [b for b in path.read_text(encoding="utf-8").split("\n\n") if b.strip()]
    out.write_text("\n\n".join(blocks[:n]) + "\n\n", encoding="utf-8")
    return out


def squad_split(out: Path, eval_articles: int) -> tuple[Path, Path]:
    """SQuAD v1.1 dev → a training part and an evaluation part, whole articles each."""
    import zstandard

    raw = zstandard.ZstdDecompressor().stream_reader(open(SHARED / "qa/squad_v1.1/dev-v1.1.json.zst", "rb")).read()
    squad = json.loads(raw)
    articles = squad["data"]
    parts = {"train": articles[:-eval_articles], "eval": articles[-eval_articles:]}
    paths = []
    for name, part in parts.items():
        path = out / f"squad-{name}.json"
        path.write_text(json.dumps({"version": squad["version"], "data": part}))
        paths.append(path)
    return paths[0], paths[1]


# ----------------------------------------------------------------------------- independent re-scoring


def read_conll(path: Path) -> tuple[list[list[str]], list[list[str]]]:
    gold, predicted, g, p = [], [], [], []
    for line in path.read_text(encoding="utf-8").split("\n"):
        if line.strip():
            _, a, b = line.split(" ")
            g.append(a)
            p.append(b)
        elif g:
            gold.append(g)
            predicted.append(p)
            g, p = [], []
    return gold, predicted


def official_squad(predictions: dict[str, str], dataset: list[dict]) -> dict[str, float]:
    """The official SQuAD v1.1 evaluate-v1.1.py, restated: normalise, EM and token F1, max over answers."""
    def normalize(s: str) -> str:
        s = s.lower()
        s = "".join(ch for ch in s if ch not in set(string.punctuation))
        s = re.sub(r"\b(a|an|the)\b", " ", s)
        return " ".join(s.split())

    def f1(prediction: str, truth: str) -> float:
        p, t = normalize(prediction).split(), normalize(truth).split()
        same = sum((Counter(p) & Counter(t)).values())
        if same == 0:
            return 0
        precision, recall = 1.0 * same / len(p), 1.0 * same / len(t)
        return (2 * precision * recall) / (precision + recall)

    em = total_f1 = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                truths = [a["text"] for a in qa["answers"]]
                prediction = predictions[qa["id"]]
                em += max(float(normalize(prediction) == normalize(t)) for t in truths)
                total_f1 += max(f1(prediction, t) for t in truths)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * total_f1 / total}


def recompute(task: str, seed_dir: Path, squad_eval: Path) -> dict[str, tuple[float, float]]:
    """{metric: (reported, recomputed)} for one seed, from its prediction files alone."""
    from seqeval.metrics import f1_score

    reported = json.loads((seed_dir / "metrics.json").read_text())
    checks = {}
    if task == "squad":
        predictions = json.loads((seed_dir / "predictions.json").read_text())
        scores = official_squad(predictions, json.loads(squad_eval.read_text())["data"])
        for key in ("exact_match", "f1"):
            checks[f"dev_{key}"] = (reported[key], scores[key])
        return checks
    test = json.loads((seed_dir / "test_metrics.json").read_text())
    for split, numbers in (("dev", reported), ("test", test)):
        gold, predicted = read_conll(seed_dir / f"{split}_predictions.conll")
        if task == "ner":
            checks[f"{split}_f1"] = (numbers["f1"], f1_score(gold, predicted))
        words = [(g, p) for gs, ps in zip(gold, predicted, strict=True) for g, p in zip(gs, ps, strict=True)]
        checks[f"{split}_accuracy"] = (numbers["accuracy"], sum(g == p for g, p in words) / len(words))
    return checks


# ----------------------------------------------------------------------------- the runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_model = ROOT / "runs" / "default" / "pretrain" / "export"
    p.add_argument("--model", type=Path, default=default_model, help="a pretraining export (HF folder)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--ner-train", type=int, default=2000, help="CoNLL-2003 training sentences used")
    p.add_argument("--pos-train", type=int, default=2000, help="UD EWT training sentences used")
    p.add_argument("--squad-train", type=int, default=2000, help="questions of the training articles used")
    p.add_argument("--squad-eval-articles", type=int, default=6, help="last articles of SQuAD dev held out")
    p.add_argument("--eval-sentences", type=int, default=None,
                   help="score NER/POS on the first N dev and test sentences only (default: all)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-4, help="fine-tuning learning rate (small encoders want more)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=128, help="≤ the model's positions")
    p.add_argument("--doc-stride", type=int, default=32, help="QA window overlap at this max_seq_len")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "token-and-qa-tasks")
    a = p.parse_args()
    if not (a.model / "config.json").is_file():
        raise SystemExit(f"--model {a.model}: no HF model folder there (pretrain and export one first)")
    # A run of some tasks only is a variant of the result (token_and_qa_tasks.ner, ...), not a replacement.
    variant = "" if a.tasks == ",".join(TASKS) else "." + a.tasks.replace(",", "+")
    with BenchmarkRecord(f"token_and_qa_tasks{variant}", argv=sys.argv) as rec:
        measure(a, rec)


def measure(a: argparse.Namespace, rec: BenchmarkRecord) -> None:
    out = a.out.resolve()
    (out / "data").mkdir(parents=True, exist_ok=True)
    squad_train, squad_eval = squad_split(out / "data", a.squad_eval_articles)
    ner, pos = SHARED / "ner/conll2003", SHARED / "pos/ud_en_ewt"
    data, n = out / "data", a.eval_sentences
    files = {
        "ner": (ner / "eng.train", first_sentences(ner / "eng.testa", n, data / "ner-dev.conll"),
                first_sentences(ner / "eng.testb", n, data / "ner-test.conll"), a.ner_train),
        "pos": (pos / "en_ewt-ud-train.conllu.zst",
                first_sentences(pos / "en_ewt-ud-dev.conllu", n, data / "dev.conllu"),
                first_sentences(pos / "en_ewt-ud-test.conllu", n, data / "test.conllu"), a.pos_train),
        "squad": (squad_train, squad_eval, None, a.squad_train),
    }
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    timings, results = {}, {}
    for task in a.tasks.split(","):
        train, dev, test, n = files[task]
        for scratch in (False, True):
            folder = out / "finetune" / f"{task}-{'scratch' if scratch else 'pretrained'}"
            started = time.monotonic()
            run(sys.executable, "launchers/finetune.py", "--config", f"configs/tasks/{task}.json", "--model", a.model,
                "--seeds", a.seeds, *(["--from-scratch"] if scratch else []),
                "--set", f"data.train_file={train}", "--set", f"data.validation_file={dev}",
                "--set", f"data.test_file={json.dumps(str(test)) if test else 'null'}",
                "--set", f"data.max_train_examples={n}", "--set", f"data.max_seq_len={a.max_seq_len}",
                *(["--set", f"data.doc_stride={a.doc_stride}"] if task == "squad" else []),
                "--set", f"train.epochs={a.epochs}", "--set", f"train.learning_rate={a.lr}",
                "--set", f"train.batch_size={a.batch_size}", "--set", f"train.output_dir={folder}",
                "--set", f"tracking.uri=sqlite:///{out / 'mlflow.db'}", "--set", "tracking.experiment=tasks", env=env)
            timings[(task, scratch)] = time.monotonic() - started
            seeds = [int(s) for s in a.seeds.split(",")]
            per_seed = []
            for seed in seeds:
                checks = recompute(task, folder / f"seed_{seed}", squad_eval)
                bad = {k: v for k, v in checks.items() if v[0] != v[1]}
                if bad:
                    raise SystemExit(f"{folder}/seed_{seed}: recomputed metrics differ from the reported ones: {bad}")
                per_seed.append({k: v[1] for k, v in checks.items()})
            results[(task, scratch)] = per_seed
            print(f"{task} {'scratch' if scratch else 'pretrained'}: every metric of {len(seeds)} seeds recomputed "
                  "from the prediction files equals the reported value", flush=True)
    report(results, timings, a, out, rec)


def report(results: dict, timings: dict, a, out: Path, rec: BenchmarkRecord) -> None:
    lines = ["| task | metric | pretrained | from scratch | gain | minutes (3 seeds, both) |",
             "|---|---|---|---|---|---|"]
    summary, rows = {}, []
    for task in a.tasks.split(","):
        keys = list(results[(task, False)][0])
        for key in keys:
            cells = []
            for scratch in (False, True):
                values = [r[key] for r in results[(task, scratch)]]
                scale = 1 if task == "squad" else 100  # SQuAD's official numbers are already percentages
                median = statistics.median(values) * scale
                spread = statistics.stdev(values) * scale if len(values) > 1 else 0.0
                cells.append((median, spread))
                summary[f"{task}/{key}/{'scratch' if scratch else 'pretrained'}"] = {"median": median, "std": spread,
                                                                                       "values": values}
            minutes = (timings[(task, False)] + timings[(task, True)]) / 60
            lines.append(f"| {task} | {key} | {cells[0][0]:.1f} ± {cells[0][1]:.1f} | {cells[1][0]:.1f} ± "
                         f"{cells[1][1]:.1f} | {cells[0][0] - cells[1][0]:+.1f} | {minutes:.1f} |")
            rows.append({"task": task, "metric": key, "pretrained": f"{cells[0][0]:.1f} ± {cells[0][1]:.1f}",
                         "from scratch": f"{cells[1][0]:.1f} ± {cells[1][1]:.1f}",
                         "gain": f"{cells[0][0] - cells[1][0]:+.1f}", "minutes (both models)": f"{minutes:.1f}"})
    table = "\n".join(lines)
    print(table)
    (out / "results.md").write_text(table + "\n")
    (out / "results.json").write_text(json.dumps({"settings": {k: str(v) for k, v in vars(a).items()},
                                                  "results": summary}, indent=2))
    rec.table(f"from {a.model.name} and from scratch, seeds {a.seeds}, median ± sd; {a.epochs} epochs, LR {a.lr}, "
              f"batch {a.batch_size}, max_seq_len {a.max_seq_len}", rows)


if __name__ == "__main__":
    main()
