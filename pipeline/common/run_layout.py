"""The one owner of every path in a run folder: what pretraining and fine-tuning write, and where.

Code never joins file names onto an output folder itself; it asks the layout. So a file moves in
one place, and a checkpoint finds its run folder (tokenizer, MLflow state) the same way everywhere.

    <pretraining output_dir>/                     <fine-tuning output_dir>/
      config.json   tokenizer/   metrics.jsonl      metrics.json        (medians over seeds)
      tracking.json token_cache/ export/            best_model.json     (pointer to the best seed)
      ledger.jsonl  checkpoints/step_NNNNNNNN/      source_model/       (export of a checkpoint --model)
                                                    seed_N/model/  seed_N/complete.json  …
                                                    baselines.json      (figures the cards set beside)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PretrainLayout:
    """Paths in a pretraining run folder (`train.output_dir`)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        """The resolved config the run was started with."""
        return self.root / "config.json"

    @property
    def tokenizer(self) -> Path:
        """A copy of the tokenizer, so exports and fine-tuning do not depend on the original folder."""
        return self.root / "tokenizer"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tracking(self) -> Path:
        """The MLflow run id, so a resumed run logs to the same run."""
        return self.root / "tracking.json"

    @property
    def ledger(self) -> Path:
        """The run's events that outlive its checkpoints: skipped ranges, checkpoints set aside (run_ledger.py)."""
        return self.root / "ledger.jsonl"

    @property
    def token_cache(self) -> Path:
        return self.root / "token_cache"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def export(self) -> Path:
        return self.root / "export"

    @classmethod
    def of_checkpoint(cls, checkpoint: str | Path) -> PretrainLayout | None:
        """The run folder that holds `checkpoint` (`<root>/checkpoints/<tag>`), or None for a loose checkpoint.

        The path is made absolute first: `step_00000008` given from inside `checkpoints/` still
        finds its run folder (a relative path's `.parent.parent` is the working directory).
        """
        checkpoint = Path(checkpoint).resolve()
        layout = cls(checkpoint.parent.parent)
        return layout if checkpoint.parent == layout.checkpoints else None


CHECKPOINT_RECORD_FILE = "complete.json"
"""In a checkpoint folder, written last: its record (pipeline/pretrain/checkpoints/record.py); a folder without one is
no checkpoint."""

EXPORT_PROVENANCE_FILE = "pipeline_export.json"
"""In an export: the checkpoint and pretraining MLflow run it came from, what trained it, its equivalence check."""

FINETUNE_PROVENANCE_FILE = "pipeline_finetune.json"
"""In a saved fine-tuned model (`SeedLayout.model`): task, labels, seed, metrics and the model it started from."""


@dataclass(frozen=True)
class SeedLayout:
    """Paths of one fine-tuning seed: `<output_dir>/seed_N/`."""

    root: Path
    seed: int

    @property
    def model(self) -> Path:
        """The best epoch as an HF folder (weights, config with the task's labels, tokenizer, provenance)."""
        return self.root / "model"

    @property
    def complete(self) -> Path:
        """Written last, when the seed has finished: a rerun skips the seed."""
        return self.root / "complete.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def history(self) -> Path:
        return self.root / "history.json"

    def dev_predictions(self, split: str, splits: int, suffix: str = ".tsv") -> Path:
        """`dev_predictions.tsv`, or `dev_predictions_<split>.tsv` when the task has several dev splits.

        Token tasks write CoNLL (`.conll`: word, gold, predicted).
        """
        return self.root / (f"dev_predictions{suffix}" if splits == 1 else f"dev_predictions_{split}{suffix}")

    def test_predictions(self, split: str, suffix: str = ".tsv") -> Path:
        """GLUE submission files: `test_predictions.tsv`, or `test_<split>.tsv` (MNLI's matched/mismatched).

        Token tasks write `test_predictions.conll`, QA tasks `test_predictions.json` (`{id: answer}`).
        """
        return self.root / (f"test_predictions{suffix}" if split == "test" else f"test_{split}{suffix}")

    def test_metrics(self, split: str) -> Path:
        """Metrics on a test split that has gold labels (token and QA tasks)."""
        return self.root / ("test_metrics.json" if split == "test" else f"test_{split}_metrics.json")

    def answers(self, split: str, splits: int) -> Path:
        """QA dev answers in the official SQuAD format, `{id: answer}`: `predictions.json`."""
        return self.root / ("predictions.json" if splits == 1 else f"predictions_{split}.json")

    def confusion(self, split: str) -> Path:
        return self.root / f"confusion_{split}.png"


@dataclass(frozen=True)
class FinetuneLayout:
    """Paths in a fine-tuning output folder (`train.output_dir`)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def metrics(self) -> Path:
        """Median, mean and standard deviation over seeds."""
        return self.root / "metrics.json"

    @property
    def best_model(self) -> Path:
        """`{"seed", "path", "task", "metric", "value"}`: which seed's model is the best."""
        return self.root / "best_model.json"

    @property
    def source_model(self) -> Path:
        """Where a pretraining checkpoint given as `--model` is exported (once, by rank 0)."""
        return self.root / "source_model"

    @property
    def timings(self) -> Path:
        """Where the run's time went: CPU and wall seconds per phase (`pipeline/finetune/loop/clock.py`)."""
        return self.root / "timings.json"

    def seed(self, seed: int) -> SeedLayout:
        return SeedLayout(self.root / f"seed_{seed}", seed)

    @property
    def baselines(self) -> Path:
        """What the run's figures stand beside (another arm, a token-count baseline): named by whoever ran them,
        shown in the saved models' cards."""
        return self.root / "baselines.json"

    @property
    def selection(self) -> Path:
        """`--sweep`: the trials that chose the setting, and `selection.json` (every trial's score, the choice)."""
        return self.root / "selection"

    @property
    def selection_record(self) -> Path:
        """`--sweep`: every trial's setting and score on the selection slice, and the chosen setting."""
        return self.root / "selection.json"

    def trial(self, name: str) -> FinetuneLayout:
        """One setting's trial: a fine-tuning folder of its own (`selection/trial_<name>/seed_N/`)."""
        return FinetuneLayout(self.selection / f"trial_{name}")

    def relative(self, path: Path) -> str:
        """`path` relative to the output folder, as recorded in `best_model.json`."""
        return Path(path).relative_to(self.root).as_posix()


MAIN_JOB_TASKS = ("keywords", "word-order")
"""The main job's fine-tuning tasks: which package a docstring comes from (token counts solve it), and
bigram shift (were two adjacent words swapped? token counts sit at chance)."""

MAIN_JOB_ARMS = ("pretrained", "from-scratch")

MAIN_JOB_CONFIG = "main-job"
"""The main job's pretraining recipe: configs/main-job.json."""

WORD_ORDER_CONFIG = "word-order"
"""The word-order task's fine-tuning recipe: configs/glue/word-order.json."""

MAIN_JOB_RECIPE = ((MAIN_JOB_CONFIG, "pretrain"), (WORD_ORDER_CONFIG, "finetune"))
"""The shipped configs (name, kind) behind the seed benchmark's figures: the pretraining recipe and the word-order
task's fine-tuning, whose gain over scratch it judges."""


@dataclass(frozen=True)
class MainJobLayout:
    """Paths in the main job's folder (`launchers/run_default.py --out`), written by its stages."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def corpus(self) -> Path:
        return self.root / "corpus.jsonl"

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    @property
    def shards(self) -> Path:
        return self.root / "shards"

    @property
    def pretrain(self) -> PretrainLayout:
        return PretrainLayout(self.root / "pretrain")

    def task(self, name: str) -> Path:
        """One of `MAIN_JOB_TASKS` (or `search`) made from the corpus: train.jsonl, dev.jsonl."""
        return self.root / "tasks" / name

    @property
    def cloze(self) -> Path:
        """The export's cloze check on the validation text (launchers/cloze.py --json)."""
        return self.root / "cloze.json"

    def token_baseline(self, task: str) -> Path:
        """A task's token-count baseline on dev (launchers/token_baseline.py --json)."""
        return self.task(task) / "token-baseline.json"

    def finetune(self, task: str, arm: str) -> FinetuneLayout:
        """`arm` is `pretrained` or `from-scratch`."""
        return FinetuneLayout(self.root / "finetune" / task / arm)

    @property
    def minimal_pairs(self) -> Path:
        """Minimal pairs made from the corpus's held-out documents (JSON lines)."""
        return self.root / "minimal-pairs.jsonl"

    @property
    def minimal_pairs_result(self) -> Path:
        """The export's minimal-pair accuracy beside the unigram baseline (launchers/minimal_pairs.py --out)."""
        return self.root / "minimal-pairs.json"

    @property
    def label_curve_plot(self) -> Path:
        """Dev accuracy against labelled examples per class, both arms, every task."""
        return self.compare / "label-efficiency.png"

    @property
    def compare(self) -> Path:
        return self.root / "compare"

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def logs(self) -> Path:
        """Each stage's full output, `<stage>.log`, and `timings.json`."""
        return self.root / "logs"


@dataclass(frozen=True)
class ArmLayout:
    """Paths of one arm of a study: `<study>/arms/<arm>/`."""

    root: Path

    @property
    def tracking(self) -> Path:
        """The arm's MLflow run id (a child of the study's run)."""
        return self.root / "tracking.json"

    @property
    def pretrain(self) -> PretrainLayout:
        return PretrainLayout(self.root / "pretrain")

    def finetune(self, task: str) -> FinetuneLayout:
        return FinetuneLayout(self.root / "finetune" / task)


@dataclass(frozen=True)
class StudyLayout:
    """Paths of one study (`<ablate --out>/<study>/`): its arms, results, curves and logs."""

    root: Path

    @property
    def plan(self) -> Path:
        """Each arm's settings, steps and tokens, as first run: a rerun with other settings is refused."""
        return self.root / "study.json"

    @property
    def tracking(self) -> Path:
        """The study's MLflow parent run id."""
        return self.root / "tracking.json"

    def arm(self, name: str) -> ArmLayout:
        return ArmLayout(self.root / "arms" / name)

    @property
    def results_md(self) -> Path:
        return self.root / "results.md"

    @property
    def results_csv(self) -> Path:
        return self.root / "results.csv"

    @property
    def curves(self) -> Path:
        return self.root / "loss_curves.png"

    @property
    def logs(self) -> Path:
        """Each stage's full output, `<arm>-<stage>.log`."""
        return self.root / "logs"


@dataclass(frozen=True)
class AblationLayout:
    """`launchers/ablate.py --out`: the tokenizer and shards every study shares, and one folder per study."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    def shards(self, pack: str) -> Path:
        """One shard folder per packing mode, shared by every arm (and study) that uses it."""
        return self.root / "shards" / pack

    def study(self, name: str) -> StudyLayout:
        return StudyLayout(self.root / name)

    @property
    def logs(self) -> Path:
        """The shared stages' output: `tokenizer.log`, `shards-<pack>.log`."""
        return self.root / "logs"

    @property
    def tracking_uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"
