"""The main job's --seed: the pretraining stage gets it as train.seed, and a folder holding a run started with
another seed is refused before any work (a rerun would continue that run)."""

from __future__ import annotations

import json

import pytest

from pipeline.commands import run_default
from pipeline.common.run_layout import MainJobLayout


def pretraining_sets(monkeypatch, tmp_path, **kwargs) -> list[str]:
    """The `--set` values the main job's pretraining stage is started with."""
    started = []
    monkeypatch.setattr(run_default.MainJob, "run", lambda self, step, name, stage, *cmd, **kw: started.append(cmd))
    layout = MainJobLayout(tmp_path)
    run_default.pretrain(run_default.MainJob(tmp_path, verbose=False), layout, {}, ranks=1, **kwargs)
    (cmd,) = started
    return [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--set"]


def test_the_seed_reaches_pretraining_as_train_seed_and_no_seed_keeps_the_configs(monkeypatch, tmp_path):
    assert "train.seed=3" in pretraining_sets(monkeypatch, tmp_path, seed=3)
    assert not [s for s in pretraining_sets(monkeypatch, tmp_path) if s.startswith("train.seed")]
    sets = pretraining_sets(monkeypatch, tmp_path, seed=3, overrides=["masking.probability=0.3"])
    assert sets[-2:] == ["train.seed=3", "masking.probability=0.3"]  # a benchmark's arm comes last


def started_with(tmp_path, seed: int) -> MainJobLayout:
    layout = MainJobLayout(tmp_path / "run")
    layout.pretrain.root.mkdir(parents=True)
    layout.pretrain.config.write_text(json.dumps({"train": {"seed": seed, "max_steps": 800}}))
    return layout


def test_a_folder_pretrained_with_another_seed_is_refused_before_any_work(tmp_path, capsys):
    layout = started_with(tmp_path, seed=0)
    with pytest.raises(SystemExit) as exit_:
        run_default.main(["--out", str(layout.root), "--seed", "3"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err
    assert "--seed 3" in error and "was started with seed 0" in error and "--fresh" in error
    assert not layout.logs.exists() and not layout.corpus.exists()  # nothing ran
    run_default.check_seed(layout, 0)  # the same seed continues it
    run_default.check_seed(layout, None)  # so does the shipped config's (seed 0)


def test_no_seed_against_a_run_started_with_another_names_the_configs_seed(tmp_path):
    layout = started_with(tmp_path, seed=4)
    with pytest.raises(run_default.PipelineError, match=r"no --seed \(configs/main-job.json's seed 0\).*seed 4"):
        run_default.check_seed(layout, None)
    run_default.check_seed(MainJobLayout(tmp_path / "empty"), 7)  # nothing there yet: any seed
