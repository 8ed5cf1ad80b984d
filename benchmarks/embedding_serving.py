"""The embedding benchmark's serving checks (`embeddings.py`): MiniLM zero-shot through sentence-transformers' own
evaluators beside roberta-embed-eval's figures, and a folder's CPU latency (PyTorch against onnxruntime fp32 and
int8) and encoding throughput (the evaluator's encoder against `SentenceTransformer.encode`)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from embedding_data import MAX_SEQ_LEN


def st_parity(model: Path, chosen, ours: dict[str, float]) -> list[dict]:
    """MiniLM zero-shot through sentence-transformers' own evaluators on the same files (`chosen`: the probes of
    `squad`, `stsb` and `mrpc`), beside our figures."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import (
        BinaryClassificationEvaluator,
        EmbeddingSimilarityEvaluator,
        InformationRetrievalEvaluator,
    )

    st = SentenceTransformer(str(model), device="cpu", local_files_only=True)
    st.max_seq_length = MAX_SEQ_LEN
    search = chosen.retrieval["squad"]
    queries = {f"q{i}": q for i, q in enumerate(dict.fromkeys(t[0] for t in search.texts))}
    ids = {q: k for k, q in queries.items()}
    corpus = {f"d{i}": d for i, d in enumerate(dict.fromkeys(d for t in search.texts for d in t[1:]))}
    docs = {t: k for k, t in corpus.items()}
    relevant: dict[str, set] = {}
    for t in search.texts:
        relevant.setdefault(ids[t[0]], set()).add(docs[t[1]])
    ir = InformationRetrievalEvaluator(queries, corpus, relevant, mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1],
                                       precision_recall_at_k=[10, 100], map_at_k=[10])(st)
    sts = chosen.sts["stsb"]
    sim = EmbeddingSimilarityEvaluator([t[0] for t in sts.texts], [t[1] for t in sts.texts], sts.labels)(st)
    pc = chosen.pair_classification["mrpc"]
    ap = BinaryClassificationEvaluator([t[0] for t in pc.texts], [t[1] for t in pc.texts], pc.labels)(st)
    pairs = [("SQuAD nDCG@10", ours["retrieval/squad/ndcg_at_10"], ir["cosine_ndcg@10"]),
             ("SQuAD MRR@10", ours["retrieval/squad/mrr_at_10"], ir["cosine_mrr@10"]),
             ("SQuAD Recall@100", ours["retrieval/squad/recall_at_100"], ir["cosine_recall@100"]),
             ("STS-B Spearman", ours["sts/stsb/spearman"], sim["spearman_cosine"]),
             ("MRPC AP", ours["pair_classification/mrpc/ap"], ap["cosine_ap"])]
    return [{"figure": name, "roberta-embed-eval": f"{x:.6f}", "sentence-transformers' evaluator": f"{y:.6f}",
             "difference": f"{abs(x - y):.1e}"} for name, x, y in pairs]


def latency(folder: Path, threads: int, repeats: int) -> list[dict]:
    """Milliseconds per batch of 128-token texts: PyTorch eager, onnxruntime fp32 and int8, batch 1 and 32."""
    import torch

    from pipeline.hub.onnx_export import onnx_layout, session
    from pipeline.models.embedding_encoder import load_transformer, pool

    torch.set_num_threads(threads)
    layout = onnx_layout(folder)
    backends = {"PyTorch eager": load_transformer(layout.transformer).eval(),
                "onnxruntime fp32": session(layout.path, threads), "onnxruntime int8": session(layout.int8_path,
                                                                                               threads)}

    def embed(backend, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if isinstance(backend, torch.nn.Module):
            return pool(backend(input_ids=ids, attention_mask=mask).last_hidden_state, mask, "mean")
        hidden = backend.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
        return pool(torch.from_numpy(hidden), mask, "mean")

    rows = []
    for batch in (1, 32):
        ids, mask = torch.full((batch, 128), 1000, dtype=torch.long), torch.ones((batch, 128), dtype=torch.long)
        for name, backend in backends.items():
            times = []
            with torch.no_grad():
                embed(backend, ids, mask)  # warm-up
                for _ in range(repeats if batch == 1 else max(3, repeats // 4)):
                    start = time.perf_counter()
                    embed(backend, ids, mask)
                    times.append(time.perf_counter() - start)
            median = statistics.median(times)
            rows.append({"batch": batch, "backend": name, "ms per batch (median)": f"{1000 * median:.1f}",
                         "texts/s": f"{batch / median:.1f}"})
    return rows


def throughput(folder: Path, texts: list[str], threads: int) -> list[dict]:
    """Sentences per second on the same folder: the stage's encoder against `SentenceTransformer.encode`."""
    import torch
    from sentence_transformers import SentenceTransformer

    from pipeline.models.embedding_encoder import load_encoder

    torch.set_num_threads(threads)
    ours, _ = load_encoder(str(folder), max_seq_len=MAX_SEQ_LEN)
    st = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    st.max_seq_length = MAX_SEQ_LEN
    rows = []
    for name, encode in (("roberta-embed-eval's encoder", ours.encode),
                         ("SentenceTransformer.encode", lambda x: st.encode(x, batch_size=32,
                                                                             show_progress_bar=False))):
        encode(texts[:64])
        start = time.perf_counter()
        encode(texts)
        rows.append({"encoder": name, "sentences": len(texts), "sentences/s":
                     f"{len(texts) / (time.perf_counter() - start):.1f}"})
    return rows
