"""Pretrain an encoder with DeepSpeed from the shards made by data_prep/shard.py.

    deepspeed --num_gpus N launchers/pretrain.py --config configs/large.json [--set key=value ...]
    torchrun --nproc_per_node N -m pipeline.commands.pretrain --config large
    roberta-pretrain --config FILE          (one process; or python launchers/pretrain.py)

`--config` is a JSON file, or the name of a shipped config (`tiny`, `large`, … from configs/).

`--set section.key=value` overrides a config key (the value is read as JSON when it parses, else
as a string), e.g. `--set train.max_steps=100 --set train.zero_stage=3`.
The run resumes by itself from the newest complete checkpoint in train.output_dir; SIGTERM or
SIGUSR1 makes it finish the step, checkpoint and exit 0. `--anneal-from CHECKPOINT --anneal-steps N`
runs only the schedule's decay from a stable-phase checkpoint, into train.output_dir. `--skip-steps A:B`
rolls back past a loss spike: it resumes from the last checkpoint before step A and leaves out the
batches of steps A to B, now and at every later resume (the run's ledger keeps the range); with no kept
checkpoint before A it is refused unless `--restart-from-scratch` (docs/long-runs.md). The run holds its
train.output_dir with the kernel's lock; a file system whose locks do not reach other nodes is refused unless
`--allow-unlocked-folder` (docs/slurm-and-faults.md). `--print-config` prints the run's plan.
"""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.common.errors import PipelineError, exit_on_pipeline_error


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="JSON config file, or a shipped config's name (e.g. tiny)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--anneal-from", metavar="CHECKPOINT",
                   help="run only the schedule's decay from this stable-phase checkpoint (its weights, optimizer and "
                        "data position) into train.output_dir: sets train.anneal_from")
    p.add_argument("--anneal-steps", type=int, metavar="N", help="the decay's steps: sets train.anneal_steps")
    p.add_argument("--skip-steps", action="append", default=[], metavar="A:B",
                   help="leave out the batches of steps A to B (1-based, inclusive, as the logs number them), resuming "
                        "from the last checkpoint before A: adds to train.skip_steps (repeatable)")
    p.add_argument("--restart-from-scratch", action="store_true",
                   help="let a --skip-steps range that no kept checkpoint precedes restart the run from step 0, "
                        "setting every checkpoint aside (refused without it): sets train.restart_from_scratch")
    p.add_argument("--allow-unlocked-folder", action="store_true",
                   help="go on where train.output_dir's file system cannot lock the run folder across nodes (refused "
                        "without it; nothing then keeps a second run out): sets train.allow_unlocked_folder")
    p.add_argument("--print-config", action="store_true",
                   help="validate, print the run's plan (config, stretches, batches, start, skips) and exit")
    p.add_argument("--verbose", action="store_true",
                   help="show the frameworks' own logs, warnings and progress bars (default: warnings and up)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def overrides(args: argparse.Namespace) -> list[str]:
    """`--set` overrides, then those of the anneal and skip flags (the path as a JSON string, so it stays a
    string; `--skip-steps` adds to the config's own ranges)."""
    out = list(args.set)
    if args.skip_steps:
        out.append(f"train.skip_steps+={json.dumps(args.skip_steps)}")
    if args.restart_from_scratch:
        out.append("train.restart_from_scratch=true")
    if args.allow_unlocked_folder:
        out.append("train.allow_unlocked_folder=true")
    if args.anneal_from is not None:
        out.append(f"train.anneal_from={json.dumps(args.anneal_from)}")
    if args.anneal_steps is not None:
        out.append(f"train.anneal_steps={args.anneal_steps}")
    return out


@exit_on_pipeline_error
def main(argv=None) -> None:
    args = parse_args(argv)
    from pipeline.common.processes.topology import prepare_environment

    topology = prepare_environment()
    from pipeline.common.config.shipped_configs import find_config
    from pipeline.hub.quality_probes import QualityProbes, probe_problems
    from pipeline.pretrain.preflight import prepare_run

    sets = overrides(args)
    try:  # the preflight: the config, this machine, its files, the checkpoint it starts from, and the run's plan
        plan = prepare_run(find_config(args.config, "pretrain"), sets, world_size=topology.world_size,
                           cuda=topology.cuda, file_checks=[probe_problems])
    except PipelineError:
        if topology.rank != 0:  # every rank finds the same problems; one copy is enough
            raise SystemExit(2) from None
        raise
    from pipeline.models.precision import bf16_cpu_warning, native_bf16

    config = plan.config
    slow_bf16 = bf16_cpu_warning(config.train.precision == "bf16", topology.cuda, topology.cuda or native_bf16(),
                                 "--set train.precision=fp32")
    if slow_bf16 and topology.is_main:
        print(slow_bf16, file=sys.stderr)
    if args.print_config:
        print(json.dumps(plan.describe(), indent=2))
        return
    from pipeline.common.console import quiet_frameworks

    quiet_frameworks(args.verbose)  # after the config checks: they report in seconds, before any framework loads
    from pipeline.pretrain.trainer import run_pretraining

    result = run_pretraining(plan, topology, make_probes=QualityProbes)
    # Tear the process group down before the interpreter does: left to exit, gloo's worker threads were
    # once destroyed while joinable on a rank that had finished ("terminate called without an active
    # exception", SIGABRT after a clean run). Only after a finished run: with a lost peer it could block.
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    if topology.is_main and result.export_dir:
        print(f"done: {result.last_step} steps; model exported to {result.export_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
