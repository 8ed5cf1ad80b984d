"""The encoder as an embedding model: search, similarity, pair classification and clustering on shared data, every arm
in one run, with the ONNX export's parity, its int8 metric delta and a CPU latency table.

    python benchmarks/embeddings.py --export /tmp/benchmarks/embeddings/pretrain [--seeds 1,2] [--out DIR]

Tasks (`embedding_data.py`): SQuAD v1.1 dev as question → paragraph search split by article, STS-B (train → dev),
MRPC dev as pair classification, BBC News as clustering. The arms (`ARMS`):

- zero-shot: BM25 (TF-IDF cosine where there is no search), MiniLM, the export, and random weights of the export's
  architecture (median over seeds), each with the geometry of its SQuAD corpus embeddings;
- the corpus stage (`embed-corpus`) from the export and from scratch, on a sample of the export's pretraining text
  plus SQuAD's paragraphs (unlabelled), scored zero-shot afterwards;
- fine-tuned through the protocol: from scratch, the export and MiniLM, and the chains export → corpus stage and
  scratch → corpus stage, each on SQuAD's training questions (search) and on STS-B train (the similarity tasks);
- sparse (`embed-sparse`, SPLADE) from the export and from scratch on SQuAD's training questions;
- hybrid: the best of the pipeline's own dense arms (chosen on the held-out training questions) fused with BM25,
  weighted (the weight chosen on those questions, `roberta-embed-eval --hybrid-select`'s code) and by RRF.

Fairness: every arm reads the same text (each text cut where every neural arm's tokenizer stops reading, so BM25
reads it too); each trained figure is the median over seeds of each seed's model scored on the reported files (never
a best seed picked on them); learning rates are chosen by the protocol on a slice of the training data, a grid whose
winner sits at its edge is widened (`WIDEN_ROUNDS`); the fine-tuning dev files and every choice between arms use held-
out training questions, never the reported files. docs/embeddings.md ("The benchmark") says how it is sized.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import harness
import numpy as np
from embedding_data import MAX_SEQ_LEN, make_data, same_text
from embedding_serving import latency, st_parity, throughput


@dataclass(frozen=True)
class Arm:
    """One row of the table: how it is made (`kind`), from what (`start`: minilm, export, scratch or another arm's
    name), and its learning-rate grid when it trains."""

    title: str
    kind: str  # lexical, zero, corpus, tuned, sparse or hybrid
    start: str = ""
    grid: tuple[float, ...] = ()

    @property
    def trains(self) -> tuple[str, ...]:
        """The training files of its runs (one run each)."""
        return {"corpus": ("corpus",), "tuned": ("squad", "stsb"), "sparse": ("squad",)}.get(self.kind, ())

    @property
    def dense(self) -> bool:
        return self.kind in ("zero", "corpus", "tuned")


OURS, MINILM_GRID, CORPUS_GRID, SPARSE_GRID = (1e-4, 3e-4, 1e-3), (1e-5, 3e-5, 1e-4), (1e-4, 3e-4), (3e-5, 1e-4, 3e-4)
ARMS = {  # the corpus stages first: the chains wait for them, and the pool starts its jobs in this order
    "bm25": Arm("BM25 / TF-IDF (no neural model)", "lexical"),
    "minilm-zero": Arm("MiniLM zero-shot", "zero", "minilm"),
    "export-zero": Arm("export zero-shot", "zero", "export"),
    "scratch-zero": Arm("random weights zero-shot", "zero", "scratch"),
    "corpus-export": Arm("export → corpus stage, zero-shot", "corpus", "export", CORPUS_GRID),
    "corpus-scratch": Arm("scratch → corpus stage, zero-shot", "corpus", "scratch", CORPUS_GRID),
    "scratch-ft": Arm("from scratch, fine-tuned", "tuned", "scratch", OURS),
    "export-ft": Arm("export, fine-tuned", "tuned", "export", OURS),
    "minilm-ft": Arm("MiniLM, fine-tuned", "tuned", "minilm", MINILM_GRID),
    "sparse-export": Arm("SPLADE from the export", "sparse", "export", SPARSE_GRID),
    "sparse-scratch": Arm("SPLADE from scratch", "sparse", "scratch", SPARSE_GRID),
    "chain-export": Arm("export → corpus stage → fine-tuned", "tuned", "corpus-export", OURS),
    "chain-scratch": Arm("scratch → corpus stage → fine-tuned", "tuned", "corpus-scratch", OURS),
    "hybrid": Arm("hybrid: the best own dense arm + BM25, weighted", "hybrid"),
    "hybrid-rrf": Arm("hybrid: the best own dense arm + BM25, RRF", "hybrid"),
}
STUDY = harness.Study(
    "embeddings", question="Is the encoder a good embedding model (zero-shot, after a corpus stage, fine-tuned, sparse "
                           "or fused with BM25), and does its ONNX export serve it?",
    metric="SQuAD question→paragraph nDCG@10 on held-out articles, STS-B dev Spearman, MRPC dev average precision, "
           "BBC News V-measure; trained arms through the protocol (LR chosen on held-out training pairs, median "
           "over seeds of each seed's model scored on the reported files)",
    baseline="BM25 for search and TF-IDF cosine elsewhere (no neural model); MiniLM; the same architecture from "
             "random weights", arms=tuple(a.title for a in ARMS.values()))
TASKS = ("squad", "stsb", "mrpc", "bbc")
KIND = {"squad": "retrieval", "squad-dev": "retrieval", "stsb": "sts", "mrpc": "pair_classification",
        "bbc": "clustering"}
SCORED = ("squad", "squad-dev", "stsb", "mrpc", "bbc")
"""What every arm is scored on: the reported files, and the held-out training questions (`squad-dev`) that choose
between arms."""
MAIN = {"squad": "retrieval/squad/ndcg_at_10", "stsb": "sts/stsb/spearman", "mrpc": "pair_classification/mrpc/ap",
        "bbc": "clustering/bbc/v_measure"}
DEV = "retrieval/squad-dev/ndcg_at_10"
WIDEN_ROUNDS = 2
"""A learning-rate grid whose winner is at the edge of every rate tried is widened (one value beyond that edge) at
most this often."""
WIDEN_FACTOR = 3.0
CONFIGS = {"corpus": "embed-corpus", "squad": "embed-pairs", "stsb": "embed-sts"}


def probes(files: dict[str, Path], tasks: tuple[str, ...]):
    from pipeline.hub.embedding_evaluation import KINDS, read_probes

    return read_probes(*([files[t] for t in tasks if KIND[t] == kind] for kind in KINDS))


def median_figures(scores: list[dict[str, float]]) -> dict[str, float]:
    if not scores:
        raise SystemExit("no model to score")
    return {key: statistics.median(s[key] for s in scores) for key in scores[0]}


def score_encoder(encode: Callable, files: dict[str, Path], tasks: tuple[str, ...]) -> dict[str, float]:
    """The evaluator's figures, and the geometry of each search's corpus embeddings (as `roberta-embed-eval`)."""
    from pipeline.hub.embedding_evaluation import score_probes
    from pipeline.hub.retrieval.figures import RememberingEncode, RetrievalExtras

    chosen, remember = probes(files, tasks), RememberingEncode(encode)
    return {**score_probes(encode, chosen, queries=remember, documents=remember),
            **RetrievalExtras(chosen).figures(remember)}


def folder_encoder(model: str | Path):
    from pipeline.models.embedding_encoder import load_encoder

    return load_encoder(str(model), max_seq_len=MAX_SEQ_LEN)[0]


def random_encoder(export: Path, seed: int):
    """The export's architecture with random weights (seeded), mean-pooled."""
    import torch
    from transformers import AutoTokenizer

    from pipeline.models.embedding_encoder import PooledEncoder, load_transformer

    torch.manual_seed(seed)
    return PooledEncoder(load_transformer(str(export), from_scratch=True), AutoTokenizer.from_pretrained(str(export)),
                         "mean", MAX_SEQ_LEN)


def lexical(files: dict[str, Path]) -> dict[str, float]:
    """BM25 for search; elsewhere TF-IDF vectors (fit on the file's own texts) as the embeddings. SQuAD's geometry:
    of its paragraphs' TF-IDF vectors, hubness of BM25's search."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    from pipeline.hub.embedding_evaluation import SCORERS, RetrievalTask, bm25_probes
    from pipeline.hub.retrieval.geometry import embedding_geometry

    all_probes = probes(files, SCORED)
    figures = {k.replace("/bm25/", "/"): v for k, v in bm25_probes(all_probes).items()}
    for kind, name, split in all_probes.items():
        if kind == "retrieval":
            continue
        vectorizer = TfidfVectorizer(sublinear_tf=True).fit([t for texts in split.texts for t in texts])
        encode = lambda texts, v=vectorizer: v.transform(texts).toarray().astype(np.float32)  # noqa: E731
        figures.update({f"{kind}/{name}/{k}": v for k, v in SCORERS[kind](encode, split).items()})
    search = RetrievalTask.of(all_probes.retrieval["squad"])
    vectors = TfidfVectorizer(sublinear_tf=True).fit(search.queries + search.corpus).transform(search.corpus)
    geometry = embedding_geometry(vectors.toarray(), search.bm25_scores())
    return {**figures, **{f"retrieval/squad/geometry/{k}": v for k, v in geometry.items()}}


@dataclass(frozen=True)
class Job:
    """One fine-tuning launch's what: an arm, its training files, its config, its start."""

    arm: str
    task: str  # squad, stsb or corpus
    config: str
    model: Path
    scratch: bool
    seeds: str
    sets: dict = field(default_factory=dict)

    def folder(self, out: Path, grid: list[float]) -> Path:
        return out / "finetune" / f"{self.arm}-{self.task}-lr{'_'.join(f'{lr:g}' for lr in grid)}"


@dataclass
class Trained:
    """A trained arm's runs on one training file: the last launch's folder, every grid tried, the minutes."""

    folder: Path
    grids: list[list[float]]
    minutes: float


def finetune(a, out: Path, files: dict[str, Path], job: Job, env: dict, grid: list[float]) -> Path:
    """One launch through the protocol (the learning rate chosen from `grid` on held-out training pairs)."""
    folder = job.folder(out, grid)
    cmd = harness.finetune_command(job.config, job.model, job.seeds, scratch=job.scratch,
                                   sweeps=[f"train.learning_rate={','.join(f'{lr:g}' for lr in grid)}"], sets={
        "data.train_file": files[f"{job.task}-train"], "data.validation_file": files[f"{job.task}-dev"],
        "data.max_seq_len": MAX_SEQ_LEN, "train.epochs": a.epochs, "train.batch_size": 32, "train.eval_batch_size": 64,
        "train.output_dir": folder, "tracking.uri": f"sqlite:///{out / 'mlflow.db'}",
        "tracking.experiment": "embeddings-benchmark", **job.sets})
    harness.launch(cmd, env=env, log=out / "logs" / f"{folder.name}.log")
    return folder


def selection(folder: Path) -> dict:
    return json.loads((folder / "selection.json").read_text())


def chosen_rate(folder: Path) -> float:
    return float(selection(folder)["chosen"]["train.learning_rate"])


def widened(tried: list[float], chosen: float) -> list[float] | None:
    """The winner and one value beyond the edge of `tried` it sits on (None: the winner is inside them)."""
    def rate(x: float) -> float:
        return float(f"{x:g}")  # as the sweep's text writes it, so a rate reads back equal

    tried = sorted({rate(x) for x in tried})
    if len(tried) > 1 and rate(chosen) == tried[-1]:
        return [rate(chosen), rate(chosen * WIDEN_FACTOR)]
    if len(tried) > 1 and rate(chosen) == tried[0]:
        return [rate(chosen / WIDEN_FACTOR), rate(chosen)]
    return None


def reuse_chosen_trial(previous: Path, target: Path) -> None:
    """The previous launch's winning trial, copied where the next launch looks for it: finished, it is not rerun."""
    record = selection(previous)
    name = next(t["trial"] for t in record["trials"] if t["setting"] == record["chosen"])
    shutil.copytree(previous / "selection" / f"trial_{name}", target / "selection" / f"trial_{name}",
                    dirs_exist_ok=True)


def finetune_widening(a, out: Path, files: dict[str, Path], job: Job, env: dict, grid: tuple[float, ...]) -> Trained:
    """`finetune`, relaunched on a widened grid while its winner sits at the edge of every rate tried (at most
    `WIDEN_ROUNDS` times); each launch's winner is the best of all tried, so the last launch holds the result."""
    started, grids = time.monotonic(), [list(grid)]
    folder = finetune(a, out, files, job, env, grids[0])
    while len(grids) <= WIDEN_ROUNDS and (wider := widened(sorted({r for g in grids for r in g}),
                                                            chosen_rate(folder))):
        reuse_chosen_trial(folder, job.folder(out, wider))
        grids.append(wider)
        folder = finetune(a, out, files, job, env, wider)
    return Trained(folder, grids, (time.monotonic() - started) / 60)


def seed_models(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("seed_*/model") if path.is_dir())


@dataclass
class Bench:
    """One run: its flags, folders and files, the models the arms start from, and what the training left."""

    a: argparse.Namespace
    out: Path
    files: dict[str, Path]
    export: Path
    minilm: Path
    trained: dict[tuple[str, str], Trained] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        return [int(s) for s in self.a.seeds.split(",")]

    def job(self, name: str, task: str, stage: Trained | None) -> Job:
        """The launch of `name` on `task`'s files; a chain starts from its corpus `stage`'s first seed's model."""
        arm = ARMS[name]
        model = seed_models(stage.folder)[0] if stage else self.minilm if arm.start == "minilm" else self.export
        if task == "corpus":  # the stage's own recipe (cached in-batch negatives under a step cap), one seed
            return Job(name, task, CONFIGS[task], model, arm.start == "scratch", str(self.seeds[0]), {
                "train.batch_size": self.a.corpus_batch, "train.epochs": 1, "embedding.max_steps": self.a.corpus_steps})
        config = "embed-sparse" if arm.kind == "sparse" else CONFIGS[task]
        return Job(name, task, config, model, arm.start == "scratch", self.a.seeds)

    def train(self) -> None:
        """Every trained arm's runs, two one-thread processes at a time (both cores); a chain waits for its stage."""
        env, futures = harness.cpu_env(1), {}

        def run(name: str, task: str) -> Trained:
            start = ARMS[name].start
            stage = futures[(start, "corpus")].result() if start in ARMS else None
            return finetune_widening(self.a, self.out, self.files, self.job(name, task, stage), env, ARMS[name].grid)

        with ThreadPoolExecutor(2) as pool:
            for name, arm in ARMS.items():
                for task in arm.trains:
                    futures[(name, task)] = pool.submit(run, name, task)
            self.trained = {key: future.result() for key, future in futures.items()}

    def loaders(self, name: str, task: str) -> list[Callable]:
        """Makers of a dense arm's encoders for `task`'s files: one per seed (a released model or the export: one)."""
        arm = ARMS[name]
        if arm.kind == "zero" and arm.start == "scratch":
            return [lambda s=s: random_encoder(self.export, s) for s in self.seeds]
        if arm.kind == "zero":
            return [lambda: folder_encoder(self.minilm if arm.start == "minilm" else self.export)]
        trained_on = "corpus" if arm.kind == "corpus" else "squad" if KIND[task] == "retrieval" else "stsb"
        return [lambda m=m: folder_encoder(m) for m in seed_models(self.trained[(name, trained_on)].folder)]

    def dense(self, name: str) -> dict[str, float]:
        """Every file's figures, the median over the arm's encoders; a fine-tuned arm's SQuAD model scores search,
        its STS-B model the rest."""
        groups = [("squad", "squad-dev"), ("stsb", "mrpc", "bbc")] if ARMS[name].kind == "tuned" else [SCORED]
        return {key: value for tasks in groups for key, value in median_figures(
            [score_encoder(load().encode, self.files, tasks) for load in self.loaders(name, tasks[0])]).items()}

    def sparse(self, name: str) -> dict[str, float]:
        """Each seed's SPLADE folder on the searches (dot products; the active dimensions beside), the median."""
        from pipeline.hub.retrieval.sparse_scoring import SparseFolderEncoder, score_sparse_probes

        chosen = probes(self.files, ("squad", "squad-dev"))
        return median_figures([score_sparse_probes(SparseFolderEncoder.load(m, max_seq_len=MAX_SEQ_LEN).encode, chosen)
                               for m in seed_models(self.trained[(name, "squad")].folder)])

    def hybrid(self, figures: dict[str, dict[str, float]]) -> str:
        """The pipeline's best dense arm on the held-out training questions, fused with BM25 (each of its encoders,
        the median): `hybrid` and `hybrid-rrf` added to `figures`; the arm's name."""
        best = max((n for n, arm in ARMS.items() if arm.dense and arm.start != "minilm"), key=lambda n: figures[n][DEV])
        merged = median_figures([fused(load().encode, self.files) for load in self.loaders(best, "squad")])
        for name, part in (("hybrid", "/hybrid/"), ("hybrid-rrf", "/hybrid_rrf/")):
            figures[name] = {key.replace(part, "/"): value for key, value in merged.items() if part in key}
        return best


def fused(encode: Callable, files: dict[str, Path]) -> dict[str, float]:
    """`roberta-embed-eval --hybrid`'s figures: on SQuAD with the weight chosen on the held-out training questions
    (`--hybrid-select`), and on those questions cross-fitted (each half's weight chosen on the other half)."""
    from pipeline.data.tasks.embedding_records import read_pairs
    from pipeline.hub.retrieval.figures import RememberingEncode, RetrievalExtras

    remember = RememberingEncode(encode)
    reported = RetrievalExtras(probes(files, ("squad",)), hybrid=True, select=read_pairs(files["squad-dev"]))
    held_out = RetrievalExtras(probes(files, ("squad-dev",)), hybrid=True)
    return {**reported.figures(remember), **held_out.figures(remember)}


def score_all(bench: Bench) -> tuple[dict[str, dict[str, float]], str]:
    """Every arm's figures by name, and the dense arm the hybrids fuse."""
    figures = {"bm25": lexical(bench.files)}
    for name, arm in ARMS.items():
        if arm.dense:
            figures[name] = bench.dense(name)
        elif arm.kind == "sparse":
            figures[name] = bench.sparse(name)
    return figures, bench.hybrid(figures)


def cell(figures: dict[str, float], key: str, lex: dict[str, float] | None = None) -> str:
    value = figures.get(key)
    if value is None:
        return "—"
    return f"{value:.4f}" if lex is None else f"{value:.4f} ({value - lex[key]:+.4f})"


def table_rows(figures: dict[str, dict[str, float]]) -> list[dict]:
    """A row per arm: each task's main figure, with BM25's (TF-IDF's) difference beside it; the held-out training
    questions' nDCG@10, on which the hybrid's arm and the best retriever are chosen."""
    lex, rows = figures["bm25"], []
    for name, arm in ARMS.items():
        own = figures.get(name, {})
        row = {"arm": arm.title, "squad": cell(own, MAIN["squad"], None if name == "bm25" else lex),
               "squad, held-out training questions": cell(own, DEV)}
        rows.append(row | {task: cell(own, key, None if name == "bm25" else lex) for task, key in MAIN.items()
                           if task != "squad"})
    return rows


def geometry_rows(figures: dict[str, dict[str, float]]) -> list[dict]:
    return [{"arm": arm.title, **{label: cell(figures[name], f"retrieval/squad/geometry/{key}") for label, key in (
                ("mean cosine", "mean_cosine"), ("effective rank", "effective_rank"), ("hubness", "hubness"))}}
            for name, arm in ARMS.items() if arm.kind in ("lexical", "zero", "corpus")]


def sparse_rows(figures: dict[str, dict[str, float]]) -> list[dict]:
    keys = {"nDCG@10": "ndcg_at_10", "MRR@10": "mrr_at_10", "Recall@100": "recall_at_100",
            "active dims per query": "query_active_dims", "active dims per paragraph": "document_active_dims"}
    return [{"arm": ARMS[name].title, **{label: cell(figures[name], f"retrieval/squad/{key}")
                                         for label, key in keys.items()}} for name in ("bm25", "sparse-export",
                                                                                        "sparse-scratch")]


def training_rows(bench: Bench) -> list[dict]:
    return [{"arm": ARMS[name].title, "trained on": task, "learning rates tried": " → ".join(
                ",".join(f"{lr:g}" for lr in grid) for grid in trained.grids),
             "chosen": f"{chosen_rate(trained.folder):g}", "minutes": f"{trained.minutes:.1f}"}
            for (name, task), trained in bench.trained.items()]


def headlines(rec, figures: dict[str, dict[str, float]]) -> None:
    squad, stsb = MAIN["squad"], MAIN["stsb"]
    chain = {key: figures["chain-export"][key] - figures["chain-scratch"][key] for key in (squad, stsb)}
    rec.headline("chain export − chain scratch (→ corpus stage → fine-tuned): SQuAD nDCG@10, STS-B Spearman",
                 f"{chain[squad]:+.4f}, {chain[stsb]:+.4f}", target="both > 0",
                 met=chain[squad] > 0 and chain[stsb] > 0)
    sparse = figures["sparse-export"][squad] - figures["sparse-scratch"][squad]
    rec.headline("SPLADE from the export − from scratch: SQuAD nDCG@10", f"{sparse:+.4f}", target="> 0",
                 met=sparse > 0)
    own = [n for n, arm in ARMS.items() if arm.kind in ("zero", "corpus", "tuned", "sparse", "hybrid")
           and arm.start != "minilm"]
    best = max(own, key=lambda n: figures[n][DEV])
    lift = figures[best][squad] - figures["bm25"][squad]
    rec.headline("the pipeline's best retriever (chosen on the held-out training questions) − BM25: SQuAD nDCG@10",
                 f"{lift:+.4f} ({ARMS[best].title})", target="≥ +0.01", met=lift >= 0.01)
    stage = figures["corpus-export"][squad]
    over = {n: stage - figures[n][squad] for n in ("export-zero", "scratch-zero")}
    rec.headline("the corpus stage on the export, zero-shot SQuAD nDCG@10 − the export's, − random weights'",
                 f"{over['export-zero']:+.4f}, {over['scratch-zero']:+.4f}", target="> both",
                 met=min(over.values()) > 0)


def measure(a, rec, export: Path, minilm: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    from pipeline.pretrain.report.plateau import metrics_beside_plateau

    started = time.monotonic()
    cut = same_text([AutoTokenizer.from_pretrained(str(m)) for m in (export, minilm)], MAX_SEQ_LEN)
    bench = Bench(a, out, make_data(a, out / "data", cut), export, minilm)
    bench.train()
    figures, fused_arm = score_all(bench)
    evals = harness.metrics(export.parent if export.name == "export" else export, "eval/mlm_loss")
    pretrained = metrics_beside_plateau(evals[-1]) if evals else "not recorded"
    lines = {name: len(path.read_text().splitlines()) for name, path in bench.files.items()}
    rec.table(f"Each task's main figure, and in brackets its difference from BM25 (search) or TF-IDF cosine "
              f"(elsewhere). SQuAD v1.1 dev split by article: {lines['squad-train']} training questions from the even "
              f"articles, {lines['squad-dev']} held-out training questions (the last tenth of those articles: the "
              f"fine-tuning runs' dev file and every choice between arms), {lines['squad']} searched (one per "
              f"paragraph of the odd articles; the corpus is their paragraphs); STS-B: {lines['stsb-train']} training "
              f"pairs, scored on dev; MRPC dev (average precision of cosine); BBC News: {lines['bbc']} articles "
              f"(V-measure of k-means). Corpus stage: {lines['corpus-train']} documents (a sample of the pretraining "
              f"text and every SQuAD paragraph), {lines['corpus-dev']} held out, {a.corpus_steps} steps of batch "
              f"{a.corpus_batch}, one seed; the chains start from it. Fine-tuned: {a.epochs} epochs, batch 32, "
              f"in-batch negatives (search) or CoSENT (STS-B; MRPC and BBC scored with the STS-B model), each arm's "
              f"LR chosen on a slice of its training pairs, median over seeds {a.seeds} of each seed's model; every "
              f"text cut to what every tokenizer reads in {MAX_SEQ_LEN} tokens. Hybrid: {ARMS[fused_arm].title} with "
              f"BM25. Export: {export} (validation MLM loss {pretrained})", table_rows(figures))
    rec.table("Geometry of the SQuAD corpus embeddings, zero-shot (BM25's row: the paragraphs' TF-IDF vectors, hubness "
              "of BM25's search)", geometry_rows(figures))
    rec.table("SPLADE on SQuAD: dot-product search over sparse vectors, and the active dimensions per text",
              sparse_rows(figures))
    rec.table("Each trained arm's learning rates: the protocol's grid, widened while its winner sat at an edge",
              training_rows(bench))
    headlines(rec, figures)
    parity = st_parity(minilm, probes(bench.files, ("squad", "stsb", "mrpc")), figures["minilm-zero"])
    rec.table("MiniLM zero-shot: roberta-embed-eval against sentence-transformers' own evaluators on the same files",
              parity)
    worst = max(float(r["difference"]) for r in parity)
    rec.headline("largest difference from sentence-transformers' evaluators (MiniLM zero-shot)", f"{worst:.1e}",
                 target="≤ 1e-4", met=worst <= 1e-4)
    serve(a, rec, bench)
    rec.headline("total time", f"{(time.monotonic() - started) / 60:.1f} min")


def serve(a, rec, bench: Bench) -> None:
    """ONNX: the first seed's SQuAD model of MiniLM fine-tuned, the export fine-tuned and the export's chain, exported
    with the proof; int8's metric delta; the latency and throughput tables on MiniLM's."""
    from contextlib import redirect_stdout

    from pipeline.hub.embedding_evaluation import score_probes
    from pipeline.hub.onnx_export import OnnxEncoder, export_onnx

    rows, deltas, key, search = [], [], MAIN["squad"], probes(bench.files, ("squad",))
    for name in ("minilm-ft", "export-ft", "chain-export"):
        folder = seed_models(bench.trained[(name, "squad")].folder)[0]
        record = export_onnx(folder, int8=True)
        with redirect_stdout(io.StringIO()):
            torch_figure = score_probes(folder_encoder(folder).encode, search)
        fp32, int8 = (score_probes(OnnxEncoder(folder, int8=q).encode, search) for q in (False, True))
        parity = record["parity"]
        rows.append({"model": f"{ARMS[name].title} (SQuAD, {folder.parent.name})", "ONNX vs PyTorch, largest "
                     "difference": f"{parity['max_logit_difference']:.2e} (tolerance {parity['tolerance']:.1e})",
                     "nDCG@10 PyTorch": f"{torch_figure[key]:.4f}", "nDCG@10 ORT fp32": f"{fp32[key]:.4f}",
                     "nDCG@10 ORT int8": f"{int8[key]:.4f}", "int8 − fp32": f"{int8[key] - fp32[key]:+.4f}"})
        deltas.append(int8[key] - fp32[key])
    rec.table("ONNX exports (torch.onnx dynamo; onnxruntime CPU): the parity check on padded and full-length inputs, "
              "and SQuAD search nDCG@10 through PyTorch, ONNX fp32 and dynamic int8", rows)
    rec.headline("ONNX − PyTorch, largest difference (the export's chain, fine-tuned on SQuAD)",
                 f"{parity['max_logit_difference']:.2e}", target="within 1e-4 of the outputs' scale",
                 met=parity["max_logit_difference"] <= parity["tolerance"])
    rec.headline("int8 − fp32 SQuAD nDCG@10 (MiniLM, export, chain)", ", ".join(f"{d:+.4f}" for d in deltas))
    latency_folder = seed_models(bench.trained[("minilm-ft", "squad")].folder)[0]
    rec.table(f"CPU latency of MiniLM fine-tuned, 128-token texts, {a.threads} thread(s), mean pooling included",
              latency(latency_folder, a.threads, repeats=40))
    sentences = [t for line in bench.files["stsb"].read_text().splitlines()[:1000]
                 for t in (json.loads(line)["sentence1"], json.loads(line)["sentence2"])]
    rec.table(f"Encoding throughput of the same folder (MiniLM fine-tuned), STS-B dev sentences, batch 32, "
              f"{a.threads} thread(s)", throughput(latency_folder, sentences, a.threads))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--export", type=Path, required=True, help="a pretraining output folder (or its export)")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--squad-train", type=int, default=600, help="training questions, spread over the even articles")
    p.add_argument("--squad-dev", type=int, default=300, help="held-out training questions (the last tenth of the "
                                                                 "even articles)")
    p.add_argument("--stsb-train", type=int, default=1000, help="STS-B training pairs, spread over the file")
    p.add_argument("--bbc", type=int, default=500, help="BBC News articles clustered, spread over the file")
    p.add_argument("--eval-rows", type=int, default=500,
                   help="at most this many searched questions, STS-B dev and MRPC pairs")
    p.add_argument("--corpus", nargs="+", default=None, metavar="FILE",
                   help="the corpus stage's pretraining text, each file an equal share (default: IMDB, WikiText-2 "
                        "and Shakespeare from ../shared/data/corpus, the export's own)")
    p.add_argument("--corpus-docs", type=int, default=3000, help="documents drawn from the pretraining text")
    p.add_argument("--corpus-held-out", type=float, default=0.05, help="the share of documents held out (seeded)")
    p.add_argument("--corpus-steps", type=int, default=40, help="the corpus stage's steps (embedding.max_steps)")
    p.add_argument("--corpus-batch", type=int, default=32, help="the corpus stage's batch (its in-batch negatives)")
    p.add_argument("--threads", type=int, default=1, help="threads for the latency and throughput tables")
    p.add_argument("--out", type=Path, default=None, help="data and runs (default: a work folder, not runs/)")
    p.add_argument("--variant", default=None, help="write benchmarks/results/embeddings.VARIANT.json (a trial: "
                                                   "`--variant trial`, or BENCHMARK_RESULTS_DIR elsewhere)")
    a = p.parse_args()
    from pipeline.models.reference_model import reference_encoder_folder

    export = a.export / "export" if (a.export / "export" / "config.json").exists() else a.export
    if not (export / "config.json").exists():
        p.error(f"--export {a.export}: no export there")
    if not 0 < a.corpus_held_out < 1:
        p.error(f"--corpus-held-out: a share between 0 and 1, got {a.corpus_held_out}")
    minilm, out = reference_encoder_folder(), harness.work_dir("embeddings-benchmark", a.out)
    with STUDY.record(a.variant) as rec:
        measure(a, rec, export, minilm, out)


if __name__ == "__main__":
    main()
