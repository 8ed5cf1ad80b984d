"""docs/quickstart.py runs end to end as a user would run it, and its models load back."""

from __future__ import annotations

import re

import pytest
from helpers import run_script


@pytest.mark.slow  # trains two tiny models (about a minute on 2 cores)
def test_the_quickstart_runs_and_its_numbers_agree(tmp_path):
    proc = run_script("docs/quickstart.py", "--out", tmp_path, "--texts", "60", check=True, timeout=900)
    out = proc.stdout
    assert "roberta-base (125M)" in out and "MLM epoch 3" in out and "fill_mask:" in out
    losses = [float(x) for x in re.findall(r"MLM epoch \d: loss ([\d.]+)", out)]
    assert losses[-1] < losses[0]
    kit = float(re.search(r"dev accuracy ([\d.]+)", out).group(1))
    hub = float(re.search(r"hub predict: accuracy ([\d.]+)", out).group(1))
    assert hub == kit  # the hub interface predicts what the Kit's evaluation measured
    assert (tmp_path / "finetuned" / "pipeline_finetune.json").is_file()
