"""Search beyond the plain cosine figures: the geometry of a corpus's embeddings, a centring or whitening module for a
Sentence-Transformers folder, the fusion of a model's scores with BM25's (`roberta-embed-eval --hybrid`), a small
search index over documents (`SearchIndex`, also in the Kit and on the hub `Encoder`), and sparse (SPLADE) scoring of
sentence-transformers' `SparseEncoder` folders by dot product, with the active dimensions per text."""
