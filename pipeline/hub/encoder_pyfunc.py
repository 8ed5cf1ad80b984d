"""The pyfunc model that MLflow stores: the hub interface (`pipeline.hub.Encoder`) behind `predict`.

Logged with MLflow's models-from-code (`tracking/model_store.py` hands MLflow this file's path):
MLflow copies the file into the model and runs it wherever the model is loaded; its last line hands
MLflow the model. Nothing is pickled, so loading a logged model unpickles nothing and runs only
this reviewed file and the `pipeline` package logged beside it. Running the file imports no more
than `mlflow.pyfunc`; the Encoder (torch, transformers) loads in `load_context`.
"""

from __future__ import annotations

import warnings

from mlflow.models import set_model
from mlflow.pyfunc import PythonModel

with warnings.catch_warnings(record=True):
    # MLflow asks for type hints on `predict` to validate inputs; the rows here are free-form
    # (a DataFrame from `mlflow models serve`, or lists of strings and pairs), checked below.
    # Recorded and dropped rather than ignored: MLflow's check sets its own "once" filter, which
    # an "ignore" filter here would not outrank.

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


set_model(EncoderModel())
