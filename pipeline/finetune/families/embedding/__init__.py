"""The encoder as an embedding model: contrastive fine-tuning on sentence-transformers, offline evaluation, and the
Sentence-Transformers folder it writes (docs/embeddings.md)."""
