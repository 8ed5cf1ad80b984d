"""ONNX for serving, with a proof: a model folder → the ecosystem's ONNX layout, checked against PyTorch, run with
onnxruntime.

    Sentence-Transformers folder   onnx/model.onnx   inputs input_ids, attention_mask → last_hidden_state
                                                     (pooled as 1_Pooling/config.json says; the file
                                                     sentence-transformers' ONNX backend reads; the folder's
                                                     modules after the pooling, such as a centring Dense, run
                                                     on the pooled vectors, as that backend runs them)
    masked-LM or classifier folder model.onnx        inputs input_ids, attention_mask → logits

The graph comes from torch's own exporter (`torch.onnx.export`, dynamo). optimum is not used: optimum-onnx 0.1
requires transformers < 4.58, and this project runs transformers 5.

The proof is the HF export's (`common/output_agreement.py`): fixed inputs go through the PyTorch model and through
onnxruntime, and the largest difference must be within fp32's tolerance (1e-4 of the outputs' scale), or nothing
is written. The inputs hold texts of different lengths (so padding) and one at the maximum length; only real
tokens are compared (what padded positions hold is never read: pooling and heads mask them). `verify_onnx`
repeats the check on a file already written, so a file changed after its export is refused before it serves.

`int8=True` adds onnxruntime's dynamic quantization (int8 weights, activations quantized at run time) beside
the fp32 file; its distance from fp32 is recorded, not refused (it is lossy by design): the task metric before
and after is the evaluator's (`roberta-embed-eval --backend onnx-int8`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from pipeline.common.atomic_files import write_json_atomic
from pipeline.common.errors import PipelineError
from pipeline.models.output_agreement import Agreement, compare_logits

OPSET = 18
PARITY_LENGTH_CAP = 1024
"""The longest input of the parity check (a model's full 8,192 positions would take minutes on a CPU)."""
PARITY_TEXTS = ("A short text.", "A somewhat longer sentence, so that the batch pads the first one to its length.")

Kind = Literal["sentence", "masked-lm", "classifier"]


@dataclass(frozen=True)
class OnnxLayout:
    """What a model folder becomes in ONNX: its kind, the HF folder with the weights, the file, the output."""

    kind: Kind
    folder: Path
    transformer: Path
    pooling: str | None = None
    max_seq_len: int | None = None
    after_pooling: tuple[tuple[str, Path], ...] = ()
    """A Sentence-Transformers folder's modules after its pooling (Normalize, a Dense without activation)."""

    @property
    def output(self) -> str:
        return "last_hidden_state" if self.kind == "sentence" else "logits"

    @property
    def path(self) -> Path:
        return self.folder / "onnx" / "model.onnx" if self.kind == "sentence" else self.folder / "model.onnx"

    @property
    def int8_path(self) -> Path:
        return self.path.with_name("model_qint8.onnx")

    @property
    def record_path(self) -> Path:
        return self.path.with_name("onnx_export.json")


def onnx_layout(folder: str | Path) -> OnnxLayout:
    """The layout of `folder`; a folder that is not a model (or holds a head this module does not export) is a
    `PipelineError` naming it."""
    from pipeline.models.embedding_encoder import sentence_folder

    folder = Path(folder)
    if not folder.is_dir():
        raise PipelineError(f"--onnx {folder}: not a folder")
    found = sentence_folder(folder)
    if found is not None:
        return OnnxLayout("sentence", folder, found.transformer, found.pooling, found.max_seq_len,
                          found.after_pooling)
    config = folder / "config.json"
    if not config.is_file():
        raise PipelineError(f"--onnx {folder}: not a model folder (no config.json, no modules.json)")
    try:
        architecture = (json.loads(config.read_text()).get("architectures") or [""])[0]
    except (OSError, ValueError) as err:
        raise PipelineError(f"{config}: not readable as a model config ({err})") from None
    if architecture.endswith(("ForMaskedLM", "ForPreTraining")):
        return OnnxLayout("masked-lm", folder, folder)
    if architecture.endswith("ForSequenceClassification"):
        return OnnxLayout("classifier", folder, folder)
    raise PipelineError(f"--onnx {folder}: a {architecture or 'model without architectures'}; ONNX export takes a "
                        "Sentence-Transformers folder, a masked-LM export or a sequence classifier")


class _Outputs(torch.nn.Module):
    """The model as the ONNX graph sees it: (input_ids, attention_mask) → one tensor."""

    def __init__(self, model: torch.nn.Module, output: str):
        super().__init__()
        self.model, self.output = model, output

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(input_ids=input_ids, attention_mask=attention_mask), self.output)


def torch_model(layout: OnnxLayout) -> torch.nn.Module:
    """The fp32 PyTorch model the ONNX file must match, in eval mode."""
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

    from pipeline.models.embedding_encoder import load_transformer

    if layout.kind == "sentence":
        model = load_transformer(layout.transformer)
    else:
        auto = AutoModelForMaskedLM if layout.kind == "masked-lm" else AutoModelForSequenceClassification
        model = auto.from_pretrained(layout.transformer)
    return _Outputs(model.float().eval(), layout.output).eval()


def parity_batch(layout: OnnxLayout, tokenizer) -> dict[str, torch.Tensor]:
    """Texts of different lengths (padding) and one at the longest input the model takes (capped)."""
    from transformers import AutoConfig

    from pipeline.models.model_source import position_limit

    longest = min(position_limit(AutoConfig.from_pretrained(layout.transformer)), PARITY_LENGTH_CAP,
                  layout.max_seq_len or PARITY_LENGTH_CAP)
    long_text = " ".join(["the parity check fills every position of the model up to its maximum length"] * longest)
    batch = tokenizer([*PARITY_TEXTS, long_text], padding=True, truncation=True, max_length=longest,
                      return_tensors="pt")
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def compare(layout: OnnxLayout, model: torch.nn.Module, session, batch: dict[str, torch.Tensor]) -> Agreement:
    """PyTorch against onnxruntime on `batch`, over the real tokens (a classifier: every example)."""
    with torch.no_grad():
        reference = model(batch["input_ids"], batch["attention_mask"])
    got = torch.from_numpy(session.run(None, {k: v.numpy() for k, v in batch.items()})[0])
    if got.shape != reference.shape:
        raise PipelineError(f"{layout.path}: onnxruntime's {layout.output} has shape {tuple(got.shape)}, PyTorch's "
                            f"{tuple(reference.shape)}")
    if layout.kind != "classifier":
        real = batch["attention_mask"].bool()
        reference, got = reference[real], got[real]
    return compare_logits(reference, got, "fp32", f"PyTorch {layout.kind} model, fp32, "
                          f"{batch['input_ids'].shape[0]} texts padded to {batch['input_ids'].shape[1]} tokens")


def refuse_unless_close(agreement: Agreement, path: Path) -> None:
    if not agreement.within_tolerance:
        a = agreement
        raise PipelineError(f"{path} refused: onnxruntime does not compute what the PyTorch model computes. Over "
                            f"{a.compared} real-token positions the largest difference is {a.max_logit_difference:.3g}"
                            f", over fp32's tolerance {a.tolerance:.3g} (a weight changed after the export, an "
                            "operator exported wrongly, or another model's file)")


def session(path: Path, threads: int | None = None):
    """An onnxruntime CPU session of `path` (`threads`: its intra-op threads; None: onnxruntime's default)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _export_graph(model: torch.nn.Module, batch: dict[str, torch.Tensor], path: Path, output: str) -> None:
    """torch's dynamo exporter, batch and sequence dynamic, weights inside the file."""
    for name in ("torch.onnx", "torch.export", "onnxscript"):
        logging.getLogger(name).setLevel(logging.ERROR)
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence", min=2)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (batch["input_ids"], batch["attention_mask"]), str(path),
                          input_names=["input_ids", "attention_mask"], output_names=[output],
                          dynamic_shapes=(dims, dims), opset_version=OPSET, dynamo=True, external_data=False,
                          verbose=False, report=False)


def export_onnx(folder: str | Path, *, int8: bool = False) -> dict:
    """Write `folder`'s ONNX file (and with `int8` its quantized twin) once it matches PyTorch; return the record
    (`onnx_export.json` beside the file)."""
    import onnx
    import onnxruntime
    from transformers import AutoTokenizer

    layout = onnx_layout(folder)
    model = torch_model(layout)
    batch = parity_batch(layout, AutoTokenizer.from_pretrained(layout.transformer))
    layout.path.parent.mkdir(parents=True, exist_ok=True)
    tmp = layout.path.with_name(f".{layout.path.name}.{os.getpid()}.tmp")
    tmp_int8 = tmp.with_suffix(".int8.tmp")
    try:
        _export_graph(model, batch, tmp, layout.output)
        agreement = compare(layout, model, session(tmp), batch)
        refuse_unless_close(agreement, layout.path)
        record = {"kind": layout.kind, "file": layout.path.relative_to(layout.folder).as_posix(),
                  "inputs": ["input_ids", "attention_mask"], "output": layout.output, "pooling": layout.pooling,
                  "after_pooling": [f"{kind} ({path.name})" for kind, path in layout.after_pooling],
                  "opset": OPSET, "exporter": f"torch.onnx (dynamo), torch {torch.__version__}",
                  "versions": {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__},
                  "parity": agreement.record()}
        if int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            root = logging.getLogger()
            level, _ = root.level, root.setLevel(logging.ERROR)  # its advice to pre-process, printed on every call
            try:
                quantize_dynamic(str(tmp), str(tmp_int8), weight_type=QuantType.QInt8)
            finally:
                root.setLevel(level)
            quantized = compare(layout, model, session(tmp_int8), batch)
            record["int8"] = {"file": layout.int8_path.relative_to(layout.folder).as_posix(),
                              "method": "onnxruntime quantize_dynamic, QInt8 weights",
                              "max_difference_from_pytorch": quantized.max_logit_difference,
                              "top1_agreement": quantized.top1_agreement}
            os.replace(tmp_int8, layout.int8_path)
        os.replace(tmp, layout.path)
        write_json_atomic(layout.record_path, record)
        return record
    finally:
        for leftover in (tmp, tmp_int8):
            leftover.unlink(missing_ok=True)
        shutil.rmtree(layout.path.parent / "onnx_export_artifacts", ignore_errors=True)


def verify_onnx(folder: str | Path, *, file: Path | None = None) -> Agreement:
    """The parity check again on the ONNX file already in `folder` (or `file`); a mismatch is refused."""
    from transformers import AutoTokenizer

    layout = onnx_layout(folder)
    path = file or layout.path
    if not path.is_file():
        raise PipelineError(f"{layout.folder}: no {path.relative_to(layout.folder)}; run `roberta-export --onnx "
                            f"{layout.folder}` first")
    model = torch_model(layout)
    agreement = compare(layout, model, session(path), parity_batch(layout, AutoTokenizer.from_pretrained(
        layout.transformer)))
    refuse_unless_close(agreement, path)
    return agreement


@dataclass
class OnnxEncoder:
    """A Sentence-Transformers folder's ONNX file run by onnxruntime and pooled as the folder says: the evaluator's
    `--backend onnx` (and `onnx-int8`); verified against PyTorch when opened unless it is the int8 file."""

    folder: Path
    int8: bool = False
    batch_size: int = 32

    def __post_init__(self):
        from transformers import AutoTokenizer

        from pipeline.models.embedding_encoder import sentence_folder, vector_map

        self.layout = onnx_layout(self.folder)
        if self.layout.kind != "sentence":
            raise PipelineError(f"{self.folder}: the ONNX backend encodes with a Sentence-Transformers folder's "
                                f"onnx/model.onnx; this is a {self.layout.kind} folder")
        path = self.layout.int8_path if self.int8 else self.layout.path
        if not self.int8:
            verify_onnx(self.folder)
        elif not path.is_file():
            raise PipelineError(f"{self.folder}: no {path.name}; run `roberta-export --onnx {self.folder} --int8`")
        self.session = session(path)
        self.after_pooling = vector_map(sentence_folder(self.folder))
        self.tokenizer = AutoTokenizer.from_pretrained(self.layout.transformer)
        told = self.tokenizer.model_max_length
        self.max_seq_len = self.layout.max_seq_len or (told if 0 < told < 1 << 20 else 512)

    def encode(self, texts) -> np.ndarray:
        from pipeline.models.embedding_encoder import pool

        order = np.argsort([len(t) for t in texts], kind="stable")
        out = None
        for start in range(0, len(texts), self.batch_size):
            rows = order[start:start + self.batch_size]
            batch = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                                   max_length=self.max_seq_len, return_tensors="np")
            hidden = self.session.run(None, {"input_ids": batch["input_ids"].astype(np.int64),
                                             "attention_mask": batch["attention_mask"].astype(np.int64)})[0]
            vectors = pool(torch.from_numpy(hidden), torch.from_numpy(batch["attention_mask"]),
                           self.layout.pooling).numpy()
            if out is None:
                out = np.zeros((len(texts), vectors.shape[1]), dtype=np.float32)
            out[rows] = vectors
        return self.after_pooling(out) if self.after_pooling is not None and out is not None else out
