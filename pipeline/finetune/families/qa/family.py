"""Extractive question answering (`squad`, `qa-custom`) as a fine-tuning task family.

The family reads SQuAD JSON or JSONL files (`qa_data`), encodes question/context windows
(`qa_features`), builds an `AutoModelForQuestionAnswering`, turns gathered start/end logits into
one answer per question (n-best over all of its windows, a no-answer threshold for SQuAD 2.0),
scores exact match and F1 with the official normalisation, and writes `predictions.json` in the
official format, `{id: answer}`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.errors import PipelineError
from pipeline.common.run_layout import SeedLayout
from pipeline.data.tasks.catalog import TaskSpec
from pipeline.data.tasks.qa_files import QASplit, read_qa
from pipeline.data.tasks.splits import TaskData
from pipeline.finetune.families.interface import TaskFamily, load_head_model
from pipeline.finetune.families.metrics import squad_metrics
from pipeline.models.spans.qa_windows import QAWindows, best_answers, encode_qa, question_lengths

QA_METRICS = ("f1", "exact_match")
# Logits put at padded positions so that padding is never an answer, yet stays finite in any dtype.
PAD_LOGIT = -1e4


def load_qa_task(task: str, data) -> TaskData:
    train = read_qa(data.train_file)
    if data.max_train_examples:
        train.examples, train.where = train.examples[:data.max_train_examples], train.where[:data.max_train_examples]
    dev = {"dev": read_qa(data.validation_file)}
    test = {"test": read_qa(data.test_file)} if data.test_file else {}
    return TaskData(TaskSpec(task, ("question", "context"), None, (), QA_METRICS), train, dev, test)


class QADataset(torch.utils.data.Dataset):
    def __init__(self, windows: QAWindows):
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict:
        w = self.windows
        item = {"input_ids": w.input_ids[i], "attention_mask": [1] * len(w.input_ids[i]),
                "start_positions": w.start_positions[i], "end_positions": w.end_positions[i]}
        if w.token_type_ids is not None:
            item["token_type_ids"] = w.token_type_ids[i]
        return item


class QuestionAnsweringFamily(TaskFamily):
    """The per-family parts of fine-tuning for answer spans in a context."""

    task_type = "question-answering"

    def __init__(self, data: TaskData, config_data):
        self.data, self.spec, self.options = data, data.spec, config_data
        self.max_seq_len, self.doc_stride = config_data.max_seq_len, config_data.doc_stride
        v2 = config_data.version_2_with_negative
        self.allow_no_answer = v2 if v2 is not None else any(
            s.has_unanswerable for s in (data.train, *data.dev.values()))
        self.windows: dict[str, QAWindows] = {}

    def build_model(self, source: str, from_scratch: bool) -> torch.nn.Module:
        from transformers import AutoModelForQuestionAnswering

        return load_head_model(AutoModelForQuestionAnswering, source, from_scratch)

    def encode(self, split: QASplit, tokenizer, max_seq_len: int) -> torch.utils.data.Dataset:
        # The tokenizer needs room for the context beside the question and the overlap; say which question is too long.
        room = max_seq_len - self.doc_stride - 4
        for length, where in zip(question_lengths(tokenizer, split.examples), split.where, strict=True):
            if length >= room:
                raise PipelineError(f"{where}: the question is {length} tokens; with data.max_seq_len "
                                    f"{max_seq_len} and data.doc_stride {self.doc_stride} it must be under {room}")
        windows = encode_qa(tokenizer, split.examples, max_seq_len, self.doc_stride)
        self.windows[split.source] = windows
        print(f"{split.source}: {windows.summary()}", flush=True)
        return QADataset(windows)

    def collator(self, tokenizer):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(tokenizer)

    def predict(self, output, batch: dict) -> tuple[torch.Tensor, None]:
        """Start and end logits `(batch, 2, max_seq_len)`, padded so that batches gather across processes."""
        logits = torch.stack([output.start_logits, output.end_logits], dim=1).float()
        return F.pad(logits, (0, self.max_seq_len - logits.shape[-1]), value=PAD_LOGIT), None

    def answers(self, split: QASplit, logits: np.ndarray) -> dict[str, str]:
        o = self.options
        return best_answers(split.examples, self.windows[split.source], logits[:, 0], logits[:, 1], n_best=o.n_best,
                            max_answer_length=o.max_answer_length, allow_no_answer=self.allow_no_answer,
                            null_threshold=o.null_score_diff_threshold)

    def metrics(self, predictions: dict[str, np.ndarray], labels: dict) -> dict[str, float]:
        result = {}
        for n, (name, logits) in enumerate(predictions.items()):
            split = self.data.dev[name]
            scores = squad_metrics(self.answers(split, logits), split.golds())
            result.update(scores if n == 0 else {f"{k}_{name}": v for k, v in scores.items()})
        return result

    def provenance(self) -> dict:
        o = self.options
        return {"task": self.spec.name, "task_type": self.task_type, "labels": [], "doc_stride": self.doc_stride,
                "n_best": o.n_best, "max_answer_length": o.max_answer_length,
                "version_2_with_negative": self.allow_no_answer,
                "null_score_diff_threshold": o.null_score_diff_threshold}

    def write_dev_reports(self, seed: SeedLayout, splits: dict[str, QASplit], predictions: dict[str, np.ndarray],
                          labels: dict, figures: bool = True) -> list[Path]:
        """`predictions.json` in the official format (`predictions_<split>.json` for several dev splits); no
        figures."""
        written = []
        for name, split in splits.items():
            path = seed.answers(name, len(splits))
            write_json_atomic(path, self.answers(split, predictions[name]))
            written.append(path)
        return written

    def write_test_predictions(self, seed: SeedLayout, name: str, split: QASplit, predictions: np.ndarray
                               ) -> list[Path]:
        """`test_predictions.json`, and `test_metrics.json` when the test questions have answers."""
        answers = self.answers(split, predictions)
        path = seed.test_predictions(name, ".json")
        write_json_atomic(path, answers)
        if not any(e.answers for e in split.examples):
            return [path]
        write_json_atomic(seed.test_metrics(name), squad_metrics(answers, split.golds()))
        return [path, seed.test_metrics(name)]
