"""The evaluator's outputs: a table on the screen, records in MTEB's result shape, MLflow metrics, and a pretraining
run's revisions scored one by one and drawn as curves."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from pipeline.common.atomic_files import write_json_atomic
from pipeline.hub.embedding_evaluation import MAIN_SCORE, Probes

MTEB_NAMES = {"spearman": "cosine_spearman", "ap": "cosine_ap"}
"""Each figure's name in MTEB's score dicts where it differs (the retrieval figures are named as MTEB names them)."""


def split_figures(figures: dict[str, float]) -> dict[tuple[str, str, str], dict[str, float]]:
    """`kind/name/[scorer/]metric` → {(kind, name, scorer): {metric: value}}: scorer `model`, `bm25`, `hybrid`,
    `hybrid_rrf`, or `geometry` (the corpus's embeddings, not a search)."""
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for key, value in figures.items():
        kind, name, *rest = key.split("/")
        scorer = rest[0] if len(rest) == 2 else "model"
        out.setdefault((kind, name, scorer), {})[rest[-1]] = value
    return out


COLUMNS = {"bm25": "BM25", "hybrid": "hybrid", "hybrid_rrf": "RRF"}
"""The scorers shown beside the model, when the figures hold them."""


def table(figures: dict[str, float]) -> str:
    """One line per file and metric: the model's figure, and beside it for retrieval BM25's and (with `--hybrid`)
    the fused ones; then the corpus's geometry (in the model's column) and the hybrid's weight (in its own)."""
    groups = split_figures(figures)
    shown = [s for s in COLUMNS if any(scorer == s for _, _, scorer in groups)]
    wide = max([16, *(len(metric) + 2 for values in groups.values() for metric in values)])  # active dims' names
    lines = [f"{'task':<22}{'file':<24}{'metric':<{wide}}{'model':>9}" + "".join(f"{COLUMNS[s]:>9}" for s in shown)]

    def line(kind: str, name: str, metric: str, cells: list[dict[str, float]]) -> str:
        return f"{kind:<22}{name[:23]:<24}{metric:<{wide}}" + "".join(
            f"{c[metric]:>9.4f}" if metric in c else f"{'—':>9}" for c in cells)

    for (kind, name, scorer), values in groups.items():
        if scorer != "model":
            continue
        beside = [groups.get((kind, name, s), {}) for s in shown]
        lines += [line(kind, name, metric, [values, *beside]) for metric in values]
        lines += [line(kind, name, metric, [groups[kind, name, "geometry"]] + [{}] * len(shown))
                  for metric in groups.get((kind, name, "geometry"), {})]
        own = dict.fromkeys(m for group in beside for m in group if m not in values)
        lines += [line(kind, name, metric, [{}, *beside]) for metric in own]
    return "\n".join(lines)


def file_digest(split_source: str) -> str | None:
    try:
        return hashlib.sha256(Path(split_source).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def mteb_records(figures: dict[str, float], probes: Probes, model: str, seconds: float) -> dict:
    """MTEB's result shape, one entry per file (and per BM25 or fused run): `task_name`, `dataset_revision` (the
    file's sha256), `evaluation_time`, `scores: {"test": [{"main_score", "hf_subset", metric_at_k, …}]}`; the
    corpus's geometry joins the model's scores as `geometry_<figure>`."""
    results = []
    splits = {(kind, name): split for kind, name, split in probes.items()}
    groups = split_figures(figures)
    for (kind, name, scorer), values in groups.items():
        if scorer == "geometry":
            continue
        if scorer == "model":
            values = {**values, **{f"geometry_{k}": v for k, v in groups.get((kind, name, "geometry"), {}).items()}}
        main = values[MAIN_SCORE[kind]]
        label = {"bm25": "BM25", "hybrid": "hybrid", "hybrid_rrf": "hybrid RRF"}.get(scorer, scorer)
        results.append({"task_name": name if scorer == "model" else f"{name} ({label})", "task_type": kind,
                        "dataset_revision": file_digest(splits[(kind, name)].source), "mteb_version": None,
                        "evaluation_time": round(seconds, 3), "scorer": scorer,
                        "scores": {"test": [{"main_score": main, "hf_subset": "default", "languages": [],
                                             **{MTEB_NAMES.get(k, k): v for k, v in values.items()}}]}})
    return {"model": model, "results": results}


def log_to_mlflow(figures: dict[str, float], uri: str, *, experiment: str = "embeddings", run_name: str,
                  run_id: str | None = None, step: int = 0) -> str:
    """Log `figures` as `embed/<kind>/<name>/…` at `step`, into `run_id` (a pretraining run's curves) or a new run
    of `experiment`; returns the run id."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(uri)
    if run_id is None:
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        run_id = client.create_run(experiment_id, run_name=run_name, tags={"stage": "embed-eval"}).info.run_id
        client.set_terminated(run_id)
    import time

    now = int(time.time() * 1000)
    metrics = [Metric(f"embed/{key}", float(value), now, step) for key, value in figures.items()]
    for start in range(0, len(metrics), 100):
        client.log_batch(run_id, metrics=metrics[start:start + 100])
    return run_id


def score_revisions(index: list[dict], out: Path, score: Callable[[str], dict[str, float]]) -> list[dict]:
    """Every revision of a pretraining run's `index` (its checkpoints exported under `out/revisions/`, by
    pretraining's `export_revisions`) scored by `score`; each revision's figures beside its step, tokens seen and
    validation loss, written to `out/revisions.json`."""
    curve = []
    for entry in index:
        folder = out / "revisions" / entry["folder"]
        figures = score(str(folder))
        curve.append({"step": entry["step"], "tokens_seen": entry["tokens_seen"],
                      "validation_loss": entry["validation_loss"], "unigram_entropy": entry["unigram_entropy"],
                      "folder": str(folder), "figures": figures})
        mains = [f"{k} {v:.4f}" for k, v in figures.items() if k.split("/")[-1] == MAIN_SCORE[k.split("/")[0]]]
        print(f"step {entry['step']:>8,}: {', '.join(mains)}", flush=True)
    write_json_atomic(out / "revisions.json", curve)
    return curve


def plot_curve(curve: list[dict], path: Path) -> Path:
    """Each file's main figure (and BM25's, dashed, flat: it never trains) against the revision's step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mains = [k for k in curve[0]["figures"] if k.split("/")[-1] == MAIN_SCORE[k.split("/")[0]] and "/bm25/" not in k]
    fig, axes = plt.subplots(1, len(mains), figsize=(4.5 * len(mains), 3.5), squeeze=False)
    steps = [point["step"] for point in curve]
    for ax, key in zip(axes[0], mains, strict=True):
        ax.plot(steps, [point["figures"][key] for point in curve], marker="o", label="model")
        bm25 = key.rsplit("/", 1)[0] + "/bm25/" + key.rsplit("/", 1)[1]
        if bm25 in curve[0]["figures"]:
            ax.axhline(curve[0]["figures"][bm25], linestyle="--", color="gray", label="BM25")
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("pretraining step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
