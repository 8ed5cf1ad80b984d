"""The hub interface: load a trained model and use it with fairseq's RoBERTa calls (see `encoder.py`)."""

from pipeline.hub.encoder import Encoder
from pipeline.models.model_source import ModelSource, resolve_model_source

__all__ = ["Encoder", "ModelSource", "resolve_model_source"]
