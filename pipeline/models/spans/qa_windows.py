"""Extractive QA: question + context → overlapping windows, and window logits → one answer per question.

Windows: `question </s></s> context` (or `[CLS] q [SEP] c [SEP]`) of at most `max_seq_len`
tokens; a long context continues in the next window with `doc_stride` tokens of overlap (the
tokenizer's `stride`, as in transformers' run_qa.py). Answer spans are located through the
offset mapping, so they hold for byte-level BPE and WordPiece alike; a training window that does
not contain the whole answer points at the first token (the no-answer position), as in BERT's
run_squad.py.

Answers: for each question, the n-best start and end logits of every window are paired (end not
before start, at most `max_answer_length` tokens, both inside the context) and the best-scoring
span over all windows wins. With unanswerable questions (SQuAD 2.0) the answer is "" when the
no-answer score (first-token start + end logits, lowest over windows) beats the best span by
more than `null_threshold`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pipeline.data.tasks.qa_files import QAExample


@dataclass
class QAWindows:
    input_ids: list[list[int]] = field(default_factory=list)
    token_type_ids: list[list[int]] | None = None
    start_positions: list[int] = field(default_factory=list)
    end_positions: list[int] = field(default_factory=list)
    example: list[int] = field(default_factory=list)
    """The question each window belongs to."""
    offsets: list[list[tuple[int, int] | None]] = field(default_factory=list)
    """Character span in the context of each token; None outside the context (question, special tokens)."""
    split_contexts: int = 0
    """Questions whose context needed more than one window."""
    answer_outside: int = 0
    """Training windows that do not hold the whole answer (labelled with the no-answer position)."""

    def __len__(self) -> int:
        return len(self.input_ids)

    def summary(self) -> str:
        return (f"{len(self)} windows of {len(set(self.example))} questions; {self.split_contexts} contexts longer "
                f"than one window; {self.answer_outside} windows without the answer")


def question_lengths(tokenizer, examples: list[QAExample]) -> list[int]:
    return [len(ids) for ids in tokenizer([e.question for e in examples], add_special_tokens=False)["input_ids"]]


def encode_qa(tokenizer, examples: list[QAExample], max_seq_len: int, doc_stride: int) -> QAWindows:
    """Tokenize questions with their contexts into windows, with answer start/end token labels."""
    enc = tokenizer([e.question for e in examples], [e.context for e in examples], truncation="only_second",
                    max_length=max_seq_len, stride=doc_stride, return_overflowing_tokens=True,
                    return_offsets_mapping=True)
    out = QAWindows(token_type_ids=[] if "token_type_ids" in enc else None)
    windows_per_example = np.bincount(enc["overflow_to_sample_mapping"], minlength=len(examples))
    out.split_contexts = int((windows_per_example > 1).sum())
    for i, offsets in enumerate(enc["offset_mapping"]):
        sequence_ids = enc.sequence_ids(i)
        example = examples[enc["overflow_to_sample_mapping"][i]]
        context_offsets = [tuple(o) if s == 1 else None for o, s in zip(offsets, sequence_ids, strict=True)]
        start = end = 0
        if example.answers:
            start, end = _answer_tokens(context_offsets, example.starts[0], example.starts[0] + len(example.answers[0]))
            out.answer_outside += start == 0
        out.input_ids.append(enc["input_ids"][i])
        if out.token_type_ids is not None:
            out.token_type_ids.append(enc["token_type_ids"][i])
        out.start_positions.append(start)
        out.end_positions.append(end)
        out.example.append(enc["overflow_to_sample_mapping"][i])
        out.offsets.append(context_offsets)
    return out


def _answer_tokens(offsets: list[tuple[int, int] | None], start_char: int, end_char: int) -> tuple[int, int]:
    """First and last token of the answer's characters in this window; (0, 0) if the window does not hold it all."""
    inside = [i for i, o in enumerate(offsets) if o is not None]
    if offsets[inside[0]][0] > start_char or offsets[inside[-1]][1] < end_char:
        return 0, 0
    start = next(i for i in inside if offsets[i][1] > start_char)
    end = next(i for i in reversed(inside) if offsets[i][0] < end_char)
    return start, end


def best_answers(examples: list[QAExample], windows: QAWindows, start_logits: list[np.ndarray],
                 end_logits: list[np.ndarray], *, n_best: int = 20, max_answer_length: int = 30,
                 allow_no_answer: bool = False, null_threshold: float = 0.0) -> dict[str, str]:
    """{question id: answer text} from each window's start and end logits (padding beyond the window ignored)."""
    by_example: dict[int, list[int]] = {}
    for k, e in enumerate(windows.example):
        by_example.setdefault(e, []).append(k)
    answers = {}
    for e, example in enumerate(examples):
        best_score, best_text, null_score = -np.inf, "", np.inf
        for k in by_example.get(e, ()):
            offsets = windows.offsets[k]
            starts, ends = start_logits[k][:len(offsets)], end_logits[k][:len(offsets)]
            null_score = min(null_score, float(starts[0] + ends[0]))
            for s in np.argsort(starts)[::-1][:n_best]:
                if offsets[s] is None:
                    continue
                for t in np.argsort(ends)[::-1][:n_best]:
                    if offsets[t] is None or t < s or t - s + 1 > max_answer_length:
                        continue
                    score = float(starts[s] + ends[t])
                    if score > best_score:
                        best_score, best_text = score, example.context[offsets[s][0]:offsets[t][1]]
        if allow_no_answer and null_score - best_score > null_threshold:
            best_text = ""
        answers[example.id] = best_text
    return answers
