"""The token and QA task families end to end in one process: files → windows → model → words/answers → files.

Each test re-scores the written prediction files independently (seqeval on the CoNLL output, the
official normalisation on predictions.json) and checks the family's metrics agree exactly.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import PYTHON, ROOT, WORDS, run_script

from pipeline.common.errors import PipelineError
from pipeline.common.run_layout import SeedLayout
from pipeline.finetune.config import FinetuneDataConfig
from pipeline.finetune.families.metrics import squad_metrics
from pipeline.finetune.families.qa.family import QuestionAnsweringFamily, load_qa_task
from pipeline.finetune.families.token.family import TokenTaggingFamily, load_token_task, read_conll_predictions

ENTITIES = {"river": "LOC", "mountain": "LOC", "seven": "NUM", "orange": "COLOR"}


def tagged_sentences(n: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """Random word sentences; the listed words are entities, and `river mountain` is one two-word LOC entity."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 30))]
        tags = []
        for i, w in enumerate(words):
            kind = ENTITIES.get(w)
            inside = kind == "LOC" and w == "mountain" and i > 0 and words[i - 1] == "river"
            tags.append("O" if kind is None else ("I-" if inside else "B-") + kind)
        sentences.append((words, tags))
    return sentences


def write_conll(path, sentences) -> None:
    path.write_text("-DOCSTART- O\n\n" + "".join("".join(f"{w} X {t}\n" for w, t in zip(*s, strict=True)) + "\n"
                                                 for s in sentences))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, bpe_tokenizer_dir):
    from transformers import AutoTokenizer, RobertaConfig, RobertaForMaskedLM

    folder = tmp_path_factory.mktemp("tiny") / "model"
    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=130, pad_token_id=tokenizer.pad_token_id)
    RobertaForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, tokenizer


def run_family(family, model, tokenizer, split, max_seq_len: int) -> tuple[np.ndarray, np.ndarray | None]:
    """What the trainer's validation does, in one process: batches → family.predict → concatenated arrays."""
    dataset = family.encode(split, tokenizer, max_seq_len)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, collate_fn=family.collator(tokenizer))
    predictions, labels = [], []
    model.eval()
    with torch.no_grad():
        for batch in loader:
            p, g = family.predict(model(**batch), batch)
            predictions.append(p)
            labels.append(g)
    return torch.cat(predictions).numpy(), torch.cat(labels).numpy() if labels[0] is not None else None


def test_token_family_predicts_one_tag_per_word_and_its_conll_file_rescores_the_same(tmp_path, tiny_model):
    from seqeval.metrics import f1_score

    folder, tokenizer = tiny_model
    for name, n, seed in (("train", 40, 0), ("dev", 12, 1), ("test", 10, 2)):
        write_conll(tmp_path / f"{name}.txt", tagged_sentences(n, seed))
    data_config = FinetuneDataConfig(train_file=str(tmp_path / "train.txt"), validation_file=str(tmp_path / "dev.txt"),
                                     test_file=str(tmp_path / "test.txt"), max_seq_len=16)
    data = load_token_task("ner", data_config)
    assert data.spec.metrics[0] == "f1" and "B-LOC" in data.spec.labels and data.spec.labels[0] == "O"
    family = TokenTaggingFamily(data, data_config)
    model = family.build_model(str(folder), from_scratch=False)
    assert model.config.id2label[1] == data.spec.labels[1]
    predictions, labels = run_family(family, model, tokenizer, data.dev["dev"], 16)
    assert predictions.shape[1] == 16 and family.windows[data.dev["dev"].source].split_sentences > 0
    metrics = family.metrics({"dev": predictions}, {"dev": labels})
    [path] = family.write_dev_reports(SeedLayout(tmp_path, 1), data.dev, {"dev": predictions}, {"dev": labels})
    assert path.name == "dev_predictions.conll"
    gold, predicted = read_conll_predictions(path)
    assert gold == data.dev["dev"].tags and [len(s) for s in predicted] == [len(s) for s in gold]
    assert metrics["f1"] == f1_score(gold, predicted) and {"f1_LOC", "precision", "recall"} <= metrics.keys()
    test_predictions, _ = run_family(family, model, tokenizer, data.test["test"], 16)
    conll, scores = family.write_test_predictions(SeedLayout(tmp_path, 1), "test", data.test["test"], test_predictions)
    assert (conll.name, scores.name) == ("test_predictions.conll", "test_metrics.json")
    assert json.loads(scores.read_text())["f1"] == f1_score(*read_conll_predictions(conll))


def test_pos_and_custom_tasks_score_accuracy_and_unknown_dev_tags_stop(tmp_path):
    conllu = "1\tHi\thi\tINTJ\t_\t_\t0\troot\t_\t_\n2\tthere\tthere\tADV\t_\t_\t1\tdep\t_\t_\n\n"
    (tmp_path / "train.conllu").write_text(conllu)
    (tmp_path / "dev.conllu").write_text(conllu.replace("ADV", "NOUN"))
    config = FinetuneDataConfig(train_file=str(tmp_path / "train.conllu"), validation_file=str(tmp_path / "dev.conllu"))
    with pytest.raises(PipelineError, match=r"dev.conllu:1: tag 'NOUN' \(word 2, 'there'\) never occurs"):
        load_token_task("pos", config)
    (tmp_path / "dev.conllu").write_text(conllu)
    assert load_token_task("pos", config).spec.metrics == ("accuracy",)
    (tmp_path / "t.jsonl").write_text(json.dumps({"tokens": ["a", "b"], "tags": ["noun", "verb"]}) + "\n")
    custom = FinetuneDataConfig(train_file=str(tmp_path / "t.jsonl"), validation_file=str(tmp_path / "t.jsonl"))
    assert load_token_task("token-custom", custom).spec.metrics == ("accuracy",)
    (tmp_path / "t.jsonl").write_text(json.dumps({"tokens": ["a", "b"], "tags": ["B-X", "O"]}) + "\n")
    assert load_token_task("token-custom", custom).spec.metrics[0] == "f1"


def test_qa_family_answers_every_question_and_predictions_json_rescores_the_same(tmp_path, tiny_model):
    folder, tokenizer = tiny_model
    rng = random.Random(0)
    rows = []
    for i in range(12):
        words = [rng.choice(WORDS) for _ in range(rng.randint(10, 60))]
        context = " ".join(words)
        answer = words[len(words) // 2]
        start = len(" ".join(words[:len(words) // 2])) + 1
        rows.append({"id": f"q{i}", "question": f"which word is in the middle of {i}?", "context": context,
                     "answers": {"text": [answer], "answer_start": [start]}})
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data_config = FinetuneDataConfig(train_file=str(tmp_path / "qa.jsonl"), validation_file=str(tmp_path / "qa.jsonl"),
                                     max_seq_len=64, doc_stride=16)
    data = load_qa_task("qa-custom", data_config)
    family = QuestionAnsweringFamily(data, data_config)
    assert not family.allow_no_answer
    model = family.build_model(str(folder), from_scratch=True)
    logits, labels = run_family(family, model, tokenizer, data.dev["dev"], 64)
    assert labels is None and logits.shape[1:] == (2, 64)
    assert family.windows[data.dev["dev"].source].split_contexts > 0
    metrics = family.metrics({"dev": logits}, {"dev": None})
    [path] = family.write_dev_reports(SeedLayout(tmp_path, 1), data.dev, {"dev": logits}, {})
    assert path.name == "predictions.json"
    answers = json.loads(path.read_text())
    assert sorted(answers) == [r["id"] for r in sorted(rows, key=lambda r: r["id"])]
    assert all(a and a in r["context"] for a, r in zip((answers[r["id"]] for r in rows), rows, strict=True))
    assert squad_metrics(answers, data.dev["dev"].golds()) == metrics


def test_a_question_too_long_for_the_window_names_its_line(tmp_path, tiny_model):
    _, tokenizer = tiny_model
    row = {"id": "q", "question": "river " * 50, "context": "a river", "answers": {"text": [], "answer_start": []}}
    (tmp_path / "qa.jsonl").write_text("\n" + json.dumps(row) + "\n")
    config = FinetuneDataConfig(train_file=str(tmp_path / "qa.jsonl"), validation_file=str(tmp_path / "qa.jsonl"),
                                max_seq_len=64, doc_stride=16)
    family = QuestionAnsweringFamily(load_qa_task("qa-custom", config), config)
    assert family.allow_no_answer
    with pytest.raises(PipelineError, match=r"qa.jsonl:2: the question is \d+ tokens"):
        family.encode(family.data.train, tokenizer, 64)


# ----------------------------------------------------------------------------- through the launcher

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ACCELERATE = [str(Path(PYTHON).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


def write_config(path: Path, task: str, files: dict, output_dir: Path, **data) -> Path:
    config = {"task": task, "data": {**{k: str(v) for k, v in files.items()}, **data},
              "train": {"output_dir": str(output_dir), "learning_rate": 1e-3, "batch_size": 16, "epochs": 4,
                        "warmup_ratio": 0.1, "eval_batch_size": 16},
              "tracking": {"enabled": False}}
    path.write_text(json.dumps(config))
    return path


@pytest.mark.slow
def test_two_processes_learn_a_tagging_task_and_the_saved_model_tags_words_the_same(tmp_path, tiny_model):
    from seqeval.metrics import f1_score

    from pipeline.models.spans.predictors import WordTagger

    folder, _ = tiny_model
    files = {}
    for key, name, n, seed in (("train_file", "train", 400, 0), ("validation_file", "dev", 60, 1),
                               ("test_file", "test", 30, 2)):
        write_conll(tmp_path / f"{name}.txt", tagged_sentences(n, seed))
        files[key] = tmp_path / f"{name}.txt"
    out = tmp_path / "ner"
    config = write_config(tmp_path / "ner.json", "ner", files, out, max_seq_len=24)
    proc = subprocess.run([*ACCELERATE, "launchers/finetune.py", "--config", str(config), "--model", str(folder),
                           "--seeds", "1,2"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "metrics.json").read_text())
    assert report["seeds"] == [1, 2] and report["f1"] >= 0.9 and {"f1_mean", "f1_std", "accuracy"} <= report.keys()
    assert "sentences longer than max_seq_len split into windows" in proc.stdout
    best = json.loads((out / "best_model.json").read_text())
    seed_dir = out / f"seed_{best['seed']}"
    per_seed = json.loads((seed_dir / "metrics.json").read_text())
    assert per_seed["processes"] == 2 and (seed_dir / "complete.json").is_file()
    # The CoNLL files re-score with seqeval to exactly the metrics the run reported.
    gold, predicted = read_conll_predictions(seed_dir / "dev_predictions.conll")
    assert f1_score(gold, predicted) == per_seed["f1"] == best["value"]
    test_gold, test_predicted = read_conll_predictions(seed_dir / "test_predictions.conll")
    assert f1_score(test_gold, test_predicted) == json.loads((seed_dir / "test_metrics.json").read_text())["f1"]
    # The saved model alone, through the hub-style tagger, gives one tag per word: the same tags.
    tagger = WordTagger(seed_dir / "model")
    dev = [s for s, _ in tagged_sentences(60, 1)]
    assert tagger.predict_many(dev) == predicted
    assert WordTagger(out).predict(" ".join(dev[0])) == predicted[0]  # the output folder: its best seed


@pytest.mark.slow
def test_qa_run_answers_across_windows_and_the_saved_model_answers_the_same(tmp_path, tiny_model):
    from pipeline.models.spans.predictors import QuestionAnswerer

    folder, _ = tiny_model
    rng = random.Random(0)

    def rows(n: int, prefix: str) -> list[dict]:
        out = []
        for i in range(n):
            words = [rng.choice([w for w in WORDS if w != "seven"]) for _ in range(rng.randint(20, 50))]
            words[rng.randrange(len(words))] = "seven"
            context = " ".join(words)
            out.append({"id": f"{prefix}{i}", "question": "what is the number?", "context": context,
                        "answers": {"text": ["seven"], "answer_start": [context.index("seven")]}})
        return out

    files = {}
    for key, name, n in (("train_file", "train", 300), ("validation_file", "dev", 40)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(n, name)))
        files[key] = tmp_path / f"{name}.jsonl"
    out = tmp_path / "qa"
    config = write_config(tmp_path / "qa.json", "qa-custom", files, out, max_seq_len=48, doc_stride=16)
    proc = run_script("launchers/finetune.py", "--config", config, "--model", folder, "--seeds", "3", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "metrics.json").read_text())
    assert report["exact_match"] >= 90 and report["f1"] >= report["exact_match"]
    assert "contexts longer than one window" in proc.stdout
    answers = json.loads((out / "seed_3" / "predictions.json").read_text())
    golds = {r["id"]: r["answers"]["text"] for r in map(json.loads, files["validation_file"].read_text().splitlines())}
    assert squad_metrics(answers, golds) == {k: report[k] for k in ("exact_match", "f1")}
    answerer = QuestionAnswerer(out / "seed_3" / "model")
    dev = [json.loads(line) for line in files["validation_file"].read_text().splitlines()[:10]]
    assert [answerer.answer(r["question"], r["context"]) for r in dev] == [answers[r["id"]] for r in dev]


def test_shipped_task_configs_load_and_bad_ones_list_every_problem(tmp_path):
    from pipeline.common.config.tree import ConfigError
    from pipeline.finetune.preflight import load_finetune_config

    for name in ("train", "dev", "test"):
        (tmp_path / name).write_text("x O\n")
    files = [f"data.train_file={tmp_path / 'train'}", f"data.validation_file={tmp_path / 'dev'}"]
    configs = [ROOT / "configs" / "tasks" / f"{name}.json" for name in ("ner", "pos", "squad", "token-custom",
                                                                          "qa-custom")]
    for path in configs:  # the token and QA families' (tests/test_shipped_configs.py loads every shipped config)
        test = [f"data.test_file={tmp_path / 'test'}"] if "custom" not in path.stem else []
        config = load_finetune_config(path, [*files, *test])
        assert config.task == path.stem
    squad = load_finetune_config(ROOT / "configs/tasks/squad.json", files)
    assert (squad.data.max_seq_len, squad.data.doc_stride, squad.data.n_best, squad.data.max_answer_length) == (
        384, 128, 20, 30)
    with pytest.raises(ConfigError) as err:
        load_finetune_config(ROOT / "configs/tasks/squad.json",
                             ["data.train_file=/no/such.json", f"data.validation_file={tmp_path / 'dev'}",
                              "data.doc_stride=300", "data.n_best=0"])
    assert len(err.value.problems) == 3 and "data.train_file: /no/such.json does not exist" in str(err.value)
    assert "data.doc_stride: must be > 0 and under half of data.max_seq_len (384), got 300" in str(err.value)
