"""The arms' loss curves overlaid in one PNG, against training tokens so arms of any batch size line up."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.common.atomic_files import write_atomic


def read_curves(metrics_jsonl: Path, tokens_per_step: int) -> dict[str, tuple[list[float], list[float]]]:
    """`{"train": (tokens, MLM loss), "val": (tokens, MLM loss)}` from a pretraining run's `metrics.jsonl`.

    The training curve is the MLM loss alone where the run logs it (BERT adds the NSP loss to
    `train/loss`), so arms with and without NSP compare on the same quantity.
    """
    by_step: dict[str, dict[int, float]] = {"train": {}, "val": {}}
    if metrics_jsonl.exists():
        for line in metrics_jsonl.read_text().splitlines():
            record = json.loads(line) if line.strip() else {}
            step = record.get("step")
            train = record.get("train/mlm_loss", record.get("train/loss"))
            if step is not None and train is not None:
                by_step["train"][step] = train  # a resumed run logs a step again: the last one counts
            if step is not None and "eval/mlm_loss" in record:
                by_step["val"][step] = record["eval/mlm_loss"]
    return {name: ([s * tokens_per_step for s in sorted(points)], [points[s] for s in sorted(points)])
            for name, points in by_step.items()}


def plot_curves(arms: dict[str, dict[str, tuple[list[float], list[float]]]], title: str, out: Path) -> Path:
    """Training (left) and validation (right) MLM loss of every arm against tokens; written atomically."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, (train_ax, val_ax) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for name, curves in arms.items():
        line, = train_ax.plot(*curves["train"], label=name, linewidth=1)
        val_ax.plot(*curves["val"], marker="o", color=line.get_color(), label=name)
    for ax, what in ((train_ax, "training MLM loss"), (val_ax, "validation MLM loss")):
        ax.set_xlabel("training tokens")
        ax.set_title(what)
        ax.grid(alpha=0.3)
    train_ax.set_ylabel("loss")
    val_ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    write_atomic(out, buffer.getvalue())
    return out
