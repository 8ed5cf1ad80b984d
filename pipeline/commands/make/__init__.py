"""The data makers' command lines: the main job's corpus, its keywords and search tasks, the bigram-shift task, minimal
pairs."""
