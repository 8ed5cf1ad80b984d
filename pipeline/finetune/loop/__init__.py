"""One training: the trainer (accelerate), the embedding tuner (sentence-transformers), the arm and its trainings, the
clock."""
