"""A fine-tuned model's card: the task, the protocol that chose and trained it (sweep, seeds), its dev figures beside
the run's seeds and the baselines it ran against, the equivalence check, and how to load it.

Rendered from the output folder's files: each seed's `pipeline_finetune.json`, the run's `metrics.json` and
`best_model.json`, and `baselines.json` when a caller (the main job) names what the run stands beside. The
runner renders the cards when its seeds are done; `record_baselines` renders them again.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.run_layout import FINETUNE_PROVENANCE_FILE, FinetuneLayout
from pipeline.models.card import equivalence_text, figure, table, write_card

PIPELINE_TAGS = {"classification": "text-classification", "regression": "text-classification",
                 "token-classification": "token-classification", "question-answering": "question-answering",
                 "embedding": "sentence-similarity"}
"""The Hugging Face task of each head the fine-tuning families save (`task_type` in the provenance)."""


def record_baselines(root: str | Path, baselines: list[dict[str, Any]]) -> None:
    """Name what a fine-tuning run's figures stand beside (`{"name", "metric", "value", "note"}` each) and render
    its models' cards again."""
    layout = FinetuneLayout(root)
    write_json_atomic(layout.baselines, baselines)
    write_finetune_cards(layout.root)


def write_finetune_cards(root: str | Path) -> list[Path]:
    """The card of every seed of a finished fine-tuning run that kept its model."""
    layout = FinetuneLayout(root)
    report = _read(layout.metrics)
    if not report:
        return []
    best = _read(layout.best_model) or {}
    baselines = _read(layout.baselines) or []
    written = []
    for seed in report.get("seeds", []):
        model = layout.seed(seed).model
        if (model / FINETUNE_PROVENANCE_FILE).is_file():
            written.append(_write_card(model, _read(model / FINETUNE_PROVENANCE_FILE), report, best, baselines))
    return written


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _write_card(model: Path, info: dict, report: dict, best: dict, baselines: list[dict]) -> Path:
    from huggingface_hub import EvalResult

    task, metric = info.get("name") or info["task"], report["metric"]  # the config's name for its task
    config = json.loads((model / "config.json").read_text())
    kind = PIPELINE_TAGS.get(info.get("task_type", "classification"), "text-classification")
    scratch = info.get("from_scratch", False)
    results = [EvalResult(task_type=kind, dataset_type=task, dataset_name=task, dataset_split="validation",
                          metric_type=name, metric_value=float(value))
               for name, value in info["metrics"].items() if isinstance(value, int | float) and "select_" not in name]
    embedding = info.get("task_type") == "embedding"  # a Sentence-Transformers folder
    metadata = {"library_name": "sentence-transformers" if embedding else "transformers", "pipeline_tag": kind,
                "datasets": [task],
                "base_model": None if scratch else info.get("source_model"), "eval_results": results,
                "model_name": f"{task}-seed{info['seed']}",
                "tags": [task, "roberta-pipeline", "from-scratch" if scratch else "fine-tuned"]}
    arch = (config.get("architectures") or ["?"])[0]
    origin = "random weights (the from-scratch arm)" if scratch else f"`{info.get('source_model')}`"
    labels = f"; labels: {', '.join(info['labels'])}" if info.get("labels") else ""
    about = (f"`{arch}` fine-tuned on {task} ({info.get('task_type', 'classification')}{labels}) from {origin}: "
             f"seed {info['seed']} of {len(report['seeds'])}, its best epoch {info.get('best_epoch')}.")
    return write_card(model, metadata, f"{task}, seed {info['seed']}", [
        ("About", about), ("Protocol", _protocol_section(info, report, best, metric)),
        ("Dev figures", _figures_section(info, report, baselines, metric)),
        ("Equivalence check", "" if "equivalence" not in info else info["equivalence"]["summary"] if embedding
         else equivalence_text(info["equivalence"], _auto_class(arch))),
        ("How to load", _embedding_loading(model, info) if embedding else _loading_section(model, arch, kind))])


def _protocol_section(info: dict, report: dict, best: dict, metric: str) -> str:
    seeds = report["seeds"]
    lines = [f"- Seeds: {', '.join(map(str, seeds))}, each trained the same way; the headline is their median "
             f"{metric}. `best_model.json` points at seed {best.get('seed', '?')}."]
    if selection := report.get("selection"):
        grid = "; ".join(" ".join(f"{k}={v}" for k, v in trial["setting"].items()) for trial in selection["trials"])
        chosen = " ".join(f"{k}={v}" for k, v in selection["chosen"].items())
        lines.append(f"- Sweep: each setting ({grid}) trained on the training split minus a held-out slice "
                     f"({selection['held_out']:,} examples, {selection['fraction']:.0%} by content hash) and scored "
                     f"on it by {selection['metric']}; dev chose nothing. Chosen: {chosen} (slice score "
                     f"{selection['score']:.4f}); the seeds then trained it on the other {selection['fit']:,}.")
    else:
        lines.append("- No sweep: the config's setting, the best epoch chosen on dev.")
    if recipe := info.get("recipe"):
        steps = f" (at most {recipe['max_steps']} steps)" if recipe.get("max_steps") else ""
        lines.append(f"- Recipe: learning rate {recipe['learning_rate']:g}, batch {recipe['batch_size']}, "
                     f"{recipe['epochs']} epochs{steps}, warmup {recipe['warmup_ratio']:.0%}, weight decay "
                     f"{recipe['weight_decay']:g}, {recipe['precision']}, at most {info.get('max_seq_len')} tokens.")
    if curve := report.get("label_curve"):
        points = ", ".join(f"{p['labels_per_class']}: {p['median']:.3f}" for p in curve)
        lines.append(f"- Label curve (labelled examples per class: median {metric}): {points}.")
    return "\n".join(lines)


def _figures_section(info: dict, report: dict, baselines: list[dict], metric: str) -> str:
    per_seed = [s[metric] for s in report.get("per_seed", []) if isinstance(s.get(metric), int | float)]
    spread = f" [{min(per_seed):.3f}–{max(per_seed):.3f}]" if len(per_seed) > 1 else ""
    rows = [(f"this model (seed {info['seed']})", metric, figure(info["metrics"].get(metric)), ""),
            (f"median of {len(per_seed)} seeds", metric, f"{statistics.median(per_seed):.3f}{spread}" if per_seed
             else "—", "")]
    rows += [(b["name"], b.get("metric", metric), figure(b.get("value")), b.get("note", "")) for b in baselines]
    return table(("", "metric", "dev", "note"), rows)


def _auto_class(arch: str) -> str:
    from pipeline.finetune.outputs.check import HEAD_AUTO_CLASSES

    return next((auto for head, auto in HEAD_AUTO_CLASSES.items() if arch.endswith(head)), "AutoModel")


def _loading_section(model: Path, arch: str, kind: str) -> str:
    folder = model.resolve()
    return (f"```python\nfrom transformers import {_auto_class(arch)}, AutoTokenizer, pipeline\n\n"
            f"model = {_auto_class(arch)}.from_pretrained(\"{folder}\")\n"
            f"tokenizer = AutoTokenizer.from_pretrained(\"{folder}\")\n"
            f"run = pipeline(\"{kind}\", model=\"{folder}\")\n```\n\n"
            f"Or through the hub interface: `pipeline.hub.Encoder.from_pretrained(\"{folder}\")`.")


def _embedding_loading(model: Path, info: dict) -> str:
    folder = model.resolve()
    if info.get("kind") == "sparse":
        return (f"```python\nfrom sentence_transformers import SparseEncoder\n\n"
                f"model = SparseEncoder(\"{folder}\")  # SPLADE: vocabulary-wide vectors, scored by dot product\n"
                f"vectors = model.encode([\"a first text\", \"a second one\"])\n```\n\n"
                f"Scored offline: `roberta-embed-eval --model {folder} --retrieval FILE` (with the active "
                "dimensions per text).")
    return (f"```python\nfrom sentence_transformers import SentenceTransformer\n\n"
            f"model = SentenceTransformer(\"{folder}\")  # {info.get('pooling', 'mean')} pooling, as the folder says\n"
            f"embeddings = model.encode([\"a first text\", \"a second one\"])\n```\n\n"
            f"Scored offline: `roberta-embed-eval --model {folder} --retrieval FILE`; for serving, "
            f"`roberta-export --onnx {folder}` writes `onnx/model.onnx`, checked against this folder.")
