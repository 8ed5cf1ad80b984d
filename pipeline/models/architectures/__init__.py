"""The encoders as transformers' own classes: RoBERTa, pre-LN RoBERTa, BERT and ModernBERT, their config section, packed
documents and FLOPs."""
