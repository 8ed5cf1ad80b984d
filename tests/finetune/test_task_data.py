"""GLUE loaders on small files with the real files' quirks, custom tasks, metrics and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import f1_score, matthews_corrcoef

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.catalog import task_spec
from pipeline.data.tasks.splits import load_custom, load_glue_folder
from pipeline.finetune.families.metrics import metric, task_metrics


def write(path: Path, text: str, encoding: str = "utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding=encoding)
    return path


@pytest.fixture
def glue_dir(tmp_path) -> Path:
    root = tmp_path / "glue"
    # CoLA: train/dev have no header; test has one.
    write(root / "CoLA/train.tsv", "gj04\t1\t\tOur friends won't buy this analysis.\ngj04\t0\t*\tThe more you eat.\n")
    write(root / "CoLA/dev.tsv", "gj04\t1\t\tBill whistled past the house.\n")
    write(root / "CoLA/test.tsv", "index\tsentence\n0\tThe car honked its way down the road.\n")
    # MRPC: a UTF-8 byte-order mark and its own column names; quotes inside sentences are text.
    mrpc = ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
            '1\t702876\t702977\tHe called " the witness " a liar .\tReferring to him as " the witness " .\n'
            "0\t2108705\t2108831\tYucaipa owned Dominick 's .\tYucaipa bought Dominick 's in 1995 .\n")
    write(root / "MRPC/train.tsv", "\ufeff" + mrpc)
    write(root / "MRPC/dev.tsv", "\ufeff" + mrpc)
    # STS-B: regression.
    write(root / "STS-B/train.tsv", "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
          "sentence2\tscore\n0\tmain\tMSRvid\t2012\t0001\tnone\tnone\tA plane is taking off.\t"
          "An air plane is taking off.\t5.000\n")
    write(root / "STS-B/dev.tsv", (root / "STS-B/train.tsv").read_text())
    # MNLI: two dev files.
    mnli = "index\tsentence1\tsentence2\tgold_label\n0\tA man eats.\tSomeone eats.\tentailment\n"
    for name in ("train", "dev_matched", "dev_mismatched"):
        write(root / f"MNLI/{name}.tsv", mnli)
    return root


def test_cola_without_a_header_and_its_test_file_with_one(glue_dir):
    data = load_glue_folder(task_spec("cola"), glue_dir)
    assert data.train.texts == [("Our friends won't buy this analysis.",), ("The more you eat.",)]
    assert data.train.labels == [1, 0]
    assert data.test["test"].texts == [("The car honked its way down the road.",)] and data.test["test"].ids == ["0"]


def test_mrpc_byte_order_mark_column_names_and_literal_quotes(glue_dir):
    data = load_glue_folder(task_spec("mrpc"), glue_dir)
    assert data.train.texts[0] == ('He called " the witness " a liar .', 'Referring to him as " the witness " .')
    assert data.train.labels == [1, 0] and data.test == {}


def test_stsb_is_a_regression_and_mnli_has_two_dev_splits(glue_dir):
    assert load_glue_folder(task_spec("sts-b"), glue_dir).train.labels == [5.0]
    mnli = load_glue_folder(task_spec("mnli"), glue_dir)
    assert set(mnli.dev) == {"matched", "mismatched"} and mnli.train.labels == [1]


def test_a_label_outside_the_tasks_labels_names_file_and_line(glue_dir):
    write(glue_dir / "CoLA/train.tsv", "gj04\t1\t\tFine.\ngj04\t2\t\tNot a label.\n")
    with pytest.raises(PipelineError, match=r"CoLA/train.tsv:2: label '2' .* not one of the task's labels \(0, 1\)"):
        load_glue_folder(task_spec("cola"), glue_dir)


def test_missing_column_empty_split_and_missing_folder(glue_dir, tmp_path):
    write(glue_dir / "SST-2/train.tsv", "sentence\tstars\ngreat film\t1\n")
    write(glue_dir / "SST-2/dev.tsv", "sentence\tlabel\n")
    with pytest.raises(PipelineError, match=r"SST-2/train.tsv:2: no column 'label' \(columns: sentence, stars\)"):
        load_glue_folder(task_spec("sst2"), glue_dir)
    write(glue_dir / "SST-2/train.tsv", "sentence\tlabel\ngreat film\t1\n")
    with pytest.raises(PipelineError, match=r"SST-2/dev.tsv: no examples \(the split is empty\)"):
        load_glue_folder(task_spec("sst2"), glue_dir)
    with pytest.raises(PipelineError, match="no QNLI/ folder"):
        load_glue_folder(task_spec("qnli"), glue_dir)


def test_custom_tasks_from_jsonl_csv_and_tsv(tmp_path):
    rows = [{"text": "a river", "topic": "nature"}, {"text": "a tensor", "topic": "math"}]
    train = write(tmp_path / "train.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    dev = write(tmp_path / "dev.csv", 'text,topic\n"a quoted, river",nature\n')
    data = load_custom(str(train), str(dev), None, ["text"], "topic", "classification", None)
    assert data.spec.labels == ("math", "nature") and data.train.labels == [1, 0]
    assert data.dev["dev"].texts == [("a quoted, river",)]
    tsv = write(tmp_path / "scores.tsv", "a\tb\tscore\nx\ty\t0.5\n")
    regression = load_custom(str(tsv), str(tsv), None, ["a", "b"], "score", "regression", None)
    assert regression.spec.is_regression and regression.train.labels == [0.5]
    with pytest.raises(PipelineError, match=r"dev.csv:2: label 'sport' .* not one of"):
        write(tmp_path / "dev.csv", "text,topic\nfootball,sport\n")
        load_custom(str(train), str(dev), None, ["text"], "topic", "classification", None)


def test_metrics_match_scikit_learn_and_scipy():
    labels = np.array([0, 1, 1, 0, 1, 1, 0, 0])
    preds = np.array([0, 1, 0, 0, 1, 1, 1, 0])
    assert metric("accuracy", preds, labels) == 0.75
    assert metric("f1", preds, labels) == pytest.approx(f1_score(labels, preds)) == pytest.approx(0.75)
    assert metric("matthews_correlation", preds, labels) == pytest.approx(matthews_corrcoef(labels, preds)) \
        == pytest.approx(0.5)
    scores, gold = np.array([0.1, 0.4, 0.35, 0.8]), np.array([0.0, 0.5, 0.3, 1.0])
    assert metric("pearson", scores, gold) == pytest.approx(pearsonr(scores, gold)[0])
    assert metric("spearman", scores, gold) == pytest.approx(spearmanr(scores, gold)[0]) == pytest.approx(1.0)
    mnli = task_metrics(("accuracy_matched", "accuracy_mismatched"),
                        {"matched": np.array([1, 1]), "mismatched": np.array([0, 1])},
                        {"matched": np.array([1, 1]), "mismatched": np.array([1, 1])})
    assert mnli == {"accuracy_matched": 1.0, "accuracy_mismatched": 0.5}


def test_datasets_glue_is_read_with_its_own_column_names(monkeypatch):
    """The `datasets` path (online: load_dataset("glue", task)), fed a local DatasetDict of the same shape."""
    import datasets

    from pipeline.data.tasks.splits import load_hf_glue

    def fake_load(name, task):
        assert (name, task) == ("glue", "mnli")
        rows = {"premise": ["A man eats.", "Nobody eats."], "hypothesis": ["Someone eats.", "A man eats."],
                "label": [0, 2], "idx": [0, 1]}  # datasets' MNLI: 0 entailment, 1 neutral, 2 contradiction
        features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                      "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"]),
                                      "idx": datasets.Value("int32")})
        train = datasets.Dataset.from_dict(rows, features=features)
        return datasets.DatasetDict({split: train for split in ("train", "validation_matched",
                                                                "validation_mismatched", "test_matched",
                                                                "test_mismatched")})

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    data = load_hf_glue(task_spec("mnli"))
    assert data.train.texts[1] == ("Nobody eats.", "A man eats.")
    assert [data.spec.labels[i] for i in data.train.labels] == ["entailment", "contradiction"]
    assert set(data.dev) == {"matched", "mismatched"} and data.test["matched"].labels is None


def test_a_custom_jsonl_line_that_is_not_an_object_names_file_and_line(tmp_path):
    dev = write(tmp_path / "dev.jsonl", '{"text": "a river", "topic": "nature"}\n')
    bad_json = write(tmp_path / "train.jsonl", '{"text": "a river", "topic": "nature"}\n\n{"text": "cut\n')
    with pytest.raises(PipelineError, match=r"train.jsonl:3: invalid JSON"):
        load_custom(str(bad_json), str(dev), None, ["text"], "topic", "classification", None)
    not_object = write(tmp_path / "train.jsonl", '{"text": "a river", "topic": "nature"}\n["a list"]\n')
    with pytest.raises(PipelineError, match=r"train.jsonl:2: expected a JSON object, got list"):
        load_custom(str(not_object), str(dev), None, ["text"], "topic", "classification", None)
