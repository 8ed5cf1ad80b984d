"""The main job on the embedded default corpus: every stage of the pipeline, end to end.

Kept so that `python launchers/run_default.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.run_default` (`python -m pipeline.commands.run_default`)
(its help and options live there).
"""

from pathlib import Path

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.run_default import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

SEED_RECORD = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "main_job_seeds.json"
"""The seed benchmark's record, which the checkout has and an installed package does not."""

if __name__ == "__main__":
    raise SystemExit(main(seed_record=SEED_RECORD))
