"""Model presets by name: the published encoders and the project's tiny configs, built with `hf_config`.

Each preset is the project's own `ModelConfig` plus the vocabulary and sequence length of the
model it is named after; `create_model_config` turns it into a transformers config through the
same `hf_config` that pretraining uses, so a Kit model and a pretrained model are built alike.
The counts in the names are the published ones. They match the transformers models built here to
within 1%, except the BERT paper's "340M" for BERT-large, which is 1.1% above the 336.2M that the
architecture actually has (the bert-large-uncased model card says 336M).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from pipeline.common.errors import PipelineError
from pipeline.data.tokenizer import TokenizerInfo
from pipeline.models.architectures.config import ModelConfig

# Special-token ids of the published vocabularies (roberta-base's <s> <pad> </s>; bert-base-uncased's).
_ROBERTA_VOCAB = TokenizerInfo("roberta-base", "", 50_265, cls_id=0, sep_id=2, pad_id=1, mask_id=50_264,
                               backend_json="")
_BERT_VOCAB = TokenizerInfo("bert-base-uncased", "", 30_522, cls_id=101, sep_id=102, pad_id=0, mask_id=103,
                            backend_json="")
_BASE = {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}
_LARGE = {"num_hidden_layers": 24, "hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 4096}


@dataclass(frozen=True)
class Preset:
    name: str
    """The name with its published size, e.g. `roberta-base (125M)`."""
    model: ModelConfig
    vocabulary: TokenizerInfo
    """The vocabulary the published model uses (replaced by a tokenizer's, when one is given)."""
    seq_len: int
    """Positions in tokens (512 for the published models)."""
    published_params: float
    """Parameters as published, in millions (the figure in the name)."""
    description: str = ""


PRESETS: dict[str, Preset] = {p.name.split(" (")[0]: p for p in (
    Preset("roberta-base (125M)", ModelConfig("roberta", **_BASE), _ROBERTA_VOCAB, 512, 125,
           "Liu et al. 2019; configs/base.json"),
    Preset("roberta-large (355M)", ModelConfig("roberta", **_LARGE), _ROBERTA_VOCAB, 512, 355,
           "Liu et al. 2019; configs/large.json"),
    Preset("bert-base-uncased (110M)", ModelConfig("bert", **_BASE, layer_norm_eps=1e-12, type_vocab_size=2),
           _BERT_VOCAB, 512, 110, "Devlin et al. 2019; configs/bert-base.json"),
    Preset("bert-large (340M)", ModelConfig("bert", **_LARGE, layer_norm_eps=1e-12, type_vocab_size=2),
           _BERT_VOCAB, 512, 340, "Devlin et al. 2019 (the architecture has 336.2M)"),
    Preset("tiny (1.5M)", ModelConfig("roberta", num_hidden_layers=2, hidden_size=128, num_attention_heads=4,
                                    intermediate_size=512), replace(_ROBERTA_VOCAB, vocab_size=8_000), 128, 1.5,
           "the main job's configs/tiny.json with its 8k tokenizer"),
    Preset("test-tiny (0.1M)", ModelConfig("roberta", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                           intermediate_size=128), replace(_ROBERTA_VOCAB, vocab_size=400), 64, 0.1,
           "the test suite's model: 2 layers, hidden 64, 400-token vocabulary"),
)}


def list_model_configs() -> list[str]:
    """Preset names with their published sizes, e.g. `roberta-base (125M)`."""
    return [p.name for p in PRESETS.values()]


def get_preset(name: str) -> Preset:
    """A preset by its short name (`roberta-base`) or its full name (`roberta-base (125M)`)."""
    key = re.sub(r"\s*\(.*\)\s*$", "", name.strip())
    if key not in PRESETS:
        raise PipelineError(f"unknown model preset {name!r}; known: {', '.join(list_model_configs())}")
    return PRESETS[key]


def create_model_config(name: str, tokenizer=None, seq_len: int | None = None, **overrides):
    """A transformers RobertaConfig/BertConfig for preset `name`.

    `tokenizer` (a tokenizer object or folder) sizes the vocabulary and special ids to it;
    `seq_len` sets the positions; `overrides` replace `ModelConfig` fields (e.g. `hidden_dropout_prob=0`).
    """
    from pipeline.models.architectures.hf_model import hf_config

    preset = get_preset(name)
    vocabulary = preset.vocabulary
    if tokenizer is not None:
        from pipeline.data.tokenizer import describe_tokenizer, load_tokenizer

        vocabulary = describe_tokenizer(load_tokenizer(tokenizer) if not hasattr(tokenizer, "encode") else tokenizer)
    unknown = sorted(set(overrides) - set(ModelConfig.__dataclass_fields__))
    if unknown:
        raise PipelineError(f"create_model_config({name!r}): unknown fields {', '.join(unknown)}; "
                            f"known: {', '.join(ModelConfig.__dataclass_fields__)}")
    return hf_config(replace(preset.model, **overrides), vocabulary, seq_len or preset.seq_len)


def count_parameters(config) -> int:
    """Parameters of the pretraining model for `config` (MLM head, BERT's NSP head), built without memory."""
    import torch
    from transformers import BertForPreTraining, RobertaForMaskedLM

    cls = RobertaForMaskedLM if config.model_type == "roberta" else BertForPreTraining
    with torch.device("meta"):  # shapes only: a 355M-parameter model costs no memory
        model = cls(config)
    return sum(p.numel() for p in model.parameters())
