"""The bare encoder of a model folder, loaded strictly: a weight of the encoder missing from the checkpoint (it would
start random) or one the encoder does not know is an error naming the keys.

What a folder may hold besides the encoder is the head its task trained, left behind on purpose: the masked-LM head
of an export (RoBERTa's `lm_head`, BERT's `cls`, ModernBERT's `head` and `decoder`), BERT's next-sentence head, a
fine-tuned classifier or QA head. What the encoder may lack is BERT's and RoBERTa's pooler (an export of a
masked-LM model has none): mean and CLS pooling read the last hidden states, never the pooler.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.common.errors import PipelineError

HEAD_PREFIXES = ("lm_head.", "cls.", "head.", "decoder.", "classifier.", "qa_outputs.")
"""Checkpoint keys of a head, which the bare encoder leaves behind."""
UNUSED_PREFIXES = ("pooler.",)
"""Encoder keys no pooling of the embedding stage reads, so that a checkpoint may lack them."""


def weight_problems(info: dict) -> list[str]:
    """What transformers' loading info (`output_loading_info=True`) reports beyond the expected heads."""
    missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith(UNUSED_PREFIXES))
    unexpected = sorted(k for k in info.get("unexpected_keys", ()) if not k.startswith(HEAD_PREFIXES))
    mismatched = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys", ()))
    problems = []
    for what, keys in (("missing from the checkpoint (they would start random)", missing),
                       ("in the checkpoint but unknown to the encoder", unexpected),
                       ("of another shape in the checkpoint", mismatched)):
        if keys:
            shown = ", ".join(keys[:8]) + (f" and {len(keys) - 8} more" if len(keys) > 8 else "")
            problems.append(f"{len(keys)} encoder weight{'s' * (len(keys) != 1)} {what}: {shown}")
    return problems + [str(e) for e in info.get("error_msgs", ())]


def load_encoder_weights(folder: str | Path, config=None):
    """`AutoModel.from_pretrained(folder)` (with `config` when given), refused with a `PipelineError` naming the keys
    when the encoder's weights are not all in the checkpoint; the expected heads are left behind quietly."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the load report is judged below, not printed
    try:
        model, info = AutoModel.from_pretrained(folder, output_loading_info=True,
                                                **({"config": config} if config is not None else {}))
    finally:
        hf_logging.set_verbosity(verbosity)
    if problems := weight_problems(info):
        raise PipelineError(f"{folder}: the checkpoint does not hold the encoder: " + "; ".join(problems))
    return model
