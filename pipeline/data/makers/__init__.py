"""Dataset makers: the main job's corpus and tasks, bigram shift, minimal pairs."""
