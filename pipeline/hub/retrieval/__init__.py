"""Retrieval beyond the dense cosine search of `embedding_evaluation`: sparse (SPLADE) scoring of sentence-transformers'
`SparseEncoder` folders, by dot product, with the active dimensions per text beside the figures (docs/embeddings.md)."""
