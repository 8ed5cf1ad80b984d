"""The floor both stages stand on: the architectures, heads and pooling, loading a model from any folder, span decoding,
parameter groups, precision, model cards and proofs."""
