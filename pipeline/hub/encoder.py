"""`Encoder`: fairseq's RoBERTa hub interface (`fairseq/models/roberta/hub_interface.py`) over transformers models.

Load any model the pipeline makes, then encode, decode, extract features, fill a mask and predict
with named classification heads:

    enc = Encoder.from_pretrained("runs/rte")            # a fine-tuning output: head "rte" comes along
    tokens = enc.encode("A man is playing.", "Someone plays.")
    enc.predict("rte", tokens).argmax()                  # log-probabilities → class id
    enc.labels("rte")                                    # ('entailment', 'not_entailment')
    lm = Encoder.from_pretrained("runs/default/pretrain/export")
    lm.score(["The cat is here.", "The cat are here."])  # pseudo-log-likelihoods: the first is higher

    ner = Encoder.from_pretrained("runs/ner")            # a token task: one tag per word
    ner.predict("ner", "EU rejects German call")         # ['B-ORG', 'O', 'B-MISC', 'O']
    qa = Encoder.from_pretrained("runs/squad")           # extractive QA
    qa.answer("Who rejects?", "EU rejects German call")  # 'EU'
    lm.search_index(docs, fusion="rrf").search("sort a list", k=5)  # [(doc index, score), ...]: retrieval/

The encoder, MLM head and task heads are transformers' own modules, loaded with `from_pretrained`;
this class only adds fairseq's calling conventions (token tensors in, features and log-probs out).
"""

from __future__ import annotations

import os
import warnings

import torch
from torch import nn
from torch.nn import functional as F

from pipeline.common.errors import PipelineError
from pipeline.hub import span_heads
from pipeline.hub.pseudo_likelihood import DEFAULT_BATCH_TOKENS, Precision, pseudo_log_likelihoods
from pipeline.models.heads import ClassificationHead, head_of, label_names, new_head
from pipeline.models.model_source import (
    OFFSET_POSITION_MODELS,
    Exporter,
    ModelSource,
    position_limit,
    resolve_model_source,
)

MASK = "<mask>"
"""The mask placeholder in `fill_mask` texts, whatever the tokenizer's own mask token (`[MASK]` for BERT)."""
NO_HEAD_SAVED = ("{path} holds {architecture} weights without a trained MLM head (a released encoder, such as a "
                 "sentence-embedding model, often ships without one); encode, extract_features and heads work, "
                 "fill_mask would be random. Continue pretraining it with model.init_from (that creates the head "
                 "and trains it) and load the export")


def mlm_head_of(model: nn.Module) -> nn.Module:
    """Features → vocabulary logits of an HF masked-LM model: RoBERTa's `lm_head`, BERT's `cls.predictions`,
    ModernBERT's `head` then `decoder`."""
    if hasattr(model, "lm_head"):
        return model.lm_head
    if hasattr(model, "decoder") and hasattr(model, "head"):
        return nn.Sequential(model.head, model.decoder)
    return model.cls.predictions


class Encoder(nn.Module):
    """A pretrained or fine-tuned encoder with fairseq's hub methods; an `nn.Module` (`.to`, `.eval`, `.train`)."""

    def __init__(self, model: nn.Module, tokenizer, lm_head: nn.Module | None = None,
                 heads: dict[str, ClassificationHead] | None = None, source: ModelSource | None = None,
                 span_predictors: dict | None = None):
        super().__init__()
        self.model = model
        """The transformers base model (`RobertaModel` / `BertModel`)."""
        self.lm_head = lm_head
        self.classification_heads = nn.ModuleDict(heads or {})
        self.span_predictors = dict(span_predictors or {})
        """Token-tagging and QA heads by name: `WordTagger` / `QuestionAnswerer` of a fine-tuned token or QA model."""
        # Registered so that .eval(), .train() and .to() reach their task layers too (the encoder is shared).
        self.span_models = nn.ModuleDict({name: p.model for name, p in self.span_predictors.items()})
        self.tokenizer = tokenizer
        self.source = source
        self.no_lm_head_reason = "it is a fine-tuned model; fill_mask needs a pretraining export or run"
        """Why `lm_head` is None, for fill_mask's error."""
        config = model.config
        self.offset_positions = config.model_type in OFFSET_POSITION_MODELS
        self.max_positions = position_limit(config)
        """The longest token sequence the position embeddings cover."""
        # BERT-style models tell the two segments apart with token type ids; RoBERTa has one type.
        self.uses_segments = (getattr(config, "type_vocab_size", 1) or 1) > 1
        self.cls_id = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
        self.sep_id = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id

    # ---- loading -------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path_or_name: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                        exporter: Exporter | None = None) -> Encoder:
        """An export, a fine-tuning output, a hub name, or a pretraining output folder or checkpoint exported by
        `exporter` (pretraining's `export_for_loading`; the commands hand it in)."""
        import transformers
        from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

        from pipeline.data.tokenizer import load_tokenizer

        source = resolve_model_source(path_or_name, exporter=exporter, cache_dir=cache_dir)
        tokenizer = load_tokenizer(source.path)
        config = AutoConfig.from_pretrained(source.path)
        architecture = (config.architectures or [""])[0]
        task_type = source.finetune_info.get("task_type")
        if task_type in span_heads.SPAN_TASK_TYPES:
            # A token or QA model: its predictor loads it; the hub's encoder is that model's own encoder.
            predictor = span_heads.load_span_predictor(source.path, task_type)
            encoder = cls(predictor.model.base_model, tokenizer, None, {}, source, {source.task: predictor})
        elif architecture.endswith("ForSequenceClassification"):
            hf = AutoModelForSequenceClassification.from_pretrained(source.path)
            name = source.task or "default"
            head = ClassificationHead(head_of(hf), label_names(hf.config), source.finetune_info.get("max_seq_len"))
            encoder = cls(hf.base_model, tokenizer, None, {name: head}, source)
        elif architecture.endswith("Model"):  # a released encoder saved headless (BertModel, RobertaModel)
            encoder = cls(AutoModel.from_pretrained(source.path), tokenizer, None, {}, source)
            encoder.no_lm_head_reason = NO_HEAD_SAVED.format(path=source.path, architecture=architecture)
        else:
            # BertForPreTraining keeps the pooler and NSP head that AutoModelForMaskedLM would drop.
            model_class = getattr(transformers, architecture, None) if architecture == "BertForPreTraining" else None
            hf, loading = (model_class or AutoModelForMaskedLM).from_pretrained(source.path, output_loading_info=True)
            lm_head = mlm_head_of(hf)
            head_ids = {id(p) for p in lm_head.parameters()}
            head_keys = {name for name, p in hf.named_parameters(remove_duplicate=False) if id(p) in head_ids}
            # A head that transformers had to initialise would fill masks at random: none rather than noise.
            untrained = bool(head_keys & set(loading["missing_keys"]))
            encoder = cls(hf.base_model, tokenizer, None if untrained else lm_head, {}, source)
            if untrained:
                encoder.no_lm_head_reason = NO_HEAD_SAVED.format(path=source.path, architecture=architecture)
        if len(tokenizer) > encoder.model.config.vocab_size:
            raise PipelineError(f"model {source.path}: the tokenizer has {len(tokenizer)} tokens but the model's "
                                f"vocabulary only {encoder.model.config.vocab_size}: they do not belong together")
        return encoder.eval()

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    # ---- tokens ------------------------------------------------------------------------------------

    def encode(self, sentence: str, *addl_sentences: str, no_separator: bool = False,
               max_length: int | None = None) -> torch.LongTensor:
        """Token ids as a 1-D LongTensor: `<s> a </s></s> b </s>` (RoBERTa), `[CLS] a [SEP] b [SEP]` (BERT).

        One or two sentences are framed by the tokenizer itself, so the ids equal what fine-tuning
        saw; `max_length` truncates as fine-tuning did (longest sentence first). Three or more
        sentences follow fairseq's rule. `no_separator` drops RoBERTa's doubled `</s>` between sentences.
        """
        if len(addl_sentences) <= 1 and not no_separator:
            ids = self.tokenizer(sentence, addl_sentences[0] if addl_sentences else None,
                                 truncation=max_length is not None, max_length=max_length)["input_ids"]
            return torch.tensor(ids, dtype=torch.long)
        if max_length is not None:
            raise PipelineError("encode: max_length works for one or two sentences only")
        pieces = [self.tokenizer(s, add_special_tokens=False)["input_ids"] for s in (sentence, *addl_sentences)]
        doubled = self.offset_positions and not no_separator  # RoBERTa separates sentences with </s></s>
        ids = [self.cls_id, *pieces[0], self.sep_id]
        for piece in pieces[1:]:
            ids += [self.sep_id] * doubled + piece + [self.sep_id]
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, tokens: torch.Tensor) -> str | list[str]:
        """The text of 1-D `tokens`: a string for one sentence, a list for several."""
        if tokens.dim() != 1:
            raise PipelineError(f"decode expects a 1-D tensor of token ids, got shape {tuple(tokens.shape)}")
        ids = [t for t in tokens.tolist() if t != self.pad_id]
        if ids and ids[0] == self.cls_id:
            ids = ids[1:]
        sentences, current = [], []
        for t in ids + [self.sep_id]:
            if t == self.sep_id:
                if current:
                    sentences.append(self.tokenizer.decode(current, clean_up_tokenization_spaces=False))
                current = []
            else:
                current.append(t)
        return sentences[0] if len(sentences) == 1 else sentences

    def pad(self, token_lists: list[torch.Tensor]) -> torch.LongTensor:
        """Right-pad 1-D token tensors into one B×T batch (padding is masked out in the model)."""
        return nn.utils.rnn.pad_sequence(list(token_lists), batch_first=True, padding_value=self.pad_id)

    def segment_ids(self, tokens: torch.Tensor) -> torch.LongTensor:
        """BERT's token type ids: 0 up to the first `[SEP]`, 1 after it, 0 on padding (as the tokenizer gives)."""
        sep = (tokens == self.sep_id).long()
        after_first = (torch.cumsum(sep, dim=-1) - sep) > 0
        return (after_first & (tokens != self.pad_id)).long()

    # ---- model -------------------------------------------------------------------------------------

    def extract_features(self, tokens: torch.Tensor, return_all_hiddens: bool = False):
        """Last layer's features B×T×C; with `return_all_hiddens`, [embeddings, layer 1, …, last layer]."""
        if tokens.dim() == 1:
            tokens = tokens.unsqueeze(0)
        if tokens.size(-1) > self.max_positions:
            raise PipelineError(f"tokens exceed the model's maximum length: {tokens.size(-1)} > {self.max_positions} "
                                "positions (encode(..., max_length=N) truncates)")
        tokens = tokens.to(self.device)
        segments = {"token_type_ids": self.segment_ids(tokens)} if self.uses_segments else {}
        out = self.model(input_ids=tokens, attention_mask=(tokens != self.pad_id).long(), **segments,
                         output_hidden_states=return_all_hiddens, return_dict=True)
        return list(out.hidden_states) if return_all_hiddens else out.last_hidden_state

    def register_classification_head(self, name: str, num_classes: int, labels: tuple[str, ...] | None = None) -> None:
        """Add a freshly initialised head `name` with `num_classes` outputs (1: regression)."""
        if labels is not None and len(labels) != num_classes:
            raise PipelineError(f"head {name!r}: {len(labels)} labels for {num_classes} classes")
        if name in self.classification_heads:
            old = self.classification_heads[name].net
            warnings.warn(f"re-registering head {name!r} with {num_classes} classes "
                          f"(was {getattr(old, 'out_proj', getattr(old, 'classifier', None)).out_features})",
                          stacklevel=2)
        if labels is None and num_classes > 1:
            labels = tuple(str(i) for i in range(num_classes))
        net = new_head(self.model.config, num_classes, self.model._init_weights)
        # A new module starts in training mode; it follows the encoder's mode instead (no dropout in eval).
        self.classification_heads[name] = ClassificationHead(net, labels).to(self.device).train(self.training)

    def labels(self, head: str) -> tuple[str, ...] | None:
        """Label names of `head` in class-id order (None for a regression head, () for a QA head)."""
        if head in self.span_predictors:
            return tuple(getattr(self.span_predictors[head], "labels", ()))
        return self._head(head).labels

    def predict(self, head: str, tokens, return_logits: bool = False):
        """Log-probabilities B×K from head `head`; logits on request and always for a regression head.

        For a token-tagging head (`ner`, `pos`, …) `tokens` are words, a list or a text split on
        whitespace, and the result is one tag per word (what `WordTagger.predict` gives).
        """
        if head in self.span_predictors:
            predictor = self.span_predictors[head]
            if span_heads.kind_of(predictor) == span_heads.QA:
                raise PipelineError(f"head {head!r} answers questions: use answer(question, context)")
            span_heads.check_on_cpu(self.device, head)
            return predictor.predict(span_heads.words_of(head, tokens))
        module = self._head(head)
        if not isinstance(tokens, torch.Tensor):
            raise PipelineError(f"head {head!r} classifies token tensors (from encode); for texts use "
                                "classify(head, texts)")
        tokens = tokens.unsqueeze(0) if tokens.dim() == 1 else tokens
        logits = module(self.extract_features(tokens), (tokens != self.pad_id).to(self.device))
        if return_logits or module.regression:
            return logits
        return F.log_softmax(logits, dim=-1)

    @torch.no_grad()
    def classify(self, head: str, examples: list, batch_size: int = 32) -> list:
        """Label names (or scores, for regression) of texts or (text, text) pairs, in padded batches.

        Inputs are truncated to the length the head was fine-tuned with (else the model's maximum).
        """
        module = self._head(head)
        max_length = module.max_seq_len or self.max_positions
        results: list = []
        for start in range(0, len(examples), batch_size):
            chunk = [(e,) if isinstance(e, str) else tuple(e) for e in examples[start:start + batch_size]]
            batch = self.pad([self.encode(*e, max_length=max_length) for e in chunk])
            out = self.predict(head, batch, return_logits=True)
            if module.regression:
                results += out.squeeze(-1).float().tolist()
            else:
                results += [module.labels[i] for i in out.argmax(-1).tolist()]
        return results

    @torch.no_grad()
    def answer(self, question: str, context: str, head: str | None = None) -> str:
        """The answer's text in `context` ("" when a SQuAD v2 model finds none), from a fine-tuned QA model."""
        qa = {n: p for n, p in self.span_predictors.items() if span_heads.kind_of(p) == span_heads.QA}
        if head is None and len(qa) == 1:
            head = next(iter(qa))
        if head not in qa:
            known = ", ".join([*self.classification_heads, *self.span_predictors]) or "none"
            raise PipelineError(f"no question-answering head{f' {head!r}' if head else ''} (this model's heads: "
                                f"{known}); answer() needs a squad / qa-custom fine-tuning output")
        span_heads.check_on_cpu(self.device, head)
        return qa[head].answer(question, context)

    def _head(self, name: str) -> ClassificationHead:
        if name not in self.classification_heads:
            if name in self.span_predictors:
                kind = span_heads.kind_of(self.span_predictors[name])
                use = "predict(head, words)" if kind == span_heads.TAGGING else "answer(question, context)"
                raise PipelineError(f"head {name!r} is a {kind} head, not a sequence classifier: use {use}")
            known = ", ".join([*self.classification_heads, *self.span_predictors]) or "none"
            raise PipelineError(f"no classification head {name!r} (this model has: {known}); load a fine-tuning "
                                "output or call register_classification_head")
        return self.classification_heads[name]

    @torch.no_grad()
    def fill_mask(self, masked_input: str, topk: int = 5) -> list[tuple[str, float, str]]:
        """The `topk` fillings of the one `<mask>` in the text: (filled sentence, probability, token), best first."""
        if self.lm_head is None:
            raise PipelineError(f"this model has no masked-LM head: {self.no_lm_head_reason}")
        text = masked_input.replace(self.tokenizer.mask_token, MASK)
        found = text.count(MASK)
        if found != 1:
            raise PipelineError(f"fill_mask needs exactly one {MASK} in the text, found {found}: {masked_input!r}")
        before, after = text.split(MASK)
        # As fairseq does: the space before the mask belongs to the predicted word (byte-level BPE
        # marks a word's leading space in its token), and the text after keeps its own leading space.
        ids = ([self.cls_id] + self.tokenizer(before.rstrip(), add_special_tokens=False)["input_ids"]
               + [self.tokenizer.mask_token_id] + self.tokenizer(after, add_special_tokens=False)["input_ids"]
               + [self.sep_id])
        tokens = torch.tensor(ids, dtype=torch.long)
        position = ids.index(self.tokenizer.mask_token_id)
        features = self.extract_features(tokens)[0, position]
        probs = self.lm_head(features[None]).float().softmax(dim=-1)[0]
        values, indices = probs.topk(min(topk, probs.numel()))
        filled = []
        for value, index in zip(values.tolist(), indices.tolist(), strict=True):
            token = self._word(index)
            pattern = f" {MASK}" if f" {MASK}" in text else MASK
            filled.append((text.replace(pattern, token if pattern.startswith(" ") else token.lstrip()), value, token))
        return filled

    def score(self, sentences: list[str], batch_tokens: int = DEFAULT_BATCH_TOKENS,
              precision: Precision = "fp32") -> list[float]:
        """Pseudo-log-likelihood of each sentence (natural log; higher is more likely).

        Each token is masked in turn and the log-probability of the true token summed; special tokens
        are never scored. Masked copies run in batches of at most `batch_tokens`; `precision="bf16"`
        autocasts the forwards (faster on CPUs with native bf16, slightly different sums; pseudo_likelihood.py).
        """
        return pseudo_log_likelihoods(self, sentences, batch_tokens=batch_tokens, precision=precision)

    def search_index(self, documents: list[str], *, pooling: str = "mean", fusion: str = "dense",
                     weight: float = 0.5, max_seq_len: int | None = None, batch_size: int = 32):
        """A `SearchIndex` of `documents` embedded by this encoder (`pooling` of the last hidden states; `fusion`
        dense, bm25, hybrid with `weight` the model's share, or rrf)."""
        from pipeline.hub.retrieval.search_index import SearchIndex
        from pipeline.models.embedding_encoder import PooledEncoder, default_length

        length = max_seq_len or default_length(self.model.config, self.tokenizer)
        encoder = PooledEncoder(self.model, self.tokenizer, pooling, length, batch_size)
        return SearchIndex(documents, encoder.encode, fusion, weight)

    def _word(self, token_id: int) -> str:
        """A predicted token as text, with a leading space when it starts a word."""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        if piece.startswith("##"):  # a WordPiece continuation attaches to the word before it
            return piece[2:]
        text = self.tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
        return text if text.startswith(" ") or self.offset_positions else " " + text
