"""The validation losses: every `train.eval_every` steps and at the run's end, each corpus's loss on its fixed
validation batches beside its unigram plateau (plateau.py: a loss means little without it), and the configured
probes of what the model can do (`probes`: the pretraining command hands in pipeline/hub/quality_probes.py's
`QualityProbes`), logged and shown."""

from __future__ import annotations

from pipeline.common.processes.topology import Topology
from pipeline.pretrain.batches.stretch_data import PretrainData
from pipeline.pretrain.plan.masking import eval_probability
from pipeline.pretrain.plan.run_plan import RunPlan
from pipeline.pretrain.report.plateau import at_mask_rate, metrics_beside_plateau, plateau_level
from pipeline.pretrain.report.run_log import RunLog


class Validation:
    """The run's validation on this rank: when it is due, and running it."""

    def __init__(self, plan: RunPlan, topology: Topology, log: RunLog, tokenizer, make_probes=None):
        t = plan.config.train
        self.every, self.sequences, self.end_step = t.eval_every, t.eval_sequences, plan.end_step
        self.mask_rate = eval_probability(plan.config.masking)
        self.topology, self.log, self.tokenizer = topology, log, tokenizer
        self._entropies: dict[str, float] = {}
        """Validation unigram entropy per shard folder (the plateau's level), computed at its first evaluation."""
        probes = plan.config.probes
        self.probes = make_probes(probes, tokenizer, plan.stretches[0].corpora[0].path, self.mask_rate) \
            if probes.any and make_probes else None
        """`make_probes(config.probes, tokenizer, shards, mask_rate)`'s probes: `run(model)` gives their figures,
        `line(figures)` says them."""

    def due(self, step: int) -> bool:
        """Whether the run evaluates after `step` steps (its end evaluates once more itself)."""
        return bool(self.every) and step % self.every == 0 and step < self.end_step

    def after_step(self, step: int, data: PretrainData, engine) -> None:
        if self.due(step):
            self.run(step, data, engine)

    def run(self, step: int, data: PretrainData, engine) -> None:
        """Every rank's validation losses on `data`'s corpora, logged by rank 0 beside each one's plateau."""
        totals = data.evaluate(engine, self.sequences, self.topology.rank)
        levels = None
        if self.topology.is_main:  # once per folder: a bincount over its validation shards
            for source in data.corpora:
                if source.path not in self._entropies:
                    self._entropies[source.path] = plateau_level(source.path, self.tokenizer)
            levels = [self._entropies[source.path] for source in data.corpora]
        metrics = {**data.eval_metrics(totals, levels), "eval/mask_rate": self.mask_rate}
        probed = self.probes.run(engine.module) if self.probes else {}
        self.log.metrics.log({**metrics, **probed}, step)
        self.log.metrics.flush()
        per_corpus = "".join(f", {s.name} {metrics_beside_plateau(metrics, f'eval/{s.name}/')}"
                             for s in data.corpora if data.mixed)
        self.log.say(f"step {step}: eval MLM loss{at_mask_rate(metrics)} {metrics_beside_plateau(metrics)}"
                     f"{per_corpus}, perplexity {metrics['eval/perplexity']:.2f}")
        if probed:
            self.log.say(f"step {step}: probes: {self.probes.line(probed)}")
