"""Submit a pipeline job to SLURM: render the sbatch script from the config and flags, then sbatch it.

Kept so that `python launchers/submit.py ...` works in a checkout, installed or not; the command is
`pipeline.commands.submit` (`python -m pipeline.commands.submit`)
(its help and options live there).
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.submit import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
