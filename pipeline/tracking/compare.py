"""Compare runs from an MLflow store: one table (differing params, final metrics, GLUE scores joined to
the pretraining run they started from) and overlaid loss curves."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pipeline.common.errors import PipelineError

PRETRAIN_METRICS = ("train/loss", "eval/mlm_loss", "eval/unigram_entropy", "eval/margin_below_unigram",
                    "eval/perplexity", "train/tokens_per_s")
PLATEAU_KEY = "eval/unigram_entropy"
"""The validation tokens' unigram entropy, logged by the pretraining trainer beside each validation loss."""


@dataclass
class Row:
    run_id: str
    name: str
    params: dict[str, str]
    metrics: dict[str, float]
    glue: dict[str, float] = field(default_factory=dict)


def select_runs(client, experiments: list[str], tags: dict[str, str], names: list[str]):
    """Runs of the named experiments (all when none), with every tag given, whose name contains one of `names`."""
    if experiments:
        found = [client.get_experiment_by_name(e) for e in experiments]
        missing = [e for e, x in zip(experiments, found, strict=True) if x is None]
        if missing:
            raise PipelineError(f"no MLflow experiment named {', '.join(missing)} in {client.tracking_uri}")
        ids = [x.experiment_id for x in found]
    else:
        ids = [x.experiment_id for x in client.search_experiments()]
    query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in tags.items())
    runs = client.search_runs(ids, filter_string=query, max_results=5000) if ids else []
    if names:
        runs = [r for r in runs if any(n in (r.info.run_name or "") for n in names)]
    return runs


def build_table(runs) -> tuple[list[str], list[Row]]:
    """Rows for pretraining runs (GLUE medians joined by `pretrain_run_id`), then unlinked fine-tuning summaries."""
    pretrain = [r for r in runs if r.data.tags.get("stage") == "pretrain"]
    summaries = [r for r in runs if r.data.tags.get("stage") == "finetune-summary"]
    rows = [Row(r.info.run_id, r.info.run_name or r.info.run_id[:8], dict(r.data.params),
                {k: r.data.metrics[k] for k in PRETRAIN_METRICS if k in r.data.metrics}) for r in pretrain]
    by_id = {row.run_id: row for row in rows}
    for s in summaries:
        kind = "scratch" if s.data.tags.get("from_scratch") == "true" else "pretrained"
        task = s.data.tags.get("task", "?")
        scores = {f"{task}/{k} ({kind})": v for k, v in s.data.metrics.items() if not k.endswith(("_mean", "_std"))}
        target = by_id.get(s.data.tags.get("pretrain_run_id", ""))
        if target is None:
            target = Row(s.info.run_id, s.info.run_name or s.info.run_id[:8], {"model": s.data.tags.get("model", "")},
                         {})
            rows.append(target)
        target.glue.update(scores)
    differing = sorted(k for k in {k for row in rows for k in row.params}
                       if len({row.params.get(k) for row in rows}) > 1 and not k.endswith(("output_dir", "uri")))
    return differing, rows


def format_table(differing: list[str], rows: list[Row]) -> str:
    metric_cols = sorted({k for row in rows for k in row.metrics}, key=PRETRAIN_METRICS.index)
    glue_cols = sorted({k for row in rows for k in row.glue})
    header = ["run", *differing, *metric_cols, *glue_cols]

    def cell(value) -> str:
        if value is None:
            return "–"
        if isinstance(value, float):
            return f"{value:,.1f}" if abs(value) >= 1000 else f"{value:.4f}"
        return str(value)

    body = [[row.name, *(row.params.get(k) for k in differing), *(row.metrics.get(k) for k in metric_cols),
             *(row.glue.get(k) for k in glue_cols)] for row in rows]
    cells = [header] + [[cell(v) for v in line] for line in body]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot_curves(client, runs, out: Path) -> list[Path]:
    """Overlaid curves: pretraining train/loss and eval/mlm_loss by step, fine-tuning train/loss by epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    panels = [("pretrain", "train/loss", "pretraining loss", "optimizer step"),
              ("pretrain", "eval/mlm_loss", "validation MLM loss", "optimizer step"),
              ("finetune", "train/loss", "fine-tuning loss", "epoch")]
    for stage, key, title, xlabel in panels:
        chosen = [r for r in runs if r.data.tags.get("stage") == stage and key in r.data.metrics]
        if not chosen:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        for r in chosen:
            history = sorted(client.get_metric_history(r.info.run_id, key), key=lambda m: m.step)
            name = r.info.run_name or r.info.run_id[:8]
            line, = ax.plot([m.step for m in history], [m.value for m in history], marker="." if len(history) <= 60
                            else None, label=name)
            if key == "eval/mlm_loss" and PLATEAU_KEY in r.data.metrics:
                # The plateau's level (pipeline/pretrain/report/plateau.py): only a loss below it shows the model
                # uses context.
                ax.axhline(r.data.metrics[PLATEAU_KEY], color=line.get_color(), linestyle="--", linewidth=1,
                           label=f"{name}: unigram entropy {r.data.metrics[PLATEAU_KEY]:.2f} (the plateau)")
        ax.set(title=title, xlabel=xlabel, ylabel=key)
        if len(chosen) <= 12:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"{stage}_{key.replace('/', '_')}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
