"""The RoBERTa paper's design studies as arms of pretraining settings, and users' own studies from JSON.

A study is a list of arms; an arm is a packing mode for the shards (`data_prep/shard.py --pack`)
and pretraining config overrides (the keys of `launchers/pretrain.py --set`) on top of one base
config. Everything else (the token budget, the fine-tuning tasks and seeds) is the same for every
arm, so the arms differ only in what the study is about.

A study file:

    {"name": "my-study", "description": "…", "paper": "what a paper found (optional)",
     "paper_order": ["best-arm", "…"],
     "arms": [{"name": "static", "description": "…", "pack": "full", "set": {"masking.mode": "static"}},
              {"name": "dynamic", "pack": "full"}]}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.common.config.tree import ConfigError, build_config, read_json_config
from pipeline.common.errors import PipelineError
from pipeline.data.packers import PackMode

# Keys the study runner sets itself for every arm, and what sets them instead.
RUNNER_KEYS = {
    "data.shards": "the arm's `pack` (shards are made once per packing mode)",
    "data.tokenizer": "the study's tokenizer",
    "train.output_dir": "the study folder",
    "train.max_steps": "--budget-tokens (steps = tokens ÷ (global batch × sequence length))",
    "tracking.uri": "--tracking-uri",
    "tracking.experiment": "the study's name",
    "tracking.run_name": "the arm's name",
}
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")

# RoBERTa Table 3: batch 256 / 2K / 8K at equal passes over the data, with lr 1e-4 / 7e-4 / 1e-3.
PAPER_BATCH_FACTORS = (1, 8, 32)
PAPER_LR_FACTORS = (1.0, 7.0, 10.0)
LrScaling = Literal["paper", "sqrt"]


@dataclass
class ArmSpec:
    name: str = ""
    """The arm's folder, table row and MLflow run name: letters, digits, '-', '_', '.'."""
    description: str = ""
    pack: PackMode = "full"
    """Shard packing: full (FULL-SENTENCES), doc (DOC-SENTENCES, padded), doc-packed, pairs (BERT + NSP)."""
    set: dict[str, Any] = field(default_factory=dict)
    """Pretraining config overrides, e.g. {"masking.mode": "static", "model.architecture": "bert"}."""

    def overrides(self) -> list[str]:
        """`set` as `--set key=value` strings (values as JSON)."""
        import json

        return [f"{key}={json.dumps(value)}" for key, value in self.set.items()]


@dataclass
class Study:
    name: str = ""
    description: str = ""
    arms: list[ArmSpec] = field(default_factory=list)
    paper: str = ""
    """What the paper found, shown beside this run's results."""
    paper_order: list[str] = field(default_factory=list)
    """Arm names from best to worst as the paper found them; empty: no direction check."""
    warmup_fraction: float = 0.06
    """LR warmup as a fraction of each arm's steps (unless an arm sets schedule.warmup_steps)."""

    def arm(self, name: str) -> ArmSpec:
        return next(a for a in self.arms if a.name == name)


def masking_study() -> Study:
    return Study(
        "masking", "static vs dynamic masking (RoBERTa §4.1, Table 1)",
        [ArmSpec("static", "one mask per sequence, the same every epoch (so it differs from dynamic only after "
                 "the first epoch)", "full", {"masking.mode": "static"}),
         ArmSpec("dynamic", "a new mask every epoch", "full", {"masking.mode": "dynamic"})],
        paper="Table 1 (BERT-base): dynamic masking is comparable to or slightly better than static "
              "(SQuAD 2.0 F1 78.7 vs 78.3, SST-2 92.9 vs 92.5; MNLI-m 84.0 vs 84.3).",
        paper_order=["dynamic", "static"])


def input_format_study() -> Study:
    return Study(
        "input-format", "input format and next-sentence prediction (RoBERTa §4.2, Table 2)",
        [ArmSpec("segment-pair-nsp", "BERT: segment pairs + NSP loss", "pairs", {"model.architecture": "bert"}),
         ArmSpec("full-sentences", "RoBERTa: contiguous text, may cross documents, no NSP", "full"),
         ArmSpec("doc-sentences", "RoBERTa: text from one document only, no NSP (documents packed, "
                 "attention kept inside each, so every step holds as many tokens as FULL-SENTENCES)",
                 "doc-packed")],
        paper="Table 2 (BERT-base size): DOC-SENTENCES ≥ FULL-SENTENCES > SEGMENT-PAIR+NSP on SQuAD 2.0, "
              "MNLI-m and RACE (MNLI-m 84.7 / 84.7 / 84.0); removing NSP matches or slightly improves "
              "downstream results. On SST-2 alone SEGMENT-PAIR was best (92.9 vs 92.5 / 92.7).",
        paper_order=["doc-sentences", "full-sentences", "segment-pair-nsp"])


def nsp_study() -> Study:
    return Study(
        "nsp", "BERT with and without the next-sentence loss, on the same segment-pair data",
        [ArmSpec("bert-nsp", "MLM + NSP on segment pairs", "pairs", {"model.architecture": "bert"}),
         ArmSpec("bert-no-nsp", "MLM only on the same segment pairs", "pairs",
                 {"model.architecture": "bert", "model.next_sentence_loss": False})],
        paper="§4.2: removing the NSP loss matches or slightly improves downstream performance "
              "(Devlin et al. had found the opposite with SENTENCE-PAIR inputs).",
        paper_order=["bert-no-nsp", "bert-nsp"])


def batch_size_study(global_batch: int, lr: float, scaling: LrScaling = "paper") -> Study:
    """Three global batches at equal training tokens: B, 8B, 32B (RoBERTa's 256, 2K, 8K).

    `paper`: LR × 1, 7, 10 (Table 3's 1e-4, 7e-4, 1e-3); `sqrt`: LR × √(batch factor).
    """
    factors = PAPER_LR_FACTORS if scaling == "paper" else tuple(f ** 0.5 for f in PAPER_BATCH_FACTORS)
    arms = [ArmSpec(f"batch-{global_batch * b}", f"global batch {b}×, LR {f:g}× ({scaling} scaling)", "full",
                    {"train.global_batch_size": global_batch * b, "optimizer.lr": lr * f})
            for b, f in zip(PAPER_BATCH_FACTORS, factors, strict=True)]
    names = [a.name for a in arms]
    return Study(
        "batch-size", "larger batches with scaled LR at the same number of training tokens (RoBERTa §5, Table 3)",
        arms,
        paper="Table 3 (BERT-base, equal passes over BookCorpus + Wikipedia): batch 2K beats 256 in perplexity "
              "(3.68 vs 3.99) and on MNLI-m (85.2 vs 84.7) and SST-2 (92.9 vs 92.7); 8K is between (3.77, "
              "84.6, 92.8). Large batches are easier to parallelise and, with a scaled LR, train better.",
        paper_order=[names[1], names[2], names[0]])


def architecture_study(intermediate_size: int) -> Study:
    """RoBERTa, pre-LN RoBERTa and ModernBERT on the same shards, masking and budget, at similar parameter counts.

    The three share the base config's layers, width and heads; ModernBERT's GeGLU has three matrices
    where the others' feed-forward has two, so its width is 2/3 of the base's (Shazeer 2020's
    parameter-matched GLU), and its parameter count comes out close (no position table, no biases).
    The masking rate is the base config's for every arm, so only the architecture differs.
    """
    glu_width = max(1, round(2 * intermediate_size / 3))
    return Study(
        "architecture", "RoBERTa vs pre-LN RoBERTa vs ModernBERT at the same token budget (Warner et al. 2024)",
        [ArmSpec("roberta", "RoBERTa: post-LN, learned positions, GELU feed-forward", "full",
                 {"model.architecture": "roberta"}),
         ArmSpec("roberta-prelayernorm", "RoBERTa with LayerNorm before each sub-layer", "full",
                 {"model.architecture": "roberta-prelayernorm"}),
         ArmSpec("modernbert", f"ModernBERT: rotary positions, GeGLU (width {glu_width}), pre-norm, no biases, "
                 "local (sliding-window) layers with every 3rd global", "full",
                 {"model.architecture": "modernbert", "model.intermediate_size": glu_width})],
        paper="ModernBERT (Warner et al. 2024, Table 1; the ModernBERT-base model card): ModernBERT-base beats the "
              "other base-size encoders on GLUE (average 88.4, against 86.4 for RoBERTa-base and 88.1 for "
              "DeBERTaV3-base), after 2T tokens of training. Pre-LN RoBERTa is not in the paper; it is here to "
              "separate pre-normalisation, one of ModernBERT's ingredients, from the rest.",
        paper_order=["modernbert", "roberta"])


STUDIES = ("masking", "input-format", "batch-size", "nsp", "architecture")


def builtin_study(name: str, global_batch: int, lr: float, scaling: LrScaling = "paper",
                  intermediate_size: int = 3072) -> Study:
    """A built-in study for a base config with this global batch, LR and feed-forward width."""
    if name == "batch-size":
        return batch_size_study(global_batch, lr, scaling)
    if name == "architecture":
        return architecture_study(intermediate_size)
    return {"masking": masking_study, "input-format": input_format_study, "nsp": nsp_study}[name]()


def load_study(name_or_file: str, global_batch: int, lr: float, scaling: LrScaling = "paper",
               intermediate_size: int = 3072) -> Study:
    """`--study`: a built-in name, or a JSON study file; any problem is a PipelineError naming it."""
    if name_or_file in STUDIES:
        return builtin_study(name_or_file, global_batch, lr, scaling, intermediate_size)
    path = Path(name_or_file)
    if path.suffix != ".json" and not path.is_file():
        raise PipelineError(f"--study {name_or_file!r}: not a study ({', '.join(STUDIES)}) or a study file (.json)")
    study, problems = build_config(Study, read_json_config(path))
    problems += study_problems(study)
    if problems:
        raise ConfigError(f"study file {path}", problems)
    return study


def study_problems(study: Study) -> list[str]:
    """Every problem of a study that needs no files: names, arms, the paper's order, reserved keys."""
    problems = []
    add = problems.append
    if not study.name or not set(study.name) <= _NAME_CHARS:
        add(f"name: {study.name!r} must be non-empty and hold only letters, digits, '_', '-' and '.' "
            "(it names the study folder)")
    if not study.arms:
        add("arms: a study needs at least one arm")
    for i, arm in enumerate(study.arms):
        if not arm.name or not set(arm.name) <= _NAME_CHARS:
            add(f"arms[{i}].name: {arm.name!r} must be non-empty and hold only letters, digits, '_', '-' and '.'")
        for key in arm.set:
            if key in RUNNER_KEYS:
                add(f"arms[{i}].set.{key}: set by the study runner from {RUNNER_KEYS[key]}; leave it out")
    names = [a.name for a in study.arms]
    for name in sorted({n for n in names if names.count(n) > 1}):
        add(f"arms: {names.count(name)} arms are named {name!r}; give each a distinct name")
    for name in study.paper_order:
        if name not in names:
            add(f"paper_order: {name!r} is not an arm (arms: {', '.join(names)})")
    if not 0 <= study.warmup_fraction < 1:
        add(f"warmup_fraction: must be in [0, 1), got {study.warmup_fraction}")
    return problems
