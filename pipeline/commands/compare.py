"""Compare MLflow runs side by side: differing params, final metrics, GLUE scores joined to pretraining runs.

    python launchers/compare.py [--experiment NAME ...] [--tag key=value ...] [--name TEXT ...] \\
        [--uri sqlite:///mlflow.db] [--out DIR]

Prints one table — a row per pretraining run (params that differ between the rows, final
train/eval loss, and the median GLUE score of every fine-tuning run started from its export,
pretrained and from scratch) plus rows for fine-tuning runs of other models — and writes PNG
plots of the loss curves overlaid across runs to --out. Browse the same store with
`mlflow ui --backend-store-uri URI --host 127.0.0.1`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.common.errors import PipelineError, exit_on_pipeline_error


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experiment", action="append", default=[], help="experiment name (repeatable; default: all)")
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="keep runs with this tag")
    p.add_argument("--name", action="append", default=[], help="keep runs whose name contains this")
    p.add_argument("--uri", default=None, help="tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    p.add_argument("--out", type=Path, default=Path("runs/compare"), help="folder for the plots")
    p.add_argument("--verbose", action="store_true",
                   help="show the frameworks' own logs, warnings and progress bars (default: warnings and up)")
    return p


@exit_on_pipeline_error
def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    from pipeline.common.console import quiet_frameworks

    quiet_frameworks(args.verbose, transformers=False)
    tags = {}
    for item in args.tag:
        key, sep, value = item.partition("=")
        if not sep:
            raise PipelineError(f"--tag {item!r}: expected key=value")
        tags[key] = value
    from mlflow.tracking import MlflowClient

    from pipeline.tracking.compare import build_table, format_table, plot_curves, select_runs
    from pipeline.tracking.mlflow_run import default_tracking_uri

    uri = args.uri or default_tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise PipelineError(f"MLflow store {uri} does not exist (pass --uri, or run from the folder holding mlflow.db)")
    client = MlflowClient(uri)
    runs = select_runs(client, args.experiment, tags, args.name)
    if not runs:
        raise PipelineError(f"no runs match in {uri}")
    differing, rows = build_table(runs)
    print(format_table(differing, rows))
    for path in plot_curves(client, runs, args.out):
        print(f"plot: {path}")


if __name__ == "__main__":
    main()
