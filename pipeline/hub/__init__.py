"""The hub interface: load a trained model and use it with fairseq's RoBERTa calls (see `encoder.py`)."""

from pipeline.finetune.model_source import ModelSource, resolve_model_source
from pipeline.hub.encoder import Encoder

__all__ = ["Encoder", "ModelSource", "resolve_model_source"]
