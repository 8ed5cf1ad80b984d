"""The model: transformers' classes with a masked-slot MLM head, packed attention, compilation and FLOPs."""
