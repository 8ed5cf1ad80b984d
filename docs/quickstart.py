"""Quickstart: the Kit API and the hub interface on one page, on text that ships with Python (no download).

    python docs/quickstart.py [--out DIR] [--texts 400]

1. a tiny RoBERTa from a preset, sized to a tokenizer trained here;
2. masked-LM training on a few hundred docstrings (dynamic masks, bf16 autocast on CPU);
3. fine-tuning on a classification task: which standard-library package a docstring comes from;
4. metrics (accuracy, F1, confusion matrix);
5. the hub interface on both models: encode, extract_features, fill_mask, predict.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import torch  # noqa: E402
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification  # noqa: E402

from pipeline.data.makers.default_corpus import iter_docstring_records  # noqa: E402
from pipeline.data.makers.docstring_task import package_of  # noqa: E402
from pipeline.data.tokenizer import train_tokenizer  # noqa: E402
from pipeline.hub import Encoder  # noqa: E402
from pipeline.kit import (  # noqa: E402
    AMPTrainer,
    create_classification_dataloader,
    create_mlm_dataloader,
    create_model_config,
    evaluate_classification_metrics,
    list_model_configs,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None, help="where models go (default: a temporary folder)")
    p.add_argument("--texts", type=int, default=150, help="docstrings per class to use")
    args = p.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="quickstart-"))
    torch.manual_seed(0)

    # Data: docstrings of the three largest standard-library packages, split 80/20.
    records = [r for r in iter_docstring_records()]
    top = [name for name, _ in Counter(package_of(r["source"]) for r in records).most_common(3)]
    examples = [(r["text"][:400], package_of(r["source"])) for r in records if package_of(r["source"]) in top]
    examples = [e for label in top for e in [x for x in examples if x[1] == label][:args.texts]]
    examples = [examples[i] for i in torch.randperm(len(examples)).tolist()]
    split = int(0.8 * len(examples))
    train, dev = examples[:split], examples[split:]
    texts = [t for t, _ in train]

    # 1. A preset sized to a tokenizer trained on the texts.
    print("presets:", ", ".join(list_model_configs()))
    tokenizer = train_tokenizer(texts, "bpe", 2000, out / "tokenizer")
    config = create_model_config("test-tiny", tokenizer=tokenizer, seq_len=128)

    # 2. Masked-LM training: each pass over the loader is a new epoch with new masks.
    model = AutoModelForMaskedLM.from_config(config)
    loader = create_mlm_dataloader(texts, tokenizer, batch_size=16, max_length=128, seed=0)
    trainer = AMPTrainer(model, torch.optim.AdamW(model.parameters(), lr=2e-3), precision="bf16")
    for epoch in range(1, 4):
        print(f"MLM epoch {epoch}: loss {trainer.train_epoch(loader):.3f}")
    model.save_pretrained(out / "export")
    tokenizer.save_pretrained(out / "export")

    # 3. Fine-tuning on the package task, from the MLM weights.
    labels = tuple(top)
    classifier = AutoModelForSequenceClassification.from_pretrained(
        out / "export", num_labels=len(labels), id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)})
    train_loader = create_classification_dataloader(texts, [y for _, y in train], tokenizer, batch_size=16,
                                                    max_length=128, shuffle=True, label_names=labels)
    dev_loader = create_classification_dataloader([t for t, _ in dev], [y for _, y in dev], tokenizer,
                                                  batch_size=32, max_length=128, label_names=labels)
    trainer = AMPTrainer(classifier, torch.optim.AdamW(classifier.parameters(), lr=1e-3), precision="bf16",
                         accumulation_steps=2)
    for epoch in range(1, 6):
        print(f"classification epoch {epoch}: loss {trainer.train_epoch(train_loader):.3f}")

    # 4. Metrics on the dev split.
    metrics = evaluate_classification_metrics(classifier, dev_loader, trainer.device, len(labels), labels)
    print(f"dev accuracy {metrics['accuracy']:.3f}, macro F1 {metrics['f1_macro']:.3f} "
          f"(majority class {max(Counter(y for _, y in dev).values()) / len(dev):.3f})")
    print("confusion matrix (rows: true", labels, ")\n", metrics["confusion_matrix"])
    finetuned = out / "finetuned"
    classifier.save_pretrained(finetuned)
    tokenizer.save_pretrained(finetuned)
    (finetuned / "pipeline_finetune.json").write_text(json.dumps(
        {"task": "package", "task_type": "classification", "labels": list(labels), "max_seq_len": 128}))

    # 5. The hub interface, as in fairseq's RoBERTa README.
    mlm = Encoder.from_pretrained(out / "export")
    tokens = mlm.encode("Return the number of items.")
    print("encode:", tokens.tolist(), "→ decode:", repr(mlm.decode(tokens)))
    print("features:", tuple(mlm.extract_features(tokens).shape), "layers + embeddings:",
          len(mlm.extract_features(tokens, return_all_hiddens=True)))
    for filled, prob, _ in mlm.fill_mask("Return the <mask> of items.", topk=3):
        print(f"fill_mask: {prob:.3f} {filled}")
    hub = Encoder.from_pretrained(finetuned)
    correct = sum(hub.labels("package")[hub.predict("package", hub.encode(text, max_length=128)).argmax().item()]
                  == label for text, label in dev)
    print(f"hub predict: accuracy {correct / len(dev):.3f} on {len(dev)} dev docstrings")
    print(f"models in {out}")


if __name__ == "__main__":
    main()
