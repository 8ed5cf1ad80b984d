"""Submit a pipeline job to SLURM: render the sbatch script from the config and flags, then sbatch it.

    python launchers/submit.py pretrain --config configs/large.json --nodes 4 --gpus-per-node 8 \\
        --time 24:00:00 --partition P [--account A] [--set key=value ...] [--dry-run]
    python launchers/submit.py finetune --config configs/glue/sst2.json --model runs/x/export [--seeds 1,2,3]
    python launchers/submit.py shard --config configs/shard/example.json --parts 16

Prints the job id (for `shard`: the array job's, then the combine job's; with `"dedup": "exact"`
a hashing array job comes first). `--dry-run` prints the
rendered script(s) instead. The config is validated before anything is submitted. On nodes
without GPUs (`--gpus-per-node 0`) each node runs `--procs-per-node` CPU processes (default 2,
each with an equal share of the node's cores: with gloo, a few processes with several threads
each beat one process per core). Scripts and logs go to `<output folder>/slurm/`. The jobs run in
the folder this command ran in, and start each stage by module (`python -m pipeline.commands.…`);
`--config` takes a file or a shipped config's name. The sbatch templates are pipeline/slurm/.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import shlex
import subprocess
import sys
import time
from pathlib import Path

from pipeline.common.config.shipped_configs import find_config
from pipeline.common.errors import PipelineError, exit_on_pipeline_error
from pipeline.common.processes.stage_commands import stage_env

DEFAULT_CPU_PROCS = 2


def templates() -> Path:
    """The sbatch templates and the shell scripts they run, shipped in the package (pipeline/slurm/)."""
    return Path(importlib.util.find_spec("pipeline").origin).parent / "slurm"


def render(template: str, values: dict[str, object]) -> str:
    text = (templates() / template).read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    if "{{" in text:
        raise PipelineError(f"template {template}: unfilled placeholder near {text[text.index('{{'):][:30]!r}")
    return "\n".join(line for line in text.splitlines() if line.strip() != "") + "\n"


def common_values(args, job_name: str, log_dir: Path) -> dict[str, object]:
    return {
        "job_name": job_name, "time": args.time, "log_dir": log_dir.resolve(),
        "workdir": shlex.quote(str(Path.cwd())), "slurm_dir": shlex.quote(str(templates())),
        "pythonpath_line": pythonpath_line(),
        "python_bin": Path(sys.executable).parent,
        "partition_line": f"#SBATCH --partition={args.partition}" if args.partition else "",
        "account_line": f"#SBATCH --account={args.account}" if args.account else "",
        "gpu_line": f"#SBATCH --gpus-per-node={args.gpus_per_node}" if args.gpus_per_node else "",
    }


def pythonpath_line() -> str:
    """Where a checkout's `pipeline` is not installed, the jobs' PYTHONPATH names it, as for a local stage."""
    path = stage_env({}).get("PYTHONPATH")
    return f"export PYTHONPATH={shlex.quote(path)}${{PYTHONPATH:+:$PYTHONPATH}}" if path else ""


def procs_per_node(args) -> int:
    return args.gpus_per_node or args.procs_per_node or DEFAULT_CPU_PROCS


def sets(overrides: list[str]) -> str:
    return " ".join(f"--set {shlex.quote(s)}" for s in overrides)


def pretrain_scripts(args) -> tuple[Path, list[str]]:
    from pipeline.hub.quality_probes import probe_problems
    from pipeline.pretrain.preflight import load_pretrain_config

    procs = procs_per_node(args)
    config_file = find_config(args.config, "pretrain")
    config = load_pretrain_config(config_file, args.set, world_size=args.nodes * procs, cuda=args.gpus_per_node > 0,
                                  check_files=not args.no_check_files, file_checks=[probe_problems])
    out = config.layout.root.resolve()
    values = common_values(args, args.job_name or f"pretrain-{out.name}", out / "slurm")
    values.update(nodes=args.nodes, procs=procs, signal_seconds=args.signal_seconds,
                  config=shlex.quote(str(config_file.resolve())), sets=sets(args.set))
    return out / "slurm", [render("pretrain.sbatch", values)]


def finetune_scripts(args) -> tuple[Path, list[str]]:
    from pipeline.finetune.preflight import load_finetune_config

    if not args.model:
        raise PipelineError("finetune: --model is required (an export folder, a checkpoint, or a hub name)")
    config_file = find_config(args.config, "finetune")
    config = load_finetune_config(config_file, args.set, world_size=procs_per_node(args),  # one node
                                  check_files=not args.no_check_files)
    out = config.output_dir.resolve()
    extra = [f"--model {shlex.quote(str(args.model))}", sets(args.set)]
    if args.seeds:
        extra.append(f"--seeds {shlex.quote(args.seeds)}")
    if args.from_scratch:
        extra.append("--from-scratch")
    values = common_values(args, args.job_name or f"finetune-{out.name}", out / "slurm")
    values.update(procs=procs_per_node(args), config=shlex.quote(str(config_file.resolve())),
                  args=" ".join(e for e in extra if e))
    return out / "slurm", [render("finetune.sbatch", values)]


def shard_scripts(args) -> tuple[Path, list[str]]:
    """The shard config is the flags of data_prep/shard.py as JSON keys, e.g. {"input": [...], "seq_len": 512}."""
    from pipeline.common.config.cli_options import config_argv, options_from_config
    from pipeline.common.config.tree import apply_overrides, read_json_config
    from pipeline.data.shards.options import ShardOptions

    config_file = find_config(args.config, "shard")
    data = apply_overrides(read_json_config(config_file), args.set)
    # Each array task gets its own --rank and --world-size from the sbatch script.
    options = options_from_config(ShardOptions, data, str(config_file), exclude=("rank", "world_size"))
    options = dataclasses.replace(options, rank=0, world_size=args.parts)
    if problems := options.problems():
        raise PipelineError(f"config {config_file}: " + "; ".join(problems))
    out = Path(options.out).resolve()
    values = common_values(args, args.job_name or f"shard-{out.name}", out.parent / f"{out.name}-slurm")
    values.update(parts=args.parts, last_part=args.parts - 1, flags=shlex.join(config_argv(ShardOptions, data)),
                  out=shlex.quote(str(out)))
    templates = ["shard.sbatch", "shard_combine.sbatch"]
    if options.dedup == "exact":  # every rank's hashes first, so that each task reads only its own piece
        templates.insert(0, "shard_hashes.sbatch")
    return out.parent / f"{out.name}-slurm", [render(t, values) for t in templates]


def sbatch(script: Path, *extra: str) -> str:
    try:
        proc = subprocess.run(["sbatch", "--parsable", *extra, str(script)], capture_output=True, text=True)
    except FileNotFoundError:
        raise PipelineError("sbatch not found: run this on a SLURM login node (or use --dry-run)") from None
    if proc.returncode != 0:
        raise PipelineError(f"sbatch {script} failed: {proc.stderr.strip()}")
    return proc.stdout.strip().split(";")[0]


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("job", choices=("pretrain", "finetune", "shard"))
    p.add_argument("--config", required=True, help="a config file, or a shipped config's name (large, sst2, …)")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (0: CPU processes)")
    p.add_argument("--procs-per-node", type=int, default=None,
                   help=f"processes per node without GPUs (default {DEFAULT_CPU_PROCS})")
    p.add_argument("--time", default="24:00:00", help="time limit, HH:MM:SS")
    p.add_argument("--partition", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--signal-seconds", type=int, default=300,
                   help="pretrain: SIGUSR1 this long before the time limit, to checkpoint and requeue")
    p.add_argument("--parts", type=int, default=4, help="shard: array tasks (input parts)")
    p.add_argument("--model", default=None, help="finetune: the model to fine-tune")
    p.add_argument("--seeds", default=None, help="finetune: comma-separated seeds")
    p.add_argument("--from-scratch", action="store_true", help="finetune: the no-pretraining baseline")
    p.add_argument("--job-name", default=None)
    p.add_argument("--no-check-files", action="store_true", help="pretrain, finetune: skip checking data paths here")
    p.add_argument("--dry-run", action="store_true", help="print the script(s) instead of submitting")
    return p


@exit_on_pipeline_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.nodes < 1 or args.gpus_per_node < 0 or args.parts < 1:
        raise PipelineError("--nodes and --parts must be ≥ 1, --gpus-per-node ≥ 0")
    make_scripts = {"pretrain": pretrain_scripts, "finetune": finetune_scripts, "shard": shard_scripts}[args.job]
    folder, scripts = make_scripts(args)
    if args.dry_run:
        print("\n".join(scripts), end="")
        return
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job = None
    for i, text in enumerate(scripts):  # each job starts once the one before it succeeded
        path = folder / f"{args.job}-{stamp}-{i}.sbatch"
        path.write_text(text)
        job = sbatch(path, *([f"--dependency=afterok:{job}"] if job else []))
        print(job)


if __name__ == "__main__":
    main()
