"""The report: what a run says on screen, in metrics.jsonl and MLflow, and the unigram plateau."""
