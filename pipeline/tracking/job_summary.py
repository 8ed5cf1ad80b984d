"""The main job's closing screen: what was built and where, the headline figures, the commands to try next.

It reads only what the stages wrote into the run folder (nothing is recomputed), so any finished
or half-finished run folder can be summarised; a figure whose file is missing says so.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.run_layout import MainJobLayout

# A docstring-like sentence for the predict example: the main job's task asks which package a docstring comes from.
PREDICT_EXAMPLE = "Return the canonical path of the specified filename, eliminating any symbolic links."


@dataclass(frozen=True)
class FinetuneHeadline:
    """The main metric of one fine-tuning output folder: its median over seeds."""

    task: str
    metric: str
    median: float
    seeds: int


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


def finetune_headline(metrics_json: Path) -> FinetuneHeadline | None:
    """The task's main metric from a fine-tuning `metrics.json`, or None if the file is missing or unreadable.

    The trainer summarises the task's metrics in the task's order, main metric first, each with
    `_mean` and `_std` beside its median: the first key that has a `_mean` is the main one.
    """
    try:
        report = json.loads(metrics_json.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    metric = next((k for k in report if f"{k}_mean" in report and isinstance(report[k], int | float)), None)
    if metric is None:
        return None
    return FinetuneHeadline(str(report.get("task", "task")), metric, float(report[metric]),
                            len(report.get("seeds") or report.get("per_seed") or []))


def _shards_line(index_json: Path) -> str | None:
    try:
        index = json.loads(index_json.read_text(encoding="utf-8"))
        totals, splits = index["totals"], index["splits"]
        return (f"{index['tokenizer']['vocab_size']:,}-token vocabulary; {totals['sequences']:,} sequences × "
                f"{index['seq_len']} tokens ({splits['val']['sequences']:,} for validation)")
    except (OSError, KeyError, TypeError, json.JSONDecodeError):
        return None


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
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


def _baseline_line(baseline: dict | None, pretrained: FinetuneHeadline, scratch: FinetuneHeadline) -> str | None:
    """The token-count baseline beside the arms, and in plain words when it matches or beats them."""
    if not baseline or not isinstance(baseline.get(pretrained.metric), int | float):
        return None
    value = float(baseline[pretrained.metric])
    line = f"{value:.3f} on the same dev split (a bag of words and a logistic regression)"
    if value >= max(pretrained.median, scratch.median) - 0.01:
        line += ": counting words does as well, so this task cannot show what pretraining buys"
    return line


def render_summary(out: Path, seconds: float | None = None, predict_cli: bool = True) -> str:
    """The closing screen for the main job's run folder `out`.

    `predict_cli` False adds a note that `launchers/predict.py` is not in this checkout yet.
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
    runs = {name: finetune_headline(layout.finetune(folder).metrics)
            for name, folder in (("pretrained", "pretrained"), ("from scratch", "from-scratch"))}
    if any(runs.values()):
        built.append(("finetune/", "fine-tuned from the export (pretrained/) and from random weights (from-scratch/)"))
    plots = sorted(layout.compare.glob("*.png")) if layout.compare.is_dir() else []
    if plots:
        built.append(("compare/", f"loss curves of every run ({len(plots)} plots)"))
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
    cloze = _read_json(layout.cloze)
    if cloze:
        figures.append(("cloze accuracy", f"{cloze['accuracy']:.3f} top-1 at {cloze['masked']:,} masked validation "
                                          f"tokens (always the most frequent token: {cloze['constant_accuracy']:.3f})"))
    pretrained, scratch = runs["pretrained"], runs["from scratch"]
    if pretrained and scratch:
        figures.append((f"{pretrained.metric} ({pretrained.task} task)",
                        f"pretrained {pretrained.median:.3f} vs from scratch {scratch.median:.3f} "
                        f"({pretrained.median - scratch.median:+.3f}; medians of {pretrained.seeds} seeds)"))
        chosen = {n: (_read_json(layout.finetune(f).metrics) or {}).get("chosen_setting")
                  for n, f in (("pretrained", "pretrained"), ("from scratch", "from-scratch"))}
        if any(chosen.values()):
            figures.append(("chosen on held-out train", "; ".join(
                f"{n} {', '.join(f'{k}={v}' for k, v in c.items())}" for n, c in chosen.items() if c)))
        if (line := _baseline_line(_read_json(layout.token_baseline), pretrained, scratch)) is not None:
            figures.append(("token counts (no neural model)", line))
    else:
        missing = [n for n, r in runs.items() if r is None]
        figures.append(("fine-tuning", f"no result for {' and '.join(missing)} in {layout.root / 'finetune'}"))

    uri = shlex.quote(layout.tracking_uri)
    task = pretrained.task if pretrained else "TASK"
    predict = (f"python launchers/predict.py --model {shlex.quote(str(layout.finetune('pretrained').root))} "
               f"--task {task} {shlex.quote(PREDICT_EXAMPLE)}")
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
    if cloze and cloze.get("examples"):
        lines += ["fill-mask on validation text (answer; the model's top 3)"]
        lines += [f"  {_around_mask(e['masked_text'])}  ({_token(e['answer'])}; "
                  + ", ".join(f"{_token(t['token'])} {t['probability']:.2f}" for t in e["top"]) + ")"
                  for e in cloze["examples"]]
    lines += ["next"] + [f"  # {what}\n  {command}" for what, command in next_commands]
    return "\n".join(lines)
