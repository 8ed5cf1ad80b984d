"""Centring or whitening fitted on a corpus, stored in a Sentence-Transformers folder as a module of its own.

The module is sentence-transformers' own `Dense` without activation, appended after the folder's last module:
`(x − mean) M`, stored as `weight = Mᵀ` and `bias = −mean M`, with M the identity (centring) or the symmetric
(ZCA) whitening matrix `U diag(1/√(λ + ε)) Uᵀ` of the corpus embeddings' covariance `U diag(λ) Uᵀ` (ε: 1e-6 of
the largest λ). Being a stock module, `SentenceTransformer(folder)` applies it without `trust_remote_code`, and so
do this project's encoders (`models/embedding_encoder.py`, the ONNX backend: the graph is the transformer's, the
module runs on the pooled vectors, as sentence-transformers' own ONNX backend runs it). Normalising afterwards is
the user's choice (cosine search normalises anyway). `centring.json` beside the module records the fit.

    roberta-embed-eval --model ST_FOLDER --fit-centring CORPUS.jsonl [--whiten] --write OUT_FOLDER

The input folder is copied, never changed; the new folder appears whole (a staged folder renamed into place) once
`SentenceTransformer(OUT_FOLDER)` gives the fitted map of the input's embeddings within `TOLERANCE`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from pipeline.common.atomic_files import sha256_file, staged_folder
from pipeline.common.errors import PipelineError

CENTRING_FILE = "centring.json"
DENSE_TYPE = "sentence_transformers.base.modules.dense.Dense"
TOLERANCE = 1e-4
"""The largest difference allowed between the saved folder's embeddings and the fitted map's, relative to their
largest magnitude."""
CHECK_TEXTS = 32


def fit_centring(embeddings: np.ndarray, whiten: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(mean, M) of `embeddings` (n × width): M the identity, or with `whiten` the ZCA whitening matrix."""
    x = np.asarray(embeddings, dtype=np.float64)
    mean = x.mean(0)
    if not whiten:
        return mean, np.eye(x.shape[1])
    eigenvalues, vectors = np.linalg.eigh(np.cov(x - mean, rowvar=False, bias=True))
    eigenvalues = np.clip(eigenvalues, 0, None) + 1e-6 * max(eigenvalues.max(), 1e-12)
    return mean, (vectors / np.sqrt(eigenvalues)) @ vectors.T


def centring_module(mean: np.ndarray, matrix: np.ndarray):
    """`(x − mean) M` as sentence-transformers' `Dense` (no activation), in float32."""
    import torch
    from sentence_transformers.base.modules import Dense

    width = len(mean)
    return Dense(width, width, bias=True, activation_function=torch.nn.Identity(),
                 init_weight=torch.tensor(matrix.T, dtype=torch.float32),
                 init_bias=torch.tensor(-mean @ matrix, dtype=torch.float32))


def _check_folders(folder: Path, out: Path) -> list[dict]:
    from pipeline.models.embedding_encoder import sentence_folder

    if out.exists():
        raise PipelineError(f"--write {out}: already exists; centring writes a new folder and never replaces one")
    if out.resolve().is_relative_to(folder.resolve()):
        raise PipelineError(f"--write {out}: inside the input folder {folder}; give a folder beside it")
    if not folder.is_dir() or sentence_folder(folder) is None:
        raise PipelineError(f"--fit-centring: {folder} is not a Sentence-Transformers folder (no modules.json); "
                            "fine-tune an embedding task or pass a Sentence-Transformers folder")
    modules = json.loads((folder / "modules.json").read_text())
    for module in modules:
        if (folder / module["path"] / CENTRING_FILE).is_file():
            raise PipelineError(f"--fit-centring: {folder} is centred already ({module['path']}/{CENTRING_FILE}); "
                                "fit on the folder it was made from")
    return modules


def write_centred_folder(folder: str | Path, corpus: str | Path, out: str | Path, *, whiten: bool = False,
                         batch_size: int = 32) -> dict:
    """`folder` copied to `out` with a centring (or whitening) module fitted on `corpus`'s `{"text"}` lines;
    returns the fit's record (`centring.json`)."""
    from sentence_transformers import SentenceTransformer

    from pipeline.data.tasks.embedding_records import read_texts

    folder, out = Path(folder), Path(out)
    modules = _check_folders(folder, out)
    texts = [t[0] for t in read_texts(corpus).texts]
    model = SentenceTransformer(str(folder), local_files_only=True, device="cpu")
    width = model.get_embedding_dimension()
    if len(texts) < 2 or (whiten and len(texts) <= (width or 0)):
        need = f"whitening needs more than the width, {width}," if whiten else "centring needs at least 2"
        raise PipelineError(f"--fit-centring {corpus}: {len(texts)} distinct texts; {need} texts")
    embeddings = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
    mean, matrix = fit_centring(embeddings, whiten)
    name = f"{len(modules)}_{'Whitening' if whiten else 'Centring'}"
    record = {"method": "whitening (ZCA)" if whiten else "centring", "module": name, "width": int(len(mean)),
              "corpus": str(corpus), "corpus_sha256": sha256_file(Path(corpus)), "texts": len(texts),
              "source_folder": str(folder)}
    check = texts[:CHECK_TEXTS]
    expected = (embeddings[:CHECK_TEXTS].astype(np.float64) - mean) @ matrix
    with staged_folder(out, replace=False) as tmp:
        shutil.copytree(folder, tmp, dirs_exist_ok=True)
        (tmp / name).mkdir()
        centring_module(mean, matrix).save(str(tmp / name))
        (tmp / name / CENTRING_FILE).write_text(json.dumps(record, indent=2) + "\n")
        modules.append({"idx": len(modules), "name": str(len(modules)), "path": name, "type": DENSE_TYPE})
        (tmp / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
        got = SentenceTransformer(str(tmp), local_files_only=True, device="cpu").encode(
            check, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)
        difference = float(np.abs(got - expected).max())
        if difference > TOLERANCE * max(1.0, float(np.abs(expected).max())):
            raise PipelineError(f"--write {out} refused: loaded back, the folder's embeddings differ from the fitted "
                                f"map's by {difference:.3g}")
    return record
