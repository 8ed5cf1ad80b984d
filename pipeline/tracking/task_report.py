"""What pretraining bought on the main job's tasks: both arms, the token-count baseline, the label curve.

Reads the files the stages wrote (each arm's `metrics.json`, each task's `token-baseline.json`, the
minimal-pair result) and says in words what they show: where counting words is enough, where the
pretrained arm falls behind random weights by more than the seeds' spread, and by how much it
leads elsewhere. Nothing is recomputed.
"""

from __future__ import annotations

from pipeline.common.run_layout import MAIN_JOB_ARMS, MAIN_JOB_TASKS, MainJobLayout
from pipeline.tracking.finetune_report import CurvePoint, FinetuneResult, finetune_result, read_json

ARM_NAMES = {"pretrained": "pretrained", "from-scratch": "from scratch"}


def task_arms(layout: MainJobLayout, task: str) -> dict[str, FinetuneResult | None]:
    return {arm: finetune_result(layout.finetune(task, arm).metrics) for arm in MAIN_JOB_ARMS}


def token_baseline(layout: MainJobLayout, task: str, metric: str) -> float | None:
    value = (read_json(layout.token_baseline(task)) or {}).get(metric)
    return float(value) if isinstance(value, int | float) else None


def _label(point: CurvePoint) -> str:
    if point.labels_per_class != "all":
        return str(point.labels_per_class)
    return "all" if point.examples is None else f"all ({point.examples:,} in total)"


def _with_labels(point: CurvePoint) -> str:
    if point.labels_per_class == "all":
        return "with all labelled examples" if point.examples is None else \
            f"with all {point.examples:,} labelled examples"
    return f"with {point.labels_per_class} labelled examples per class"


def task_rows(layout: MainJobLayout) -> list[tuple[str, ...]]:
    """The table: task, labels per class, each arm's median [min–max], the gap, token counts (on the full row)."""
    rows = [("task", "labels/class", "pretrained", "from scratch", "gap", "token counts")]
    for task in MAIN_JOB_TASKS:
        arms = task_arms(layout, task)
        pretrained, scratch = arms["pretrained"], arms["from-scratch"]
        if pretrained is None or scratch is None:
            missing = " and ".join(ARM_NAMES[a] for a, r in arms.items() if r is None)
            rows.append((task, "", f"no result for {missing}", "", "", ""))
            continue
        baseline = token_baseline(layout, task, pretrained.metric)
        points = list(zip(pretrained.curve, scratch.curve, strict=False))
        for i, (p, s) in enumerate(points):
            last = i == len(points) - 1
            rows.append((task if i == 0 else "", _label(p), f"{p.median:.3f} [{p.low:.2f}–{p.high:.2f}]",
                         f"{s.median:.3f} [{s.low:.2f}–{s.high:.2f}]", f"{p.median - s.median:+.3f}",
                         f"{baseline:.3f}" if last and baseline is not None else ""))
    return rows


def task_findings(layout: MainJobLayout) -> list[str]:
    """Plain sentences: what each task shows, including every point where pretraining did not pay."""
    lines = []
    for task in MAIN_JOB_TASKS:
        arms = task_arms(layout, task)
        pretrained, scratch = arms["pretrained"], arms["from-scratch"]
        if pretrained is None or scratch is None:
            continue
        gap = pretrained.median - scratch.median
        baseline = token_baseline(layout, task, pretrained.metric)
        if baseline is not None and baseline >= max(pretrained.median, scratch.median) - 0.01:
            lines.append(f"{task}: counting words ({baseline:.3f}) does as well as both arms, so this task cannot "
                         "show what pretraining buys")
        elif baseline is not None:
            lines.append(f"{task}: pretrained {gap:+.3f} against from scratch with all labels; counting words gets "
                         f"{baseline:.3f}")
        for p, s in zip(pretrained.curve, scratch.curve, strict=False):
            spread = max(p.spread, s.spread)
            if p.median < s.median - spread:
                full = p.labels_per_class == "all"  # the baseline was measured on the full split
                counting = f"; counting words gets {baseline:.3f}" if baseline is not None and full else ""
                lines.append(f"{task}: {_with_labels(p)} pretrained is BELOW from scratch by "
                             f"{s.median - p.median:.3f}, more than the seeds' spread ({spread:.3f}){counting}")
        if pretrained.chosen or scratch.chosen:
            lines.append(f"{task}: chosen on held-out train: " + "; ".join(
                f"{ARM_NAMES[a]} {', '.join(f'{k}={v}' for k, v in r.chosen.items())}"
                for a, r in arms.items() if r.chosen))
    return lines


def minimal_pairs_line(layout: MainJobLayout) -> str | None:
    """The export's minimal-pair accuracy beside the unigram model's, overall and per phenomenon."""
    result = read_json(layout.minimal_pairs_result)
    if not result or "model_scores" not in result:
        return None
    model, unigram = result["model_scores"], result.get("unigram_scores")
    line = f"{model['overall']['accuracy']:.3f} on {model['overall']['pairs']:,} held-out pairs"
    if unigram:
        line += f" (unigram model {unigram['overall']['accuracy']:.3f})"
    groups = model.get("groups") or {}
    if groups:
        line += "; " + ", ".join(f"{g} {r['accuracy']:.2f}" + (f"/{unigram['groups'][g]['accuracy']:.2f}"
                                                                if unigram else "") for g, r in groups.items())
    return line


def search_lines(layout: MainJobLayout) -> list[tuple[str, str]]:
    """Docstring search, nDCG@10 on the dev docstrings, each arm: dense (after the corpus stage with no labels →
    after one epoch of pairs), sparse (SPLADE), and hybrid (the dense model fused with BM25); BM25 beside."""
    dense = {arm: read_json(layout.finetune("search", arm).metrics) for arm in MAIN_JOB_ARMS}
    if not all(dense.values()):
        return []
    main = "ndcg_at_10"
    arms = [f"{ARM_NAMES[arm]} {r[f'zero_shot_{main}']:.3f} → {r[main]:.3f}" for arm, r in dense.items()]
    lines = [("search, dense", f"nDCG@10 (first sentence → the rest, dev docstrings) after a contrastive stage on the "
                               f"corpus (no labels) → after one epoch of pairs: {'; '.join(arms)}; "
                               f"BM25 {dense['pretrained'][f'bm25_{main}']:.3f}")]
    sparse = {arm: read_json(layout.finetune("search-sparse", arm).metrics) for arm in MAIN_JOB_ARMS}
    if all(sparse.values()):
        lines.append(("search, sparse", "SPLADE from each arm's masked-LM head: " + "; ".join(
            f"{ARM_NAMES[arm]} {r[main]:.3f} ({r['document_active_dims']:.0f} active dimensions per document)"
            for arm, r in sparse.items())))
    if all(f"hybrid_{main}" in r for r in dense.values()):
        lines.append(("search, hybrid", "dense + BM25, the weight chosen on held-out queries: " + "; ".join(
            f"{ARM_NAMES[arm]} {r[f'hybrid_{main}']:.3f} (weight {r['hybrid_weight']:.1f})"
            for arm, r in dense.items())))
    return lines
