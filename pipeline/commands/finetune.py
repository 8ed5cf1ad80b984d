"""Fine-tune a pretrained encoder on a GLUE, token-tagging or extractive-QA task, and log it to MLflow.

    python launchers/finetune.py --config configs/glue/sst2.json --model runs/default/pretrain/export \\
        [--set key=value ...] [--seeds 1,2,3] [--from-scratch]
        [--sweep train.learning_rate=1e-4,3e-4,1e-3 ...] [--select-fraction 0.1] [--labels-per-class 8,32]
    python launchers/finetune.py --config configs/tasks/ner.json --model ...  (ner pos squad token-custom qa-custom)
    accelerate launch --num_processes 2 launchers/finetune.py --config ...     (several processes)

--model is an HF model folder or hub name (e.g. `roberta-base` when online), or a pretraining
checkpoint / output folder (exported first). --from-scratch trains the same architecture from
random weights: the baseline that shows what pretraining bought. Each seed writes
`<train.output_dir>/seed_N/` (the best epoch's model as an HF folder, metrics.json, history.json,
dev and test predictions — CoNLL files for token tasks, predictions.json for QA — confusion matrix,
and complete.json last: a rerun skips finished seeds);
`<train.output_dir>/metrics.json` holds the median, mean and standard deviation over seeds, and
`best_model.json` points at the best seed's model.

--sweep runs the fair protocol (pipeline/finetune/protocol/sweep.py): every setting of the grid is trained
with the first seed on the training split minus a held-out slice (--select-fraction of it, chosen
by a hash of each example) and scored on that slice; the best setting is then trained over every
seed on the same data and reported on dev. Dev never takes part in the choice.

--labels-per-class 8,32 (with --sweep) adds a label-efficiency curve: the chosen setting retrained
over every seed on 8, then 32, examples of each class (pipeline/finetune/protocol/label_curve.py), reported
on dev beside the full split as `label_curve` in metrics.json.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import sys

from pipeline.common.errors import PipelineError, exit_on_pipeline_error


def parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise PipelineError(f"--seeds {text!r}: expected comma-separated integers, e.g. 1,2,3") from None
    if not seeds:
        raise PipelineError("--seeds: give at least one seed")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="a config file, or a shipped config's name (e.g. sst2, ner)")
    p.add_argument("--model", required=True, help="HF model folder, hub name, or pretraining checkpoint/output folder")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--seeds", default=None, help="comma-separated seeds (default: train.seed)")
    p.add_argument("--from-scratch", action="store_true", help="random initial weights (the no-pretraining baseline)")
    p.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="try each value of a config key (repeatable: the grid of all keys); the setting is chosen "
                        "on a held-out slice of the training split, never on dev")
    p.add_argument("--select-fraction", type=float, default=None,
                   help="with --sweep: the share of the training split held out to choose the setting (default 0.1)")
    p.add_argument("--labels-per-class", default=None, metavar="N1,N2,...",
                   help="with --sweep: also retrain the chosen setting on N examples of each class (classification "
                        "tasks), a label-efficiency curve in metrics.json")
    p.add_argument("--verbose", action="store_true",
                   help="show the frameworks' own logs, warnings and progress bars (default: warnings and up)")
    return p


def build_sweep(args: argparse.Namespace, world_size: int):
    """The `Sweep` of `--sweep` / `--select-fraction` (None without --sweep); every setting's config checked now."""
    from pipeline.finetune.preflight import load_finetune_config
    from pipeline.finetune.protocol.sweep import DEFAULT_SELECT_FRACTION, Setting, Sweep, parse_sweep

    if not args.sweep:
        if args.select_fraction is not None:
            raise PipelineError("--select-fraction: only with --sweep (it holds out the slice that scores settings)")
        return None
    settings = [Setting(overrides, load_finetune_config(args.config_path, [*args.set, *overrides],
                                                        world_size=world_size))
                for overrides in parse_sweep(args.sweep)]
    fraction = DEFAULT_SELECT_FRACTION if args.select_fraction is None else args.select_fraction
    return Sweep(settings, fraction)


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    # At the interpreter's exit, its last garbage collection walks every object still alive (torch's,
    # transformers'): 1.2 s of CPU measured on 2 cores, after the run's files are written and closed. Frozen, they
    # are left to the operating system (gc.freeze: never collected again, so only at exit).
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
    from pipeline.common.config.shipped_configs import find_config
    from pipeline.common.processes.topology import current_topology
    from pipeline.finetune.preflight import load_finetune_config

    topology = current_topology()
    args.config_path = find_config(args.config, "finetune")
    config = load_finetune_config(args.config_path, args.set, world_size=topology.world_size)
    seeds = parse_seeds(args.seeds) if args.seeds else [config.train.seed]
    sweep = build_sweep(args, topology.world_size)
    labels_per_class = None
    if args.labels_per_class is not None:
        from pipeline.finetune.protocol.label_curve import parse_labels_per_class

        if sweep is None:
            raise PipelineError("--labels-per-class: only with --sweep (the selection slice picks each point's best "
                                "epoch; for one fixed setting give --sweep KEY=VALUE)")
        labels_per_class = parse_labels_per_class(args.labels_per_class)
    from pipeline.common.console import quiet_frameworks
    from pipeline.models.precision import bf16_cpu_warning, native_bf16

    slow_bf16 = bf16_cpu_warning(config.train.precision == "bf16", topology.cuda,
                                 topology.cuda or native_bf16(), "--set train.precision=fp32")
    if slow_bf16 and topology.rank == 0:
        print(slow_bf16, file=sys.stderr)

    quiet_frameworks(args.verbose)  # after the config checks: they report in seconds, before any framework loads
    from pipeline.finetune.runner import run_finetuning
    from pipeline.pretrain.export.folder import export_for_loading

    report = run_finetuning(config, args.model, seeds, args.from_scratch, sweep, labels_per_class,
                            exporter=export_for_loading)
    if not topology.is_main:
        return
    headline = {k: round(v, 4) for k, v in report.items() if isinstance(v, float)}
    chosen = {"chosen_setting": report["chosen_setting"]} if sweep else {}
    if "label_curve" in report:
        chosen["label_curve"] = {str(p["labels_per_class"]): round(p["median"], 4) for p in report["label_curve"]}
    print(json.dumps({"task": report["task"], "seeds": seeds, "from_scratch": args.from_scratch, **headline,
                      **chosen}))


if __name__ == "__main__":
    main()
