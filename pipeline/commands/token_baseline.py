"""The token-count baseline of a fine-tuning task: a bag of words and a logistic regression, scored on dev.

    python launchers/token_baseline.py --config configs/glue/embedded-docs.json [--set key=value ...] [--json OUT]

It reads the task exactly as fine-tuning does (the same config, `--set` overrides and files), fits
on the training split and prints the task's metrics on dev, to stand beside the neural arms: a task
that counting solves shows nothing about what pretraining buys. See
pipeline/finetune/families/sequence/token_baseline.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pipeline.common.errors import exit_on_pipeline_error


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True, help="a fine-tuning config file, or a shipped config's name (e.g. sst2)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--json", type=Path, default=None, help="also write the result to this file")
    return p


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    from pipeline.common.atomic_files import write_json_atomic
    from pipeline.common.config.shipped_configs import find_config
    from pipeline.finetune.families.sequence.token_baseline import token_count_baseline
    from pipeline.finetune.preflight import load_finetune_config
    from pipeline.finetune.task_loading import load_task

    data = load_task(load_finetune_config(find_config(args.config, "finetune"), args.set))
    result = {"task": data.spec.name, "baseline": "token counts", "train": len(data.train),
              **token_count_baseline(data)}
    if args.json:
        write_json_atomic(args.json, result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
