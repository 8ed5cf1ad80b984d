"""Fine-tuning data: a GLUE data folder, `datasets`' ("glue", task), or a custom CSV/TSV/JSONL task.

CoLA's train/dev files have no header; the files' other quirks (MRPC's byte-order mark, literal
quotes) are `text_files.py`'s. Every problem — a missing file or column, a label outside the
task's labels, an empty split — is an error naming the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.catalog import GLUE_FOLDERS, TaskSpec
from pipeline.data.tasks.text_files import table_rows


@dataclass
class Split:
    """Examples of one file: 1 or 2 texts each, labels (None for unlabelled test files), ids."""

    source: str
    texts: list[tuple[str, ...]] = field(default_factory=list)
    labels: list[float] | None = None
    ids: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class TaskData:
    spec: TaskSpec
    train: Split
    dev: dict[str, Split]
    """Dev splits by name: `dev`, or MNLI's `matched` and `mismatched`."""
    test: dict[str, Split]


def read_split(path: Path, text_columns: tuple[str, ...], label_column: str | None, labels: tuple[str, ...] | None,
               *, headerless: tuple[str, ...] | None = None, labelled: bool = True) -> Split:
    """Read one file of a task; labels become class ids (or floats for regression)."""
    split, raw = _read(path, text_columns, label_column if labelled else None, headerless)
    return _labelled(split, raw, label_column, labels) if labelled else split


def _read(path: Path, text_columns: tuple[str, ...], label_column: str | None,
          headerless: tuple[str, ...] | None = None) -> tuple[Split, list[tuple[int, str]]]:
    """The examples of one file, and each one's (line, label as written) when `label_column` is named."""
    split, raw = Split(str(path), labels=None if label_column is None else []), []
    for number, row, header in table_rows(path, headerless):
        missing = [c for c in (*text_columns, *([label_column] if label_column else [])) if c not in row]
        if missing:
            raise PipelineError(f"{path}:{number}: no column {', '.join(map(repr, missing))} "
                                f"(columns: {', '.join(map(str, header))})")
        split.texts.append(tuple(str(row[c]) for c in text_columns))
        split.ids.append(str(row.get("index", row.get("id", len(split.ids)))))
        if label_column:
            raw.append((number, str(row[label_column]).strip()))
    if not split.texts:
        raise PipelineError(f"{path}: no examples (the split is empty)")
    return split, raw


def _labelled(split: Split, raw: list[tuple[int, str]], label_column: str, labels: tuple[str, ...] | None) -> Split:
    """`split` with its labels as class ids (`labels` in class-id order), or as numbers (`labels` None: regression)."""
    label_ids = {label: i for i, label in enumerate(labels)} if labels else None
    for number, value in raw:
        if label_ids is None:
            try:
                split.labels.append(float(value))
            except ValueError:
                raise PipelineError(f"{split.source}:{number}: label {value!r} in column {label_column!r} is not a "
                                    "number (the task is a regression)") from None
        elif value not in label_ids:
            raise PipelineError(f"{split.source}:{number}: label {value!r} in column {label_column!r} is not one of "
                                f"the task's labels ({', '.join(labels)})")
        else:
            split.labels.append(label_ids[value])
    return split


def load_glue_folder(spec: TaskSpec, glue_dir: str | Path) -> TaskData:
    """A task from a folder in the GLUE layout (`<glue_dir>/<TASK>/train.tsv`, …)."""
    root = Path(glue_dir)
    folder = root / GLUE_FOLDERS[spec.name]
    if not folder.is_dir():
        raise PipelineError(f"data.glue_dir {root}: no {GLUE_FOLDERS[spec.name]}/ folder for task {spec.name}")

    def read(name: str, labelled: bool = True) -> Split:
        headerless = spec.headerless_columns if name != "test" else None
        text_columns = spec.text_columns
        return read_split(folder / f"{name}.tsv", text_columns, spec.label_column, spec.labels,
                          headerless=headerless, labelled=labelled)

    train = read("train")
    dev = {_dev_name(f): read(Path(f).stem) for f in spec.dev_files}
    test = {_dev_name(f): read(Path(f).stem, labelled=False) for f in spec.test_files if (folder / f).is_file()}
    return TaskData(spec, train, dev, test)


def _dev_name(file: str) -> str:
    stem = Path(file).stem
    return stem.split("_", 1)[1] if "_" in stem else stem  # dev_matched → matched; dev → dev


def load_hf_glue(spec: TaskSpec) -> TaskData:
    """The task from `datasets.load_dataset("glue", task)` (needs the hub, or its local cache)."""
    import datasets

    try:
        ds = datasets.load_dataset("glue", spec.name)
    except Exception as err:  # noqa: BLE001 - offline, unknown config, …: all mean "not available here"
        raise PipelineError(f"cannot load ('glue', {spec.name!r}) with datasets: {type(err).__name__}: {err}. "
                            "Pass data.glue_dir with the GLUE files instead") from None
    columns = spec.hf_text_columns or spec.text_columns

    def convert(split_name: str, labelled: bool) -> Split:
        part = ds[split_name]
        split = Split(f"datasets glue/{spec.name}/{split_name}", labels=[] if labelled else None)
        # datasets numbers MNLI/QNLI/RTE's classes in its own order (entailment first); map by name.
        names = getattr(part.features.get("label"), "names", None)
        by_name = names and spec.labels and set(names) <= set(spec.labels)
        for i, row in enumerate(part):
            split.texts.append(tuple(row[c] for c in columns))
            split.ids.append(str(row.get("idx", i)))
            if labelled:
                label = row["label"]
                if spec.is_regression:
                    split.labels.append(float(label))
                else:
                    split.labels.append(spec.labels.index(names[label]) if by_name else int(label))
        return split

    if spec.name == "mnli":
        dev = {"matched": convert("validation_matched", True), "mismatched": convert("validation_mismatched", True)}
        test = {"matched": convert("test_matched", False), "mismatched": convert("test_mismatched", False)}
    else:
        dev, test = {"dev": convert("validation", True)}, {"test": convert("test", False)}
    return TaskData(spec, convert("train", True), dev, test)


def load_custom(train_file: str, validation_file: str, test_file: str | None, text_fields: list[str],
                label_field: str, task_type: str, labels: list[str] | None) -> TaskData:
    """A GLUE-style task from CSV/TSV/JSONL files with named text and label columns."""
    if not 1 <= len(text_fields) <= 2:
        raise PipelineError(f"data.text_fields: expected 1 or 2 column names, got {text_fields}")
    columns = tuple(text_fields)
    train, raw = _read(Path(train_file), columns, label_field)  # read once: its labels, then its examples
    if task_type == "classification" and not labels:
        labels = sorted({value for _, value in raw}, key=_label_sort_key)
    label_tuple = tuple(labels) if task_type == "classification" else None
    metrics = ("accuracy", "f1_macro") if task_type == "classification" else ("pearson", "spearman")
    spec = TaskSpec("custom", columns, label_field, label_tuple, metrics)
    train = _labelled(train, raw, label_field, label_tuple)
    dev = {"dev": read_split(Path(validation_file), columns, label_field, label_tuple)}
    test = {"test": read_split(Path(test_file), columns, label_field, label_tuple, labelled=False)} if test_file else {}
    return TaskData(spec, train, dev, test)


def _label_sort_key(label: str):
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)
