"""The fair fine-tuning protocol: a sweep scored on a hashed slice of the training split, never on dev.

The end-to-end tests run the command in this process on a tiny random-weight encoder and a keyword
task whose dev labels are INVERTED: a setting that learns the task scores near 0 on that dev file
and near 1 on the slice, a setting that learns nothing about 0.5 on both. Only a protocol that
never looks at dev chooses the learning setting.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from helpers import PYTHON, ROOT, WORDS

from pipeline.common.config.tree import build_config, flatten, to_dict
from pipeline.common.errors import PipelineError
from pipeline.data.tasks.qa_files import QAExample, QASplit
from pipeline.data.tasks.splits import Split
from pipeline.data.tasks.token_files import TaggedSplit
from pipeline.finetune.config import FinetuneConfig
from pipeline.finetune.loop import trainer
from pipeline.finetune.loop.arm import RESULT_NEUTRAL_SETTINGS
from pipeline.finetune.protocol.selection import select_score, split_for_selection
from pipeline.finetune.protocol.sweep import FIXED_PER_LAUNCH, SWEEPABLE_DATA, parse_sweep

# ----------------------------------------------------------------------------- the grid and the slice

def test_the_grid_is_the_product_of_the_swept_keys_in_the_order_given():
    grid = parse_sweep(["train.learning_rate=1e-4,1e-3", "train.epochs=2,3"])
    assert grid == [("train.learning_rate=1e-4", "train.epochs=2"), ("train.learning_rate=1e-4", "train.epochs=3"),
                    ("train.learning_rate=1e-3", "train.epochs=2"), ("train.learning_rate=1e-3", "train.epochs=3")]


@pytest.mark.parametrize("spec, message", [
    (["train.learning_rate"], "expected KEY=V1,V2"), (["train.learning_rate=1e-4,"], "expected KEY=V1,V2"),
    (["train.epochs=2", "train.epochs=3"], "given twice"), (["train.seed=1,2"], "cannot be swept"),
    (["train.output_dir=a,b"], "cannot be swept"), (["train.epochs=2,2"], "listed twice"),
    (["data.max_train_examples=8,32"], "read once, before the sweep"),
    (["train.precision=fp32,bf16"], "read once per launch"), (["task=sst2,rte"], "read once per launch"),
    (["train.eval_batch_size=32,64"], "changes no result"), (["tracking.experiment=a,b"], "changes no result")])
def test_a_bad_sweep_is_an_error_naming_it(spec, message):
    with pytest.raises(PipelineError, match=message):
        parse_sweep(spec)


def test_every_key_a_sweep_refuses_by_name_is_a_config_key_today():
    """A renamed key left in these lists would let its new name be swept unchecked."""
    config, problems = build_config(FinetuneConfig, {"data": {"glue_dir": "glue"}})
    assert not problems
    keys = set(flatten(to_dict(config)))
    assert set(FIXED_PER_LAUNCH + RESULT_NEUTRAL_SETTINGS + SWEEPABLE_DATA) <= keys


def sentence_split(n: int, start: int = 0) -> Split:
    return Split("train.jsonl", [(f"example {i}",) for i in range(start, start + n)], [i % 2 for i in range(n)],
                 [str(i) for i in range(start, start + n)])


def test_the_slice_is_chosen_by_content_so_order_and_added_examples_do_not_move_it():
    cut = split_for_selection(sentence_split(2000), 0.1)
    held = {t for t, in cut.held_out.texts}
    assert 150 <= len(held) <= 250 and len(cut.fit) + len(held) == 2000
    assert held.isdisjoint(t for t, in cut.fit.texts)
    shuffled = sentence_split(2000)
    order = list(range(2000))
    random.Random(0).shuffle(order)
    shuffled.texts = [shuffled.texts[i] for i in order]
    shuffled.labels = [shuffled.labels[i] for i in order]
    shuffled.ids = [shuffled.ids[i] for i in order]
    assert {t for t, in split_for_selection(shuffled, 0.1).held_out.texts} == held
    grown = sentence_split(2500)
    assert {t for t, in split_for_selection(grown, 0.1).held_out.texts} & {f"example {i}" for i in range(2000)} == held
    # Labels and ids travel with their texts.
    assert all(cut.held_out.labels[i] == int(cut.held_out.ids[i]) % 2 for i in range(len(cut.held_out)))


def test_token_and_qa_splits_are_cut_by_their_words_and_questions():
    words = [[f"w{i}", "river", f"x{i}"] for i in range(400)]
    tagged = TaggedSplit("ner.conll", words, [["O", "B-LOC", "O"] for _ in words], list(range(1, 401)))
    cut = split_for_selection(tagged, 0.2)
    assert {" ".join(w) for w in cut.held_out.words} == {" ".join(w) for w in words
                                                          if select_score(" ".join(w)) < 0.2}
    assert cut.held_out.lines == [i + 1 for i, w in enumerate(words) if select_score(" ".join(w)) < 0.2]
    examples = [QAExample(str(i), f"q{i}?", f"context {i}", ["context"], [0]) for i in range(300)]
    qa = split_for_selection(QASplit("qa.jsonl", examples, [f"qa.jsonl:{i + 1}" for i in range(300)]), 0.2)
    assert len(qa.fit) + len(qa.held_out) == 300 and {e.id for e in qa.held_out.examples}.isdisjoint(
        e.id for e in qa.fit.examples)
    assert qa.held_out.source.endswith("(selection slice)")


def test_a_fraction_that_leaves_one_side_empty_is_an_error():
    with pytest.raises(PipelineError, match="each needs at least one"):
        split_for_selection(sentence_split(3), 0.01)
    with pytest.raises(PipelineError, match="between 0 and 1"):
        split_for_selection(sentence_split(30), 1.0)


# ----------------------------------------------------------------------------- end to end, in this process

def keyword_rows(n: int, seed: int, inverted: bool = False) -> list[dict]:
    """Six random words; the label says whether `river` is among them (balanced); `inverted` flips every label."""
    rng = random.Random(seed)
    others = [w for w in WORDS if w != "river"]
    rows = []
    for i in range(n):
        words = [rng.choice(others) for _ in range(6)]
        if i % 2:
            words[rng.randrange(6)] = "river"
        rows.append({"text": " ".join(words), "label": "yes" if (i % 2) != inverted else "no"})
    return rows


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, bpe_tokenizer_dir):
    from transformers import AutoTokenizer, RobertaConfig, RobertaForMaskedLM

    folder = tmp_path_factory.mktemp("tiny") / "model"
    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=130, pad_token_id=tokenizer.pad_token_id)
    RobertaForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def poisoned_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("poisoned")
    for name, n, seed, inverted in (("train", 400, 0, False), ("dev", 100, 1, True)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keyword_rows(n, seed, inverted)))
    uri = f"sqlite:///{root / 'mlflow.db'}"
    cfg = {"task": "custom",
           "data": {"train_file": str(root / "train.jsonl"), "validation_file": str(root / "dev.jsonl"),
                    "text_fields": ["text"], "label_field": "label", "max_seq_len": 32},
           "train": {"output_dir": str(root / "ft"), "learning_rate": 1e-3, "batch_size": 16, "epochs": 3,
                     "warmup_ratio": 0.1, "eval_batch_size": 64},
           "tracking": {"enabled": True, "uri": uri, "experiment": "sweep-tests"}}
    (root / "config.json").write_text(json.dumps(cfg))
    return root


class Spy:
    """Records, for every FineTuner, the splits it was given as dev and how often it scored dev."""

    def __init__(self, monkeypatch):
        self.runs: list[dict] = []
        spy = self
        original_run, original_validate = trainer.FineTuner.run, trainer.FineTuner.validate

        def run(tuner, takes_over=None):
            trial = tuner.training.part if tuner.training.role == "trial" else None
            spy.runs.append({"trial": trial, "dev": [s.source for s in tuner.data.dev.values()],
                             "dev_scored": 0, "train": tuner.data.train.source, "took_over": takes_over is not None})
            tuner._spy = spy.runs[-1]
            return original_run(tuner, takes_over)

        def validate(tuner, loaders=None):
            if loaders is None:
                tuner._spy["dev_scored"] += 1
            return original_validate(tuner, loaders)

        monkeypatch.setattr(trainer.FineTuner, "run", run)
        monkeypatch.setattr(trainer.FineTuner, "validate", validate)


def finetune(*args) -> None:
    from pipeline.commands.finetune import main

    main([str(a) for a in args])


SWEEP = ["--sweep", "train.learning_rate=1e-6,1e-3"]


def test_selection_never_reads_dev_and_a_rerun_skips_every_finished_trial(poisoned_task, tiny_model, monkeypatch,
                                                                         capsys):
    from mlflow.tracking import MlflowClient

    spy = Spy(monkeypatch)
    finetune("--config", poisoned_task / "config.json", "--model", tiny_model, "--from-scratch", "--seeds", "1", *SWEEP)
    trials = [r for r in spy.runs if r["trial"]]
    seeds = [r for r in spy.runs if not r["trial"]]
    assert len(trials) == 2 and len(seeds) == 1
    # Trials are given the slice as their only "dev" and train on the rest of train.
    assert all(r["dev"] == [f"{poisoned_task / 'train.jsonl'} (selection slice)"] for r in trials)
    assert all(r["train"].endswith("(without the selection slice)") for r in spy.runs)
    # The final seed scores dev exactly once, after the slice chose its epoch.
    assert seeds[0]["dev"] == [str(poisoned_task / "dev.jsonl")] and seeds[0]["dev_scored"] == 1

    ft = poisoned_task / "ft"
    report = json.loads((ft / "metrics.json").read_text())
    # The setting that learns wins on the slice; the inverted dev would have chosen 1e-6.
    assert report["chosen_setting"] == {"train.learning_rate": "1e-3"}
    assert report["selection_score"] >= 0.9 and report["accuracy"] <= 0.2
    selection = report["selection"]
    assert selection["metric"] == "accuracy" and selection["seed"] == 1 and selection["fraction"] == 0.1
    assert [t["setting"] for t in selection["trials"]] == [{"train.learning_rate": "1e-6"},
                                                           {"train.learning_rate": "1e-3"}]
    assert selection["held_out"] + selection["fit"] == 400
    assert json.loads((ft / "selection.json").read_text()) == selection
    per_seed = report["per_seed"][0]
    assert per_seed["select_accuracy"] >= 0.9
    assert json.loads((ft / "best_model.json").read_text())["metric"] == "select_accuracy"
    assert not list((ft / "selection").glob("trial_*/seed_1/model"))  # trials keep no weights
    from huggingface_hub import ModelCard  # the saved model's card tells the protocol that chose it

    card = ModelCard.load(ft / "seed_1" / "model" / "README.md")
    assert card.data.base_model is None and "from-scratch" in card.data.tags
    assert (f"- Sweep: each setting (train.learning_rate=1e-6; train.learning_rate=1e-3) trained on the training "
            f"split minus a held-out slice ({selection['held_out']:,} examples, 10% by content hash) and scored on it "
            f"by accuracy; dev chose nothing. Chosen: train.learning_rate=1e-3") in card.text

    client = MlflowClient(f"sqlite:///{poisoned_task / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("sweep-tests").experiment_id])
    (parent,) = [r for r in runs if r.data.tags["stage"] == "finetune-summary"]
    children = [r for r in runs if r.data.tags["stage"] == "finetune-trial"]
    assert len(children) == 2 and all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
    assert parent.data.tags["chosen_setting"] == "train.learning_rate=1e-3"
    assert all(r.data.metrics["best/select_accuracy"] == t["score"] for r, t in zip(
        sorted(children, key=lambda r: r.data.tags["trial"]), sorted(selection["trials"], key=lambda t: t["trial"]),
        strict=True))
    assert all("eval/accuracy" not in r.data.metrics for r in children)
    assert parent.data.metrics["selection/score"] == report["selection_score"]

    capsys.readouterr()
    spy.runs.clear()
    finetune("--config", poisoned_task / "config.json", "--model", tiny_model, "--from-scratch", "--seeds", "1", *SWEEP)
    out = capsys.readouterr().out
    assert spy.runs == [] and out.count("finished before") == 3
    assert json.loads((ft / "metrics.json").read_text())["selection"] == selection

    # A grown grid trains only its new setting; the choice stands, so the finished seed is kept too.
    finetune("--config", poisoned_task / "config.json", "--model", tiny_model, "--from-scratch", "--seeds", "1",
             "--sweep", "train.learning_rate=1e-6,1e-3,1e-5")
    assert [r["trial"] for r in spy.runs] == [trial for trial in {t["trial"] for t in json.loads(
        (ft / "selection.json").read_text())["trials"]} - {t["trial"] for t in selection["trials"]}]
    assert json.loads((ft / "metrics.json").read_text())["chosen_setting"] == {"train.learning_rate": "1e-3"}


def test_the_selection_seed_takes_the_winning_trial_over_with_the_result_of_training_it(poisoned_task, tiny_model,
                                                                                       monkeypatch, tmp_path):
    """Seed 1 on the chosen setting would repeat the winning trial step for step: it is not trained again, and
    its result is the one a training gives (a rerun whose trials were finished before trains seed 1 itself)."""
    import shutil

    fits = []
    original_fit = trainer.FineTuner.fit
    monkeypatch.setattr(trainer.FineTuner, "fit", lambda tuner: fits.append(tuner.label) or original_fit(tuner))
    spy = Spy(monkeypatch)
    args = ["--config", poisoned_task / "config.json", "--model", tiny_model, "--from-scratch", "--seeds", "1,2",
            *SWEEP, "--set", "tracking.enabled=false"]
    finetune(*args, "--set", f"train.output_dir={tmp_path / 'took-over'}")
    assert [r["took_over"] for r in spy.runs] == [False, False, True, False]  # two trials, seed 1, seed 2
    assert len(fits) == 3 and not any(label.startswith("custom seed 1") for label in fits)
    # Figures for the seeds that keep a model; a trial reports in files alone.
    assert (tmp_path / "took-over" / "seed_1" / "confusion_dev.png").exists()
    assert not list((tmp_path / "took-over" / "selection").rglob("*.png"))
    assert list((tmp_path / "took-over" / "selection").rglob("dev_predictions.tsv"))

    shutil.copytree(tmp_path / "took-over" / "selection", tmp_path / "trained" / "selection")
    fits.clear()
    finetune(*args, "--set", f"train.output_dir={tmp_path / 'trained'}")
    assert len(fits) == 2  # the trials were finished before, so they kept no weights: seeds 1 and 2 train
    for name in ("metrics.json", "history.json"):
        took_over, trained = (json.loads((tmp_path / run / "seed_1" / name).read_text())
                              for run in ("took-over", "trained"))
        assert took_over == trained
    assert (tmp_path / "took-over" / "seed_1" / "model" / "model.safetensors").read_bytes() == (
        tmp_path / "trained" / "seed_1" / "model" / "model.safetensors").read_bytes()


def test_every_training_accumulates_as_its_own_batch_plan_says(poisoned_task, tiny_model, monkeypatch, tmp_path):
    """A swept batch size changes the accumulation from trial to trial; each training (trials, then the seeds on
    the chosen setting) steps with its own plan's, whatever trained before it."""
    accumulated = []
    original_fit = trainer.FineTuner.fit

    def fit(tuner):
        accumulated.append((tuner.label, tuner.accelerator.gradient_accumulation_steps,
                            tuner.config.train.batch_size // 8))
        return original_fit(tuner)

    monkeypatch.setattr(trainer.FineTuner, "fit", fit)
    finetune("--config", poisoned_task / "config.json", "--model", tiny_model, "--from-scratch", "--seeds", "1,2",
             "--sweep", "train.batch_size=8,32", "--set", "train.micro_batch_size=8", "--set", "train.epochs=1",
             "--set", "tracking.enabled=false", "--set", f"train.output_dir={tmp_path / 'ft'}")
    chosen = json.loads((tmp_path / "ft" / "metrics.json").read_text())["chosen_setting"]["train.batch_size"]
    assert [label for label, _, _ in accumulated][-1] == "custom seed 2 (scratch)"  # seed 1 took its trial over
    assert all(steps == planned for _, steps, planned in accumulated)
    assert accumulated[-1][1] == int(chosen) // 8 and {steps for _, steps, _ in accumulated[:2]} == {1, 4}


def test_a_sweep_of_a_token_task_chooses_on_its_slice(tmp_path, tiny_model):
    rng = random.Random(0)
    for name, n in (("train", 200), ("dev", 40)):
        lines = []
        for _ in range(n):
            words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]
            lines += [f"{w} X {'B-LOC' if w == 'river' else 'O'}" for w in words] + [""]
        (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n")
    cfg = {"task": "ner", "data": {"train_file": str(tmp_path / "train.txt"),
                                   "validation_file": str(tmp_path / "dev.txt"), "max_seq_len": 24},
           "train": {"output_dir": str(tmp_path / "ner"), "batch_size": 16, "epochs": 2, "eval_batch_size": 32},
           "tracking": {"enabled": False}}
    (tmp_path / "ner.json").write_text(json.dumps(cfg))
    finetune("--config", tmp_path / "ner.json", "--model", tiny_model, "--sweep", "train.learning_rate=1e-5,3e-3",
             "--select-fraction", "0.25")
    report = json.loads((tmp_path / "ner" / "metrics.json").read_text())
    assert report["selection"]["metric"] == "f1" and len(report["selection"]["trials"]) == 2
    assert report["metric"] == "f1"  # the main metric is named: "accuracy" sorts before it in the file
    assert {"f1", "select_f1"} <= report["per_seed"][0].keys()
    assert report["selection_score"] == max(t["score"] for t in report["selection"]["trials"])


def test_select_fraction_without_a_sweep_is_an_error(poisoned_task, tiny_model, capsys):
    with pytest.raises(SystemExit) as stop:
        finetune("--config", poisoned_task / "config.json", "--model", tiny_model, "--select-fraction", "0.2")
    assert stop.value.code == 2 and "only with --sweep" in capsys.readouterr().err


# ----------------------------------------------------------------------------- under accelerate launch

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ACCELERATE = [str(Path(PYTHON).parent / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


@pytest.mark.slow  # accelerate launch of 2 processes
def test_two_processes_choose_the_same_setting_and_report_it(poisoned_task, tiny_model, tmp_path):
    cfg = json.loads((poisoned_task / "config.json").read_text())
    cfg["train"]["output_dir"] = str(tmp_path / "ft")
    cfg["tracking"]["enabled"] = False
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    proc = subprocess.run([*ACCELERATE, "launchers/finetune.py", "--config", str(tmp_path / "config.json"),
                           "--model", str(tiny_model), "--from-scratch", "--seeds", "1,2", *SWEEP],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "ft" / "metrics.json").read_text())
    assert report["chosen_setting"] == {"train.learning_rate": "1e-3"} and report["seeds"] == [1, 2]
    assert all(json.loads((tmp_path / "ft" / f"seed_{s}" / "metrics.json").read_text())["processes"] == 2
               for s in (1, 2))
    assert report["accuracy"] <= 0.2  # dev is inverted: the model learned the task, chosen without dev
