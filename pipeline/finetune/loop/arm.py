"""One training of a fine-tuning run as one value, with its completion record; what a run's trainings share.

A run trains its seeds (`runner.py`), a sweep's trials (`sweep.py`) and the label curve's points
(`label_curve.py`). Each is a `Training`: what it trains (config, data, family, seed), what picks its
best epoch, and what its completion record must match. It owns its name, label and MLflow tags, its
folder and whether it keeps its weights, and its completion record: a training whose `complete.json`
matches is read back by a rerun, not trained again (`trainer.train_or_reuse`, which `trainer.FineTuner`
carries out otherwise). What every training of the run shares is its `Arm`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.config.tree import flatten, to_dict
from pipeline.common.errors import PipelineError
from pipeline.common.processes.batch_plan import BatchPlan
from pipeline.common.run_kernel import run_tags
from pipeline.common.run_layout import SeedLayout
from pipeline.data.tasks.splits import Split, TaskData
from pipeline.finetune.config import FinetuneConfig
from pipeline.finetune.families.interface import TaskFamily
from pipeline.finetune.loop.clock import RunClock
from pipeline.models.fingerprints import describe_differences, model_fingerprint
from pipeline.models.model_source import Exporter, ModelSource
from pipeline.tracking.metrics import MetricsSink

if TYPE_CHECKING:
    import torch

RESULT_NEUTRAL_SETTINGS = ("name", "train.output_dir", "train.eval_batch_size", "train.collective_timeout_s",
                           "train.seed")
"""Settings that change where or how fast a run reports, not what it trains: a rerun may differ in them and still
skip finished trainings. (`train.seed` is the default seed; each training's own is in its record.)"""

SELECT = "select"
"""The selection slice's name where it stands beside the dev splits (protocol/selection.py cuts it; a training
scores it apart from dev)."""

RERUN_HINT = "Rerun the same command: seeds with a complete.json are skipped, the others start again from epoch 1."

Role = Literal["seed", "trial", "point"]
"""A seed of the run (it keeps its model), a sweep trial, or a seed of a label-curve point (they report only)."""

STAGES: dict[Role, str] = {"seed": "finetune", "trial": "finetune-trial", "point": "finetune-label-curve"}


@dataclass
class Arm:
    """What every training of one run shares: the run's config (fit to the model), the model it starts from, from
    its weights or from scratch (the arm), this process among the run's, the run's MLflow run (each training's
    parent), and the tokenizer and each split's encoding, made once.

    A run with a sweep, seeds and a label curve trains a dozen times on the same few splits; loading
    the tokenizer and tokenizing a split once per run, not once per training, is the fixed cost saved.
    An encoding is kept per (family, split, max_seq_len): a family's options (a token task's
    `label_all_tokens`, QA's stride) change what it encodes. The encodings are read-only datasets.
    """

    config: FinetuneConfig
    source: ModelSource
    from_scratch: bool
    processes: Any
    """accelerate's `PartialState` (`accelerator.processes`): the main process, the barrier."""
    parent: MetricsSink = field(default_factory=MetricsSink)
    clock: RunClock = field(default_factory=RunClock)
    """Where the run's time goes (`run_clock.py`): every training charges its phases to it."""
    _tokenizer: Any = field(default=None, init=False, repr=False)
    _encodings: dict = field(default_factory=dict, init=False, repr=False)

    @property
    def is_main(self) -> bool:
        return self.processes.is_main_process

    @property
    def world_size(self) -> int:
        return self.processes.num_processes

    @property
    def kind(self) -> str:
        return "scratch" if self.from_scratch else "pretrained"

    @cached_property
    def fingerprint(self) -> str:
        """The model's content (its config and tokenizer alone from scratch), read once per run."""
        return model_fingerprint(self.source.path, weights=not self.from_scratch)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.source.path)
        return self._tokenizer

    def encoded(self, family: TaskFamily, split, max_seq_len: int):
        key = (id(family), id(split), max_seq_len)
        if key not in self._encodings:  # the value holds the family and split too, so their ids are never reused
            with self.clock.phase("tokenization"):
                self._encodings[key] = (family, split, family.encode(split, self.tokenizer, max_seq_len))
        return self._encodings[key][2]


@dataclass
class SeedResult:
    """What one training gave: its best epoch's dev figures, the epochs' history, and (trained here) its weights."""

    seed: int
    best: dict[str, float]
    best_epoch: int
    history: list[dict] = field(default_factory=list)
    state: dict[str, torch.Tensor] | None = None
    """The best epoch's weights (on the CPU) when trained in this process: what a training that would repeat this
    one step for step (the selection seed on the chosen setting, see sweep.py) takes over instead of retraining."""


@dataclass(frozen=True)
class Training:
    """One training: its recipe, data and seed, what picks its best epoch, and what its record must match."""

    config: FinetuneConfig
    """Its recipe; its folder is `seed_<seed>/` in `train.output_dir`."""
    data: TaskData
    """Trained on `train`, scored on `dev` (a trial's only dev split is the selection slice), predicts `test`."""
    family: TaskFamily
    arm: Arm
    seed: int
    role: Role = "seed"
    part: str = ""
    """The trial's id, or the curve point's name (`8-per-class`), in its name and label."""
    held_out: Split | None = None
    """The selection slice, when it picks the best epoch: dev is then scored once, on that epoch (the family must
    know the slice as `select_split.SELECT`)."""
    protocol: dict | None = None
    """What the completion record must match besides the recipe: the slice and setting, the curve point."""
    score_every: int = 1
    """Epochs between scorings (a curve point's short epochs); the last epoch is always scored."""

    def for_seed(self, seed: int) -> Training:
        return dataclasses.replace(self, seed=seed)

    @property
    def folder(self) -> SeedLayout:
        return self.config.layout.seed(self.seed)

    @property
    def keeps_weights(self) -> bool:
        """A seed's model is the run's product; a trial's setting is retrained over the seeds, a curve point reports."""
        return self.role == "seed"

    @property
    def on_slice(self) -> bool:
        """Whether the selection slice picks the best epoch, so that its scores are named `select_`."""
        return self.held_out is not None or self.role == "trial"

    @property
    def plan(self) -> BatchPlan:
        return self.config.batch_plan(self.arm.world_size)

    @property
    def label(self) -> str:
        """How the console names it: `sst2 trial 1a2b3c4d seed 1 (scratch)`."""
        part = {"seed": "", "trial": f" trial {self.part}", "point": f" {self.part}"}[self.role]
        return f"{self.config.task_name}{part} seed {self.seed}{' (scratch)' if self.arm.from_scratch else ''}"

    @property
    def run_name(self) -> str:
        """Its MLflow run's name: `sst2-scratch-trial-1a2b3c4d-seed1`."""
        part = {"seed": "", "trial": f"-trial-{self.part}", "point": f"-{self.part}"}[self.role]
        return f"{self.config.task_name}-{self.arm.kind}{part}-seed{self.seed}"

    def tags(self) -> dict[str, str]:
        """Its MLflow run's tags, a child of the run's."""
        source, part = self.arm.source, {"seed": {}, "trial": {"trial": self.part}, "point": {"point": self.part}}
        tags = run_tags(STAGES[self.role], self.arm.world_size, task=self.config.task_name, seed=self.seed,
                        **part[self.role], from_scratch=str(self.arm.from_scratch).lower(), model=source.path,
                        pretrain_run_id=source.pretrain_run_id, pretrain_checkpoint=source.pretrain_checkpoint)
        if self.arm.parent.run_id:
            tags["mlflow.parentRunId"] = self.arm.parent.run_id
        return tags

    def completion_key(self) -> dict:
        """What a finished training must match to be skipped by a rerun: the task, the model's content (its
        config and tokenizer alone from scratch) and every setting that changes what is trained."""
        recipe = flatten(to_dict(self.config))
        for key in [k for k in recipe if k.startswith("tracking.")] + list(RESULT_NEUTRAL_SETTINGS):
            recipe.pop(key, None)
        key = {"task": self.data.spec.name, "from_scratch": self.arm.from_scratch, "model": self.arm.source.path,
               "model_fingerprint": self.arm.fingerprint, "recipe": recipe}
        if self.protocol is not None:
            key["protocol"] = self.protocol
        return json.loads(json.dumps(key))  # as the record reads back (tuples as lists)

    def mark_complete(self, record: dict) -> None:
        """The last write of a training (its completion key and `record`): from here on a rerun skips it."""
        write_json_atomic(self.folder.complete, {"seed": self.seed, **self.completion_key(), **record})

    def finished(self) -> dict | None:
        """The completion record of this training finished before, None if it has to be (re)done.

        A record that says it was trained differently (another task, model content, recipe or from-scratch
        setting) is an error rather than a skip or an overwrite: its results would be mixed with this run's, or lost.
        """
        folder = self.folder
        try:
            record = json.loads(folder.complete.read_text())
        except (OSError, json.JSONDecodeError):
            return None  # never finished (or killed while writing the marker, which is atomic anyway)
        if record.get("seed") != self.seed or not isinstance(record.get("metrics"), dict) or (
                self.keeps_weights and not folder.model.is_dir()):
            return None
        expected = self.completion_key()
        differs = describe_differences(record, expected, keys=expected)  # the record's own keys (metrics, …) aside
        if differs:
            raise PipelineError(f"{folder.root} holds a finished seed trained differently ({', '.join(differs)}); "
                                "choose another train.output_dir, or delete the folder to redo it")
        return record


def holds_pretrained_seeds(root: Path) -> bool:
    """Whether a fine-tuning output folder holds a finished seed trained from its model's weights (not from scratch)."""
    for marker in root.glob("seed_*/complete.json"):
        try:
            if json.loads(marker.read_text()).get("from_scratch") is False:
                return True
        except (OSError, json.JSONDecodeError, AttributeError):
            continue  # unreadable: not finished (see Training.finished)
    return False


def open_arm(config: FinetuneConfig, model: str, from_scratch: bool, seeds: list[int],
             clock: RunClock | None = None, exporter: Exporter | None = None) -> Arm:
    """The run's `Arm`: its processes (as many as the launcher started), the model (a pretraining checkpoint is
    exported once by `exporter`, by the main process, into the run's `source_model/`), the config fit to the model's
    positions,
    the run's MLflow run, every training's parent, and the run's `clock` (a new one if None)."""
    from pipeline.common.processes.topology import current_topology
    from pipeline.finetune.loop.accelerator import processes
    from pipeline.models.model_source import resolve_model_source
    from pipeline.tracking.sinks import open_metrics

    world_size = current_topology().world_size
    group = processes(world_size=world_size, collective_timeout_s=config.train.collective_timeout_s)
    if group.num_processes != world_size:  # the batch plans would split the batch wrongly
        raise PipelineError(f"the launcher started {world_size} processes (WORLD_SIZE) but accelerate sees "
                            f"{group.num_processes}; check `accelerate config` (on CPU: --multi_gpu with gloo)")
    is_main, layout = group.is_main_process, config.layout
    source = resolve_model_source(model, exporter=exporter, export_to=layout.source_model, is_main=is_main,
                                  barrier=group.wait_for_everyone, keep_export=holds_pretrained_seeds(layout.root),
                                  what="--model")
    config = config.capped_to(source.path, say=is_main)  # the families cut their inputs at data.max_seq_len
    arm, listed = Arm(config, source, from_scratch, group, clock=clock or RunClock()), ",".join(map(str, seeds))
    with arm.clock.phase("tracking"):
        arm.parent = open_metrics(is_main, tracking=config.tracking, run_name=f"{config.task_name}-{arm.kind}",
                                  tags=run_tags("finetune-summary", world_size, task=config.task_name, seeds=listed,
                                                from_scratch=str(from_scratch).lower(), model=source.path,
                                                pretrain_run_id=source.pretrain_run_id,
                                                pretrain_checkpoint=source.pretrain_checkpoint),
                                  params={**flatten(to_dict(config)), "model": source.path, "seeds": listed})
    return arm

