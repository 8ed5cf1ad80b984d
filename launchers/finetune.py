"""Fine-tune a pretrained encoder on a GLUE, token-tagging or extractive-QA task, and log it to MLflow.

A thin shim: the command is `pipeline/commands/finetune.py` (also installed as `roberta-finetune`).

    python launchers/finetune.py --config configs/glue/sst2.json --model runs/default/pretrain/export \\
        [--set key=value ...] [--seeds 1,2,3] [--from-scratch] [--sweep KEY=V1,V2,...] [--select-fraction 0.1]
    accelerate launch --num_processes 2 launchers/finetune.py --config ...     (several processes)
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.finetune import build_parser, main, parse_seeds  # noqa: F401  (build_parser: tests/docs)

if __name__ == "__main__":
    main()
