"""Use a fine-tuned token or QA model: one tag per word, and `answer(question, context)`.

These read a saved seed model (`<output_dir>/seed_N/model/`, or the best one of an output folder
through its `best_model.json`) and its provenance
(`pipeline_finetune.json`: max_seq_len, doc_stride, n-best, …), and go through the same windows
and post-processing as training and evaluation, so a sentence longer than a window or a context
longer than 384 tokens is handled here exactly as in the dev metrics.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pipeline.common.errors import PipelineError
from pipeline.common.run_layout import FINETUNE_PROVENANCE_FILE as PROVENANCE_FILE
from pipeline.data.tasks.qa_files import QAExample
from pipeline.models.spans.qa_windows import best_answers, encode_qa
from pipeline.models.spans.token_windows import WordPieces, encode_tagged, word_predictions


def model_folder(path: str | Path) -> Path:
    """A saved seed model (`seed_N/model`), or a fine-tuning output folder: its best seed's model."""
    path = Path(path)
    pointer = path / "best_model.json"
    return path / json.loads(pointer.read_text())["path"] if pointer.is_file() else path


def _provenance(folder: Path, task_type: str) -> dict:
    path = folder / PROVENANCE_FILE
    if not path.is_file():
        raise PipelineError(f"{folder}: no {PROVENANCE_FILE}; expected a fine-tuned model folder (seed_N/model)")
    info = json.loads(path.read_text())
    if info.get("task_type") != task_type:
        raise PipelineError(f"{folder}: a {info.get('task_type')!r} model ({info.get('task')}), not {task_type!r}")
    return info


class WordTagger:
    """A token-classification model that tags words: `predict(["EU", "rejects", ...])` → `["B-ORG", "O", ...]`."""

    def __init__(self, folder: str | Path, batch_size: int = 32):
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        folder = model_folder(folder)
        self.info = _provenance(folder, "token-classification")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForTokenClassification.from_pretrained(folder).eval()
        self.labels = [self.model.config.id2label[i] for i in range(self.model.config.num_labels)]
        self.max_seq_len, self.batch_size = int(self.info["max_seq_len"]), batch_size
        self.pieces = WordPieces(self.tokenizer)

    def predict(self, words: list[str] | str) -> list[str]:
        """One tag per word; a string is split on whitespace into words."""
        return self.predict_many([words.split() if isinstance(words, str) else list(words)])[0]

    @torch.no_grad()
    def predict_many(self, sentences: list[list[str]]) -> list[list[str]]:
        from transformers import DataCollatorForTokenClassification

        windows = encode_tagged(self.tokenizer, sentences, None, self.max_seq_len, pieces=self.pieces)
        collate = DataCollatorForTokenClassification(self.tokenizer)
        token_predictions = []
        for start in range(0, len(windows), self.batch_size):
            ids = windows.input_ids[start:start + self.batch_size]
            batch = collate([{"input_ids": x, "attention_mask": [1] * len(x)} for x in ids])
            token_predictions += self.model(**batch).logits.argmax(-1).tolist()
        ids = word_predictions(windows, token_predictions, [len(s) for s in sentences])
        return [[self.labels[i] for i in sentence] for sentence in ids]


class QuestionAnswerer:
    """An extractive QA model: `answer(question, context)` → the answer's text in `context` ("" for no answer)."""

    def __init__(self, folder: str | Path, batch_size: int = 16):
        from transformers import AutoModelForQuestionAnswering, AutoTokenizer

        folder = model_folder(folder)
        self.info = _provenance(folder, "question-answering")
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForQuestionAnswering.from_pretrained(folder).eval()
        self.batch_size = batch_size

    @torch.no_grad()
    def answer(self, question: str, context: str) -> str:
        from transformers import DataCollatorWithPadding

        if not context.strip():
            raise PipelineError("answer(): the context is empty")
        info = self.info
        example = QAExample("q", question.lstrip(), context, [], [])
        windows = encode_qa(self.tokenizer, [example], int(info["max_seq_len"]), int(info["doc_stride"]))
        collate = DataCollatorWithPadding(self.tokenizer)
        starts, ends = [], []
        for start in range(0, len(windows), self.batch_size):
            rows = []
            for k in range(start, min(start + self.batch_size, len(windows))):
                row = {"input_ids": windows.input_ids[k], "attention_mask": [1] * len(windows.input_ids[k])}
                if windows.token_type_ids is not None:
                    row["token_type_ids"] = windows.token_type_ids[k]
                rows.append(row)
            output = self.model(**collate(rows))
            starts += list(output.start_logits.float().numpy())
            ends += list(output.end_logits.float().numpy())
        return best_answers([example], windows, starts, ends, n_best=info["n_best"],
                            max_answer_length=info["max_answer_length"],
                            allow_no_answer=info["version_2_with_negative"],
                            null_threshold=info["null_score_diff_threshold"])["q"]
