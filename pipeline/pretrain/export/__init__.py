"""The export: a checkpoint as an HF folder, its model card, and the check that proves it."""
