"""A centring (or whitening) module fitted on a corpus rides in a new Sentence-Transformers folder: the input is
never changed, `SentenceTransformer(folder)`, the evaluator's encoder and the ONNX backend all apply it (ONNX within
1e-4), bad input is refused before any fit; and `roberta-embed-eval --hybrid` runs end to end on the folder."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import make_documents, write_records
from model_folders import save_export

from pipeline.commands.embed_eval import build_parser
from pipeline.commands.embed_eval import main as embed_eval
from pipeline.commands.export import main as export_main
from pipeline.common.errors import PipelineError
from pipeline.hub.onnx_export import OnnxEncoder


@pytest.fixture(scope="module")
def folders(tmp_path_factory, wordpiece_tokenizer_dir):
    """A tiny BERT Sentence-Transformers folder, a corpus of 100 texts, and the folder centred on it."""
    from pipeline.finetune.families.embedding.sentence_folder import build_sentence_model

    root = tmp_path_factory.mktemp("centring")
    export = save_export(wordpiece_tokenizer_dir, root / "bert", "bert")
    build_sentence_model(str(export), pooling="mean", max_seq_len=48).save(str(root / "st"))
    corpus = write_records(root / "corpus.jsonl", [{"text": d} for d in make_documents(100, seed=5, max_words=30)])
    embed_eval(["--model", str(root / "st"), "--fit-centring", str(corpus), "--write", str(root / "centred")])
    return root / "st", corpus, root / "centred"


def encodings(folder, texts):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), local_files_only=True, device="cpu").encode(texts)


def test_the_centred_folder_gives_the_input_folders_embeddings_minus_the_corpus_mean(folders):
    st, corpus, centred = folders
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    raw, ours = encodings(st, texts), encodings(centred, texts)
    assert np.abs(ours - (raw - raw.mean(0))).max() < 1e-4
    assert np.abs(ours.mean(0)).max() < 1e-4
    modules = json.loads((centred / "modules.json").read_text())
    assert modules[-1]["type"] == "sentence_transformers.base.modules.dense.Dense"
    assert json.loads((centred / modules[-1]["path"] / "centring.json").read_text())["texts"] == 100
    assert len(json.loads((st / "modules.json").read_text())) == len(modules) - 1  # the input is left as it was


def test_the_evaluators_encoder_and_the_onnx_export_apply_the_module(folders):
    from pipeline.models.embedding_encoder import load_encoder

    _, _, centred = folders
    texts = make_documents(10, seed=8, min_words=2, max_words=60)
    theirs = encodings(centred, texts)
    encoder, _ = load_encoder(str(centred))
    assert np.abs(encoder.encode(texts) - theirs).max() <= 1e-4
    export_main(["--onnx", str(centred)])
    record = json.loads((centred / "onnx" / "onnx_export.json").read_text())
    assert record["after_pooling"] == ["Dense (2_Centring)"] and record["parity"]["within_tolerance"]
    assert np.abs(OnnxEncoder(centred).encode(texts) - theirs).max() <= 1e-4


def test_whitening_gives_the_corpus_unit_variance_in_every_direction_it_varies_in(folders, tmp_path):
    st, corpus, _ = folders
    embed_eval(["--model", str(st), "--fit-centring", str(corpus), "--whiten", "--write", str(tmp_path / "white")])
    texts = [json.loads(line)["text"] for line in corpus.read_text().splitlines()]
    white = encodings(tmp_path / "white", texts).astype(np.float64)
    variances = np.linalg.eigvalsh(np.cov(white, rowvar=False, bias=True))
    # The untrained model's vectors are means of LayerNorm outputs, whose coordinates sum to 0: that one direction
    # has no variance to scale, and stays at 0.
    assert np.sum(np.abs(variances - 1) < 1e-2) == white.shape[1] - 1 and variances.min() < 1e-3


def test_bad_input_is_refused_before_any_fit(folders, tmp_path, bpe_tokenizer_dir):
    st, corpus, centred = folders
    cases = [
        (["--model", str(st), "--fit-centring", str(corpus)], "give --write"),
        (["--model", str(st), "--fit-centring", str(corpus), "--write", str(centred)], "already exists"),
        (["--model", str(st), "--fit-centring", str(corpus), "--write", str(st / "inner")], "inside the input"),
        (["--model", str(centred), "--fit-centring", str(corpus), "--write", str(tmp_path / "x")], "centred already"),
        (["--model", str(save_export(bpe_tokenizer_dir, tmp_path / "export")), "--fit-centring", str(corpus),
          "--write", str(tmp_path / "y")], "not a Sentence-Transformers folder"),
        (["--model", str(st), "--fit-centring", str(tmp_path / "none.jsonl"), "--write", str(tmp_path / "z")],
         "no such file"),
        (["--model", str(st), "--whiten"], "go with --fit-centring"),
    ]
    few = write_records(tmp_path / "few.jsonl", [{"text": d} for d in make_documents(10, seed=1)])
    cases.append((["--model", str(st), "--fit-centring", str(few), "--whiten", "--write", str(tmp_path / "w")],
                  "whitening needs more than the width, 64"))
    for argv, message in cases:
        with pytest.raises(PipelineError, match=message):
            embed_eval.__wrapped__(argv)
    assert not any(p.name in {"x", "y", "z", "w"} for p in tmp_path.iterdir())


def test_the_hybrid_flags_parse():
    args = build_parser().parse_args(["--model", "m", "--retrieval", "a.jsonl", "--hybrid", "--hybrid-select",
                                      "b.jsonl"])
    assert args.hybrid and str(args.hybrid_select) == "b.jsonl"
    assert not build_parser().parse_args(["--model", "m", "--retrieval", "a.jsonl"]).hybrid


def test_hybrid_search_end_to_end_beside_the_model_bm25_and_the_geometry(folders, tmp_path, capsys):
    _, _, centred = folders
    docs = make_documents(24, seed=12, min_words=8, max_words=20)
    pairs = write_records(tmp_path / "search.jsonl", [{"query": " ".join(d.split()[:3]),
                                                       "positive": " ".join(d.split()[3:])} for d in docs])
    out = tmp_path / "result.json"
    embed_eval(["--model", str(centred), "--retrieval", str(pairs), "--hybrid", "--json", str(out)])
    screen = capsys.readouterr()
    header = screen.out.splitlines()[0].split()
    assert header[-4:] == ["model", "BM25", "hybrid", "RRF"]
    assert any(line.split()[2] == "hubness" for line in screen.out.splitlines()[1:])
    assert "each chosen on the other half of the file's 24 queries" in screen.err
    results = {r["task_name"]: r["scores"]["test"][0] for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"search", "search (BM25)", "search (hybrid)", "search (hybrid RRF)"}
    assert 0 <= results["search (hybrid)"]["weight"] <= 1
    assert results["search (hybrid)"]["main_score"] == results["search (hybrid)"]["ndcg_at_10"]
    assert abs(results["search"]["geometry_mean_cosine"]) < 0.2  # centred on other texts: near 0, not near 1
