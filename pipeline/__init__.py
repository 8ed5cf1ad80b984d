"""roberta-pipeline: raw text → tokenizer → packed zstd shards → pretraining → fine-tuning."""

__version__ = "0.1.0"
