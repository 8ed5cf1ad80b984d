"""The main job's closing screen: what was built and where, the headline figures, the commands to try next.

It reads only what the stages wrote into the run folder (nothing is recomputed), so any finished
or half-finished run folder can be summarised; a figure whose file is missing says so.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path

from pipeline.common.config.shipped_configs import documented_path, find_config
from pipeline.common.run_layout import MAIN_JOB_RECIPE, MainJobLayout
from pipeline.tracking.finetune_report import read_json
from pipeline.tracking.task_report import minimal_pairs_line, search_lines, task_arms, task_findings, task_rows

SEED_SPREAD = "the main job's recipe over pretraining seeds"
"""Its headline sentence: the recipe's spread over seeds, which the summary and the README quote."""

# A docstring-like sentence for the predict example: the main job's task asks which package a docstring comes from.
PREDICT_EXAMPLE = "Return the canonical path of the specified filename, eliminating any symbolic links."


def last_eval(metrics_jsonl: Path) -> dict | None:
    """The last evaluation record (`eval/mlm_loss`) in a pretraining `metrics.jsonl`, or None."""
    if not metrics_jsonl.is_file():
        return None
    last = None
    for line in metrics_jsonl.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if "eval/mlm_loss" in record:
            last = record
    return last


def recipe_files() -> list[Path]:
    """The shipped configs the seed benchmark judges (`MAIN_JOB_RECIPE`), in its order."""
    return [find_config(name, kind) for name, kind in MAIN_JOB_RECIPE]


def recipe_fingerprint() -> str:
    """sha256 of `recipe_files()`, one after the other: a seed record measured on another recipe is told apart."""
    digest = hashlib.sha256()
    for path in recipe_files():
        digest.update(path.read_bytes())
    return digest.hexdigest()


def seed_spread(record: Path | None) -> str | None:
    """The recipe's spread over pretraining seeds as the seed benchmark's `record` says it (its one owner), or None
    without one; a record measured on another recipe (`recipe_files()`) says so, naming them."""
    data = (read_json(record) if record else None) or {}
    entry = (data.get("results") or {}).get("headline", {}).get(SEED_SPREAD)
    if not isinstance(entry, dict):
        return None
    shown = " or ".join(documented_path(path) for path in recipe_files())
    stale = "" if data.get("recipe_sha256") == recipe_fingerprint() else f" (measured on another recipe: {shown})"
    return f"{entry['value']}{stale}"


def started_seed(config_json: Path) -> int | None:
    """The train.seed a pretraining was started with (its run folder's config.json), None before it started."""
    try:
        return json.loads(config_json.read_text(encoding="utf-8"))["train"]["seed"]
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return None


def _shards_line(index_json: Path) -> str | None:
    try:
        index = json.loads(index_json.read_text(encoding="utf-8"))
        totals, splits = index["totals"], index["splits"]
        return (f"{index['tokenizer']['vocab_size']:,}-token vocabulary; {totals['sequences']:,} sequences × "
                f"{index['seq_len']} tokens ({splits['val']['sequences']:,} for validation)")
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return None


def _token(text: str) -> str:
    """A filling as the summary shows it: quoted, its leading space dropped, but a newline kept visible."""
    return repr(text.strip() or text)


def _around_mask(text: str, width: int = 60) -> str:
    """One line of at most about `width` characters around the `<mask>`, cut with '…'."""
    text = " ".join(text.split())
    at = text.find("<mask>")
    start = max(0, min(at - width // 2, len(text) - width))
    end = start + width
    return ("…" if start > 0 else "") + text[start:end] + ("…" if end < len(text) else "")


def render_summary(out: Path, seconds: float | None = None, predict_cli: bool = True,
                   seed_record: Path | None = None) -> str:
    """The closing screen for the main job's run folder `out`.

    `predict_cli` False adds a note that `launchers/predict.py` is not in this checkout yet. `seed_record`: the seed
    benchmark's record (benchmarks/main_job_seeds.py), which a checkout's launcher names; without it, no spread.
    """
    out = Path(out)
    layout = MainJobLayout(out)
    built: list[tuple[str, str]] = []
    if (line := _shards_line(layout.shards / "index.json")) is not None:
        built.append(("tokenizer/, shards/", line))
    evaluation = last_eval(layout.pretrain.metrics)
    if layout.pretrain.export.is_dir():
        step = f", {evaluation['step']} steps" if evaluation else ""
        built.append(("pretrain/export/", f"the pretrained encoder, an HF model folder{step}"))
    arms = task_arms(layout, "keywords")
    if any(arms.values()):
        built.append(("finetune/", "each task fine-tuned from the export (pretrained/) and from random weights "
                                   "(from-scratch/)"))
    plots = sorted(layout.compare.glob("*.png")) if layout.compare.is_dir() else []
    if plots:
        curve = " and the label-efficiency curve" if layout.label_curve_plot in plots else ""
        built.append(("compare/", f"loss curves of every run{curve} ({len(plots)} plots)"))
    built.append(("mlflow.db, logs/", "every run's parameters and metrics; each stage's full output"))

    figures: list[tuple[str, str]] = []
    if evaluation:
        rate = evaluation.get("eval/mask_rate")  # the validation masking rate (older runs did not log it)
        at_rate = "" if rate is None else f" at {100 * rate:.3g}% masking"
        perplexity = evaluation.get("eval/perplexity", float("nan"))
        figures.append(("validation MLM loss", f"{evaluation['eval/mlm_loss']:.3f}{at_rate} at step "
                                               f"{evaluation['step']} (perplexity {perplexity:.1f})"))
        if "eval/unigram_entropy" in evaluation:
            margin = evaluation["eval/unigram_entropy"] - evaluation["eval/mlm_loss"]
            figures.append(("unigram entropy", f"{evaluation['eval/unigram_entropy']:.3f} (the plateau of a model "
                                               f"that knows only word frequencies): the loss is {margin:.3f} nats "
                                               f"{'below' if margin >= 0 else 'ABOVE'} it"))
    else:
        figures.append(("validation MLM loss", f"not found in {layout.pretrain.metrics}"))
    if (seed := started_seed(layout.pretrain.config)) is not None:
        figures.append(("pretraining seed", f"{seed} (--seed N picks another)"))
    if (spread := seed_spread(seed_record)) is not None:
        figures.append(("the recipe's spread", f"{spread} (benchmarks/main_job_seeds.py)"))
    cloze = read_json(layout.cloze)
    if cloze:
        figures.append(("cloze accuracy", f"{cloze['accuracy']:.3f} top-1 at {cloze['masked']:,} masked validation "
                                          f"tokens (always the most frequent token: {cloze['constant_accuracy']:.3f})"))
    if (pairs := minimal_pairs_line(layout)) is not None:
        figures.append(("minimal pairs", pairs))
    figures += search_lines(layout)

    uri = shlex.quote(layout.tracking_uri)
    keywords_model = shlex.quote(str(layout.finetune("keywords", "pretrained").root))
    predict = f"python launchers/predict.py --model {keywords_model} --task custom {shlex.quote(PREDICT_EXAMPLE)}"
    next_commands = [
        ("browse every run", f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1"),
        ("compare runs", f"python launchers/compare.py --uri {uri} --out {shlex.quote(str(layout.compare))}"),
        ("use the model" + ("" if predict_cli else " (launchers/predict.py is coming)"), predict),
    ]
    took = f" in {seconds:.0f} s" if seconds is not None else ""
    lines = [f"== main job done{took}; everything is in {out}"]
    for title, rows in (("built", built), ("figures", figures)):
        width = max(len(k) for k, _ in rows)
        lines += [title] + [f"  {k:<{width}}  {v}" for k, v in rows]
    rows = task_rows(layout)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    metric = next((r.metric for r in task_arms(layout, "keywords").values() if r), "accuracy")
    lines += [f"tasks (dev {metric}, median of seeds [min–max]; each arm through the protocol)"]
    lines += ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines += [f"  {finding}" for finding in task_findings(layout)]
    if cloze and cloze.get("examples"):
        lines += ["fill-mask on validation text (answer; the model's top 3)"]
        lines += [f"  {_around_mask(e['masked_text'])}  ({_token(e['answer'])}; "
                  + ", ".join(f"{_token(t['token'])} {t['probability']:.2f}" for t in e["top"]) + ")"
                  for e in cloze["examples"]]
    lines += ["next"] + [f"  # {what}\n  {command}" for what, command in next_commands]
    return "\n".join(lines)
