"""Fine-tune a pretrained encoder on a GLUE, token-tagging or extractive-QA task, and log it to MLflow.

Kept so that `python launchers/finetune.py ...` and `accelerate launch launchers/finetune.py ...` work in a
checkout, installed or not; the command is `pipeline.commands.finetune` (`python -m pipeline.commands.finetune`,
or `roberta-finetune`), where its help and options live.
"""

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.finetune import build_parser, main  # noqa: F401  (build_parser: tests/docs parse commands)

if __name__ == "__main__":
    raise SystemExit(main())
