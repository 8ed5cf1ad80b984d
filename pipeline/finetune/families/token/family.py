"""Token classification (`ner`, `pos`, `token-custom`) as a fine-tuning task family.

The family loads the files, encodes them into windows (`token_features`), builds an
`AutoModelForTokenClassification` whose config names the real tags, turns gathered per-token
predictions back into one tag per word, scores them (seqeval entities for IOB tags, accuracy for
POS), and writes CoNLL prediction files (`word gold predicted`, one word per line, a blank line
between sentences) that conlleval-style tools re-score.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.common.atomic_files import write_json_atomic, write_text_atomic
from pipeline.common.errors import PipelineError
from pipeline.common.run_layout import SeedLayout
from pipeline.data.tasks.catalog import TOKEN_TASKS, TaskSpec
from pipeline.data.tasks.splits import TaskData
from pipeline.data.tasks.token_files import (
    TaggedSplit,
    check_known_tags,
    is_iob,
    label_list,
    read_tagged,
)
from pipeline.finetune.families.interface import TaskFamily, load_head_model
from pipeline.finetune.families.metrics import entity_metrics, token_accuracy
from pipeline.models.spans.token_windows import (
    IGNORE_INDEX,
    TokenWindows,
    continuation_ids,
    encode_tagged,
    word_predictions,
)

ENTITY_METRICS = ("f1", "precision", "recall", "accuracy")


def load_token_task(task: str, data) -> TaskData:
    """Read train/dev(/test) files of a token task; dev/test tags must be known from train (or mapped to O)."""
    kind = TOKEN_TASKS[task]
    train = read_tagged(data.train_file, kind.format)
    labels = label_list(train)  # from the whole file: a quick run on its first sentences still knows every tag
    if data.max_train_examples:
        n = data.max_train_examples
        train.words, train.tags, train.lines = train.words[:n], train.tags[:n], train.lines[:n]
    dev = {"dev": read_tagged(data.validation_file, kind.format)}
    test = {"test": read_tagged(data.test_file, kind.format)} if data.test_file else {}
    for split in (*dev.values(), *test.values()):
        check_known_tags(split, labels, map_unknown_to_o=data.map_unknown_tags_to_o)
    entity_level = kind.entity_level if kind.entity_level is not None else is_iob(labels)
    if entity_level and not is_iob(labels):
        odd = next(t for t in labels if not is_iob([t]))
        raise PipelineError(f"{data.train_file}: task {task!r} needs IOB tags (O, B-X, I-X) for entity scores; "
                            f"found {odd!r}")
    metrics = ENTITY_METRICS if entity_level else ("accuracy",)
    return TaskData(TaskSpec(task, (), None, tuple(labels), metrics), train, dev, test)


class WindowDataset(torch.utils.data.Dataset):
    def __init__(self, windows: TokenWindows):
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict:
        ids = self.windows.input_ids[i]
        return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": self.windows.labels[i]}


class TokenTaggingFamily(TaskFamily):
    """The per-family parts of fine-tuning for one tag per word."""

    task_type = "token-classification"

    def __init__(self, data: TaskData, config_data):
        self.data, self.spec = data, data.spec
        self.labels = list(data.spec.labels)
        self.max_seq_len = config_data.max_seq_len
        self.label_all_tokens = config_data.label_all_tokens
        self.entity_level = data.spec.metrics == ENTITY_METRICS
        self.windows: dict[str, TokenWindows] = {}
        """The windows of every split encoded so far, by file: predictions map back to words through them."""

    def build_model(self, source: str, from_scratch: bool) -> torch.nn.Module:
        from transformers import AutoModelForTokenClassification

        return load_head_model(AutoModelForTokenClassification, source, from_scratch, num_labels=len(self.labels),
                               id2label=dict(enumerate(self.labels)),
                               label2id={t: i for i, t in enumerate(self.labels)})

    def encode(self, split: TaggedSplit, tokenizer, max_seq_len: int) -> torch.utils.data.Dataset:
        index = {t: i for i, t in enumerate(self.labels)}
        label_ids = [[index[t] for t in tags] for tags in split.tags]
        windows = encode_tagged(tokenizer, split.words, label_ids, max_seq_len, label_all_tokens=self.label_all_tokens,
                                continuation=continuation_ids(self.labels))
        self.windows[split.source] = windows
        print(f"{split.source}: {windows.summary()}", flush=True)
        return WindowDataset(windows)

    def collator(self, tokenizer):
        from transformers import DataCollatorForTokenClassification

        return DataCollatorForTokenClassification(tokenizer, label_pad_token_id=IGNORE_INDEX)

    def predict(self, output, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token predictions and labels, padded to `max_seq_len` so batches gather across processes."""
        def pad(t: torch.Tensor) -> torch.Tensor:
            return F.pad(t, (0, self.max_seq_len - t.shape[1]), value=IGNORE_INDEX)

        return pad(output.logits.argmax(-1)), pad(batch["labels"])

    def word_tags(self, split: TaggedSplit, token_predictions: np.ndarray) -> list[list[str]]:
        ids = word_predictions(self.windows[split.source], token_predictions, [len(w) for w in split.words])
        return [[self.labels[i] for i in sentence] for sentence in ids]

    def score(self, split: TaggedSplit, predicted: list[list[str]]) -> dict[str, float]:
        if self.entity_level:
            return entity_metrics(split.tags, predicted)
        return {"accuracy": token_accuracy(split.tags, predicted)}

    def metrics(self, predictions: dict[str, np.ndarray], labels: dict[str, np.ndarray]) -> dict[str, float]:
        """Word-level metrics of each dev split (the first split's keys unprefixed)."""
        result = {}
        for n, (name, tokens) in enumerate(predictions.items()):
            split = self.data.dev[name]
            scores = self.score(split, self.word_tags(split, tokens))
            result.update(scores if n == 0 else {f"{k}_{name}": v for k, v in scores.items()})
        return result

    def provenance(self) -> dict:
        return {"task": self.spec.name, "task_type": self.task_type, "labels": self.labels,
                "label_all_tokens": self.label_all_tokens, "entity_level": self.entity_level}

    def write_dev_reports(self, seed: SeedLayout, splits: dict[str, TaggedSplit],
                          predictions: dict[str, np.ndarray], labels: dict[str, np.ndarray],
                          figures: bool = True) -> list[Path]:
        """`dev_predictions.conll` (`dev_predictions_<split>.conll` for several dev splits); no figures."""
        written = []
        for name, split in splits.items():
            path = seed.dev_predictions(name, len(splits), ".conll")
            write_conll(path, split, self.word_tags(split, predictions[name]))
            written.append(path)
        return written

    def write_test_predictions(self, seed: SeedLayout, name: str, split: TaggedSplit, predictions: np.ndarray
                               ) -> list[Path]:
        """`test_predictions.conll`, and `test_metrics.json` (the test files of these tasks carry gold tags)."""
        predicted = self.word_tags(split, predictions)
        conll, scores = seed.test_predictions(name, ".conll"), seed.test_metrics(name)
        write_conll(conll, split, predicted)
        write_json_atomic(scores, self.score(split, predicted))
        return [conll, scores]


def write_conll(path: Path, split: TaggedSplit, predicted: list[list[str]]) -> None:
    """One `word gold predicted` line per word, a blank line after each sentence (conlleval's input)."""
    lines = []
    for words, gold, tags in zip(split.words, split.tags, predicted, strict=True):
        # conlleval splits on spaces: a word holding one (possible in JSONL) is written with `_`.
        lines += [f"{w.replace(' ', '_') or '_'} {g} {p}\n" for w, g, p in zip(words, gold, tags, strict=True)]
        lines.append("\n")
    write_text_atomic(path, "".join(lines))


def read_conll_predictions(path: str | Path) -> tuple[list[list[str]], list[list[str]]]:
    """(gold, predicted) tag sentences of a file written by `write_conll`."""
    gold: list[list[str]] = [[]]
    predicted: list[list[str]] = [[]]
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            if gold[-1]:
                gold.append([])
                predicted.append([])
            continue
        _, g, p = line.split(" ")
        gold[-1].append(g)
        predicted[-1].append(p)
    if not gold[-1]:
        gold.pop()
        predicted.pop()
    return gold, predicted

