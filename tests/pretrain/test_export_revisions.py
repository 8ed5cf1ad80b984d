"""A run's checkpoints as revisions: each kept checkpoint an HF folder under one root, each proven, with an index
of step, tokens seen and validation loss; every revision loads in `pipeline("fill-mask")` and as a classifier."""

from __future__ import annotations

import json
import re

import pytest
from model_folders import save_pretraining_run

from pipeline.commands.export import main as export_main
from pipeline.common.errors import PipelineError
from pipeline.pretrain.export.folder import PROVENANCE_FILE, REVISIONS_INDEX, export_revisions

STEPS = (2, 4, 6)
LOSSES = {2: 6.1, 4: 5.8, 6: 5.5}


@pytest.fixture
def run(tmp_path, bpe_tokenizer_dir, doc_packed_shards):
    return save_pretraining_run(tmp_path / "run", doc_packed_shards, bpe_tokenizer_dir, steps=STEPS,
                                evaluations=LOSSES)


def test_every_checkpoint_becomes_a_proven_revision_indexed_by_step_tokens_and_loss(run, tmp_path, capsys):
    root = tmp_path / "revisions"
    export_main([str(run), "--out", str(root), "--all-checkpoints"])
    index = json.loads((root / REVISIONS_INDEX).read_text())
    assert [e["step"] for e in index] == list(STEPS)
    assert [e["folder"] for e in index] == [f"step_0000000{s}" for s in STEPS]
    assert [e["tokens_seen"] for e in index] == [s * 16 * 64 for s in STEPS]  # global batch 16 × 64 tokens
    assert [e["validation_loss"] for e in index] == [LOSSES[s] for s in STEPS]
    for entry in index:
        record = json.loads((root / entry["folder"] / PROVENANCE_FILE).read_text())
        assert record["step"] == entry["step"] and record["equivalence"]["within_tolerance"]
        assert record["checkpoint"] == str(run / "checkpoints" / entry["folder"])
    printed = capsys.readouterr().out
    assert re.search(r"\n +6 +6,144 +5\.500 +0 +step_00000006\n3 revisions under ", printed)


@pytest.mark.parametrize("architecture, shards, tokenizer", [
    ("roberta", "doc_packed_shards", "bpe_tokenizer_dir"), ("bert", "pairs_shards", "wordpiece_tokenizer_dir"),
    ("modernbert", "roberta_shards", "bpe_tokenizer_dir")])
def test_every_revision_loads_in_fill_mask_and_as_a_sequence_classifier(request, tmp_path, architecture, shards,
                                                                        tokenizer):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, pipeline

    run = save_pretraining_run(tmp_path / "run", request.getfixturevalue(shards), request.getfixturevalue(tokenizer),
                               architecture, steps=STEPS, evaluations=LOSSES)
    root = tmp_path / "revisions"
    export_revisions(run, root)
    first_logits = None
    for step in STEPS:
        folder = root / f"step_0000000{step}"
        fill = pipeline("fill-mask", model=str(folder))
        filled = fill(f"the model {fill.tokenizer.mask_token} a token.")
        assert len(filled) == 5 and all(0 <= f["score"] <= 1 for f in filled)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        torch.manual_seed(0)  # the same new head on every revision: the encoders differ
        classifier = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2).eval()
        with torch.no_grad():
            logits = classifier(**tokenizer(["the river quietly"], return_tensors="pt")).logits
        assert logits.shape == (1, 2)
        assert first_logits is None or not torch.equal(logits, first_logits)
        first_logits = logits


def test_chosen_steps_and_a_rerun_export_only_what_is_missing(run, tmp_path, monkeypatch):
    import pipeline.pretrain.export.folder as export

    root = tmp_path / "revisions"
    export_main([str(run / "checkpoints" / "step_00000004"), "--out", str(root), "--steps", "2,4"])
    assert sorted(p.name for p in root.iterdir()) == ["revisions.json", "step_00000002", "step_00000004"]
    exported = []
    real = export.export_checkpoint
    monkeypatch.setattr(export, "export_checkpoint", lambda c, out, **kw: exported.append(out) or real(c, out, **kw))
    index = export_revisions(run, root)
    assert exported == [root / "step_00000006"]  # the others already hold these very checkpoints
    assert [e["step"] for e in index] == list(STEPS)


def test_a_step_without_a_checkpoint_is_an_error_naming_the_kept_ones(run, tmp_path):
    with pytest.raises(PipelineError, match=r"--steps 3,5: no complete checkpoint at those steps under .*; "
                                            r"kept: 2, 4, 6"):
        export_revisions(run, tmp_path / "revisions", steps=[2, 3, 5])
    assert not (tmp_path / "revisions").exists()
