"""Fine-tuning a task over seeds: an optional sweep's selection first, then every seed not finished yet.

Writes `metrics.json` (medians over seeds, and the chosen setting with its selection score) and
`best_model.json`; the task's MLflow run is the parent of every seed's and trial's run. One seed's
training is `trainer.FineTuner`; choosing a setting on the held-out slice is `sweep.select_setting`.
"""

from __future__ import annotations

import dataclasses
import gc

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.config_tree import flatten, to_dict
from pipeline.common.errors import PipelineError
from pipeline.common.lost_rank import is_lost_peer, lost_rank_error
from pipeline.common.run_kernel import run_tags
from pipeline.finetune.config import FinetuneConfig
from pipeline.finetune.families import task_family
from pipeline.finetune.label_curve import (
    check_curve_task,
    curve_point,
    curve_scoring_interval,
    per_class_sample,
    point_config,
)
from pipeline.finetune.model_card import write_finetune_cards
from pipeline.finetune.model_source import cap_seq_len, resolve_model_source
from pipeline.finetune.outputs import finished_seed, holds_pretrained_seeds, summarize, write_best_model
from pipeline.finetune.select_split import SELECT
from pipeline.finetune.sweep import Sweep, select_setting
from pipeline.finetune.task_data import TaskData
from pipeline.finetune.task_loading import load_task
from pipeline.finetune.trainer import RERUN_HINT, FineTuner, RunInputs, build_accelerator
from pipeline.tracking.sinks import open_metrics


def run_finetuning(config: FinetuneConfig, model: str, seeds: list[int], from_scratch: bool,
                   sweep: Sweep | None = None, labels_per_class: list[int] | None = None) -> dict:
    """Fine-tune every seed not finished yet; write `metrics.json` (medians over seeds) and `best_model.json`.

    With a `sweep`, the setting is chosen first on the selection slice of the training split (see
    `sweep.py`), and the seeds train the chosen setting on the rest of it. With `labels_per_class`, the
    setting is then retrained on that many examples per class (`label_curve.py`).

    A process that loses the others (a dead or stuck process) ends with a `PipelineError` saying so.
    """
    from pipeline.common.topology import current_topology

    topology = current_topology()
    # What is alive now (the frameworks' modules, above all) lives to the end: frozen out of the collector's
    # sight, the full collection after each training (accelerate's `free_memory`) stops re-scanning it.
    gc.collect()
    gc.freeze()
    try:
        return _run_finetuning(config, model, seeds, from_scratch, sweep, labels_per_class or [])
    except Exception as err:
        if topology.world_size == 1 or not is_lost_peer(err):
            raise
        raise lost_rank_error(err, topology.rank, topology.world_size, "while fine-tuning",
                              config.train.collective_timeout_s, RERUN_HINT) from None
    finally:
        gc.unfreeze()


def _run_finetuning(config: FinetuneConfig, model: str, seeds: list[int], from_scratch: bool,
                    sweep: Sweep | None, labels_per_class: list[int]) -> dict:
    from pipeline.common.topology import current_topology

    layout = config.layout
    data = load_task(config)  # every problem with the data surfaces here, before any model is loaded
    if labels_per_class:
        check_curve_task(data)
    family = task_family(data, config.data)
    plan = config.batch_plan(current_topology().world_size)
    accelerator = build_accelerator(config, plan)
    if accelerator.num_processes != plan.world_size:  # the batch plan would split the batch wrongly
        raise PipelineError(f"the launcher started {plan.world_size} processes (WORLD_SIZE) but accelerate sees "
                            f"{accelerator.num_processes}; check `accelerate config` (on CPU: --multi_gpu with gloo)")
    is_main = accelerator.is_main_process
    source = resolve_model_source(model, export_to=layout.source_model, is_main=is_main,
                                  barrier=accelerator.wait_for_everyone,
                                  keep_export=holds_pretrained_seeds(layout.root), what="--model")
    capped = cap_seq_len(config, source.path, say=is_main)
    if capped is not config:  # the families cut their inputs at data.max_seq_len
        config, family = capped, task_family(data, capped.data)
    inputs = RunInputs(source.path)  # one tokenizer and one encoding per split for every training below
    kind = "scratch" if from_scratch else "pretrained"
    parent = open_metrics(is_main, tracking=config.tracking, run_name=f"{config.task_name}-{kind}",
                          tags=run_tags("finetune-summary", plan.world_size, task=config.task_name, seeds=",".join(
                              map(str, seeds)), from_scratch=str(from_scratch).lower(), model=source.path,
                              pretrain_run_id=source.pretrain_run_id,
                              pretrain_checkpoint=source.pretrain_checkpoint),
                          params={**flatten(to_dict(config)), "model": source.path, "seeds": ",".join(map(str, seeds))})
    selection, held_out, protocol, best_metric = None, None, None, family.main_metric
    if sweep is not None:
        selection = select_setting(sweep, data, source, accelerator, seeds[0], from_scratch, parent.run_id, config,
                                   inputs)
        config = dataclasses.replace(selection.chosen.config, train=dataclasses.replace(
            selection.chosen.config.train, output_dir=config.train.output_dir))
        plan = config.batch_plan(plan.world_size)
        accelerator.gradient_accumulation_steps = plan.accumulation
        cut = selection.cut
        held_out, protocol, best_metric = cut.held_out, selection.protocol(), f"select_{family.main_metric}"
        # The family knows the slice by name (token and QA metrics look their split up); the seeds' data does not.
        family = task_family(TaskData(data.spec, cut.fit, {**data.dev, SELECT: cut.held_out}, data.test), config.data)
        data = TaskData(data.spec, cut.fit, data.dev, data.test)
    results: dict[int, dict[str, float]] = {}
    for seed in seeds:
        tuner = FineTuner(config, data, family, source, accelerator, plan, seed, from_scratch, parent.run_id,
                          held_out=held_out, protocol=protocol, inputs=inputs)
        done = finished_seed(layout.seed(seed), tuner.completion_key())
        if done is not None:
            if is_main:
                print(f"{tuner.label}: finished before ({layout.seed(seed).complete}), skipped", flush=True)
            results[seed] = done["metrics"]
            continue
        # The selection seed on the chosen setting repeats the winning trial exactly: it takes that training over.
        trained = selection.trained if selection is not None and seed == selection.seed else None
        if trained is not None and is_main:
            print(f"{tuner.label}: the chosen trial's training (same data, setting and seed), taken over; dev "
                  "scored on its best epoch", flush=True)
        results[seed] = tuner.run(trained).best
    curve = [_curve_point(n, config, data, family, source, accelerator, plan, seeds, from_scratch, parent.run_id,
                          held_out, protocol, inputs) for n in labels_per_class]
    summary = summarize(list(results.values()), data.spec.metrics)
    report = {**summary, "metric": family.main_metric, "task": data.spec.name, "seeds": seeds,
              "from_scratch": from_scratch, "model": source.path,
              "pretrain_run_id": source.pretrain_run_id,
              "per_seed": [{**results[s], "seed": s} for s in seeds]}
    if curve:
        full = curve_point("all", len(data.train), config.train.epochs, [results[s] for s in seeds],
                           family.main_metric)
        report["label_curve"] = [*curve, full]
    if selection is not None:
        report.update(selection_score=selection.score, chosen_setting=selection.chosen.values,
                      selection=selection.record())
    if is_main:
        layout.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(layout.metrics, report)
        # With a sweep the best seed is the best on the slice too: dev only reports.
        write_best_model(layout, results, data.spec.name, best_metric)
        write_finetune_cards(layout.root)  # each kept seed's model card, now that the run's figures exist
        parent.log(summary | ({"selection/score": selection.score} if selection else {}), 0)
        if selection is not None:
            parent.set_tags({"chosen_setting": " ".join(selection.chosen.overrides)})
        parent.log_artifact(layout.metrics)
    parent.close()
    accelerator.wait_for_everyone()
    return report


def _curve_point(per_class: int, config: FinetuneConfig, data: TaskData, family, source, accelerator, plan,
                 seeds: list[int], from_scratch: bool, parent_run_id: str | None, held_out, protocol,
                 inputs: RunInputs) -> dict:
    """Every seed of one label-curve point, trained (or skipped when finished) on its own draw of the examples."""
    results, epochs, examples = [], config.train.epochs, 0
    for seed in seeds:
        train = per_class_sample(data.train, per_class, seed)
        point = point_config(config, per_class, len(data.train), len(train))
        epochs, examples = point.train.epochs, len(train)
        score_every = curve_scoring_interval(epochs, config.train.epochs)
        tuner = FineTuner(point, TaskData(data.spec, train, data.dev, {}), family, source, accelerator, plan, seed,
                          from_scratch, parent_run_id, held_out=held_out,
                          protocol={**(protocol or {}), "labels_per_class": per_class, "score_every": score_every},
                          point=f"{per_class}-per-class", score_every=score_every, inputs=inputs)
        done = finished_seed(point.layout.seed(seed), tuner.completion_key(), needs_model=False)
        if done is not None:
            if accelerator.is_main_process:
                print(f"{tuner.label}: finished before ({point.layout.seed(seed).complete}), skipped", flush=True)
            results.append(done["metrics"])
        else:
            results.append(tuner.run().best)
    return curve_point(per_class, examples, epochs, results, family.main_metric)
