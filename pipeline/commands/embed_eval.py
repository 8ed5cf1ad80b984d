"""Score any model as an embedding model, zero-shot and offline: search, similarity, pair classification, clustering.

    roberta-embed-eval --model FOLDER [--retrieval PAIRS.jsonl] [--sts STS.jsonl]
        [--pair-classification PAIRS.jsonl] [--clustering TEXTS.jsonl] [--json OUT] [--tracking-uri URI]
        [--pooling mean|cls] [--max-seq-len N] [--backend torch|onnx|onnx-int8] [--hybrid [--hybrid-select PAIRS]]
    roberta-embed-eval --model ST_FOLDER --fit-centring TEXTS.jsonl [--whiten] --write NEW_FOLDER   (then scores it)
    roberta-embed-eval --run PRETRAIN_RUN --retrieval PAIRS.jsonl [--sts …] --out DIR     (every kept revision)

--model is any model the stage takes: an export, a pretraining run or checkpoint (exported once), a fine-tuning
output or saved model, a released HF folder, or a Sentence-Transformers folder (its own pooling and length, and
its prompts: a search's queries get its `query` prompt, its corpus the `document` one, and the output says so). A
sparse (SPLADE) `SparseEncoder` folder, such as `embed-sparse` saves, is scored on --retrieval files by dot-product
search, with the active dimensions per query and per document beside the figures.
Each file is read and checked before the model loads (docs/embeddings.md has the formats):
  --retrieval            {"query", "positive", "negative"?}: each query searched against every positive and negative
                         of the file as the corpus, by exact cosine search; nDCG@10, MRR@10, Recall@10 and @100
                         (trec_eval, via pytrec-eval), with BM25 (bm25s) on the same search beside each, and
                         the corpus's geometry (mean cosine, effective rank, hubness: hub/retrieval/geometry.py)
  --sts                  {"sentence1", "sentence2", "score"}: Spearman correlation of cosine (scipy)
  --pair-classification  {"sentence1", "sentence2", "label" 0/1}: average precision of cosine (scikit-learn)
  --clustering           {"text", "label"}: V-measure of k-means on the embeddings (scikit-learn)
--hybrid fuses the model's search with BM25's (hub/retrieval/fusion.py): z-normalised scores added with a weight
chosen on held-out queries (--hybrid-select's pairs, else each half of the file's queries on the other half), and
reciprocal rank fusion (k 60); `retrieval/<name>/hybrid/…` and `…/hybrid_rrf/…` stand beside the model and BM25.
--fit-centring writes --write, a copy of a Sentence-Transformers folder with a centring (--whiten: whitening) module
fitted on a {"text"} file (hub/retrieval/centring.py), and scores that folder on the files given, if any.
--json writes the figures in MTEB's result shape; --tracking-uri logs them to MLflow (experiment `embeddings`).
--backend onnx runs a Sentence-Transformers folder's onnx/model.onnx with onnxruntime (verified against PyTorch
first); onnx-int8 its quantized twin (`roberta-export --onnx FOLDER --int8`).

--run scores every kept checkpoint of a pretraining run (each exported once under --out/revisions/), writes
--out/revisions.json and --out/embed-curve.png, and with --tracking-uri logs each revision's figures at its step
into the pretraining run's own MLflow run, as curves.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from pipeline.common.errors import PipelineError, exit_on_pipeline_error


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/docs parse the documented commands with it)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="a model folder, export, pretraining run or checkpoint, or fine-tuning output")
    which.add_argument("--run", type=Path, help="a pretraining run folder: score every kept checkpoint")
    p.add_argument("--retrieval", action="append", default=[], metavar="FILE", help="pairs to search (repeatable)")
    p.add_argument("--sts", action="append", default=[], metavar="FILE", help="scored pairs (repeatable)")
    p.add_argument("--pair-classification", action="append", default=[], metavar="FILE",
                   help="pairs labelled 0/1 (repeatable)")
    p.add_argument("--clustering", action="append", default=[], metavar="FILE", help="labelled texts (repeatable)")
    p.add_argument("--score-range", default="0,5", metavar="LOW,HIGH", help="--sts scores' range (default 0,5)")
    p.add_argument("--pooling", choices=("mean", "cls"), default=None,
                   help="default: a Sentence-Transformers folder's own, else mean")
    p.add_argument("--max-seq-len", type=int, default=None, help="default: the folder's own, or its positions (≤ 512)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--backend", choices=("torch", "onnx", "onnx-int8"), default="torch")
    p.add_argument("--hybrid", action="store_true", help="fuse each search with BM25's (weighted and RRF)")
    p.add_argument("--hybrid-select", type=Path, default=None, metavar="PAIRS",
                   help="with --hybrid: choose the weight on this pairs file (default: cross-fitted halves)")
    p.add_argument("--fit-centring", type=Path, default=None, metavar="TEXTS",
                   help='fit a centring module on these {"text"} lines; needs --write')
    p.add_argument("--whiten", action="store_true", help="with --fit-centring: whiten, not only centre")
    p.add_argument("--write", type=Path, default=None, metavar="FOLDER",
                   help="with --fit-centring: the new Sentence-Transformers folder (must not exist)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="the figures in MTEB's result shape")
    p.add_argument("--out", type=Path, default=None, help="with --run: revisions, revisions.json and the curve")
    p.add_argument("--tracking-uri", default=None, help="log the figures to MLflow (with --run: into the run's own)")
    p.add_argument("--verbose", action="store_true",
                   help="show the frameworks' own logs, warnings and progress bars (default: warnings and up)")
    return p


def score_range(text: str) -> tuple[float, float]:
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise PipelineError(f"--score-range {text!r}: expected LOW,HIGH (e.g. 0,5)") from None
    if not low < high:
        raise PipelineError(f"--score-range {text!r}: LOW must be below HIGH")
    return low, high


def sparse_encoder_for(model: str, args: argparse.Namespace):
    """`model`'s `SparseEncoder` when it is a sparse (SPLADE) folder or a fine-tuning output of one; else None."""
    from pipeline.hub.retrieval.sparse_scoring import SparseFolderEncoder, sparse_folder_of

    folder = sparse_folder_of(model)
    if folder is None:
        return None
    if args.backend != "torch" or args.pooling:
        raise PipelineError(f"--model {model}: a sparse (SPLADE) folder runs on the torch backend with its own "
                            "pooling; leave out --backend and --pooling")
    return SparseFolderEncoder.load(folder, batch_size=args.batch_size, max_seq_len=args.max_seq_len)


def encoder_for(model: str, args: argparse.Namespace):
    """`(encoder, tokenizer, max_len)` of `model` on the chosen backend: its `encode`, and its prompts by role
    (`encoder.prompts`, a Sentence-Transformers folder's own; none elsewhere)."""
    if args.backend == "torch":
        from pipeline.models.embedding_encoder import load_encoder
        from pipeline.pretrain.export.folder import export_for_loading

        encoder, _ = load_encoder(model, pooling=args.pooling, max_seq_len=args.max_seq_len,
                                  batch_size=args.batch_size, exporter=export_for_loading)
        return encoder, encoder.tokenizer, encoder.max_seq_len
    if args.pooling or args.max_seq_len:
        raise PipelineError("--pooling and --max-seq-len: an ONNX backend pools and cuts as its folder says")
    from pipeline.hub.onnx_export import OnnxEncoder
    from pipeline.models.embedding_encoder import RolePrompts

    encoder = OnnxEncoder(Path(model), int8=args.backend == "onnx-int8", batch_size=args.batch_size)
    encoder.prompts = RolePrompts.read(model)
    return encoder, encoder.tokenizer, encoder.max_seq_len


@exit_on_pipeline_error
def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from pipeline.hub.embedding_evaluation import read_probes

    probes = read_probes(args.retrieval, args.sts, args.pair_classification, args.clustering,
                         score_range(args.score_range))
    check_centring_flags(args)
    if not probes.items() and args.fit_centring is None:
        raise PipelineError("give at least one file: --retrieval, --sts, --pair-classification or --clustering")
    if args.run is not None and args.out is None:
        raise PipelineError("--run: give --out, the folder for its revisions and their curve")
    from pipeline.common.console import quiet_frameworks

    quiet_frameworks(args.verbose)
    from pipeline.data.tasks.embedding_records import read_pairs
    from pipeline.hub.embedding_evaluation import bm25_probes, score_probes, warn_long_texts
    from pipeline.hub.embedding_results import log_to_mlflow, mteb_records, table
    from pipeline.hub.retrieval.figures import RememberingEncode, RetrievalExtras
    from pipeline.models.embedding_encoder import prompted

    extras = RetrievalExtras(probes, args.hybrid or args.hybrid_select is not None,
                             read_pairs(args.hybrid_select) if args.hybrid_select else None)
    lexical = bm25_probes(probes)
    used = {}
    if args.fit_centring is not None:
        args.model = fit_centring(args)
        if not probes.items():
            return

    def score(model: str) -> dict[str, float]:
        if (sparse := sparse_encoder_for(model, args)) is not None:  # dot-product search, active dims beside
            from pipeline.hub.retrieval.sparse_scoring import score_sparse_probes

            warn_long_texts(probes, sparse.tokenizer, sparse.max_seq_len)
            return {**score_sparse_probes(sparse.encode, probes), **lexical}
        encoder, tokenizer, max_len = encoder_for(model, args)
        warn_long_texts(probes, tokenizer, max_len)
        prompts = used[model] = encoder.prompts
        queries, documents = (RememberingEncode(prompted(encoder.encode, prompt))
                              for prompt in (prompts.query, prompts.document))
        figures = {**score_probes(prompted(encoder.encode, prompts.default), probes, queries=queries,
                                  documents=documents), **lexical, **extras.figures(queries, documents)}
        for note in extras.notes:
            print(note, file=sys.stderr)
        return figures

    if args.run is not None:
        score_run(args, score)
        return
    started = time.monotonic()
    figures = score(args.model)
    seconds = time.monotonic() - started
    prompts = used.get(args.model)
    print(table(figures) + (f"\n{prompts.describe()}" if prompts else ""))
    if args.json:
        from pipeline.common.atomic_files import write_json_atomic

        record = mteb_records(figures, probes, args.model, seconds)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(args.json, {**record, **({"prompts": prompts.record()} if prompts else {})})
        print(f"written to {args.json}", file=sys.stderr)
    if args.tracking_uri:
        run_id = log_to_mlflow(figures, args.tracking_uri, run_name=f"embed-eval {Path(args.model).name}")
        print(f"MLflow run {run_id} at {args.tracking_uri}", file=sys.stderr)


def check_centring_flags(args: argparse.Namespace) -> None:
    """--fit-centring's companions, every problem at once, before any model loads."""
    problems = []
    if args.fit_centring is not None:
        if args.write is None:
            problems.append("--fit-centring: give --write, the new folder")
        if args.model is None:
            problems.append("--fit-centring: give --model, a Sentence-Transformers folder")
        if args.backend != "torch":
            problems.append("--fit-centring: fitted with PyTorch; score the new folder's ONNX export afterwards")
        if not args.fit_centring.is_file():
            problems.append(f"--fit-centring {args.fit_centring}: no such file")
    elif args.whiten or args.write is not None:
        problems.append("--whiten and --write go with --fit-centring")
    if problems:
        raise PipelineError("; ".join(problems))


def fit_centring(args: argparse.Namespace) -> str:
    """Write the centred copy of --model; the folder the evaluation then scores."""
    from pipeline.hub.retrieval.centring import write_centred_folder

    record = write_centred_folder(args.model, args.fit_centring, args.write, whiten=args.whiten,
                                  batch_size=args.batch_size)
    print(f"{record['method']} fitted on {record['texts']} texts of {args.fit_centring}: {args.write} "
          f"(module {record['module']})", file=sys.stderr)
    return str(args.write)


def score_run(args: argparse.Namespace, score) -> None:
    """Every kept revision of `args.run`, its curve drawn, and (with a tracking URI) logged into the run's own
    MLflow run at each revision's step."""
    from pipeline.common.run_layout import PretrainLayout
    from pipeline.hub.embedding_results import log_to_mlflow, plot_curve, score_revisions
    from pipeline.pretrain.export.folder import export_revisions

    curve = score_revisions(export_revisions(args.run, args.out / "revisions"), args.out, score)
    plot = plot_curve(curve, args.out / "embed-curve.png")
    print(f"{len(curve)} revisions scored: {args.out / 'revisions.json'}; curve: {plot}")
    if args.tracking_uri:
        state = PretrainLayout(args.run).tracking
        run_id = json.loads(state.read_text()).get("run_id") if state.is_file() else None
        for point in curve:
            run_id = log_to_mlflow(point["figures"], args.tracking_uri, run_name=f"embed-eval {args.run.name}",
                                   run_id=run_id, step=point["step"])
        print(f"logged as curves to MLflow run {run_id} at {args.tracking_uri}", file=sys.stderr)


if __name__ == "__main__":
    main()
