"""A confusion matrix drawn as a PNG: counts in a colour grid, true classes as rows, predictions as columns.

Drawn with matplotlib's object API (a `Figure` and the Agg canvas), not pyplot or scikit-learn's
`ConfusionMatrixDisplay`, which it imitates: importing `sklearn.metrics` for the display cost a fine-tuning process
about a second of CPU, and pyplot keeps every figure in global state until it is closed.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import write_atomic


def draw_confusion(path: str | Path, counts: np.ndarray, class_names: Sequence[str], title: str | None = None) -> Path:
    """Write `counts` (true classes as rows) as a PNG to `path`, atomically; returns the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(class_names)
    figure = Figure(figsize=(4 + 0.4 * n, 3.5 + 0.4 * n))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    image = ax.imshow(counts, interpolation="nearest", cmap="viridis")
    middle = (counts.max() + counts.min()) / 2.0
    for (row, column), value in np.ndenumerate(counts):  # light text on the dark cells, dark on the light ones
        colour = image.cmap(1.0 if value < middle else 0.0)
        ax.text(column, row, f"{value:d}", ha="center", va="center", color=colour)
    ax.set(xticks=range(n), yticks=range(n), xticklabels=list(class_names), yticklabels=list(class_names),
           xlabel="Predicted label", ylabel="True label", ylim=(n - 0.5, -0.5))
    if title:
        ax.set_title(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    write_atomic(path, buffer.getvalue())
    return Path(path)
