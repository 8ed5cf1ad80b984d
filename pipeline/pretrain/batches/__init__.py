"""The batches: a stretch's micro batches gathered, masked and loaded, and its validation batches."""
