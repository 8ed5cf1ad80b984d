"""The hub interface: load a trained model and use it with fairseq's RoBERTa calls (see `encoder.py`)."""

from pipeline.hub.encoder import Encoder
from pipeline.hub.sources import ModelSource, resolve_source

__all__ = ["Encoder", "ModelSource", "resolve_source"]
