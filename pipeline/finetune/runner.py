"""Fine-tuning a task over seeds, as the fair protocol reads: the setting chosen on the held-out slice (with a
sweep), then every seed not finished yet, then the label curve (with `--labels-per-class`), then the report.

Writes `metrics.json` (medians over seeds, and the chosen setting with its selection score) and
`best_model.json`; the task's MLflow run is the parent of every seed's, trial's and curve point's run.
One training is a `training.Training`, trained (or reused when finished) by `training.train_or_reuse`;
choosing a setting on the held-out slice is `sweep.select_setting`; the curve is `label_curve.label_curve`.
"""

from __future__ import annotations

import gc

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.processes.lost_rank import is_lost_peer, lost_rank_error
from pipeline.finetune.config import FinetuneConfig
from pipeline.finetune.families.registry import task_family
from pipeline.finetune.loop.arm import RERUN_HINT, Arm, Training, open_arm
from pipeline.finetune.loop.clock import RunClock, summary_line
from pipeline.finetune.loop.trainer import train_or_reuse
from pipeline.finetune.outputs.card import write_finetune_cards
from pipeline.finetune.outputs.folders import summarize, write_best_model
from pipeline.finetune.protocol.label_curve import check_curve_task, label_curve
from pipeline.finetune.protocol.sweep import Selection, Sweep, select_setting
from pipeline.finetune.task_loading import load_task
from pipeline.models.model_source import Exporter


def run_finetuning(config: FinetuneConfig, model: str, seeds: list[int], from_scratch: bool,
                   sweep: Sweep | None = None, labels_per_class: list[int] | None = None,
                   exporter: Exporter | None = None) -> dict:
    """Fine-tune every seed not finished yet; write `metrics.json` (medians over seeds) and `best_model.json`.

    With a `sweep`, the setting is chosen first on the selection slice of the training split (see
    `sweep.py`), and the seeds train the chosen setting on the rest of it. With `labels_per_class`, the
    setting is then retrained on that many examples per class (`label_curve.py`). A pretraining run or checkpoint
    as `model` is exported by `exporter` (the command hands in pretraining's).

    A process that loses the others (a dead or stuck process) ends with a `PipelineError` saying so.
    """
    from pipeline.common.processes.topology import current_topology

    clock = RunClock()  # what ran before (the process, its imports, the config checks) is its start-up
    topology = current_topology()
    # What is alive now (the frameworks' modules, above all) lives to the end: frozen out of the collector's
    # sight, the full collection after each training (accelerate's `free_memory`) stops re-scanning it.
    gc.collect()
    gc.freeze()
    try:
        return _run_finetuning(config, model, seeds, from_scratch, sweep, labels_per_class or [], clock, exporter)
    except Exception as err:
        if topology.world_size == 1 or not is_lost_peer(err):
            raise
        raise lost_rank_error(err, topology.rank, topology.world_size, "while fine-tuning",
                              config.train.collective_timeout_s, RERUN_HINT) from None
    finally:
        gc.unfreeze()


def _run_finetuning(config: FinetuneConfig, model: str, seeds: list[int], from_scratch: bool,
                    sweep: Sweep | None, labels_per_class: list[int], clock: RunClock,
                    exporter: Exporter | None) -> dict:
    data = load_task(config)  # every problem with the data surfaces here, before any model is loaded
    if labels_per_class:
        check_curve_task(data)
    arm = open_arm(config, model, from_scratch, seeds, clock, exporter)
    if sweep is None:
        selection, training = None, Training(arm.config, data, task_family(data, arm.config.data), arm, seeds[0])
    else:
        selection = select_setting(sweep, data, arm, seeds[0])
        training = selection.seeds_training(data, arm)
    results = {}
    for seed in seeds:
        # The selection seed on the chosen setting repeats the winning trial exactly: it takes that training over.
        takes_over = selection.trained if selection is not None and seed == selection.seed else None
        results[seed] = train_or_reuse(training.for_seed(seed), takes_over).best
    curve = label_curve(training, labels_per_class, seeds, [results[seed] for seed in seeds])
    return _report(arm, training, seeds, results, curve, selection)


def _report(arm: Arm, training: Training, seeds: list[int], results: dict[int, dict], curve: list[dict],
            selection: Selection | None) -> dict:
    """`metrics.json` (medians over seeds, the curve, the selection), `best_model.json`, the seeds' model cards,
    the run's MLflow figures, and where the run's time went (`timings.json`, and one line on screen)."""
    data, metric, layout = training.data, training.family.main_metric, arm.config.layout
    source, parent = arm.source, arm.parent
    summary = summarize(list(results.values()), data.spec.metrics)
    report = {**summary, "metric": metric, "task": data.spec.name, "seeds": seeds, "from_scratch": arm.from_scratch,
              "model": source.path, "pretrain_run_id": source.pretrain_run_id,
              "per_seed": [{**results[seed], "seed": seed} for seed in seeds]}
    if curve:
        report["label_curve"] = curve
    if selection is not None:
        report.update(selection_score=selection.score, chosen_setting=selection.chosen.values,
                      selection=selection.record())
    if arm.is_main:
        layout.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(layout.metrics, report)
        # With a sweep the best seed is the best on the slice too: dev only reports.
        write_best_model(layout, results, data.spec.name, f"select_{metric}" if selection else metric)
        write_finetune_cards(layout.root)  # each kept seed's model card, now that the run's figures exist
        parent.log(summary | ({"selection/score": selection.score} if selection else {}), 0)
        if selection is not None:
            parent.set_tags({"chosen_setting": " ".join(selection.chosen.overrides)})
        parent.log_artifact(layout.metrics)
    with arm.clock.phase("tracking"):
        parent.close()
    arm.processes.wait_for_everyone()
    if arm.is_main:
        print(summary_line(arm.clock.write(layout.timings)), flush=True)
    return report
