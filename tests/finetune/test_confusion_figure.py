"""The confusion figure: one viridis cell per count, darkest for the fewest, drawn without importing matplotlib."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from PIL import Image

from pipeline.finetune.families.sequence.confusion_figure import CELL, draw_confusion, viridis


def cell_colours(png, counts: np.ndarray) -> dict[tuple[int, int], tuple[int, int, int]]:
    """Each cell's colour, read a few pixels in from its top-left corner (clear of the count written in it)."""
    image = Image.open(png).convert("RGB")
    pixels = np.asarray(image)
    dark = viridis(0.0)
    # the grid's top-left corner: the first pixel, reading rows then columns, in the colour of a count's cell
    ys, xs = np.nonzero((np.abs(pixels.astype(int) - viridis(1.0)).sum(axis=2) == 0)
                        | (np.abs(pixels.astype(int) - dark).sum(axis=2) == 0))
    top, left = ys.min(), xs.min()
    return {(r, c): tuple(int(v) for v in pixels[top + r * CELL + 3, left + c * CELL + 3])
            for r in range(counts.shape[0]) for c in range(counts.shape[1])}


def test_each_count_is_a_cell_coloured_from_dark_for_the_fewest_to_light_for_the_most(tmp_path):
    counts = np.array([[9, 0, 2], [1, 5, 0], [0, 3, 7]])
    png = draw_confusion(tmp_path / "cm.png", counts, ["cat", "dog", "bird"], "pets dev")

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    colours = cell_colours(png, counts)
    assert colours[(0, 0)] == viridis(1.0)  # 9, the most
    assert colours[(0, 1)] == viridis(0.0)  # 0, the fewest
    assert colours[(1, 1)] == viridis(5 / 9)


def test_long_class_names_widen_the_figure_and_every_size_of_matrix_draws(tmp_path):
    short = Image.open(draw_confusion(tmp_path / "a.png", np.eye(2, dtype=int), ["a", "b"]))
    long = Image.open(draw_confusion(tmp_path / "b.png", np.eye(2, dtype=int), ["a rather long name", "b"]))
    single = Image.open(draw_confusion(tmp_path / "c.png", np.array([[4]]), ["only"]))

    assert long.width > short.width and long.height > short.height  # names wider than a cell are written upwards
    assert single.width > CELL


def test_drawing_does_not_import_matplotlib(tmp_path):
    code = ("import sys, numpy as np\n"
            "from pipeline.finetune.families.sequence.confusion_figure import draw_confusion\n"
            f"draw_confusion({str(tmp_path / 'cm.png')!r}, np.array([[1, 2], [3, 4]]), ['x', 'y'], 't')\n"
            "print('matplotlib' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert shown.strip() == "False"
