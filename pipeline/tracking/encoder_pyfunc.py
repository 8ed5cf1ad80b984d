"""The pyfunc model that MLflow stores: the hub interface (`pipeline.hub.Encoder`) behind `predict`.

Kept apart from `model_store.py` so that only logging and loading a model import `mlflow.pyfunc`;
MLflow pickles a reference to this class, so its module path is part of every logged model.
"""

from __future__ import annotations

import warnings

from mlflow.pyfunc import PythonModel

with warnings.catch_warnings():
    # MLflow asks for type hints on `predict` to validate inputs; the rows here are free-form
    # (a DataFrame from `mlflow models serve`, or lists of strings and pairs), checked below.
    warnings.simplefilter("ignore")

    class EncoderModel(PythonModel):
        """The pyfunc wrapper: `predict` classifies with the model's task head, or fills masks for an export."""

        def load_context(self, context) -> None:
            from pipeline.hub import Encoder

            self.encoder = Encoder.from_pretrained(context.artifacts["model"])
            self.head = next(iter(self.encoder.classification_heads), None)

        def predict(self, context, model_input, params=None) -> list:
            examples = _examples(model_input)
            if self.head is not None:
                return self.encoder.classify(self.head, examples)
            return [self.encoder.fill_mask(text[0], topk=1)[0][0] for text in examples]


def _examples(model_input) -> list[tuple[str, ...]]:
    """Rows of one or two texts from a DataFrame (`text`, optional `text_b`), a list of strings or of pairs."""
    if hasattr(model_input, "columns"):  # a pandas DataFrame, as `mlflow models serve` passes it
        columns = [c for c in ("text", "text_b") if c in model_input.columns] or list(model_input.columns[:2])
        rows = model_input[columns].itertuples(index=False, name=None)
        return [tuple(t for t in row if isinstance(t, str)) for row in rows]
    if isinstance(model_input, str):
        return [(model_input,)]
    return [(x,) if isinstance(x, str) else tuple(x) for x in model_input]
