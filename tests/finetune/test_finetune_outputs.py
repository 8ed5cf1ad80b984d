"""Fine-tuning in one process: the saved model reproduces its dev metrics, finished seeds are skipped,
the batch arithmetic and AdamW settings come from the config."""

from __future__ import annotations

import json
import random

import pytest
from helpers import WORDS, predict_with_saved_model

from pipeline.common.errors import PipelineError


def keyword_rows(n: int, seed: int) -> list[dict]:
    """Five random words; the label says whether `river` is among them."""
    rng = random.Random(seed)
    others = [w for w in WORDS if w != "river"]
    rows = []
    for i in range(n):
        words = [rng.choice(others) for _ in range(5)]
        if i % 2:
            words[rng.randrange(5)] = "river"
        rows.append({"text": " ".join(words), "label": "yes" if i % 2 else "no"})
    return rows


@pytest.fixture(scope="module")
def small_task(tmp_path_factory, bpe_tokenizer_dir):
    """A custom task, a tiny RoBERTa folder (2 layers, hidden 64) and a fine-tuning config dict."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaForMaskedLM

    root = tmp_path_factory.mktemp("small_task")
    for name, n, seed in (("train", 96, 0), ("dev", 40, 1), ("test", 8, 2)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in keyword_rows(n, seed)))
    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    config = RobertaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=130, pad_token_id=tokenizer.pad_token_id)
    RobertaForMaskedLM(config).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    return {"root": root, "model": str(root / "model"), "config": {
        "task": "custom",
        "data": {"train_file": str(root / "train.jsonl"), "validation_file": str(root / "dev.jsonl"),
                 "test_file": str(root / "test.jsonl"), "text_fields": ["text"], "label_field": "label",
                 "max_seq_len": 32},
        "train": {"output_dir": str(root / "ft"), "learning_rate": 1e-3, "batch_size": 16, "epochs": 2,
                  "eval_batch_size": 16},
        "tracking": {"enabled": False}}}


def load(small_task, tmp_path, *overrides: str, world_size: int = 1):
    from pipeline.finetune.preflight import load_finetune_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps(small_task["config"]))
    return load_finetune_config(path, list(overrides), world_size=world_size)


@pytest.fixture(scope="module")
def finetuned(small_task, tmp_path_factory):
    from pipeline.finetune.runner import run_finetuning

    config = load(small_task, tmp_path_factory.mktemp("cfg"))
    report = run_finetuning(config, small_task["model"], [1], from_scratch=False)
    return {"config": config, "report": report, "out": config.output_dir}


def test_the_saved_model_reproduces_the_dev_metrics_exactly(finetuned, small_task):
    from pipeline.finetune.families.metrics import task_metrics

    out = finetuned["out"]
    pointer = json.loads((out / "best_model.json").read_text())
    saved = json.loads((out / "metrics.json").read_text())
    assert pointer == {"seed": 1, "path": "seed_1/model", "task": "custom", "metric": "accuracy",
                       "value": saved["accuracy"]}
    dev = [json.loads(line) for line in (small_task["root"] / "dev.jsonl").read_text().splitlines()]
    model, predicted = predict_with_saved_model(out / pointer["path"], [r["text"] for r in dev], batch_size=16)
    assert model.config.id2label == {0: "no", 1: "yes"} and model.config.label2id == {"no": 0, "yes": 1}
    gold = [model.config.label2id[r["label"]] for r in dev]
    recomputed = task_metrics(("accuracy", "f1_macro"), {"dev": predicted}, {"dev": gold})
    complete = json.loads((out / "seed_1" / "complete.json").read_text())
    assert recomputed == complete["metrics"] == {k: saved[k] for k in ("accuracy", "f1_macro")}
    rows = [line.split("\t") for line in (out / "seed_1" / "dev_predictions.tsv").read_text().splitlines()]
    assert rows[0] == ["index", "prediction", "label"] and len(rows) == 41
    assert [p for _, p, _ in rows[1:]] == [model.config.id2label[int(p)] for p in predicted]
    assert [g for _, _, g in rows[1:]] == [r["label"] for r in dev]
    provenance = json.loads((out / "seed_1" / "model" / "pipeline_finetune.json").read_text())
    assert provenance["task"] == "custom" and provenance["task_type"] == "classification"
    assert provenance["labels"] == ["no", "yes"] and provenance["seed"] == 1 and provenance["max_seq_len"] == 32
    assert provenance["metrics"] == complete["metrics"] and provenance["source_model"] == small_task["model"]
    assert {"pretrain_run_id", "pretrain_checkpoint"} <= set(provenance)
    assert list((out / "seed_1" / "model").glob("*.safetensors"))
    spent = json.loads((out / "timings.json").read_text())["cpu_s"]  # where the run's time went
    assert spent["training steps"] > 0 and spent["evaluation"] > 0 and spent["saving"] > 0


def test_the_saved_model_is_proven_and_carries_a_model_card_with_its_protocol(finetuned, small_task):
    from huggingface_hub import ModelCard

    model = finetuned["out"] / "seed_1" / "model"
    provenance = json.loads((model / "pipeline_finetune.json").read_text())
    check = provenance["equivalence"]  # the model in memory against the folder AutoModelFor… loads
    assert check["within_tolerance"] and check["max_logit_difference"] <= 1e-5 and check["top1_agreement"] == 1.0
    assert check["compared"] == 16 and "RobertaForSequenceClassification in memory as fine-tuned (cpu)" in \
        check["reference"]
    card = ModelCard.load(model / "README.md")
    assert card.data.pipeline_tag == "text-classification" and card.data.base_model == small_task["model"]
    (result,) = [r for r in card.data.eval_results if r.metric_type == "accuracy"]
    assert result.metric_value == provenance["metrics"]["accuracy"] and result.dataset_split == "validation"
    assert "- No sweep: the config's setting, the best epoch chosen on dev." in card.text
    assert "- Recipe: learning rate 0.001, batch 16, 2 epochs, warmup 6%, weight decay 0.1, fp32, at most 32 " \
           "tokens." in card.text
    assert "loaded with `AutoModelForSequenceClassification` in fp32" in card.text


def test_the_baselines_a_run_stood_beside_join_its_card(finetuned):
    from huggingface_hub import ModelCard

    from pipeline.finetune.outputs.card import record_baselines

    record_baselines(finetuned["out"], [{"name": "from scratch", "metric": "accuracy", "value": 0.5, "note": "median"},
                                        {"name": "token counts", "metric": "accuracy", "value": 0.95}])
    text = ModelCard.load(finetuned["out"] / "seed_1" / "model" / "README.md").text
    assert "| from scratch | accuracy | 0.500 | median |" in text and "| token counts | accuracy | 0.950 |  |" in text


def test_a_saved_folder_that_computes_otherwise_is_refused_and_not_written(small_task, tmp_path, bpe_tokenizer_dir):
    """A position table offset on the way (the config's pad id moved by one): refused, nothing written."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from pipeline.finetune.outputs.folders import save_model

    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer_dir)
    model = AutoModelForSequenceClassification.from_pretrained(small_task["model"], num_labels=2)
    saved = model.save_pretrained

    def shifted(folder, **kwargs):
        saved(folder, **kwargs)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "pad_token_id": config["pad_token_id"] + 1}))

    model.save_pretrained = shifted
    batch = dict(tokenizer(["the river quietly", "a model"], padding=True, return_tensors="pt"))
    with pytest.raises(PipelineError, match="saving the fine-tuned model .* refused: .* largest logit difference"):
        save_model(tmp_path / "model", model, tokenizer, {"seed": 1}, check_batch=batch, precision="fp32")
    assert not (tmp_path / "model").exists()


def test_a_rerun_skips_finished_seeds_and_still_summarizes_them(finetuned, small_task, capsys):
    from pipeline.finetune.runner import run_finetuning

    out = finetuned["out"]
    before = (out / "seed_1" / "complete.json").read_text()
    capsys.readouterr()
    report = run_finetuning(finetuned["config"], small_task["model"], [1, 2], from_scratch=False)
    printed = capsys.readouterr().out
    assert f"custom seed 1: finished before ({out / 'seed_1' / 'complete.json'}), skipped" in printed
    assert "seed 2: finished before" not in printed
    assert (out / "seed_1" / "complete.json").read_text() == before  # not retrained
    first = json.loads(before)["metrics"]
    assert report["seeds"] == [1, 2] and report["per_seed"][0] == {**first, "seed": 1}
    assert json.loads((out / "seed_2" / "complete.json").read_text())["seed"] == 2
    assert report["accuracy"] == pytest.approx((first["accuracy"] + report["per_seed"][1]["accuracy"]) / 2)
    # A finished seed of another set-up (here: from scratch) is not overwritten silently.
    with pytest.raises(PipelineError, match="from_scratch True there, False now|from_scratch False there, True now"):
        run_finetuning(finetuned["config"], small_task["model"], [1], from_scratch=True)


def test_a_rerun_with_another_recipe_is_refused_naming_the_setting(finetuned, small_task):
    from pipeline.finetune.preflight import load_finetune_config
    from pipeline.finetune.runner import run_finetuning

    out = finetuned["out"]
    path = out.parent / "other_lr.json"
    path.write_text(json.dumps({**small_task["config"], "train": {**small_task["config"]["train"],
                                                                   "output_dir": str(out), "learning_rate": 5e-4}}))
    before = (out / "seed_1" / "complete.json").read_text()
    with pytest.raises(PipelineError, match=r"recipe train.learning_rate 0.001 there, 0.0005 now"):
        run_finetuning(load_finetune_config(path, []), small_task["model"], [1], from_scratch=False)
    assert (out / "seed_1" / "complete.json").read_text() == before


def test_a_model_retrained_in_place_is_not_mistaken_for_the_old_one(small_task, tmp_path):
    """Same folder, other weights: the pretrained seed is refused, the from-scratch one (which reads only the
    config and tokenizer) is still skipped."""
    import shutil

    import torch
    from transformers import AutoModelForMaskedLM

    from pipeline.finetune.runner import run_finetuning

    model = tmp_path / "model"
    shutil.copytree(small_task["model"], model)
    pretrained = load(small_task, tmp_path, f"train.output_dir={tmp_path / 'ft'}", "train.epochs=1")
    scratch = load(small_task, tmp_path, f"train.output_dir={tmp_path / 'scratch'}", "train.epochs=1")
    run_finetuning(pretrained, str(model), [1], from_scratch=False)
    run_finetuning(scratch, str(model), [1], from_scratch=True)
    retrained = AutoModelForMaskedLM.from_pretrained(model)
    with torch.no_grad():
        retrained.get_input_embeddings().weight.add_(0.1)
    retrained.save_pretrained(model)
    with pytest.raises(PipelineError, match="model_fingerprint '[0-9a-f]+' there, '[0-9a-f]+' now"):
        run_finetuning(pretrained, str(model), [1], from_scratch=False)
    assert run_finetuning(scratch, str(model), [1], from_scratch=True)["seeds"] == [1]


def test_only_a_seed_finished_from_the_models_weights_pins_its_export(tmp_path):
    from pipeline.finetune.loop.arm import holds_pretrained_seeds

    for seed, record in (("seed_1", '{"from_scratch": true}'), ("seed_2", "{damaged")):
        (tmp_path / seed).mkdir()
        (tmp_path / seed / "complete.json").write_text(record)
    assert not holds_pretrained_seeds(tmp_path)
    (tmp_path / "seed_3").mkdir()
    (tmp_path / "seed_3" / "complete.json").write_text('{"from_scratch": false}')
    assert holds_pretrained_seeds(tmp_path)


def test_batch_size_is_global_and_split_by_the_batch_plan(small_task, tmp_path):
    from pipeline.common.config.tree import ConfigError

    assert load(small_task, tmp_path, world_size=2).batch_plan(2).micro_batch_size == 8
    plan = load(small_task, tmp_path, "train.micro_batch_size=4", world_size=2).batch_plan(2)
    assert (plan.global_batch_size, plan.micro_batch_size, plan.world_size, plan.accumulation) == (16, 4, 2, 2)
    with pytest.raises(ConfigError) as err:
        load(small_task, tmp_path, "train.batch_size=10", "train.micro_batch_size=4", world_size=2)
    assert "train.batch_size 10 is not divisible by train.micro_batch_size 4 × world size 2" in str(err.value)


def test_precision_has_the_pipelines_one_spelling_and_the_old_key_says_the_new_one(small_task, tmp_path):
    from pipeline.common.config.tree import ConfigError

    assert load(small_task, tmp_path).train.precision == "fp32"
    assert load(small_task, tmp_path, "train.precision=bf16").train.precision == "bf16"
    with pytest.raises(ConfigError) as err:
        load(small_task, tmp_path, "train.mixed_precision=no")
    assert 'train.mixed_precision: this spelling is no longer read; write train.precision: "fp32"' in str(err.value)
    with pytest.raises(ConfigError, match="train.precision"):
        load(small_task, tmp_path, "train.precision=no")


def scratch_training(config, model: str, seed: int = 3):
    """One from-scratch training of `config`'s task on `model`'s architecture, in this process."""
    from pipeline.finetune.families.registry import task_family
    from pipeline.finetune.loop.accelerator import processes
    from pipeline.finetune.loop.arm import Arm, Training
    from pipeline.finetune.task_loading import load_task
    from pipeline.models.model_source import ModelSource

    data = load_task(config)
    return Training(config, data, task_family(data), Arm(config, ModelSource(model), True, processes()), seed)


def test_adam_betas_and_eps_come_from_the_config(small_task, tmp_path):
    from pipeline.finetune.loop.trainer import FineTuner

    default = load(small_task, tmp_path).train
    assert (default.adam_betas, default.adam_eps) == ((0.9, 0.98), 1e-6)  # RoBERTa's GLUE recipe
    config = load(small_task, tmp_path, "train.adam_betas=[0.9, 0.999]", "train.adam_eps=1e-8")
    tuner = FineTuner(scratch_training(config, small_task["model"]))
    tuner.setup()
    assert {(g["betas"], g["eps"]) for g in tuner.optimizer.param_groups} == {((0.9, 0.999), 1e-8)}


def test_training_batches_hold_rows_of_similar_length_and_scores_come_back_in_the_files_order(small_task, tmp_path):
    """Each batch pads to its longest row, so the training batches group rows of similar length (HF's
    `group_by_length`) and evaluation reads shortest first; predictions and labels return in the file's order."""
    import numpy as np
    import torch

    from pipeline.finetune.loop.trainer import FineTuner, LengthSorted

    rng = random.Random(5)
    for name, n in (("train", 640), ("dev", 48)):  # 1 to 24 words, so the lengths differ
        rows = [{"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 24))), "label": rng.choice("ab")}
                for _ in range(n)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = load(small_task, tmp_path, f"data.train_file={tmp_path / 'train.jsonl'}",
                  f"data.validation_file={tmp_path / 'dev.jsonl'}", "data.test_file=null")
    tuner = FineTuner(scratch_training(config, small_task["model"]))
    tuner.setup()
    data = tuner.data

    def padding(batches) -> float:
        batches = list(batches)
        return 1 - sum(int(b["attention_mask"].sum()) for b in batches) / sum(b["input_ids"].numel() for b in batches)

    train_set = tuner.arm.encoded(tuner.family, data.train, config.data.max_seq_len)
    shuffled = torch.utils.data.DataLoader(train_set, batch_size=16, shuffle=True, collate_fn=tuner.family.collator(
        tuner.tokenizer), generator=torch.Generator().manual_seed(0))
    assert padding(tuner.train_loader) < padding(shuffled) / 2
    assert sorted(tuner.train_loader.get_sampler()) == list(range(640))  # every row once an epoch

    sorted_dev = tuner.dev_loaders["dev"].dataset
    lengths = [len(sorted_dev[i]["input_ids"]) for i in range(len(sorted_dev))]
    assert lengths == sorted(lengths) and lengths != [len(x) for x in train_set.encodings["input_ids"][:48]]
    evaluation = tuner.validate()
    assert evaluation.labels["dev"].tolist() == data.dev["dev"].labels
    assert LengthSorted(train_set).unsort(np.array(sorted(len(x) for x in train_set.encodings["input_ids"]))
                                          ).tolist() == [len(x) for x in train_set.encodings["input_ids"]]
