"""A stage the main job runs alone (the cloze check after --stop-after pretrain, the seed benchmark's minimal pairs)
starts with a flat command line: each argument a string, number or path, as `run_together` starts it."""

from __future__ import annotations

from pathlib import Path

from pipeline.commands import run_default
from pipeline.common.run_layout import MainJobLayout


def test_a_stage_run_alone_gets_the_arguments_run_together_would_give_it(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(run_default.MainJob, "run",
                        lambda self, step, name, stage, *cmd, **kw: started.append((name, stage, cmd)))
    monkeypatch.setattr(run_default, "record_scores", lambda *a, **kw: None)
    layout = MainJobLayout(tmp_path)
    job = run_default.MainJob(tmp_path, verbose=False)

    run_default.score_minimal_pairs(job, layout, env={})
    job.run_one("6/10 cloze check", run_default.cloze_run(layout), env={})

    assert [(name, stage) for name, stage, _ in started] == [
        ("minimal-pairs-make", "make.minimal_pairs"), ("minimal-pairs", "minimal_pairs"), ("cloze", "cloze")]
    for _, _, cmd in started:
        assert cmd and all(isinstance(arg, str | int | float | Path) for arg in cmd), cmd
    assert "--model" in started[1][2] and "--json" in started[2][2]
