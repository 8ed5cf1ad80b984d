"""Encoders built from transformers' own classes, with the MLM head applied only at masked positions.

The training classes subclass `RobertaForMaskedLM`, `RobertaPreLayerNormForMaskedLM` (pre-LN: LayerNorm
before each sub-layer, stable at higher learning rates), `BertForPreTraining` and `ModernBertForMaskedLM`
(Warner et al. 2024: rotary positions, GeGLU, pre-norm without biases, alternating sliding-window and
global attention), and only override `forward`: parameter names and state-dict keys are HF's, so an
export is a plain HF checkpoint. The override gathers the ~15% masked positions before the head, so
the vocabulary projection (most of the FLOPs of a small encoder) runs on those alone; the loss is the
same mean cross-entropy over masked tokens that HF computes from full logits.

The batch names the masked positions in a fixed number of slots (masked_slots.py): the gather is an
`index_select`, with no device→host sync and the same shape every micro batch, so a compiled graph stays static.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F
from transformers import (
    BertConfig,
    BertForPreTraining,
    ModernBertConfig,
    ModernBertForMaskedLM,
    RobertaConfig,
    RobertaForMaskedLM,
    RobertaPreLayerNormConfig,
    RobertaPreLayerNormForMaskedLM,
)

from pipeline.common.errors import PipelineError
from pipeline.common.hub_names import local_or_hub
from pipeline.data.tokenizer import TokenizerInfo
from pipeline.models.architectures.config import ModelConfig
from pipeline.models.architectures.packed_attention import FLEX, check_flex_mask, encoder_inputs
from pipeline.models.architectures.span_contrast import SpanContrast
from pipeline.models.heads import IGNORE_INDEX

HF_CONFIG_FIELDS = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "hidden_act",
                    "hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps", "initializer_range")


def hf_config(model: ModelConfig, tokenizer: TokenizerInfo,
              seq_len: int) -> RobertaConfig | RobertaPreLayerNormConfig | BertConfig | ModernBertConfig:
    """The transformers config for `model`, sized to the tokenizer's vocabulary and `seq_len`."""
    if model.architecture == "modernbert":
        return modernbert_config(model, tokenizer, seq_len)
    fields = {name: getattr(model, name) for name in HF_CONFIG_FIELDS}
    fields["attn_implementation"] = model.attn_implementation
    if model.architecture in ("roberta", "roberta-prelayernorm"):
        cls = RobertaConfig if model.architecture == "roberta" else RobertaPreLayerNormConfig
        return cls(**fields, vocab_size=tokenizer.vocab_size,  # positions from pad_id + 1: that many more slots
                   max_position_embeddings=seq_len + first_position_id(model.architecture, tokenizer.pad_id),
                   type_vocab_size=model.type_vocab_size or 1, pad_token_id=tokenizer.pad_id,
                   bos_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id)
    return BertConfig(**fields, vocab_size=tokenizer.vocab_size, max_position_embeddings=seq_len,
                      type_vocab_size=model.type_vocab_size or 2, pad_token_id=tokenizer.pad_id)


def modernbert_config(model: ModelConfig, tokenizer: TokenizerInfo, seq_len: int) -> ModernBertConfig:
    """ModernBertConfig from the shared shape keys and ModernBERT's own; no biases, as in the paper.

    Rotary positions need no table, so `max_position_embeddings` only records `seq_len`. The saved
    config keeps `sparse_prediction` false: an export gives full logits, as `fill-mask` expects.
    """
    return ModernBertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=model.hidden_size, intermediate_size=model.intermediate_size,
        num_hidden_layers=model.num_hidden_layers, num_attention_heads=model.num_attention_heads,
        hidden_activation=model.hidden_act, max_position_embeddings=seq_len,
        initializer_range=model.initializer_range, norm_eps=model.layer_norm_eps,
        embedding_dropout=model.hidden_dropout_prob, mlp_dropout=model.hidden_dropout_prob,
        attention_dropout=model.attention_probs_dropout_prob, local_attention=model.local_attention,
        global_attn_every_n_layers=model.global_attn_every_n_layers, global_rope_theta=model.global_rope_theta,
        local_rope_theta=model.local_rope_theta, classifier_pooling=model.classifier_pooling,
        pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.cls_id,
        cls_token_id=tokenizer.cls_id, eos_token_id=tokenizer.sep_id, sep_token_id=tokenizer.sep_id,
        attn_implementation=model.attn_implementation)


def first_position_id(architecture: str, pad_id: int) -> int:
    """The position id of a sequence's first token: RoBERTa counts from pad_id + 1, BERT and ModernBERT from 0."""
    return pad_id + 1 if architecture in ("roberta", "roberta-prelayernorm") else 0


def _head_at(hidden: torch.Tensor, masked_positions: torch.Tensor,
             head: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Vocabulary logits of every slot, (slots, vocab): `hidden` (rows, seq_len, H) gathered at the flat
    `masked_positions`, then `head` (leftover slots included; their labels are IGNORE_INDEX)."""
    return head(hidden.flatten(0, 1).index_select(0, masked_positions))


def _slot_loss(logits: torch.Tensor, masked_labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the slots' logits over the real masked positions (leftover slots ignored)."""
    return F.cross_entropy(logits.float(), masked_labels, ignore_index=IGNORE_INDEX)


def _real_slots(logits: torch.Tensor, masked_labels: torch.Tensor) -> torch.Tensor:
    """The logits of the real masked positions, row-major: for checks, not training (boolean indexing syncs)."""
    return logits[masked_labels != IGNORE_INDEX]


def encoder_kwargs(config, input_ids, attention_mask=None, document_ids=None, position_ids=None) -> dict:
    """An HF encoder's forward arguments; with `document_ids` (doc-packed rows) attention, and ModernBERT's local
    window, stay inside each document. On the flex path a dense mask is refused (flex would add it to the scores)."""
    if document_ids is None and attention_mask is not None and config._attn_implementation in ("sdpa", "eager"):
        # Padded rows as one document each, their padding another: the same attention for every real token, but
        # a mask built here. Given a 2-D mask, transformers reads it on the host to see whether it may drop it
        # (`padding_mask.all()`): a device→host sync every forward.
        document_ids = attention_mask.long() - 1
    if document_ids is None:
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    else:
        inputs = encoder_inputs(input_ids, document_ids, position_ids, config._attn_implementation,
                                half_window=config.sliding_window if config.model_type == "modernbert" else None)
    if config._attn_implementation == FLEX:
        check_flex_mask(inputs["attention_mask"])
    return inputs


def encode(encoder, input_ids, attention_mask=None, token_type_ids=None, document_ids=None, position_ids=None):
    """Run an HF encoder (any of the four architectures' base models) on plain or doc-packed rows."""
    inputs = encoder_kwargs(encoder.config, input_ids, attention_mask, document_ids, position_ids)
    if token_type_ids is not None:  # ModernBERT has no segments
        inputs["token_type_ids"] = token_type_ids.reshape(inputs["input_ids"].shape)
    out = encoder(**inputs, return_dict=True)
    out.last_hidden_state = out.last_hidden_state.reshape(*input_ids.shape, -1)  # undo FlashAttention's flattening
    return out


class SparseMaskedLM:
    """RoBERTa's and pre-LN RoBERTa's training forward: the encoder, then `lm_head` at the masked slots only
    (ModernBERT's: its own `_hidden` and `_mlm_head`).

    Every training class has `masked_logits(**batch)`: the logits of the real masked positions, row-major, on
    the path its training forward takes the loss of (the export's equivalence check compares them with the
    exported folder's). With `span_contrast` set and `span_ids` in the batch, the training forward adds the
    span-contrastive term, pooled from the same last hidden states (span_contrast.py).
    """

    span_contrast: SpanContrast | None = None
    """The span-contrastive term's settings (`build_model` sets them; a training switch, not saved in exports)."""

    def _hidden(self, input_ids, attention_mask=None, token_type_ids=None, document_ids=None, position_ids=None,
                **_) -> torch.Tensor:
        """The encoder's last hidden states, (rows, seq_len, H): what the MLM head reads."""
        encoder = getattr(self, self.base_model_prefix)
        return encode(encoder, input_ids, attention_mask, token_type_ids, document_ids, position_ids).last_hidden_state

    def _mlm_head(self, rows: torch.Tensor) -> torch.Tensor:
        return self.lm_head(rows)

    def masked_logits(self, input_ids, masked_positions, masked_labels, **batch) -> torch.Tensor:
        return _real_slots(_head_at(self._hidden(input_ids, **batch), masked_positions, self._mlm_head), masked_labels)

    def forward(self, input_ids, masked_positions, masked_labels, span_ids=None, **batch):
        hidden = self._hidden(input_ids, **batch)
        mlm = _slot_loss(_head_at(hidden, masked_positions, self._mlm_head), masked_labels)
        if span_ids is None:
            return {"loss": mlm}
        return _contrast(self).losses(mlm, hidden, span_ids)


def _contrast(model) -> SpanContrast:
    """The model's span-contrastive settings, for a batch that carries `span_ids`."""
    if model.span_contrast is None:
        raise ValueError(f"{type(model).__name__}: the batch carries span_ids, but the model has no span_contrast "
                         "(build_model sets it from the config's contrastive section)")
    return model.span_contrast


class SparseRobertaForMaskedLM(SparseMaskedLM, RobertaForMaskedLM):
    """RobertaForMaskedLM whose training forward projects masked positions only; returns the loss."""


class SparseRobertaPreLayerNormForMaskedLM(SparseMaskedLM, RobertaPreLayerNormForMaskedLM):
    """RobertaPreLayerNormForMaskedLM with the sparse MLM head; returns the loss."""


class SparseModernBertForMaskedLM(SparseMaskedLM, ModernBertForMaskedLM):
    """ModernBertForMaskedLM training at masked slots only: `head` and `decoder` applied to the gathered rows.

    The model's own `sparse_prediction` picks the rows by a boolean mask, a device→host sync with a
    data-dependent shape, so it is left off: the saved config keeps it false, and an export gives full logits.
    """

    def _hidden(self, input_ids, attention_mask=None, document_ids=None, position_ids=None, **_) -> torch.Tensor:
        return encode(self.model, input_ids, attention_mask, None, document_ids, position_ids).last_hidden_state

    def _mlm_head(self, rows: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.head(rows))


class SparseBertForPreTraining(BertForPreTraining):
    """BertForPreTraining (MLM + next-sentence prediction) with the sparse MLM head; returns the losses.

    `next_sentence_loss = False` trains MLM alone, on segment pairs (the NSP ablation) or on full,
    doc or doc-packed rows: the next-sentence head and the pooler then get no gradient and stay as
    initialised. Then, with `span_contrast` and `span_ids`, it adds the span-contrastive term.
    """

    next_sentence_loss = True
    span_contrast: SpanContrast | None = None

    def masked_logits(self, input_ids, masked_positions, masked_labels, attention_mask=None, token_type_ids=None,
                      document_ids=None, position_ids=None, **_) -> torch.Tensor:
        out = encode(self.bert, input_ids, attention_mask, token_type_ids, document_ids, position_ids)
        return _real_slots(_head_at(out.last_hidden_state, masked_positions, self.cls.predictions), masked_labels)

    def forward(self, input_ids, masked_positions, masked_labels, next_sentence_label=None, attention_mask=None,
                token_type_ids=None, document_ids=None, position_ids=None, span_ids=None, **_):
        out = encode(self.bert, input_ids, attention_mask, token_type_ids, document_ids, position_ids)
        logits = _head_at(out.last_hidden_state, masked_positions, self.cls.predictions)
        mlm = _slot_loss(logits, masked_labels)
        if span_ids is not None:  # the config allows spans without next-sentence prediction only
            return _contrast(self).losses(mlm, out.last_hidden_state, span_ids)
        if not self.next_sentence_loss:  # full, doc or doc-packed rows carry no next-sentence label
            return {"loss": mlm, "mlm_loss": mlm}
        nsp = F.cross_entropy(self.cls.seq_relationship(out.pooler_output).float(), next_sentence_label)
        return {"loss": mlm + nsp, "mlm_loss": mlm, "nsp_loss": nsp}


SPARSE_CLASSES = {"roberta": SparseRobertaForMaskedLM, "roberta-prelayernorm": SparseRobertaPreLayerNormForMaskedLM,
                  "bert": SparseBertForPreTraining, "modernbert": SparseModernBertForMaskedLM}
EXPORT_CLASSES = {"roberta": RobertaForMaskedLM, "roberta-prelayernorm": RobertaPreLayerNormForMaskedLM,
                  "bert": BertForPreTraining, "modernbert": ModernBertForMaskedLM}


def build_model(model: ModelConfig, tokenizer: TokenizerInfo, seq_len: int,
                span_contrast: SpanContrast | None = None) -> torch.nn.Module:
    """A freshly initialised training model, or one loaded from `model.init_from`, in training mode; with
    `span_contrast`, its training forward adds the span-contrastive term where a batch carries `span_ids`.

    A released encoder often ships without its MLM head (a sentence-embedding model is saved as
    `BertModel`): transformers then initialises the head, the decoder tied to the word embeddings
    (as in BERT), and `built.init_note` says so for the run's log. Otherwise `init_note` is None.
    """
    cls = SPARSE_CLASSES[model.architecture]
    note = None
    if model.init_from:  # checked against the tokenizer and seq_len when the config was loaded
        built, info = cls.from_pretrained(local_or_hub(model.init_from, "model.init_from"),
                                          attn_implementation=model.attn_implementation, output_loading_info=True)
        note = created_head_note(built, info["missing_keys"], model.init_from)
        built.train()  # from_pretrained leaves it in eval mode; the trainer's engine expects training mode
    else:
        built = cls(hf_config(model, tokenizer, seq_len))
    if model.architecture == "bert":
        built.next_sentence_loss = model.next_sentence_loss  # a training switch, not saved in the export's config
    built.span_contrast = span_contrast
    built.init_note = note
    return built


def exported_model(architecture: str, hf: dict | None, model: ModelConfig, tokenizer: TokenizerInfo, seq_len: int,
                   state: dict[str, torch.Tensor], source: str | Path) -> tuple[torch.nn.Module, dict]:
    """transformers' own class of `architecture` (what a user's `from_pretrained` builds) holding `state`, and its
    config: `hf` as a checkpoint's record keeps it (an init_from folder's own shape), or for one written before
    records held it (None), rebuilt from the model section."""
    hf = hf or hf_config(model, tokenizer, seq_len).to_dict()
    cls = EXPORT_CLASSES[architecture]
    return load_trained_weights(cls(cls.config_class.from_dict(hf)), state, source), hf


def load_trained_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str | Path) -> torch.nn.Module:
    """`model` holding the consolidated weights `state` (every key but the tied ones required, none unexpected),
    its tied weights tied again."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise PipelineError(f"checkpoint {source} does not match {type(model).__name__}: "
                            f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.tie_weights()
    return model


def created_head_note(model: torch.nn.Module, missing_keys, source: str) -> str | None:
    """After `from_pretrained`: tie a newly created MLM head's decoder to the word embeddings and say so.

    None when the checkpoint had its MLM head. Missing next-sentence weights alone (a released
    BERT trained without NSP) are named too, since that head starts untrained.
    """
    missing = sorted(missing_keys)
    head_name = "lm_head" if hasattr(model, "lm_head") else "cls.predictions"
    head = [k for k in missing if k.startswith(f"{head_name}.")]
    nsp = [k for k in missing if k.startswith("cls.seq_relationship.")]
    if not head and not nsp:
        return None
    parts = []
    if head:
        decoder, embeddings = model.get_submodule(head_name).decoder, model.get_input_embeddings()
        if decoder.weight is not embeddings.weight:  # a config with tie_word_embeddings false
            decoder.weight = embeddings.weight
            model.config.tie_word_embeddings = True  # so the export reloads it tied
        parts.append(f"it has no masked-LM head: created {head_name} (transform and bias newly "
                     f"initialised, decoder tied to the word embeddings)")
    if nsp:
        parts.append("no next-sentence head: cls.seq_relationship newly initialised")
    return f"model.init_from {source}: " + "; ".join(parts)


# ModernBertConfig's layer types: the global layers attend fully, the local ones in a sliding window.
LAYER_TYPE_OF = {"global": "full_attention", "local": "sliding_attention"}


def rope_thetas(model: torch.nn.Module) -> dict[str, float]:
    """The config's rotary bases, as {"global": θ, "local": θ}."""
    parameters = model.config.rope_parameters
    return {kind: float(parameters[layer_type]["rope_theta"]) for kind, layer_type in LAYER_TYPE_OF.items()}


@torch.no_grad()
def set_rope_theta(model: torch.nn.Module, global_theta: float, local_theta: float) -> bool:
    """Give a ModernBERT model (or an engine's module) these rotary bases, as a context-extension phase raises them
    (10k → 160k in ModernBERT); returns whether anything changed.

    transformers 5 computes each layer type's non-persistent `<layer type>_inv_freq` buffer (and its
    `_original_` copy) once, from `config.rope_parameters`, so changing the config alone changes nothing:
    the buffers are recomputed here with the module's own init function, so the model and its config
    (which the checkpoint record and the export keep) carry the same bases. The buffers are not saved
    in checkpoints; a resumed run rebuilds them from its phase.
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.modernbert.modeling_modernbert import ModernBertRotaryEmbedding

    rotary = next((m for m in model.modules() if isinstance(m, ModernBertRotaryEmbedding)), None)
    if rotary is None:
        raise ValueError(f"{type(model).__name__} has no ModernBERT rotary embedding to set a RoPE theta on")
    wanted = {"global": float(global_theta), "local": float(local_theta)}
    if rope_thetas(model) == wanted:
        return False
    config = model.config
    for kind, layer_type in LAYER_TYPE_OF.items():
        config.rope_parameters[layer_type]["rope_theta"] = wanted[kind]
    for layer_type in rotary.layer_types:
        init = rotary.compute_default_rope_parameters
        if rotary.rope_type[layer_type] != "default":
            init = ROPE_INIT_FUNCTIONS[rotary.rope_type[layer_type]]
        inv_freq, scaling = init(rotary.config, layer_type=layer_type)
        buffer = getattr(rotary, f"{layer_type}_inv_freq")
        buffer.copy_(inv_freq.to(buffer.device, buffer.dtype))
        getattr(rotary, f"{layer_type}_original_inv_freq").copy_(inv_freq.to(buffer.device, buffer.dtype))
        setattr(rotary, f"{layer_type}_attention_scaling", scaling)
    return True


def use_rope_thetas(model: torch.nn.Module, global_theta: float | None, local_theta: float | None,
                    say: Callable[[str], None]) -> None:
    """A ModernBERT phase's rotary bases on `model` (None: the phase has none, as every other architecture's), said
    when they change."""
    if global_theta is not None and set_rope_theta(model, global_theta, local_theta):
        say(f"RoPE theta: global {global_theta:g}, local {local_theta:g}")
