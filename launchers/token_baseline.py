"""The token-count baseline of a fine-tuning task (a thin shim: see pipeline/commands/token_baseline.py).

    python launchers/token_baseline.py --config configs/glue/embedded-docs.json [--set key=value ...] [--json OUT]
"""

from __future__ import annotations

import _bootstrap  # noqa: F401  (makes `import pipeline` work from a checkout)

from pipeline.commands.token_baseline import build_parser, main  # noqa: F401  (build_parser: tests/docs)

if __name__ == "__main__":
    main()
