"""Every task family fine-tunes a ModernBERT export through the shipped configs, as a user runs them.

One process runs `launchers/finetune.py` with configs/glue/custom.json (sentence classification),
configs/tasks/token-custom.json (token tagging) and configs/tasks/qa-custom.json (extractive QA),
each from the same tiny ModernBERT export; the saved models load in the hub interface.
"""

from __future__ import annotations

import json
import random
import subprocess

import pytest
from helpers import PYTHON, ROOT, WORDS
from model_folders import save_export

pytestmark = pytest.mark.slow  # one subprocess, three short fine-tuning runs


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def family_data(root):
    rng = random.Random(0)
    sentences, tagged, questions = [], [], []
    for i in range(48):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 12))]
        sentences.append({"text": " ".join(words), "label": "yes" if "river" in words else "no"})
        tagged.append({"tokens": words, "tags": ["B-LOC" if w == "river" else "O" for w in words]})
        context = " ".join(words)
        answer = words[len(words) // 2]
        questions.append({"id": f"q{i}", "question": "which word is in the middle?", "context": context,
                          "answers": {"text": [answer],
                                      "answer_start": [len(" ".join(words[:len(words) // 2])) + 1]}})
    return {"sentence": write_jsonl(root / "sentence.jsonl", sentences),
            "token": write_jsonl(root / "token.jsonl", tagged), "qa": write_jsonl(root / "qa.jsonl", questions)}


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, bpe_tokenizer_dir):
    root = tmp_path_factory.mktemp("modernbert-ft")
    export = save_export(bpe_tokenizer_dir, root / "export", "modernbert")
    files = family_data(root)
    common = ["--model", str(export), "--set", "train.epochs=1", "--set", "train.batch_size=8",
              "--set", "tracking.enabled=false", "--set", "data.max_seq_len=48"]
    plan = []
    for name, config, data in (("sentence", "configs/glue/custom.json", files["sentence"]),
                               ("token", "configs/tasks/token-custom.json", files["token"]),
                               ("qa", "configs/tasks/qa-custom.json", files["qa"])):
        plan.append(["--config", config, *common, "--set", f"data.train_file={data}",
                     "--set", f"data.validation_file={data}", "--set", f"train.output_dir={root / name}",
                     *(["--set", "data.doc_stride=16"] if name == "qa" else [])])
    (root / "plan.json").write_text(json.dumps(plan))
    proc = subprocess.run([PYTHON, "tests/dist/finetune_each_family.py", str(root / "plan.json")], cwd=ROOT,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root


@pytest.mark.parametrize("family,model_class,metric", [
    ("sentence", "ModernBertForSequenceClassification", "accuracy"),
    ("token", "ModernBertForTokenClassification", "f1"),
    ("qa", "ModernBertForQuestionAnswering", "f1")])
def test_each_family_fine_tunes_the_modernbert_export(finetuned, family, model_class, metric):
    best = json.loads((finetuned / family / "best_model.json").read_text())
    folder = finetuned / family / best["path"]
    assert json.loads((folder / "config.json").read_text())["architectures"] == [model_class]
    assert metric in json.loads((finetuned / family / "metrics.json").read_text())


def test_the_fine_tuned_modernbert_models_work_in_the_hub_interface(finetuned):
    from pipeline.hub import Encoder

    sentence = Encoder.from_pretrained(finetuned / "sentence")
    assert set(sentence.classify("custom", ["the river runs", "a model reads"])) <= {"yes", "no"}
    words = "the river is seven".split()
    assert len(Encoder.from_pretrained(finetuned / "token").predict("token-custom", words)) == 4
    context = "the river runs past the mountain"
    assert Encoder.from_pretrained(finetuned / "qa").answer("which word is in the middle?", context) in context
