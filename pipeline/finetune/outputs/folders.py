"""What a fine-tuning run leaves behind: each kept seed's proven model folder, the medians over seeds, the best seed.

    <output_dir>/metrics.json            medians over seeds (plus _mean, _std, per_seed)
    <output_dir>/best_model.json         {"seed", "path": "seed_N/model", "task", "metric", "value"}
    <output_dir>/seed_N/model/           HF folder: weights, config (id2label = the task's classes),
                                         tokenizer, pipeline_finetune.json (provenance)
    <output_dir>/seed_N/complete.json    written last: the seed is finished and a rerun skips it
    <output_dir>/selection.json          with --sweep: every trial's setting and selection score, the choice
    <output_dir>/selection/trial_<id>/seed_N/   a trial's reports and complete.json (no weights)

A training's `complete.json`, which a rerun reads back, is `training.py`'s.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from pipeline.common.atomic_files import staged_folder, write_json_atomic
from pipeline.common.run_layout import FINETUNE_PROVENANCE_FILE as PROVENANCE_FILE
from pipeline.common.run_layout import FinetuneLayout
from pipeline.models.output_agreement import refuse_unless_within


def save_model(folder: Path, model, tokenizer, provenance: dict, *, check_batch: dict, precision: str) -> None:
    """The HF folder (safetensors, config, tokenizer, provenance), swapped into place whole once it is proven:
    `check_batch` through `model` (in memory, in `precision`) and through the saved folder agree, their figures
    recorded in the provenance; beyond the tolerance nothing is written (`saved_model_check.py`)."""
    from pipeline.common.processes.topology import import_deepspeed
    from pipeline.finetune.outputs.check import check_saved_model

    # save_pretrained unwraps the model through accelerate, which imports DeepSpeed wherever it is installed, and
    # DeepSpeed imports mlflow (1-2 s of CPU), unless it was imported the pipeline's way first.
    import_deepspeed()
    with staged_folder(folder) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        agreement = check_saved_model(model, tmp, check_batch, precision)
        refuse_unless_within(agreement, f"saving the fine-tuned model {folder}")
        write_json_atomic(tmp / PROVENANCE_FILE, {**provenance, "equivalence": agreement.record()})


def summarize(results: list[dict[str, float]], metric_names: tuple[str, ...]) -> dict:
    """Median (the headline), mean and standard deviation over seeds, for each metric."""
    summary = {}
    for name in metric_names:
        values = [r[name] for r in results]
        summary[name] = statistics.median(values)
        summary[f"{name}_mean"] = statistics.fmean(values)
        summary[f"{name}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return summary


def write_best_model(layout: FinetuneLayout, results: dict[int, dict[str, float]], task: str, metric: str) -> dict:
    """Point `best_model.json` at the seed with the highest `metric` (the first such seed on a tie)."""
    seed = max(results, key=lambda s: (results[s][metric], -s))
    pointer = {"seed": seed, "path": layout.relative(layout.seed(seed).model), "task": task, "metric": metric,
               "value": results[seed][metric]}
    write_json_atomic(layout.best_model, pointer)
    return pointer
