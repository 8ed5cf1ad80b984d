"""The fair fine-tuning protocol: a small sweep per arm, settings chosen on held-out TRAINING data.

RoBERTa's GLUE protocol (Liu et al. 2019, section 5.1) sweeps a few learning rates and batch sizes
per task and reports the median over seeds of the chosen setting. One recipe for both arms is not
fair: a pretrained encoder and random weights want different learning rates. Here each setting of
the grid (`--sweep KEY=V1,V2,...`, one product over the keys) is trained once, with the selection
seed (the first of `--seeds`), on the training split minus the selection slice
(`select_split.py`), and scored on that slice. The best score wins (the first setting in grid
order on a tie). The chosen setting is then trained over every seed on the same data (the slice
stays held out: it picks each seed's best epoch, so dev is scored once per seed, at the end) and
reported on dev as the median. Dev never takes part in a choice.

Each trial is a fine-tuning run of its own (`<output_dir>/selection/trial_<id>/seed_N/`, an MLflow
child run under the task's run, tagged `stage=finetune-trial`); its `complete.json` makes a rerun
skip it, as finished seeds are skipped.

The selection seed's final training on the chosen setting would repeat the winning trial step for
step (the same data, setting, seed and slice picking the epoch), so that seed takes the trial's best
epoch over (`FineTuner.take_over`) and only scores dev on it: one training fewer per sweep. A trial
skipped as finished keeps no weights, so then the seed trains as usual, to the same result.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from dataclasses import dataclass

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.errors import PipelineError
from pipeline.data.tasks.splits import TaskData
from pipeline.finetune.config import FinetuneConfig
from pipeline.finetune.families.registry import task_family
from pipeline.finetune.loop.arm import RESULT_NEUTRAL_SETTINGS, Arm, SeedResult, Training
from pipeline.finetune.loop.trainer import train_or_reuse
from pipeline.finetune.protocol.selection import SELECT, SelectionSplit, selection_task, split_for_selection

DEFAULT_SELECT_FRACTION = 0.1

FIXED_PER_LAUNCH = ("task", "train.precision")
"""Keys read once per launch, before any trial: the task's data, and the precision the one accelerator of the
process is built for (a swept precision would train every trial in the first setting's).
A sweep refuses these, `training.RESULT_NEUTRAL_SETTINGS` (they change no result: the rerun skip rule
and the sweep name the same keys), `tracking.*`, and the `data.*` keys outside `SWEEPABLE_DATA`."""

SWEEPABLE_DATA = ("data.max_seq_len", "data.label_all_tokens", "data.doc_stride", "data.n_best",
                  "data.max_answer_length", "data.version_2_with_negative", "data.null_score_diff_threshold")
"""The `data.*` keys a sweep may vary: how examples are encoded and answers read. The others say which
examples there are, and the task is read once, before the sweep."""


def parse_sweep(specs: list[str]) -> list[tuple[str, ...]]:
    """`["train.learning_rate=1e-4,1e-3", "train.epochs=3,5"]` → every setting of the grid, as `--set` overrides
    (`("train.learning_rate=1e-4", "train.epochs=3")`, …), the last key varying fastest."""
    keys, values = [], []
    for spec in specs:
        key, sep, text = spec.partition("=")
        key = key.strip()
        options = [v.strip() for v in text.split(",")]
        if not sep or not key or not all(options):
            raise PipelineError(f"--sweep {spec!r}: expected KEY=V1,V2,... (e.g. train.learning_rate=1e-4,3e-4,1e-3)")
        if key in keys:
            raise PipelineError(f"--sweep {key}: given twice; list all its values in one --sweep")
        if key in FIXED_PER_LAUNCH:
            raise PipelineError(f"--sweep {key}: cannot be swept (it is read once per launch, before any trial); "
                                "set it with --set, or run one launch per value")
        if key in RESULT_NEUTRAL_SETTINGS or key.startswith("tracking."):
            raise PipelineError(f"--sweep {key}: cannot be swept (it names the run or changes no result); set it "
                                "with --set")
        if key.startswith("data.") and key not in SWEEPABLE_DATA:
            raise PipelineError(f"--sweep {key}: the task's data is read once, before the sweep; of the data keys "
                                f"only {', '.join(SWEEPABLE_DATA)} can be swept")
        if len(set(options)) != len(options):
            raise PipelineError(f"--sweep {spec!r}: a value is listed twice")
        keys.append(key)
        values.append(options)
    return [tuple(f"{k}={v}" for k, v in zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


@dataclass
class Setting:
    """One point of the grid: its `--set` overrides and the config they give (checked when loaded)."""

    overrides: tuple[str, ...]
    config: FinetuneConfig

    @property
    def name(self) -> str:
        """A stable short id of the overrides: the trial's folder and MLflow run name."""
        return hashlib.sha256(json.dumps(list(self.overrides)).encode()).hexdigest()[:8]

    @property
    def values(self) -> dict[str, str]:
        return dict(o.split("=", 1) for o in self.overrides)


@dataclass
class Sweep:
    """What `--sweep` and `--select-fraction` ask for."""

    settings: list[Setting]
    fraction: float = DEFAULT_SELECT_FRACTION

    def __post_init__(self) -> None:
        if not self.settings:
            raise PipelineError("--sweep: no setting to try")
        if not 0 < self.fraction < 1:
            raise PipelineError(f"--select-fraction: must be between 0 and 1 (exclusive), got {self.fraction}")


@dataclass
class Selection:
    """The outcome: the chosen setting, its score on the slice, every trial, and the cut of the training split."""

    chosen: Setting
    score: float
    metric: str
    seed: int
    trials: list[dict]
    cut: SelectionSplit
    trained: SeedResult | None = None
    """The chosen setting's trial, when it trained in this process (with its weights): the selection seed takes it
    over."""

    def protocol(self) -> dict:
        """What the final seeds' completion records must match: the slice and the chosen setting."""
        return {"slice": self.cut.record(), "setting": list(self.chosen.overrides)}

    def seeds_training(self, data: TaskData, arm: Arm) -> Training:
        """What the seeds train: the chosen setting, in the run's folder, on the training split minus the slice,
        which picks each seed's best epoch (dev is scored once, on it)."""
        chosen, cut = self.chosen.config, self.cut
        config = dataclasses.replace(chosen, train=dataclasses.replace(chosen.train,
                                                                       output_dir=arm.config.train.output_dir))
        # The family knows the slice by name (token and QA metrics look their split up); the seeds' data does not.
        family = task_family(TaskData(data.spec, cut.fit, {**data.dev, SELECT: cut.held_out}, data.test), config.data)
        return Training(config, TaskData(data.spec, cut.fit, data.dev, data.test), family, arm, self.seed,
                        held_out=cut.held_out, protocol=self.protocol())

    def record(self) -> dict:
        """`metrics.json`'s `selection` entry."""
        return {"chosen": self.chosen.values, "score": self.score, "metric": self.metric, "seed": self.seed,
                **self.cut.record(), "trials": self.trials}


def select_setting(sweep: Sweep, data: TaskData, arm: Arm, seed: int) -> Selection:
    """Train every setting on the training split minus the slice, score it on the slice; keep the best.

    `data.dev` is not given to any trial: the trials see `selection_task(data, cut)` alone. Trials with the same
    data options share one family, so one encoding (`Arm.encoded`).
    """
    cut = split_for_selection(data.train, sweep.fraction)
    task = selection_task(data, cut)
    layout = arm.config.layout
    # Each setting fit to the model's positions, as the run's config is (a swept length says so itself).
    settings = [Setting(s.overrides, s.config.capped_to(arm.source.path,
                                                        say=arm.is_main and "data.max_seq_len" in s.values))
                for s in sweep.settings]
    if arm.is_main:
        print(f"selection: {len(sweep.settings)} setting(s), seed {seed}, trained on {len(cut.fit)} training "
              f"examples, scored on {len(cut.held_out)} held out ({sweep.fraction:g} of train; dev unused)",
              flush=True)
    trials, scores, families = [], [], {}
    best_trained: SeedResult | None = None
    for setting in settings:
        config = dataclasses.replace(setting.config, train=dataclasses.replace(
            setting.config.train, output_dir=str(layout.trial(setting.name).root)))
        if repr(config.data) not in families:
            families[repr(config.data)] = task_family(task, config.data)
        family = families[repr(config.data)]
        result = train_or_reuse(Training(config, task, family, arm, seed, role="trial", part=setting.name,
                                         protocol={"slice": cut.record(), "setting": list(setting.overrides)}))
        score = result.best[f"select_{family.main_metric}"]
        if not scores or score > max(scores):  # the best so far (the first on a tie): keep its weights only
            best_trained = result if result.state is not None else None
        scores.append(score)
        trials.append({"trial": setting.name, "setting": setting.values, "score": score,
                       "best_epoch": result.best_epoch, "metrics": result.best})
        if arm.is_main:
            print(f"selection: {' '.join(setting.overrides)} → {family.main_metric} {score:.4f} on the slice",
                  flush=True)
    best_index = max(range(len(scores)), key=lambda i: (scores[i], -i))  # the first setting on a tie
    chosen = settings[best_index]
    selection = Selection(chosen, scores[best_index], family.main_metric, seed, trials, cut, best_trained)
    if arm.is_main:
        layout.root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(layout.selection_record, selection.record())
        print(f"selection: chose {' '.join(chosen.overrides)} ({family.main_metric} {selection.score:.4f} on the "
              "slice)", flush=True)
    arm.processes.wait_for_everyone()
    return selection
