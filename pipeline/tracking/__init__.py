"""Run tracking: metrics sinks (MLflow, JSONL) and comparisons across runs."""
