"""`launchers/predict.py`: a task head's label for a pair, the fillings of a mask, clear errors."""

from __future__ import annotations

import pytest
from helpers import run_script


@pytest.mark.slow  # a launch of the script
def test_predict_prints_the_label_fill_mask_the_fillings(finetuned_rte, rte_dev, roberta_export, predict):
    (a, b), _ = rte_dev[0]
    proc = run_script("launchers/predict.py", "--model", finetuned_rte["dir"], "--task", "rte", a, b, check=True)
    lines = proc.stdout.splitlines()
    assert lines[0] == finetuned_rte["predictions"][0]
    assert [line.split("\t")[0].strip() for line in lines[1:]] == ["entailment", "not_entailment"]
    assert abs(sum(float(line.split("\t")[1]) for line in lines[1:]) - 1) < 1e-3

    code, out, _ = predict("--model", roberta_export, "--fill-mask", "The river is <mask>.", "--topk", "3")
    rows = [line.split("\t") for line in out.splitlines()]
    assert code == 0 and len(rows) == 3 and all(row[2].startswith("The river is") for row in rows)

    code, _, err = predict("--model", finetuned_rte["dir"], "--task", "mnli", "a")
    assert code == 2 and "no classification head 'mnli'" in err and "Traceback" not in err
