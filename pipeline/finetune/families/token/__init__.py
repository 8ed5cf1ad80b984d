"""Token tagging (NER, POS) as a task family."""
