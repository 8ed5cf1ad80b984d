"""Cheap probes of what the model can do, at each evaluation: the validation loss says how well it predicts on
average, not what a checkpoint is good for (OLMo-core's in-loop evaluators; ModernBERT's `run_evals.py` does it
after the fact). Configured under `probes` (the pretraining config's `ProbesConfig`), all off by default:

- cloze: top-1 fill accuracy at blanked tokens of validation text (pipeline/hub/cloze.py), beside the accuracy of
  always guessing the blanks' most frequent token, the plateau's;
- minimal pairs: the share of pairs whose good sentence scores the higher pseudo-log-likelihood
  (pipeline/hub/minimal_pairs.py);
- retrieval and STS, zero-shot, through the embedding evaluator (pipeline/hub/embedding_evaluation.py), with
  BM25's retrieval figures beside.

Every rank runs the same probes on the live model (under ZeRO 3 each forward gathers the weights on all ranks) and
rank 0 logs them, as `probe/...` metrics in metrics.jsonl and MLflow beside `eval/mlm_loss`. The files are read
and checked before the run starts: the pretraining command hands `probe_problems` to the preflight and
`QualityProbes` to the trainer, whose validation (pretraining's `report/validation.py`) calls it, so that
pretraining imports nothing from the layers above it, and this module nothing from pretraining: it reads the
config's `probes` section through `ProbeSettings`.
"""

from __future__ import annotations

from typing import Protocol

import torch

from pipeline.common.errors import PipelineError
from pipeline.hub.minimal_pairs import accuracy, pair_scores, read_pairs
from pipeline.tracking.metrics import file_metric_name


class ProbeSettings(Protocol):
    """What the probes read of a config's `probes` section."""

    cloze_texts: int
    minimal_pairs: list[str]
    retrieval: list[str]
    sts: list[str]
    pooling: str


class ProbedConfig(Protocol):
    """A config with a `probes` section: what a preflight's file check is handed."""

    probes: ProbeSettings


def probe_problems(config: ProbedConfig) -> list[str]:
    """Each of `config.probes`' files read and checked, its problem naming the key; nothing is kept (a preflight
    file check: pretraining's preflight)."""
    probes = config.probes
    problems = []
    for kind, read in (("minimal_pairs", _read_minimal_pairs), ("retrieval", _read_embedding_files),
                       ("sts", _read_embedding_files)):
        for path in getattr(probes, kind):
            try:
                read(kind, path)
            except (PipelineError, OSError) as err:
                problems.append(f"probes.{kind}: {err}")
    return problems


def _read_minimal_pairs(_kind: str, path: str):
    return read_pairs(path)


def _read_embedding_files(kind: str, path: str):
    from pipeline.hub.embedding_evaluation import read_probes  # sentence-transformers: only where asked for

    return read_probes(**{kind: [path]})


class QualityProbes:
    """The configured probes, their files read once; `run(model)` gives their figures as metrics."""

    def __init__(self, probes: ProbeSettings, tokenizer, shards: str, mask_rate: float):
        from pipeline.hub.cloze import validation_texts

        self.tokenizer, self.mask_rate, self.pooling = tokenizer, mask_rate, probes.pooling
        self.cloze_texts = validation_texts(shards, tokenizer, limit=probes.cloze_texts) if probes.cloze_texts else []
        if probes.cloze_texts and not self.cloze_texts:
            raise PipelineError(f"probes.cloze_texts: {shards} has no validation text of 40 characters or more to "
                                f"blank; set probes.cloze_texts to 0, or shard with a validation split")
        self.minimal_pairs = {file_metric_name(path): read_pairs(path) for path in probes.minimal_pairs}
        self.embedding = None
        self.bm25: dict[str, float] = {}
        if probes.retrieval or probes.sts:
            from pipeline.hub.embedding_evaluation import bm25_probes, read_probes

            self.embedding = read_probes(retrieval=probes.retrieval, sts=probes.sts)
            self.bm25 = {f"probe/{key}": value for key, value in bm25_probes(self.embedding).items()}

    @torch.no_grad()
    def run(self, model: torch.nn.Module) -> dict[str, float]:
        """The probes' figures for `model` (the masked-LM being trained), in eval mode; its mode is restored."""
        from pipeline.hub.encoder import Encoder, mlm_head_of

        was_training = model.training
        model.eval()
        try:
            encoder = Encoder(model.base_model, self.tokenizer, mlm_head_of(model))
            metrics = {}
            if self.cloze_texts:
                metrics.update(self._cloze(encoder))
            for name, pairs in self.minimal_pairs.items():
                metrics[f"probe/minimal_pairs/{name}"] = self._minimal_pairs(encoder, pairs)
            if self.embedding is not None:
                from pipeline.hub.embedding_evaluation import probe_model

                figures = probe_model(model, self.tokenizer, self.embedding, pooling=self.pooling,
                                      max_seq_len=encoder.max_positions)
                metrics.update({f"probe/{key}": value for key, value in figures.items()}, **self.bm25)
            return metrics
        finally:
            model.train(was_training)

    def _cloze(self, encoder) -> dict[str, float]:
        from pipeline.hub.cloze import cloze_score

        score = cloze_score(encoder, self.cloze_texts, mask_rate=self.mask_rate, max_texts=None)
        return {"probe/cloze/top1": score.accuracy, "probe/cloze/constant": score.constant_accuracy}

    @staticmethod
    def _minimal_pairs(encoder, pairs) -> float:
        return accuracy(pair_scores(pairs, encoder.score))["accuracy"]

    @staticmethod
    def line(metrics: dict[str, float]) -> str:
        """The probes' figures in one line for the screen: the main figure of each, BM25 and the plateau beside."""
        parts = []
        if "probe/cloze/top1" in metrics:
            parts.append(f"cloze top-1 {metrics['probe/cloze/top1']:.3f} (most frequent token "
                         f"{metrics['probe/cloze/constant']:.3f})")
        for key, value in metrics.items():
            kind, _, rest = key.removeprefix("probe/").partition("/")
            if kind == "minimal_pairs":
                parts.append(f"minimal pairs {rest} {value:.3f}")
            elif kind == "retrieval" and rest.endswith("/ndcg_at_10") and "/bm25/" not in rest:
                name = rest.removesuffix("/ndcg_at_10")
                bm25 = metrics[f"probe/retrieval/{name}/bm25/ndcg_at_10"]
                parts.append(f"{name} nDCG@10 {value:.3f} (BM25 {bm25:.3f})")
            elif kind == "sts" and rest.endswith("/spearman"):
                parts.append(f"{rest.removesuffix('/spearman')} Spearman {value:.3f}")
        return ", ".join(parts)
