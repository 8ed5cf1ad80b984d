"""Token-tagging and extractive-QA heads of the hub interface, dispatched on the saved model's `task_type`.

A fine-tuned `ner` / `pos` / `token-custom` model tags words and a `squad` / `qa-custom` model
answers questions; both go through the fine-tuning predictors (`WordTagger`, `QuestionAnswerer` in
`pipeline/models/spans/predictors.py`), so the hub gives exactly the tags and answers that the
saved model gives there (same windows, same post-processing). This module only names them as heads.
"""

from __future__ import annotations

from pipeline.common.errors import PipelineError
from pipeline.models.spans.predictors import QuestionAnswerer, WordTagger

TAGGING = "token-classification"
QA = "question-answering"
SPAN_TASK_TYPES = (TAGGING, QA)
"""The `task_type`s of `pipeline_finetune.json` served by these heads rather than by a sequence head."""


def load_span_predictor(folder: str, task_type: str) -> WordTagger | QuestionAnswerer:
    """The predictor of a saved token or QA model folder (`seed_N/model`)."""
    return WordTagger(folder) if task_type == TAGGING else QuestionAnswerer(folder)


def kind_of(predictor) -> str:
    return TAGGING if isinstance(predictor, WordTagger) else QA


def words_of(head: str, words) -> list[str]:
    """A list of words, or a string split on whitespace; anything else is a clear error."""
    if isinstance(words, str):
        words = words.split()
    elif isinstance(words, (list, tuple)) and all(isinstance(w, str) for w in words):
        words = list(words)
    else:
        raise PipelineError(f"head {head!r} tags words: give a list of words or a text (split on whitespace), "
                            f"not {type(words).__name__}")
    if not words:
        raise PipelineError(f"head {head!r}: no words to tag")
    return words


def check_on_cpu(device, head: str) -> None:
    if device.type != "cpu":
        raise PipelineError(f"head {head!r} runs on the CPU (as the fine-tuning predictors do); call .cpu() first")
