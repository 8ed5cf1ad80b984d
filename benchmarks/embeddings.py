"""The encoder as an embedding model: search, similarity, pair classification and clustering on shared data, every arm
in one run, with the ONNX export's parity, its int8 metric delta and a CPU latency table.

    python benchmarks/embeddings.py --export /tmp/benchmarks/embeddings/pretrain [--seeds 1,2] [--out DIR]

Tasks (../shared/data): SQuAD v1.1 dev as question → paragraph search, split by article (even articles train, odd
ones are searched); STS-B (train → dev); MRPC dev as pair classification; BBC News as clustering. Arms: BM25 (TF-IDF
cosine where there is no search), MiniLM and the export zero-shot, and from scratch, the export and MiniLM each
fine-tuned through the protocol (`launchers/finetune.py`, the learning rate chosen on held-out training pairs,
median over seeds): on SQuAD's training articles for search, on STS-B train for the three similarity tasks.
docs/embeddings.md ("The benchmark") says how it is sized and what each figure means.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import harness
import numpy as np

ARMS = {"bm25": "BM25 / TF-IDF (no neural model)", "minilm-zero": "MiniLM zero-shot", "export-zero": "export zero-shot",
        "scratch-ft": "from scratch, fine-tuned", "export-ft": "export, fine-tuned", "minilm-ft": "MiniLM, fine-tuned"}
STUDY = harness.Study(
    "embeddings", question="Is the encoder a good embedding model once fine-tuned, and does its ONNX export serve it?",
    metric="SQuAD question→paragraph nDCG@10 on held-out articles, STS-B dev Spearman, MRPC dev average precision, "
           "BBC News V-measure; fine-tuned arms through the protocol (LR chosen on held-out training pairs, median "
           "over seeds)", baseline="BM25 for search and TF-IDF cosine elsewhere (no neural model); MiniLM zero-shot",
    arms=tuple(ARMS.values()))
TASKS = ("squad", "stsb", "mrpc", "bbc")
MAX_SEQ_LEN = 128
"""Every arm reads at most 128 tokens: the export's positions. The task files are cut to what every neural arm's
tokenizer reads within them (`same_text`), so BM25 and TF-IDF read exactly the text the models read."""
WIDEN_ROUNDS = 2
"""A learning-rate grid whose winner is at its edge is widened (one value beyond that edge) at most this often."""
WIDEN_FACTOR = 3.0
SWEEPS = {"minilm": "train.learning_rate=1e-5,3e-5", "export": "train.learning_rate=3e-4,1e-3",
          "scratch": "train.learning_rate=3e-4,1e-3"}


def read_squad() -> list[dict]:
    import zstandard

    path = harness.SHARED / "qa" / "squad_v1.1" / "dev-v1.1.json.zst"
    return json.loads(zstandard.ZstdDecompressor().stream_reader(path.open("rb")).read())["data"]


def spread(rows: list, n: int) -> list:
    return rows if len(rows) <= n else [rows[i * len(rows) // n] for i in range(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def tsv(path: Path) -> list[dict]:
    from pipeline.data.tasks.text_files import table_rows

    return [row for _, row, _ in table_rows(path)]


def same_text(tokenizers: list) -> callable:
    """A function cutting a text to its longest prefix of whole words that every tokenizer reads within
    `MAX_SEQ_LEN` tokens (special tokens included): what a neural arm reads is then all of it, for BM25 too."""

    def fits(text: str) -> bool:
        return all(len(t(text, truncation=False)["input_ids"]) <= MAX_SEQ_LEN for t in tokenizers)

    def cut(text: str) -> str:
        if fits(text):
            return text
        words = text.split()
        low, high = 0, len(words)  # words[:low] fits, words[:high] does not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if fits(" ".join(words[:middle])) else (low, middle)
        return " ".join(words[:low])

    return cut


def make_data(a: argparse.Namespace, folder: Path, cut) -> dict[str, Path]:
    """The task files, every text `cut` to what the models read: SQuAD split by article, STS-B, MRPC and BBC News as
    the evaluator's and fine-tuning's jsonl. The fine-tuning runs' dev files are held out of the training data (the
    last tenth of the training articles; a tenth of STS-B train), never the reported files."""
    articles = read_squad()
    training, searched = articles[0::2], articles[1::2]
    held = max(1, len(training) // 10)
    train = [{"query": qa["question"], "positive": cut(p["context"])}
             for art in training[:-held] for p in art["paragraphs"] for qa in p["qas"]]
    dev = [{"query": p["qas"][0]["question"], "positive": cut(p["context"])} for art in training[-held:]
           for p in art["paragraphs"]]
    # One question per paragraph of the held-out articles is searched; the corpus is every one of their paragraphs.
    test = [{"query": p["qas"][0]["question"], "positive": cut(p["context"])} for art in searched
            for p in art["paragraphs"]]
    glue = harness.SHARED / "glue"
    sts_rows = [{"sentence1": cut(r["sentence1"]), "sentence2": cut(r["sentence2"]), "score": float(r["score"])}
                for r in tsv(glue / "STS-B" / "train.tsv")]
    sts_held = spread(sts_rows, max(1, len(sts_rows) // 10))
    held_ids = {id(r) for r in sts_held}
    sts = [r for r in sts_rows if id(r) not in held_ids]
    sts_dev = [{"sentence1": cut(r["sentence1"]), "sentence2": cut(r["sentence2"]), "score": float(r["score"])}
               for r in tsv(glue / "STS-B" / "dev.tsv")]
    mrpc = [{"sentence1": cut(r["#1 String"]), "sentence2": cut(r["#2 String"]), "label": int(r["Quality"])}
            for r in tsv(glue / "MRPC" / "dev.tsv")]
    bbc = [json.loads(line) for line in (harness.SHARED / "tasks" / "bbc_news.jsonl").read_text().splitlines()]
    cap = a.eval_rows or 1 << 30
    return {"squad-train": write_jsonl(folder / "squad-train.jsonl", spread(train, a.squad_train)),
            "squad-dev": write_jsonl(folder / "squad-dev.jsonl", spread(dev, a.squad_dev)),
            "squad": write_jsonl(folder / "squad.jsonl", spread(test, cap)),
            "stsb-train": write_jsonl(folder / "stsb-train.jsonl", spread(sts, a.stsb_train)),
            "stsb-dev": write_jsonl(folder / "stsb-dev.jsonl", sts_held),
            "stsb": write_jsonl(folder / "stsb.jsonl", spread(sts_dev, cap)),
            "mrpc": write_jsonl(folder / "mrpc.jsonl", spread(mrpc, cap)),
            "bbc": write_jsonl(folder / "bbc.jsonl", [{"text": cut(r["text"]), "label": r["category"]}
                                                      for r in spread(bbc, a.bbc)])}


def probes(files: dict[str, Path], tasks: tuple[str, ...]):
    from pipeline.hub.embedding_evaluation import read_probes

    return read_probes([files["squad"]] if "squad" in tasks else [], [files["stsb"]] if "stsb" in tasks else [],
                       [files["mrpc"]] if "mrpc" in tasks else [], [files["bbc"]] if "bbc" in tasks else [])


MAIN = {"squad": "retrieval/squad/ndcg_at_10", "stsb": "sts/stsb/spearman", "mrpc": "pair_classification/mrpc/ap",
        "bbc": "clustering/bbc/v_measure"}


def score_model(model: str | Path, files: dict[str, Path], tasks: tuple[str, ...]) -> tuple[dict, float]:
    """The evaluator in this process: (figures, seconds)."""
    from pipeline.hub.embedding_evaluation import score_probes, warn_long_texts
    from pipeline.models.embedding_encoder import load_encoder

    started = time.monotonic()
    encoder, _ = load_encoder(str(model), max_seq_len=MAX_SEQ_LEN)
    chosen = probes(files, tasks)
    warn_long_texts(chosen, encoder.tokenizer, MAX_SEQ_LEN)
    return score_probes(encoder.encode, chosen), time.monotonic() - started


def lexical(files: dict[str, Path]) -> dict[str, float]:
    """BM25 for search; elsewhere TF-IDF vectors (fit on the file's own texts) as the embeddings."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from pipeline.hub.embedding_evaluation import SCORERS, bm25_probes

    all_probes = probes(files, TASKS)
    figures = {k.replace("/bm25/", "/"): v for k, v in bm25_probes(all_probes).items()}
    for kind, name, split in all_probes.items():
        if kind == "retrieval":
            continue
        vectorizer = TfidfVectorizer(sublinear_tf=True).fit([t for texts in split.texts for t in texts])
        encode = lambda texts, v=vectorizer: v.transform(texts).toarray().astype(np.float32)  # noqa: E731
        figures.update({f"{kind}/{name}/{k}": v for k, v in SCORERS[kind](encode, split).items()})
    return figures


def finetune(a, out: Path, files: dict[str, Path], arm: str, task: str, model: Path, env: dict, grid: list[float],
             config: str | None = None) -> Path:
    """One arm on one training task through the protocol (the learning rate chosen from `grid` on held-out training
    pairs); its output folder."""
    rates = ",".join(f"{lr:g}" for lr in grid)
    folder = out / "finetune" / f"{task}-{arm}-lr{rates.replace(',', '_')}"
    config = config or ("embed-pairs" if task == "squad" else "embed-sts")
    cmd = harness.finetune_command(config, model, a.seeds, scratch=arm.startswith("scratch"),
                                   sweeps=[f"train.learning_rate={rates}"], sets={
        "data.train_file": files[f"{task}-train"], "data.validation_file": files[f"{task}-dev"],
        "data.max_seq_len": MAX_SEQ_LEN, "train.epochs": a.epochs, "train.batch_size": 32, "train.eval_batch_size": 64,
        "train.output_dir": folder, "tracking.uri": f"sqlite:///{out / 'mlflow.db'}",
        "tracking.experiment": "embeddings-benchmark"})
    harness.launch(cmd, env=env, log=out / "logs" / f"{folder.name}.log")
    return folder


def chosen_rate(folder: Path) -> float:
    return float(json.loads((folder / "selection.json").read_text())["chosen"]["train.learning_rate"])


def widened(grid: list[float], chosen: float) -> list[float] | None:
    """The grid one value beyond the edge its winner sits on (None: the winner is inside it)."""
    if chosen == max(grid) and len(grid) > 1:
        return [chosen, chosen * WIDEN_FACTOR]
    if chosen == min(grid) and len(grid) > 1:
        return [chosen / WIDEN_FACTOR, chosen]
    return None


def finetune_widening(a, out: Path, files: dict[str, Path], arm: str, task: str, model: Path, env: dict,
                      grid: list[float], config: str | None = None) -> tuple[Path, list[list[float]]]:
    """`finetune`, rerun on a widened grid while its winner sits at the grid's edge (at most `WIDEN_ROUNDS` times):
    the last run's folder, and every grid tried."""
    grids = [grid]
    folder = finetune(a, out, files, arm, task, model, env, grid, config)
    while len(grids) <= WIDEN_ROUNDS and (wider := widened(grids[-1], chosen_rate(folder))):
        grids.append(wider)
        folder = finetune(a, out, files, arm, task, model, env, wider, config)
    return folder, grids


def seed_models(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("seed_*/model") if path.is_dir())


def median_over_seeds(folder: Path, files: dict[str, Path], tasks: tuple[str, ...]) -> dict[str, float]:
    """Each seed's model scored on the reported files; the median of each figure over the seeds."""
    scores = [score_model(model, files, tasks)[0] for model in seed_models(folder)]
    if not scores:
        raise SystemExit(f"{folder}: no seed's model was saved")
    return {key: statistics.median(s[key] for s in scores) for key in scores[0]}


def st_parity(model: Path, files: dict[str, Path], ours: dict[str, float]) -> list[dict]:
    """MiniLM zero-shot through sentence-transformers' own evaluators on the same files, beside ours."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.evaluation import (
        BinaryClassificationEvaluator,
        EmbeddingSimilarityEvaluator,
        InformationRetrievalEvaluator,
    )

    st = SentenceTransformer(str(model), device="cpu", local_files_only=True)
    st.max_seq_length = MAX_SEQ_LEN
    chosen = probes(files, ("squad", "stsb", "mrpc"))
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
    pairs = [("SQuAD nDCG@10", ours[MAIN["squad"]], ir["cosine_ndcg@10"]),
             ("SQuAD MRR@10", ours["retrieval/squad/mrr_at_10"], ir["cosine_mrr@10"]),
             ("SQuAD Recall@100", ours["retrieval/squad/recall_at_100"], ir["cosine_recall@100"]),
             ("STS-B Spearman", ours[MAIN["stsb"]], sim["spearman_cosine"]),
             ("MRPC AP", ours[MAIN["mrpc"]], ap["cosine_ap"])]
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


def table_rows(figures: dict[str, dict[str, float]]) -> list[dict]:
    """A row per arm: each task's main figure, with BM25's (TF-IDF's) beside it."""
    lex = figures["bm25"]
    rows = []
    for arm, title in ARMS.items():
        own = figures.get(arm, {})
        row = {"arm": title}
        for task, key in MAIN.items():
            value = own.get(key)
            row[task] = "—" if value is None else (f"{value:.4f}" if arm == "bm25"
                                                   else f"{value:.4f} ({value - lex[key]:+.4f})")
        rows.append(row)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--export", type=Path, required=True, help="a pretraining output folder (or its export)")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--squad-train", type=int, default=1000, help="training questions, spread over the even articles")
    p.add_argument("--squad-dev", type=int, default=300, help="fine-tuning dev questions from the searched articles")
    p.add_argument("--stsb-train", type=int, default=2000, help="STS-B training pairs, spread over the file")
    p.add_argument("--bbc", type=int, default=1000, help="BBC News articles clustered, spread over the file")
    p.add_argument("--eval-rows", type=int, default=None,
                   help="at most this many searched questions, STS-B dev and MRPC pairs (quick trials; default all)")
    p.add_argument("--threads", type=int, default=1, help="threads for the latency and throughput tables")
    p.add_argument("--out", type=Path, default=None, help="data and runs (default: a work folder, not runs/)")
    a = p.parse_args()
    from pipeline.models.reference_model import reference_encoder_folder

    export = a.export / "export" if (a.export / "export" / "config.json").exists() else a.export
    if not (export / "config.json").exists():
        p.error(f"--export {a.export}: no export there")
    minilm, out = reference_encoder_folder(), harness.work_dir("embeddings-benchmark", a.out)
    with STUDY.record() as rec:
        measure(a, rec, export, minilm, out)


def measure(a, rec, export: Path, minilm: Path, out: Path) -> None:
    from pipeline.pretrain.report.plateau import metrics_beside_plateau

    started = time.monotonic()
    files = make_data(a, out / "data")
    figures: dict[str, dict[str, float]] = {"bm25": lexical(files)}
    seconds = {}
    for arm, model in (("minilm-zero", minilm), ("export-zero", export)):
        figures[arm], seconds[arm] = score_model(model, files, TASKS)
    env, models = harness.cpu_env(1), {"minilm": minilm, "export": export, "scratch": export}
    runs = [(arm, task) for arm in ("minilm", "export", "scratch") for task in ("squad", "stsb")]
    with ThreadPoolExecutor(2) as pool:  # two fine-tuning processes of one thread each: both cores
        folders = dict(zip(runs, pool.map(lambda r: finetune(a, out, files, *r, models[r[0]], env), runs),
                           strict=True))
    reports = {}
    for arm in ("scratch", "export", "minilm"):
        search, _ = score_model(folders[(arm, "squad")], files, ("squad",))
        similar, _ = score_model(folders[(arm, "stsb")], files, ("stsb", "mrpc", "bbc"))
        figures[f"{arm}-ft"] = {**search, **similar}
        reports[arm] = {task: json.loads((folders[(arm, task)] / "metrics.json").read_text())
                        for task in ("squad", "stsb")}
    evals = harness.metrics(export.parent if export.name == "export" else export, "eval/mlm_loss")
    pretrained = metrics_beside_plateau(evals[-1]) if evals else "not recorded"
    rec.table(f"Each task's main figure, and in brackets its difference from BM25 (search) or TF-IDF cosine "
              f"(elsewhere). SQuAD v1.1 dev split by article: {a.squad_train} training questions from the even "
              f"articles, {len(files['squad'].read_text().splitlines())} searched (one per paragraph of the odd "
              f"articles; the corpus is their paragraphs); STS-B: {a.stsb_train} training pairs, scored on dev; MRPC "
              f"dev (average precision of cosine); BBC News: {a.bbc} articles (V-measure of k-means). Fine-tuned: "
              f"{a.epochs} epochs, batch 32, in-batch negatives (search) or CoSENT (STS-B; MRPC and BBC scored with "
              f"the STS-B model), each arm's LR chosen on 10% of its training pairs (MiniLM {SWEEPS['minilm']}; export "
              f"and scratch {SWEEPS['export']}), median over seeds {a.seeds}; every text cut at {MAX_SEQ_LEN} tokens. "
              f"Export: {export} (validation MLM loss {pretrained})", table_rows(figures))
    fine = {arm: {task: reports[arm][task][reports[arm][task]["metric"]] for task in ("squad", "stsb")}
            for arm in reports}
    gain = {task: fine["export"][task] - fine["scratch"][task] for task in ("squad", "stsb")}
    rec.headline("export fine-tuned − from scratch fine-tuned: SQuAD nDCG@10, STS-B Spearman (dev medians)",
                 f"{gain['squad']:+.4f}, {gain['stsb']:+.4f}", target="both > 0",
                 met=gain["squad"] > 0 and gain["stsb"] > 0)
    zero, tuned = figures["minilm-zero"][MAIN["squad"]], figures["minilm-ft"][MAIN["squad"]]
    rec.headline("MiniLM fine-tuned − zero-shot, SQuAD nDCG@10 on the held-out articles", f"{tuned - zero:+.4f}",
                 target="≥ 0", met=tuned >= zero)
    parity = st_parity(minilm, files, figures["minilm-zero"])
    rec.table("MiniLM zero-shot: roberta-embed-eval against sentence-transformers' own evaluators on the same files",
              parity)
    worst = max(float(r["difference"]) for r in parity)
    rec.headline("largest difference from sentence-transformers' evaluators (MiniLM zero-shot)", f"{worst:.1e}",
                 target="≤ 1e-4", met=worst <= 1e-4)
    serve(a, rec, files, folders, reports)
    rec.headline("total time", f"{(time.monotonic() - started) / 60:.1f} min")


def serve(a, rec, files: dict[str, Path], folders: dict, reports: dict) -> None:
    """ONNX: MiniLM's and the export's fine-tuned search folders exported with the proof; int8's metric delta; the
    latency and throughput tables."""
    from contextlib import redirect_stdout

    from pipeline.hub.embedding_evaluation import score_probes
    from pipeline.hub.onnx_export import OnnxEncoder, export_onnx
    from pipeline.models.embedding_encoder import load_encoder

    rows, deltas = [], []
    for arm in ("minilm", "export"):
        best = folders[(arm, "squad")]
        folder = best / json.loads((best / "best_model.json").read_text())["path"]
        record = export_onnx(folder, int8=True)
        search = probes(files, ("squad",))
        with redirect_stdout(io.StringIO()):
            torch_figure = score_probes(load_encoder(str(folder), max_seq_len=MAX_SEQ_LEN)[0].encode, search)
        fp32, int8 = (score_probes(OnnxEncoder(folder, int8=q).encode, search) for q in (False, True))
        key = MAIN["squad"]
        rows.append({"model": f"{arm}, fine-tuned (SQuAD)", "ONNX vs PyTorch, largest difference":
                     f"{record['parity']['max_logit_difference']:.2e} (tolerance {record['parity']['tolerance']:.1e})",
                     "nDCG@10 PyTorch": f"{torch_figure[key]:.4f}", "nDCG@10 ORT fp32": f"{fp32[key]:.4f}",
                     "nDCG@10 ORT int8": f"{int8[key]:.4f}", "int8 − fp32": f"{int8[key] - fp32[key]:+.4f}"})
        deltas.append(int8[key] - fp32[key])
        if arm == "minilm":
            latency_folder = folder
    rec.table("ONNX exports (torch.onnx dynamo; onnxruntime CPU): the parity check on padded and full-length inputs, "
              "and SQuAD search nDCG@10 through PyTorch, ONNX fp32 and dynamic int8", rows)
    rec.headline("int8 − fp32 SQuAD nDCG@10 (MiniLM, export)", ", ".join(f"{d:+.4f}" for d in deltas))
    rec.table(f"CPU latency of MiniLM fine-tuned, 128-token texts, {a.threads} thread(s), mean pooling included",
              latency(latency_folder, a.threads, repeats=40))
    sentences = [t for line in files["stsb"].read_text().splitlines()[:1000]
                 for t in (json.loads(line)["sentence1"], json.loads(line)["sentence2"])]
    rec.table(f"Encoding throughput of the same folder (MiniLM fine-tuned), STS-B dev sentences, batch 32, "
              f"{a.threads} thread(s)", throughput(latency_folder, sentences, a.threads))


if __name__ == "__main__":
    main()
