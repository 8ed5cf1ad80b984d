"""The label-efficiency curve: the chosen setting retrained on a few labelled examples per class.

How much labelled data does pretraining save? Each point of `--labels-per-class 8,32` trains every
seed on N examples of each class, drawn from the training split the seeds train on (the selection
slice stays held out and picks each seed's best epoch), and reports dev as the median over seeds,
beside the full split's result ("all"). The draw is keyed by (seed, N), so both arms see the same
examples for the same seed, and the spread over seeds includes which examples were drawn.

A point with fewer examples gets more epochs, so that it trains about as many optimizer steps as the
full run (`epochs × full size ÷ point size`), never fewer epochs than the full run and at most
`MAX_CURVE_EPOCHS`: a handful of steps would measure the step count, not the labels. It is scored
about as often as the full run (every `curve_scoring_interval` epochs, and after the last), and the
best of those scorings on the selection slice is its result. A point's seeds
keep no weights (their reports and MLflow runs stay), and a rerun skips finished ones.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from typing import TYPE_CHECKING

from pipeline.common.errors import PipelineError
from pipeline.data.tasks.splits import Split, TaskData

if TYPE_CHECKING:
    from pipeline.finetune.loop.arm import Training

MAX_CURVE_EPOCHS = 20


def parse_labels_per_class(text: str) -> list[int]:
    """`"8,32"` → `[8, 32]`: distinct positive counts, in increasing order."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise PipelineError(f"--labels-per-class {text!r}: expected comma-separated whole numbers, e.g. 8,32") from None
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise PipelineError(f"--labels-per-class {text!r}: expected distinct counts of at least 1, e.g. 8,32")
    return sorted(counts)


def per_class_sample(split: Split, per_class: int, seed: int) -> Split:
    """`per_class` examples of each label (all of a label that has fewer), drawn by (seed, per_class), in order."""
    by_label: dict[float, list[int]] = {}
    for i, label in enumerate(split.labels or []):
        by_label.setdefault(label, []).append(i)
    rng = random.Random(f"{seed}:{per_class}")
    chosen = sorted(i for label in sorted(by_label) for i in rng.sample(by_label[label],
                                                                         min(per_class, len(by_label[label]))))
    return Split(f"{split.source} ({per_class} per class, draw {seed})", [split.texts[i] for i in chosen],
                 [split.labels[i] for i in chosen], [split.ids[i] for i in chosen])


def curve_scoring_interval(point_epochs: int, full_epochs: int) -> int:
    """Epochs between a point's scorings on the selection slice: about as many scorings as the full run has
    (a point of 20 one-step epochs scored after each spent most of its time scoring)."""
    return max(1, math.ceil(point_epochs / max(full_epochs, 1)))


def curve_epochs(epochs: int, full_examples: int, examples: int) -> int:
    """Epochs for a point of `examples` so it trains about the full run's steps, within [epochs, MAX_CURVE_EPOCHS]."""
    return max(epochs, min(MAX_CURVE_EPOCHS, math.ceil(epochs * full_examples / max(examples, 1))))


def label_curve(full: Training, counts: list[int], seeds: list[int], results: list[dict]) -> list[dict]:
    """`metrics.json`'s `label_curve`: a row per count of examples per class, every seed of the run's training
    `full` retrained on its own draw of them; then the full split's row ("all": `results`, the seeds' own)."""
    if not counts:
        return []
    rows = [_point(full, per_class, seeds) for per_class in counts]
    return [*rows, curve_point("all", len(full.data.train), full.config.train.epochs, results, full.family.main_metric)]


def _point(full: Training, per_class: int, seeds: list[int]) -> dict:
    """Every seed of one point, trained (or reused when finished) on its own draw of the examples."""
    from pipeline.finetune.loop.trainer import train_or_reuse

    points = [point_training(full.for_seed(seed), per_class) for seed in seeds]
    results = [train_or_reuse(point).best for point in points]
    last = points[-1]
    return curve_point(per_class, len(last.data.train), last.config.train.epochs, results, full.family.main_metric)


def point_training(seed: Training, per_class: int) -> Training:
    """`seed`'s training on `per_class` examples of each class: in its own folder (`labels_<N>_per_class/`), with
    the epochs for about the full run's steps, scored about as often, its completion record naming the point."""
    config = seed.config
    train = per_class_sample(seed.data.train, per_class, seed.seed)
    epochs = curve_epochs(config.train.epochs, len(seed.data.train), len(train))
    score_every = curve_scoring_interval(epochs, config.train.epochs)
    point = dataclasses.replace(config, train=dataclasses.replace(
        config.train, output_dir=str(config.layout.root / f"labels_{per_class}_per_class"), epochs=epochs))
    return dataclasses.replace(
        seed, config=point, data=TaskData(seed.data.spec, train, seed.data.dev, {}), role="point",
        part=f"{per_class}-per-class", score_every=score_every,
        protocol={**(seed.protocol or {}), "labels_per_class": per_class, "score_every": score_every})


def curve_point(per_class: int | str, examples: int, epochs: int, results: list[dict], metric: str) -> dict:
    """One row of `metrics.json`'s `label_curve`: the median, spread and every seed of the main metric."""
    values = [r[metric] for r in results]
    return {"labels_per_class": per_class, "examples": examples, "epochs": epochs, "metric": metric,
            "median": statistics.median(values), "min": min(values), "max": max(values), "per_seed": values}


def check_curve_task(data: TaskData) -> None:
    """The curve draws examples per class: classification tasks only."""
    if not isinstance(data.train, Split) or data.spec.is_regression or data.train.labels is None:
        raise PipelineError(f"--labels-per-class: {data.spec.name} is not a classification task (it draws N "
                            "training examples of each class)")
