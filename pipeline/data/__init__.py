"""The data stage: corpus reading, tokenizer, packing, the shard format and index, the shard stage, readers."""
