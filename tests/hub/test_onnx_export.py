"""ONNX for serving, with a proof: onnxruntime matches PyTorch within fp32's tolerance on inputs with padding and the
maximum length (RoBERTa, BERT, ModernBERT), a Sentence-Transformers folder's file embeds as
`SentenceTransformer(folder).encode` does, and a file changed after its export is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_documents
from model_folders import save_export

from pipeline.commands.export import main as export_main
from pipeline.common.errors import PipelineError
from pipeline.hub.onnx_export import OnnxEncoder, export_onnx, onnx_layout, parity_batch, verify_onnx


@pytest.fixture(scope="module")
def sentence_folder(tmp_path_factory, bpe_tokenizer_dir):
    """A ModernBERT Sentence-Transformers folder (CLS pooling), exported to ONNX with its int8 twin."""
    from pipeline.finetune.families.embedding.sentence_folder import build_sentence_model

    root = tmp_path_factory.mktemp("onnx")
    export = save_export(bpe_tokenizer_dir, root / "modernbert", "modernbert")
    build_sentence_model(str(export), pooling="cls", max_seq_len=64).save(str(root / "st"))
    export_main(["--onnx", str(root / "st"), "--int8"])
    return root / "st"


def test_an_st_folders_onnx_file_embeds_as_sentence_transformers_encode_does(sentence_folder, capsys):
    from sentence_transformers import SentenceTransformer

    record = json.loads((sentence_folder / "onnx" / "onnx_export.json").read_text())
    assert record["file"] == "onnx/model.onnx" and record["output"] == "last_hidden_state"
    assert record["pooling"] == "cls" and record["parity"]["within_tolerance"]
    assert (sentence_folder / "onnx" / "model_qint8.onnx").is_file() and "int8" in record
    texts = make_documents(12, seed=2, min_words=2, max_words=90)  # beyond 64 tokens too: truncated by both
    theirs = SentenceTransformer(str(sentence_folder), local_files_only=True, device="cpu").encode(texts)
    ours = OnnxEncoder(sentence_folder).encode(texts)
    assert np.abs(ours - theirs).max() <= 1e-4
    int8 = OnnxEncoder(sentence_folder, int8=True).encode(texts)
    assert int8.shape == ours.shape and not np.array_equal(int8, ours)  # lossy by design; its metric is measured


def test_a_weight_changed_in_the_onnx_file_after_the_export_is_refused(sentence_folder, tmp_path):
    import shutil

    import onnx
    from onnx import numpy_helper

    folder = tmp_path / "tampered"
    shutil.copytree(sentence_folder, folder)
    path = folder / "onnx" / "model.onnx"
    graph = onnx.load(str(path))
    weight = max(graph.graph.initializer, key=lambda t: np.prod(t.dims))  # the largest weight: the embeddings
    values = numpy_helper.to_array(weight).copy()
    values += np.random.default_rng(0).normal(0, 0.05, values.shape).astype(values.dtype)
    weight.CopyFrom(numpy_helper.from_array(values, weight.name))
    onnx.save(graph, str(path))
    with pytest.raises(PipelineError, match="refused: onnxruntime does not compute what the PyTorch model"):
        verify_onnx(folder)
    with pytest.raises(PipelineError, match="refused"):
        OnnxEncoder(folder)  # the evaluator's ONNX backend checks before it serves


@pytest.mark.parametrize("architecture, tokenizer", [("roberta", "bpe_tokenizer_dir"),
                                                     ("bert", "wordpiece_tokenizer_dir")])
def test_masked_lm_exports_match_pytorch_with_padding_and_the_maximum_length(request, tmp_path, architecture,
                                                                            tokenizer):
    from transformers import AutoTokenizer

    export = save_export(request.getfixturevalue(tokenizer), tmp_path / architecture, architecture)
    record = export_onnx(export)
    assert record["file"] == "model.onnx" and record["output"] == "logits"
    assert record["parity"]["within_tolerance"] and record["parity"]["max_logit_difference"] <= 1e-4
    batch = parity_batch(onnx_layout(export), AutoTokenizer.from_pretrained(export))
    mask = batch["attention_mask"]
    assert mask.shape[1] == 64 and bool(mask[-1].all()) and not bool(mask[0].all())  # full length, and padding
    assert record["parity"]["compared"] == int(mask.sum())
