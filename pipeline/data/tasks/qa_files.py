"""Extractive QA data: SQuAD v1.1 / v2.0 JSON, and JSONL of `{id, context, question, answers: {text, answer_start}}`.

Every answer is checked against its context (`context[answer_start:]` must start with the answer
text) and every context must hold text; a problem names the file and line. A question with no
answers is unanswerable (SQuAD 2.0). Files may be zstd- or gzip-compressed (`.zst`, `.gz`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.common.config.size_limits import MAX_JSON_FILE_BYTES
from pipeline.common.errors import PipelineError
from pipeline.data.tasks.text_files import jsonl_records, text_lines


@dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list[str]
    """Gold answer texts; empty for an unanswerable question."""
    starts: list[int]
    """Character offset of each answer in `context`."""


@dataclass
class QASplit:
    source: str
    examples: list[QAExample] = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    """`file:line` of each example, for messages."""

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def has_unanswerable(self) -> bool:
        return any(not e.answers for e in self.examples)

    def golds(self) -> dict[str, list[str]]:
        return {e.id: e.answers for e in self.examples}


def read_qa(path: str | Path) -> QASplit:
    """A SQuAD JSON file (`.json`) or a JSONL file (`.jsonl`), optionally compressed."""
    name = Path(path).name.lower().removesuffix(".zst").removesuffix(".gz")
    split = read_qa_jsonl(path) if name.endswith(".jsonl") else read_squad_json(path)
    if not split.examples:
        raise PipelineError(f"{path}: no questions (the file is empty)")
    seen: dict[str, str] = {}
    for example, where in zip(split.examples, split.where, strict=True):
        if example.id in seen:
            raise PipelineError(f"{where}: question id {example.id!r} was already used at {seen[example.id]}")
        seen[example.id] = where
    return split


def read_squad_json(path: str | Path) -> QASplit:
    """The official SQuAD layout: `data[].paragraphs[].{context, qas[].{id, question, answers[], is_impossible}}`."""
    # The official files are one line of tens of MB: the bound is the whole file's, not a task file line's.
    text = "\n".join(line for _, line in text_lines(path, max_line_bytes=MAX_JSON_FILE_BYTES))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise PipelineError(f"{path}:{err.lineno}: invalid JSON: {err.msg}") from None
    except RecursionError:
        raise PipelineError(f"{path}: invalid JSON: nested too deeply") from None
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise PipelineError(f"{path}: expected SQuAD JSON, an object with a \"data\" list of articles")
    split = QASplit(str(path))

    def objects(value, where: str) -> list[dict]:
        if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
            raise PipelineError(f"{path} ({where}): expected a list of objects, got {type(value).__name__}")
        return value

    for a, article in enumerate(objects(data["data"], "data")):
        for p, paragraph in enumerate(objects(article.get("paragraphs", []), f"data[{a}].paragraphs")):
            context = paragraph.get("context")
            for q, qa in enumerate(objects(paragraph.get("qas", []), f"data[{a}].paragraphs[{p}].qas")):
                qid = str(qa.get("id", f"{a}.{p}.{q}"))
                where = f"{path} (data[{a}].paragraphs[{p}].qas[{q}], id {qid})"
                answers = [] if qa.get("is_impossible") else qa.get("answers", [])
                try:
                    try:
                        texts = [str(x["text"]) for x in answers]
                        starts = [int(x["answer_start"]) for x in answers]
                    except (KeyError, TypeError, ValueError):
                        raise BadExample('each answer needs "text" and an integer "answer_start"') from None
                    _add(split, where, qid, qa.get("question"), context, texts, starts)
                except BadExample as err:
                    # The line is looked up only here: a search per question would be quadratic in the file size.
                    raise PipelineError(f"{path}:{_line_of(text, qid)} (data[{a}].paragraphs[{p}].qas[{q}], "
                                        f"id {qid}): {err}") from None
    return split


def read_qa_jsonl(path: str | Path) -> QASplit:
    split = QASplit(str(path))
    for number, record in jsonl_records(path):
        where = f"{path}:{number}"
        if not isinstance(record, dict) or not {"id", "context", "question", "answers"} <= record.keys():
            found = ", ".join(sorted(record)) if isinstance(record, dict) else type(record).__name__
            raise PipelineError(f"{where}: expected an object with id, context, question and answers; got {found}")
        answers = record["answers"]
        if not isinstance(answers, dict) or not isinstance(answers.get("text"), list) \
                or not isinstance(answers.get("answer_start"), list) \
                or len(answers["text"]) != len(answers["answer_start"]):
            raise PipelineError(f"{where}: \"answers\" must be {{\"text\": [...], \"answer_start\": [...]}} with "
                                "lists of equal length")
        try:
            starts = [int(s) for s in answers["answer_start"]]
        except (TypeError, ValueError):
            raise PipelineError(f"{where}: answer_start values must be integers") from None
        try:
            _add(split, where, str(record["id"]), record["question"], record["context"],
                 [str(t) for t in answers["text"]], starts)
        except BadExample as err:
            raise PipelineError(f"{where}: {err}") from None
    return split


class BadExample(Exception):
    """A problem with one question; the reader adds the file and line."""


def _add(split: QASplit, where: str, qid: str, question, context, texts: list[str], starts: list[int]) -> None:
    if not isinstance(context, str) or not context.strip():
        raise BadExample("the context is empty; a question needs a passage to answer from")
    if not isinstance(question, str) or not question.strip():
        raise BadExample("the question is empty")
    for answer, start in zip(texts, starts, strict=True):
        if not answer or context[start:start + len(answer)] != answer or start < 0:
            found = context[max(start, 0):max(start, 0) + len(answer) + 10]
            raise BadExample(f"answer {answer!r} does not match the context at answer_start {start} "
                                f"(the context there reads {found!r})")
    # Questions are stripped of leading spaces: some SQuAD questions start with many, which waste window room.
    split.examples.append(QAExample(qid, question.lstrip(), context, texts, starts))
    split.where.append(where)


def _line_of(text: str, qid: str) -> int:
    position = text.find(json.dumps(qid))
    return text.count("\n", 0, position) + 1 if position >= 0 else 1
