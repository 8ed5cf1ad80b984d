"""The pipeline's stages as commands: one module per stage, each with `main(argv)` (see pyproject's console scripts)."""
