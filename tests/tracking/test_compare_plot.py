"""The validation-loss plot draws each run's unigram entropy (the plateau's level) as a reference line."""

from __future__ import annotations

from types import SimpleNamespace

from pipeline.tracking.compare import plot_curves


def _run(run_id: str, metrics: dict[str, float]):
    return SimpleNamespace(info=SimpleNamespace(run_id=run_id, run_name=f"run-{run_id}"),
                           data=SimpleNamespace(tags={"stage": "pretrain"}, metrics=metrics, params={}))


class History:
    """An MLflow client's `get_metric_history`: a falling validation loss every 25 steps."""

    def get_metric_history(self, run_id, key):
        return [SimpleNamespace(step=s, value=7.0 - s / 100) for s in range(25, 201, 25)]


def test_the_validation_plot_has_a_dashed_plateau_line_per_run_that_logged_one(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    drawn = []
    original = Axes.axhline
    monkeypatch.setattr(Axes, "axhline", lambda self, y, **kw: drawn.append((y, kw)) or original(self, y, **kw))
    runs = [_run("a", {"eval/mlm_loss": 5.0, "train/loss": 5.1, "eval/unigram_entropy": 6.42}),
            _run("b", {"eval/mlm_loss": 6.5, "train/loss": 6.6})]  # logged before the entropy was: no line
    written = plot_curves(History(), runs, tmp_path)
    assert tmp_path / "pretrain_eval_mlm_loss.png" in written
    assert (tmp_path / "pretrain_eval_mlm_loss.png").read_bytes()[:4] == b"\x89PNG"
    assert [(y, kw["linestyle"]) for y, kw in drawn] == [(6.42, "--")]
    assert "unigram entropy 6.42" in drawn[0][1]["label"]
