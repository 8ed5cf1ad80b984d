"""What a fine-tuning run writes: saved model folders and best_model.json, the model card, the saved model's proof."""
