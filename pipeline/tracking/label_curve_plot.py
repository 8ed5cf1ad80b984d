"""The main job's label-efficiency plot: dev score against labelled examples per class, both arms, every task."""

from __future__ import annotations

from pipeline.common.run_layout import MAIN_JOB_TASKS, MainJobLayout
from pipeline.tracking.task_report import ARM_NAMES, task_arms, token_baseline


def plot_label_curves(layout: MainJobLayout) -> bool:
    """Write `layout.label_curve_plot` (one panel per task: median over seeds, min–max bars, token counts dashed);
    False when no task has a curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [(task, task_arms(layout, task)) for task in MAIN_JOB_TASKS]
    tasks = [(task, arms) for task, arms in tasks if all(r is not None and len(r.curve) > 1 for r in arms.values())]
    if not tasks:
        return False
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, (task, arms) in zip(axes[0], tasks, strict=True):
        metric = next(iter(arms.values())).metric
        for arm, result in arms.items():
            # "all" sits at its examples per class, so the x axis is one scale.
            classes = max(1, round(result.curve[0].examples / result.curve[0].labels_per_class)) \
                if isinstance(result.curve[0].labels_per_class, int) else 1
            xs = [p.labels_per_class if isinstance(p.labels_per_class, int) else p.examples / classes
                  for p in result.curve]
            ax.errorbar(xs, [p.median for p in result.curve],
                        yerr=[[p.median - p.low for p in result.curve], [p.high - p.median for p in result.curve]],
                        marker="o", capsize=3, label=ARM_NAMES[arm])
        if (baseline := token_baseline(layout, task, metric)) is not None:
            ax.axhline(baseline, color="gray", linestyle="--", linewidth=1, label=f"token counts ({baseline:.3f})")
        ax.set(xscale="log", title=task, xlabel="labelled examples per class (log)", ylabel=f"dev {metric}")
        ax.set_xticks(xs, [str(p.labels_per_class) if isinstance(p.labels_per_class, int) else f"all ({x:.0f})"
                           for p, x in zip(result.curve, xs, strict=True)])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    fig.tight_layout()
    layout.label_curve_plot.parent.mkdir(parents=True, exist_ok=True)
    tmp = layout.label_curve_plot.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(layout.label_curve_plot)
    return True
