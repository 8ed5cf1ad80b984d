"""An export's model card: what the model is, what trained it, what it scores, the proof it loads right, how to load it.

The card is rendered from the folder alone: `config.json` and the record in `pipeline_export.json` (what the
export wrote: the training facts and the equivalence check; `record_scores` adds the cloze and minimal-pair
figures when they are measured later, and renders the card again).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.config.tree import to_dict
from pipeline.common.run_layout import EXPORT_PROVENANCE_FILE
from pipeline.models.card import equivalence_text, figure, table, write_card
from pipeline.pretrain.config import named_corpora
from pipeline.pretrain.export.facts import CheckpointFacts
from pipeline.pretrain.report.plateau import at_mask_rate, metrics_beside_plateau


def write_record_and_card(folder: Path, facts: CheckpointFacts, equivalence: dict[str, Any], tokenizer,
                          parameters: int, shown_as: Path | None = None) -> None:
    """An export's record (`pipeline_export.json`: the checkpoint and pretraining run it came from, what trained it,
    its equivalence check) and the card rendered from it, in `folder`."""
    record = {**provenance(facts), "equivalence": equivalence, "training": training_record(facts, tokenizer,
                                                                                           parameters)}
    write_json_atomic(folder / EXPORT_PROVENANCE_FILE, record)
    write_export_card(folder, record, shown_as=shown_as)


def provenance(facts: CheckpointFacts) -> dict:
    """Where the export came from: the checkpoint (path, step, fingerprint) and its pretraining MLflow run."""
    tracking = facts.run.tracking if facts.run else None
    run = json.loads(tracking.read_text()) if tracking and tracking.exists() else {}
    return {"checkpoint": str(facts.folder.resolve()), "step": facts.step,
            "checkpoint_fingerprint": facts.fingerprint,
            "pretrain_run_id": run.get("run_id"), "tracking_uri": run.get("uri")}


def training_record(facts: CheckpointFacts, tokenizer, parameters: int) -> dict[str, Any]:
    """What the card says of the training, kept in `pipeline_export.json` so the card can be rendered again."""
    c = facts.config
    run_name = c.tracking.run_name or (facts.run.root.resolve().name if facts.run else facts.folder.name)
    return {
        "name": run_name, "architecture": facts.architecture, "parameters": parameters,
        "init_from": c.model.init_from or None, "attn_implementation": c.model.attn_implementation,
        "data": trained_corpora(facts),
        "phases": [{"name": p.name, "shards": ", ".join(s.name for s in named_corpora(p.shards)),
                    "steps_fraction": p.steps_fraction} for p in c.phases],
        "tokenizer": {"kind": type(tokenizer.backend_tokenizer.model).__name__, "vocab_size": len(tokenizer),
                      "mask_token": tokenizer.mask_token},
        "step": facts.step, "max_steps": c.train.max_steps, "samples_consumed": facts.samples_consumed,
        "tokens_seen": facts.tokens_seen, "seq_len": facts.seq_len,
        "global_batch_size": c.train.global_batch_size, "micro_batch_size": c.train.micro_batch_size,
        "precision": facts.precision, "zero_stage": facts.zero_stage, "optimizer": to_dict(c.optimizer),
        "schedule": to_dict(c.schedule), "masking": {"probability": c.masking.probability, "unit": c.masking.unit},
        "validation": facts.validation,
    }


def trained_corpora(facts: CheckpointFacts) -> list[dict[str, Any]]:
    """Each corpus the run trained on, once: `data`'s with their weights, or every phase's (whose weights are the
    phase's own, so none is given for the run)."""
    c = facts.config
    if not c.phases:
        return [{"name": s.name, "path": str(s.path), "weight": s.weight} for s in c.data.corpora()]
    corpora = {s.path: s for p in c.phases for s in named_corpora(p.shards)}
    return [{"name": s.name, "path": str(s.path), "weight": None} for s in corpora.values()]


def record_scores(folder: str | Path, *, cloze: dict | None = None, minimal_pairs: dict | None = None) -> None:
    """Add measured figures to an export's record (the cloze command's `--json`, minimal_pairs' `--out`) and
    render its card again."""
    folder = Path(folder)
    record = json.loads((folder / EXPORT_PROVENANCE_FILE).read_text())
    scores = record.setdefault("scores", {})
    if cloze is not None:
        scores["cloze"] = {k: cloze[k] for k in ("accuracy", "constant_accuracy", "masked", "texts", "mask_rate")}
    if minimal_pairs is not None:
        scores["minimal_pairs"] = {"model": minimal_pairs["model_scores"],
                                   "unigram": minimal_pairs.get("unigram_scores"), "group_by": minimal_pairs.get(
                                       "group_by"), "pairs_file": minimal_pairs.get("pairs_file")}
    write_json_atomic(folder / EXPORT_PROVENANCE_FILE, record)
    if "training" in record:  # an export written before exports held their training record has no card
        write_export_card(folder, record)


def write_export_card(folder: Path, record: dict[str, Any], shown_as: Path | None = None) -> Path:
    """Render the card of the export in `folder` from its record; `shown_as`: the path the card's loading code
    names (the folder's final place, when it is written in a staging folder); default `folder`."""
    config = json.loads((folder / "config.json").read_text())
    t, equivalence = record["training"], record["equivalence"]
    metadata = {"library_name": "transformers", "pipeline_tag": "fill-mask", "base_model": t["init_from"],
                "datasets": [d["name"] for d in t["data"]], "tags": [t["architecture"], "masked-lm",
                                                                      "roberta-pipeline"]}
    continued = f", continued from `{t['init_from']}`" if t["init_from"] else ""
    intro = (f"A {t['architecture']} encoder pretrained by masked language modelling with roberta-pipeline"
             f"{continued}: step {t['step']:,} of {t['max_steps']:,}, from checkpoint `{record['checkpoint']}`.")
    model, training = _model_rows(config, t), _training_rows(t)
    loss_and_tokenizer, loading = _loss_and_tokenizer_text(equivalence), _loading_section(
        shown_as or folder, t["tokenizer"]["mask_token"])
    figures = _figure_rows(t, record.get("scores", {}))
    return write_card(folder, metadata, t["name"], [
        ("About", intro), ("Model", table(("", ""), model)), ("Training", table(("", ""), training)),
        ("Figures", table(("figure", "this model (its baseline)"), figures) + "\n\n" + FIGURES_NOTE),
        ("Equivalence check", equivalence_text(equivalence, "AutoModelForMaskedLM") + loss_and_tokenizer),
        ("How to load", loading)])


def _loss_and_tokenizer_text(equivalence: dict) -> str:
    """The export check's loss and tokenizer figures (exports made before it checked them have none)."""
    loss = equivalence.get("mlm_loss")
    if loss is None:
        return ""
    return (f" The MLM loss on that batch is the same through the training class and this folder "
            f"({loss['reference']:.6g} and {loss['exported']:.6g}, tolerance {loss['tolerance']:.3g}), and its "
            f"tokenizer has the fingerprint of the tokenizer the shards were made with "
            f"(`{equivalence['tokenizer_fingerprint']}`).")


def _model_rows(config: dict, t: dict) -> list[tuple[str, Any]]:
    return [("class", (config.get("architectures") or ["?"])[0]), ("layers", config["num_hidden_layers"]),
            ("hidden size", config["hidden_size"]), ("attention heads", config["num_attention_heads"]),
            ("intermediate size", config["intermediate_size"]), ("parameters", f"{t['parameters']:,}"),
            ("sequence length trained", t["seq_len"]), ("attention (training)", t["attn_implementation"]),
            ("tokenizer", f"{t['tokenizer']['kind']}, vocabulary {t['tokenizer']['vocab_size']:,}")]


def _training_rows(t: dict) -> list[tuple[str, Any]]:
    weights = len(t["data"]) > 1 and all(d["weight"] is not None for d in t["data"])
    data = ", ".join(f"`{d['name']}` ({d['path']}" + (f", weight {d['weight']:g})" if weights else ")")
                     for d in t["data"])
    tokens = "not recorded" if t["tokens_seen"] is None else f"{t['tokens_seen']:,}"
    o, s, m = t["optimizer"], t["schedule"], t["masking"]
    rows = [("data", data), ("tokens seen", f"{tokens} (sequence positions, padding included)"),
            ("sequences seen", f"{t['samples_consumed']:,}"), ("steps", f"{t['step']:,} of {t['max_steps']:,}"),
            ("global batch", f"{t['global_batch_size']} sequences ({t['micro_batch_size']} per micro batch)"),
            ("optimizer", f"{o['name']}, peak LR {o['lr']:g}, betas {tuple(o['betas'])}, weight decay "
                          f"{o['weight_decay']:g}"),
            ("schedule", f"{s['kind']}: warmup {s['warmup_steps']} steps, {s['decay']} decay"),
            ("masking", f"{m['probability']:.0%} of {m['unit']}s"),
            ("precision", f"{t['precision']}, DeepSpeed ZeRO {t['zero_stage']}")]
    if t["phases"]:
        rows.append(("phases", ", ".join(f"{p['name']} ({p['steps_fraction']:g} of the steps, {p['shards']})"
                                         for p in t["phases"])))
    return rows


FIGURES_NOTE = ("A loss at the unigram entropy is what predicting word frequencies alone gives; the margin below it is "
                "what the model learned from context.")


def _figure_rows(t: dict, scores: dict) -> list[tuple[str, str]]:
    """The validation loss beside its plateau, and the cloze and minimal-pair scores beside their baselines."""
    v = t["validation"]
    rows = [(f"validation MLM loss{at_mask_rate(v)} (step {v['step']:,})", metrics_beside_plateau(v)) if v
            else ("validation MLM loss", "not evaluated")]
    if cloze := scores.get("cloze"):
        rows.append(("cloze top-1 accuracy", f"{cloze['accuracy']:.3f} (always the most frequent token: "
                                             f"{cloze['constant_accuracy']:.3f}; {cloze['masked']:,} blanks)"))
    if pairs := scores.get("minimal_pairs"):
        unigram = pairs.get("unigram")
        rows.append(("minimal pairs", f"{pairs['model']['overall']['accuracy']:.3f} (unigram model: "
                                      f"{figure(unigram and unigram['overall']['accuracy'])}; "
                                      f"{pairs['model']['overall']['pairs']:,} pairs)"))
    return rows


def _loading_section(folder: Path, mask: str) -> str:
    return (f"```python\nfrom transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline\n\n"
            f"fill = pipeline(\"fill-mask\", model=\"{folder}\")\nfill(\"Return the {mask} of the list.\")\n"
            f"model = AutoModelForMaskedLM.from_pretrained(\"{folder}\")\n"
            f"tokenizer = AutoTokenizer.from_pretrained(\"{folder}\")\n```\n\n"
            f"It fine-tunes with `roberta-finetune --model {folder}`, and loads in the hub interface with "
            f"`pipeline.hub.Encoder.from_pretrained(\"{folder}\")`.")
