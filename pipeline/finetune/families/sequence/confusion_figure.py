"""A confusion matrix drawn as a PNG: counts in a colour grid, true classes as rows, predictions as columns.

Drawn with Pillow, by hand, in the layout of scikit-learn's `ConfusionMatrixDisplay` (viridis cells, each count
in light text on dark cells and dark text on light ones, "True label" down the side, "Predicted label" along the
bottom). Every fine-tuning process draws one per seed: importing matplotlib for it cost a process about 0.45 s of
CPU (6% of a small run, which HF `Trainer` does not pay) and importing `sklearn.metrics` for the display about a
second; Pillow costs 15 ms.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import write_atomic

# matplotlib's viridis at 0, 1/8, ..., 1: the colour of a cell is interpolated between its neighbours here.
VIRIDIS = np.array([(68, 1, 84), (71, 44, 122), (59, 81, 139), (44, 113, 142), (33, 144, 141),
                    (39, 173, 129), (92, 200, 99), (170, 220, 50), (253, 231, 37)], dtype=np.float64)
CELL, MARGIN, FONT_SIZE = 64, 12, 15
INK = (0, 0, 0)


def viridis(fraction: float) -> tuple[int, int, int]:
    """The viridis colour at `fraction` of the way from its dark end (0) to its light end (1)."""
    position = min(max(fraction, 0.0), 1.0) * (len(VIRIDIS) - 1)
    low = min(int(position), len(VIRIDIS) - 2)
    colour = VIRIDIS[low] + (position - low) * (VIRIDIS[low + 1] - VIRIDIS[low])
    return tuple(int(round(c)) for c in colour)


def draw_confusion(path: str | Path, counts: np.ndarray, class_names: Sequence[str], title: str | None = None) -> Path:
    """Write `counts` (true classes as rows) as a PNG to `path`, atomically; returns the path."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=FONT_SIZE)
    counts = np.asarray(counts)
    n, names = len(class_names), [str(name) for name in class_names]
    line = _text_size(font, "Hg")[1]
    row_names = max(_text_size(font, name)[0] for name in names)
    upwards = row_names > CELL  # names wider than a cell are written upwards under the columns
    column_names = row_names if upwards else line
    left = MARGIN + line + MARGIN + row_names + MARGIN
    top = MARGIN + (line + MARGIN if title else 0)
    width = left + n * CELL + MARGIN
    height = top + n * CELL + MARGIN + column_names + MARGIN + line + MARGIN
    image = Image.new("RGB", (max(width, left + _text_size(font, "Predicted label")[0]), height), "white")
    draw = ImageDraw.Draw(image)

    low, high = counts.min(), counts.max()
    middle = (high + low) / 2.0
    for (row, column), value in np.ndenumerate(counts):
        x, y = left + column * CELL, top + row * CELL
        draw.rectangle((x, y, x + CELL - 1, y + CELL - 1), fill=viridis((value - low) / (high - low or 1)))
        ink = viridis(1.0) if value < middle else viridis(0.0)  # light text on the dark cells, dark on the light
        draw.text((x + CELL / 2, y + CELL / 2), f"{int(value):d}", fill=ink, font=font, anchor="mm")
    grid_bottom = top + n * CELL
    for index, name in enumerate(names):
        draw.text((left - MARGIN, top + index * CELL + CELL / 2), name, fill=INK, font=font, anchor="rm")
        centre = left + index * CELL + CELL / 2
        if upwards:
            _paste_upwards(image, font, name, centre, grid_bottom + MARGIN)
        else:
            draw.text((centre, grid_bottom + MARGIN), name, fill=INK, font=font, anchor="mt")
    draw.text((left + n * CELL / 2, height - MARGIN), "Predicted label", fill=INK, font=font, anchor="mb")
    _paste_upwards(image, font, "True label", MARGIN + line / 2, top + n * CELL / 2, centred=True)
    if title:
        draw.text((left + n * CELL / 2, MARGIN), title, fill=INK, font=font, anchor="mt")

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    write_atomic(path, buffer.getvalue())
    return Path(path)


def _text_size(font, text: str) -> tuple[int, int]:
    left, top, right, bottom = font.getbbox(text)
    return right - left, bottom - top


def _paste_upwards(image, font, text: str, x: float, y: float, centred: bool = False) -> None:
    """`text` turned a quarter anticlockwise, centred on `x`; its start at `y`, or its middle there if `centred`."""
    from PIL import Image, ImageDraw

    width, height = _text_size(font, text)
    label = Image.new("RGB", (width + 4, height + 6), "white")
    ImageDraw.Draw(label).text((2, 3 - font.getbbox(text)[1]), text, fill=INK, font=font)
    label = label.rotate(90, expand=True)
    top = int(y - label.height / 2) if centred else int(y)
    image.paste(label, (int(x - label.width / 2), top))
