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


def test_a_chain_runs_its_stages_in_order_in_one_slot_and_stops_at_the_first_failure(monkeypatch, tmp_path):
    ran = []

    def run_logged(self, name, args, env, screen):
        ran.append(name)
        self.seconds[name] = 0.0
        return (1 if name == "b-fails" else 0), tmp_path / f"{name}.log"

    monkeypatch.setattr(run_default.MainJob, "_run_logged", run_logged)
    job = run_default.MainJob(tmp_path, verbose=False)
    job.run_together("chains", [[("a1", "cloze", []), ("a2", "cloze", [])], ("single", "cloze", [])], env={},
                     at_once=1)
    assert ran == ["a1", "a2", "single"]
    ran.clear()
    try:
        job.run_together("a failing chain", [[("b-fails", "cloze", []), ("b-after", "cloze", [])]], env={})
    except SystemExit as stop:
        assert "'b-fails'" in str(stop)
    else:
        raise AssertionError("a failed stage must stop the job")
    assert ran == ["b-fails"]  # the stage after a failure never starts


def test_the_search_chain_takes_each_stages_folder_from_the_stage_before(tmp_path):
    layout = MainJobLayout(tmp_path)
    for arm in ("pretrained", "from-scratch"):
        corpus, search = run_default.search_chain(layout, arm)
        assert ("--from-scratch" in corpus[2]) == (arm == "from-scratch") and "--from-scratch" not in search[2]
        assert search[2][search[2].index("--model") + 1] == layout.finetune("search-corpus", arm).seed(1).model
