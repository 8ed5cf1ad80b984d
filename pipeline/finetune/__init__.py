"""Fine-tuning: tasks, their data and metrics, the trainer, and the main job's docstring task."""
