"""Pretraining: config, batch plan, masking, batches, model, DeepSpeed engine, trainer, checkpoints, export."""
